"""verl's separated trainer with Conduit's advantage stage: the chunked stage builds the batch
verl's own ``SeparateRayPPOTrainer._fit_compute_advantage`` builds, bit for bit, in every
chunking and depth; it falls back where the stage is not per group; options are Hydra's."""

import copy

import numpy as np
import pytest
import torch

pytest.importorskip("verl", reason="needs verl[verl-core]")

from conduit_core.errors import ConfigError  # noqa: E402
from conduit_verl.separated import (AdvantageStageMixin, V1Options, advantage_stage_trainer, grpo_batch,  # noqa: E402
                                    legacy_chunkable, options)
from conduit_verl.v1_trainer import verl_config  # noqa: E402

GRPO = ["algorithm.adv_estimator=grpo", "trainer.use_v1=False", "actor_rollout_ref.rollout.n=4"]


def _verl_and_conduit(overrides, *, prompts=12, n=4, seed=0, extra=None):
    from verl.experimental.separation.ray_trainer import SeparateRayPPOTrainer
    cfg = verl_config(GRPO + overrides)
    batch, reward = grpo_batch(prompts, n, 48, seed)
    infos = extra(batch) if extra else None
    ref = advantage_stage_trainer(cfg, SeparateRayPPOTrainer, reward_tensor=reward.clone(), reward_extra_infos=infos)
    ours = advantage_stage_trainer(cfg, reward_tensor=reward.clone(), reward_extra_infos=infos)
    expected = ref._fit_compute_advantage(copy.deepcopy(batch))
    got = ours._fit_compute_advantage(copy.deepcopy(batch))
    return expected, got, ref, ours


def _assert_same_batch(expected, got):
    assert set(got.batch.keys()) == set(expected.batch.keys())
    for k in expected.batch.keys():
        assert torch.equal(got.batch[k], expected.batch[k]), k
    assert set(got.non_tensor_batch) == set(expected.non_tensor_batch)
    for k, v in expected.non_tensor_batch.items():
        np.testing.assert_array_equal(got.non_tensor_batch[k], v)
        assert got.non_tensor_batch[k].dtype == v.dtype, k
    assert got.meta_info == expected.meta_info


def mixed_extra_infos(batch) -> dict:
    """Reward extra infos whose dtype differs from chunk to chunk: ints, short strings and None
    in the first group's rows (the first chunk's), floats, longer strings elsewhere. verl builds
    each column once over the whole batch; a review found them cast into the first chunk's
    dtype (0.5 -> 0, '12345' -> '1')."""
    uid = batch.non_tensor_batch["uid"]
    first = uid == uid[0]
    return {"acc": [i % 3 for i in range(len(uid))], "score": [1 if f else 0.5 for f in first],
            "pred": ["7" if f else "12345" for f in first], "note": [None if f else "x" for f in first]}


@pytest.mark.parametrize("groups_per_chunk,depth", [(1, 1), (2, 2), (5, 3), (12, 2), (100, 2)])
@pytest.mark.parametrize("kl", [False, True])
def test_chunked_stage_builds_verls_batch_bit_for_bit(groups_per_chunk, depth, kl, monkeypatch):
    from conduit_verl import separated
    overrides = [f"+trainer.conduit.groups_per_chunk={groups_per_chunk}", f"+trainer.conduit.depth={depth}"]
    if kl:
        overrides.append("algorithm.use_kl_in_reward=True")
    ran = []
    chunked = separated.chunked_advantage
    monkeypatch.setattr(separated, "chunked_advantage", lambda *a: ran.append(1) or chunked(*a))
    expected, got, ref, ours = _verl_and_conduit(overrides, extra=mixed_extra_infos)
    assert ran  # the chunked path ran (not the fallback)
    assert "advantages" in got.batch.keys() and "token_level_rewards" in got.batch.keys()
    _assert_same_batch(expected, got)
    assert set(ours.metrics) == set(ref.metrics) and "adv" in ours.timing_raw
    for k, v in ref.metrics.items():  # row-weighted means of per-chunk means: equal up to rounding
        assert ours.metrics[k] == pytest.approx(v, rel=1e-5), k


def test_without_options_the_stage_is_verls():
    expected, got, _, _ = _verl_and_conduit([])
    _assert_same_batch(expected, got)
    assert options(verl_config(GRPO)) == V1Options()


def test_falls_back_where_the_stage_is_not_per_group(caplog):
    base = ["+trainer.conduit.groups_per_chunk=2", "algorithm.use_kl_in_reward=True"]
    cfg = verl_config(GRPO + base + ["algorithm.kl_ctrl.type=adaptive"])
    batch, _ = grpo_batch(4, 4, 16)
    assert "kl_ctrl" in legacy_chunkable(cfg, batch)
    batch.batch["rollout_log_probs"] = batch.batch["old_log_probs"].clone()
    assert "rollout" in legacy_chunkable(verl_config(GRPO + base), batch)
    AdvantageStageMixin._conduit_fallback_logged = False
    with caplog.at_level("WARNING"):
        expected, got, _, _ = _verl_and_conduit(base + ["algorithm.kl_ctrl.type=adaptive"])
    _assert_same_batch(expected, got)
    assert "whole-batch" in caplog.text and "kl_ctrl" in caplog.text


def test_options_are_validated_with_their_hydra_path():
    assert options(verl_config(GRPO + ["+trainer.conduit.groups_per_chunk=3"])) == V1Options(groups_per_chunk=3)
    with pytest.raises(ConfigError, match=r"trainer\.conduit\.groups_per_chnk"):
        options(verl_config(GRPO + ["+trainer.conduit.groups_per_chnk=3"]))
    with pytest.raises(ConfigError, match=r"trainer\.conduit\.depth.*>= 1"):
        options(verl_config(GRPO + ["+trainer.conduit.depth=0"]))


def test_a_failing_chunk_reaches_the_caller():
    from conduit_verl import separated
    cfg = verl_config(GRPO + ["+trainer.conduit.groups_per_chunk=2"])
    batch, reward = grpo_batch(6, 4, 16)
    trainer = advantage_stage_trainer(cfg, reward_tensor=reward)
    calls = []

    def stage(view, chunk):
        calls.append(len(chunk))
        if len(calls) == 2:
            raise ValueError("chunk 2 failed")
        return chunk

    with pytest.raises(ValueError, match="chunk 2 failed"):
        separated.chunked_advantage(trainer, batch, stage, options(cfg))
    assert len(calls) == 3  # the other chunks ran to completion


def test_the_class_subclasses_verls_separated_trainer_and_pickles():
    import pickle

    from verl.experimental.separation.ray_trainer import SeparateRayPPOTrainer

    from conduit_verl import separated
    cls = separated.ConduitSeparateTrainer
    assert issubclass(cls, SeparateRayPPOTrainer) and cls.__mro__[1] is AdvantageStageMixin
    assert pickle.loads(pickle.dumps(cls)) is cls
