"""verl's V1 trainer mode ``conduit``: registered through the ``verl.plugins`` entry point
(lazily), configured with Hydra overrides, and its pipelined advantage stage writes what
verl's whole-batch stage writes into a real TransferQueue, bit for bit (where every chunk pads
to the batch's width; see conduit_verl.v1_trainer for the rounding otherwise)."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("verl", reason="needs verl[verl-core]")

from conduit_core.errors import ConfigError  # noqa: E402
from conduit_verl.v1_trainer import (V1Options, advantage_stage_trainer, chunkable, grpo_rows,  # noqa: E402
                                     pipelined_advantage, split_by_groups, verl_config)

GRPO = ["algorithm.adv_estimator=grpo", "trainer.v1.trainer_mode=conduit", "actor_rollout_ref.rollout.n=4"]


def _run(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180,
                          env={**os.environ, **env})


def test_entry_point_registers_the_mode_when_verl_loads_its_v1_trainers():
    code = ("import sys, verl\n"
            "print('eager', 'verl.trainer.ppo.v1.trainer_base' in sys.modules)\n"
            "from verl.trainer.ppo.v1 import get_trainer_cls\n"
            "cls = get_trainer_cls('conduit')\n"
            "print('cls', cls.__module__, cls.__name__, [b.__name__ for b in cls.__mro__[1:3]])\n")
    out = _run(code)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "eager False" in out.stdout  # `import verl` stays cheap: nothing of V1 is imported by the plugin
    assert "cls conduit_verl.v1_trainer ConduitV1Trainer ['PPOTrainerSync', 'PPOTrainer']" in out.stdout


def test_verl_switch_turns_the_plugin_off():
    out = _run("import verl\nfrom verl.trainer.ppo.v1 import get_trainer_cls\nget_trainer_cls('conduit')\n",
               VERL_USE_EXTERNAL_PLUGINS="none")
    assert out.returncode != 0 and "Unknown trainer 'conduit'" in out.stderr


def test_hydra_overrides_compose_with_verls_config():
    cfg = verl_config(GRPO + ["+trainer.v1.conduit.groups_per_chunk=4", "+trainer.v1.conduit.depth=3"])
    assert cfg.trainer.use_v1 and cfg.trainer.v1.trainer_mode == "conduit"
    assert V1Options.from_config(cfg) == V1Options(groups_per_chunk=4, depth=3)
    assert V1Options.from_config(verl_config(GRPO)) == V1Options()  # every option is optional
    with pytest.raises(ConfigError, match="trainer.v1.conduit.group_per_chunk"):
        V1Options.from_config(verl_config(GRPO + ["+trainer.v1.conduit.group_per_chunk=4"]))
    with pytest.raises(ConfigError, match="trainer.v1.conduit.depth.*>= 1"):
        V1Options.from_config(verl_config(GRPO + ["+trainer.v1.conduit.depth=0"]))


def test_chunking_only_where_the_stage_is_per_group():
    assert chunkable(verl_config(GRPO)) is None
    assert chunkable(verl_config(GRPO + ["algorithm.use_kl_in_reward=True"])) is None  # fixed coefficient
    assert "kl_ctrl" in chunkable(verl_config(GRPO + ["algorithm.use_kl_in_reward=True",
                                                      "algorithm.kl_ctrl.type=adaptive"]))
    assert "gae" in chunkable(verl_config(GRPO + ["algorithm.adv_estimator=gae"]))
    assert "rollout_correction" in chunkable(verl_config(GRPO + ["algorithm.rollout_correction.rollout_is=token"]))


def _meta(keys):
    from transfer_queue import KVBatchMeta
    return KVBatchMeta(keys=keys, tags=[{"i": i} for i in range(len(keys))], partition_id="train")


def test_split_keeps_groups_whole_and_rows_in_order():
    keys = ["a_0_0", "b_0_0", "a_1_0", "c_0_0", "b_1_0", "a_2_0", "d_0_0"]
    chunks = split_by_groups(_meta(keys), groups_per_chunk=2)
    assert [c.keys for c in chunks] == [["a_0_0", "b_0_0", "a_1_0", "b_1_0", "a_2_0"], ["c_0_0", "d_0_0"]]
    assert sorted(k for c in chunks for k in c.keys) == sorted(keys)
    with pytest.raises(ConfigError, match="uid"):
        split_by_groups(_meta(["no-session-index"]), 1)


def test_a_failing_chunk_reaches_the_caller_after_the_others_finish():
    done = []

    def stage(chunk, metrics):
        if chunk.keys[0].startswith("b"):
            raise RuntimeError("stage failed on b")
        done.append(chunk.keys[0])
        return chunk

    with pytest.raises(RuntimeError, match="stage failed on b"):
        pipelined_advantage(stage, _meta(["a_0_0", "b_0_0", "c_0_0"]), {}, V1Options(groups_per_chunk=1, depth=2))
    assert sorted(done) == ["a_0_0", "c_0_0"]  # nothing left running


@pytest.fixture(scope="module")
def transferqueue():
    import ray
    import transfer_queue as tq
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if ray.is_initialized():  # a session another module left behind has the wrong CPU count
        ray.shutdown()
    # TransferQueue's controller and storage actors each take a CPU: 2 would deadlock here
    from conduit_core.remote.ray_local import init_local
    init_local(num_cpus=4, object_store_memory=256 << 20, log_to_driver=False)
    tq.init()
    yield tq
    tq.close()
    ray.shutdown()


FIELDS = ["advantages", "returns", "token_level_rewards"]


@pytest.mark.parametrize("kl", [False, True])
@pytest.mark.parametrize("groups_per_chunk,depth", [(1, 2), (3, 2), (5, 1), (64, 2)])
def test_pipelined_stage_writes_what_verls_whole_batch_stage_writes(transferqueue, kl, groups_per_chunk, depth):
    import torch
    from tensordict import TensorDict  # noqa: F401 - TransferQueue's batch type
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict
    tq = transferqueue
    cfg = verl_config(GRPO + [f"algorithm.use_kl_in_reward={kl}", f"+trainer.v1.conduit.groups_per_chunk={groups_per_chunk}",
                              f"+trainer.v1.conduit.depth={depth}"])
    keys, rows = grpo_rows(prompts=9, n=4, max_len=300, seed=groups_per_chunk * 2 + kl, widest_in_every_group=True)
    meta = tq.kv_batch_put(keys=keys, partition_id="train", fields=list_of_dict_to_tensordict(rows),
                           tags=[{"is_padding": False, "row": i} for i in range(len(keys))])
    trainer = advantage_stage_trainer(cfg)
    m_verl, m_conduit = {}, {}
    out_verl = PPOTrainerSync._compute_advantage(trainer, meta, m_verl)
    want = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=FIELDS if kl else FIELDS[:2])
    tq.kv_clear(keys=keys, partition_id="train")
    meta = tq.kv_batch_put(keys=keys, partition_id="train", fields=list_of_dict_to_tensordict(rows),
                           tags=[{"is_padding": False, "row": i} for i in range(len(keys))])
    out = trainer._compute_advantage(meta, m_conduit)
    got = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=FIELDS if kl else FIELDS[:2])
    tq.kv_clear(keys=keys, partition_id="train")
    assert out.keys == out_verl.keys and out.tags == out_verl.tags and sorted(out.fields) == sorted(out_verl.fields)
    # every group holds a widest response, so each chunk pads to the batch's width: bit for bit
    for f in (FIELDS if kl else FIELDS[:2]):
        assert all(torch.equal(a, b) for a, b in zip(want[f].unbind(), got[f].unbind())), f
    assert m_conduit.keys() == m_verl.keys()
    for k in m_verl:
        assert m_conduit[k] == pytest.approx(m_verl[k], rel=1e-6, abs=1e-9)
