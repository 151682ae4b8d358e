"""SAC and TQC through Conduit with the real RLlib 2.60: RLlib runs both with DQN's training
step and buffer calls, so they take DQN's replay path with continuous actions. The checks
are exact: on RLlib's uniform buffer and Conduit's sharing its RNG, every learner update
gets the same batch, tensor for tensor, and the same seeds train to the same weights.

The batches are compared, not only the weights: early in training SAC's critic loss is in
Huber's linear region, where its gradient does not depend on a reward's value (rewards
shifted by 1.0 trained to the same weights), so equal weights alone would not show equal
rewards."""

import copy

import numpy as np
import pytest
import torch

import conduit_rllib
from conduit_core import ConfigError
from conduit_rllib import workloads
from conduit_rllib.replay_buffer import ConduitEpisodeReplayBuffer

from .rllib_episodes import make_chunks


def small_sac(*, tqc=False, uniform=False, n_step=1, seed=3):
    cfg = workloads.sac_pendulum(seed=seed, capacity=2000, tqc=tqc, hidden=32, batch=32, n_step=n_step)
    # iterations of a fixed number of env steps (RLlib's default also waits a second per iteration)
    cfg.reporting(min_time_s_per_iteration=0, min_sample_timesteps_per_iteration=40)
    if uniform:
        cfg.training(replay_buffer_config={"type": "EpisodeReplayBuffer", "capacity": 2000})
    return cfg


def _train(cfg, iterations, *, share_seed=None):
    """(results, final weights, the buffer, every learner update's batch as the loss saw it)."""
    algo = cfg.build_algo()
    try:
        buf = algo.local_replay_buffer
        if share_seed is not None:   # both buffers draw from a generator seeded alike
            if isinstance(buf, ConduitEpisodeReplayBuffer):
                buf.share_rng(np.random.default_rng(share_seed))
            else:
                buf.rng = np.random.default_rng(share_seed)
        learner = algo.learner_group._learner
        batches, loss = [], learner.compute_loss_for_module

        def recorded(*, module_id, config, batch, fwd_out):
            batches.append({k: v.detach().clone() for k, v in batch.items() if isinstance(v, torch.Tensor)})
            return loss(module_id=module_id, config=config, batch=batch, fwd_out=fwd_out)
        learner.compute_loss_for_module = recorded
        results = [algo.train() for _ in range(iterations)]
        weights = {k: v.detach().clone() for k, v in learner.module["default_policy"].state_dict().items()}
        return results, weights, buf, batches
    finally:
        algo.stop()


def _same_batches(ours: list, theirs: list, *, reward_atol: float = 0.0) -> int:
    """Every update's tensors equal; with n-step, rewards to ``reward_atol`` and the one known
    label departure: where a window is cut short by what is stored, RLlib's uniform buffer labels
    it with the drawn n and Conduit with the steps it spans (docs §10). Returns how many rows
    carried that departure."""
    assert len(ours) == len(theirs) > 0, (len(ours), len(theirs))
    relabelled = 0
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert set(a) >= {"obs", "actions", "rewards", "new_obs", "terminateds", "weights"}, sorted(a)
        assert set(a) == set(b), (i, sorted(set(a) ^ set(b)))
        for k in a:
            assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, (i, k, a[k].dtype, b[k].dtype)
            if k == "rewards" and reward_atol:
                torch.testing.assert_close(a[k], b[k], rtol=0, atol=reward_atol)
            elif k == "n_step" and reward_atol:
                cut = a[k] != b[k]
                assert (a[k][cut] < b[k][cut]).all(), f"update {i}: an n_step label longer than RLlib's"
                relabelled += int(cut.sum())
            else:
                assert torch.equal(a[k], b[k]), f"update {i}: {k} differs from RLlib's"
    return relabelled


# TQC's own loss broadcasts its quantiles (RLlib's code; it warns natively too)
@pytest.mark.filterwarnings("ignore:Using a target size:UserWarning")
@pytest.mark.parametrize("tqc", [False, True], ids=["sac", "tqc"])
def test_sac_trains_on_rllibs_batches_to_rllibs_weights_bit_for_bit(ray_session, tqc):
    """Pendulum, 40 env steps per iteration after 32 warm-up steps: every learner update gets
    RLlib's batch (observations, continuous actions, rewards, next observations, flags, weights),
    so the actor, critics and temperature end equal."""
    native_res, native_w, _, native_b = _train(small_sac(tqc=tqc, uniform=True), 4, share_seed=11)
    res, w, buf, b = _train(conduit_rllib.enable(small_sac(tqc=tqc, uniform=True)), 4, share_seed=11)
    assert isinstance(buf, ConduitEpisodeReplayBuffer) and not buf.prioritized
    trained = res[-1]["learners"]["default_policy"]["num_module_steps_trained_lifetime"]
    assert trained == native_res[-1]["learners"]["default_policy"]["num_module_steps_trained_lifetime"] > 0
    _same_batches(b, native_b)
    assert set(w) == set(native_w)
    differ = [k for k in w if not torch.equal(w[k], native_w[k])]
    assert not differ, f"{len(differ)} of {len(w)} tensors differ from RLlib's after the same updates: {differ[:4]}"


def test_sac_n_step_batches_are_rllibs_but_for_the_stated_reward_rounding(ray_session):
    """3-step returns of Pendulum's float64 rewards: the same rows, and returns that differ
    from RLlib's only by the float32 storage of the rewards (the stated departure)."""
    _, _, _, native_b = _train(small_sac(uniform=True, n_step=3), 3, share_seed=11)
    _, _, _, b = _train(conduit_rllib.enable(small_sac(uniform=True, n_step=3)), 3, share_seed=11)
    _same_batches(b, native_b, reward_atol=1e-5)   # (Pendulum's rewards: |r| < 17; float32 steps ~1e-6)
    # and the departure is real: Pendulum's float64 rewards round differently in some returns
    assert any(not torch.equal(x["rewards"], y["rewards"]) for x, y in zip(b, native_b))


@pytest.mark.filterwarnings("ignore::UserWarning")   # Meta-World's observations leave its declared bounds
def test_sac_on_metaworld_trains_on_rllibs_batches_to_rllibs_weights(ray_session):
    """The paper's continuous-control task: Meta-World reach (float64 observations, 4-dim
    actions, float64 rewards). Conduit stores the observations as they came and hands them to
    the learner as RLlib's connector does (float32): the same batches, the same weights."""
    pytest.importorskip("metaworld", reason="needs metaworld (pip install 'conduit-rllib[metaworld]')")

    def small(seed=3):
        cfg = workloads.sac_metaworld(task="reach-v3", seed=seed, capacity=2000, hidden=32, batch=32, n_step=1)
        cfg.reporting(min_time_s_per_iteration=0, min_sample_timesteps_per_iteration=100)
        return cfg.training(replay_buffer_config={"type": "EpisodeReplayBuffer", "capacity": 2000})

    _, native_w, _, native_b = _train(small(), 3, share_seed=5)
    _, w, buf, b = _train(conduit_rllib.enable(small()), 3, share_seed=5)
    assert buf.edp.buffer.spec["obs"].dtype == torch.float64   # stored as the env gave it
    _same_batches(b, native_b)
    differ = [k for k in w if not torch.equal(w[k], native_w[k])]
    assert not differ, f"{len(differ)} of {len(w)} tensors differ from RLlib's after the same updates: {differ[:4]}"


def test_sac_on_the_prioritized_buffer_trains_and_updates_every_priority(ray_session):
    cfg = conduit_rllib.enable(small_sac(n_step=(2, 5)))
    assert cfg.replay_buffer_config["type"] == "PrioritizedEpisodeReplayBuffer"   # SACConfig.validate's names
    res, _, buf, _ = _train(cfg, 3)
    assert isinstance(buf, ConduitEpisodeReplayBuffer) and buf.prioritized
    m = buf.conduit_metrics()
    assert m.deliver.calls >= 1 and m.priorities.calls == m.deliver.calls
    assert m.ingest.items_in == buf.get_added_timesteps()
    assert res[-1]["learners"]["default_policy"]["num_module_steps_trained"] > 0
    assert res[-1]["conduit"]["priorities_calls"] == m.priorities.calls   # in RLlib's result, as for DQN


def _filled_pair(chunks, *, capacity: int):
    """Conduit's uniform buffer and RLlib's, drawing from generators in the same state, each
    holding ``chunks`` (its own copy)."""
    from ray.rllib.utils.replay_buffers.episode_replay_buffer import EpisodeReplayBuffer
    theirs = EpisodeReplayBuffer(capacity=capacity)
    ours = ConduitEpisodeReplayBuffer(capacity=capacity, conduit={"reuse_outputs": 0})
    ours.share_rng(copy.deepcopy(theirs.rng))
    ours.add(copy.deepcopy(chunks))
    theirs.add(copy.deepcopy(chunks))
    return ours, theirs


def test_continuous_actions_are_delivered_as_rllib_stores_them():
    """Box(3) float32 actions: the same rows under a shared RNG, bit for bit, in RLlib's dtype."""
    ours, theirs = _filled_pair(make_chunks(4, episodes=20, action_dims=3)[0], capacity=400)
    try:
        want = theirs.sample(num_items=64, n_step=2, gamma=0.9, sample_episodes=True)
        got = ours.sample(num_items=64, n_step=2, gamma=0.9, sample_episodes=True)[0].batch
        actions = np.stack([e.get_actions(0) for e in want])
        assert got["action"].dtype == torch.float32 and tuple(got["action"].shape) == (64, 3)
        np.testing.assert_array_equal(got["action"].numpy(), actions)
        np.testing.assert_array_equal(got["reward"].numpy(), np.array([e.get_rewards(0) for e in want], np.float32))
    finally:
        ours.close()


def test_float64_rewards_are_stored_as_float32_and_that_is_the_only_departure():
    """A stated limit (docs/guides/rllib.md): Conduit stores rewards as float32; RLlib keeps
    float64 and rounds its n-step return once, at the learner connector. For float64 rewards
    (Meta-World's) a 1-step reward is the same float32; an n-step return is RLlib's return of
    the float32-rounded rewards, which may differ from RLlib's in the last bits."""
    import scipy.signal
    chunks, _ = make_chunks(4, episodes=30, action_dims=2, reward_dtype=np.float64)
    ours, theirs = _filled_pair(chunks, capacity=600)
    try:
        rounded = {e.id_: e for e in theirs.episodes}
        for n_step in (1, 3):
            want = theirs.sample(num_items=256, n_step=n_step, gamma=0.99, sample_episodes=True)
            got = ours.sample(num_items=256, n_step=n_step, gamma=0.99, sample_episodes=True)[0].batch
            theirs_f32 = np.array([e.get_rewards(0) for e in want]).astype(np.float32)
            if n_step == 1:
                np.testing.assert_array_equal(got["reward"].numpy(), theirs_f32)
                continue
            # RLlib's own sum (lfilter, float64) over each window's rewards rounded to float32 first
            src = [(rounded[e.id_], e.t_started) for e in want]
            of_f32 = np.array([scipy.signal.lfilter([1], [1, -0.99], ep.get_rewards(slice(t - ep.t_started,
                               t - ep.t_started + n))[::-1].astype(np.float32).astype(np.float64))[-1]
                               for (ep, t), n in zip(src, got["n_step"].numpy())]).astype(np.float32)
            np.testing.assert_allclose(got["reward"].numpy(), of_f32, rtol=0, atol=4e-7 * np.abs(of_f32).max())
            assert np.any(got["reward"].numpy() != theirs_f32)   # (the departure is real: this data shows it)
    finally:
        ours.close()


def test_multi_agent_sac_is_refused_by_name():
    from ray.rllib.algorithms.sac import SACConfig
    cfg = SACConfig().environment("Pendulum-v1").multi_agent(policies={"a", "b"},
                                                             policy_mapping_fn=lambda aid, *a, **k: "a")
    before = copy.deepcopy(cfg.replay_buffer_config), cfg.learner_class, cfg.algo_class
    with pytest.raises(ConfigError, match="single-agent SAC config"):
        conduit_rllib.enable(cfg)
    assert (cfg.replay_buffer_config, cfg.learner_class, cfg.algo_class) == before   # nothing of the config changed


@pytest.mark.parametrize("tqc", [False, True], ids=["sac", "tqc"])
@pytest.mark.parametrize("uniform", [False, True], ids=["prioritized", "uniform"])
def test_enable_twice_changes_nothing_for_sac_and_tqc(tqc, uniform):
    from conduit_rllib.algorithms import ConduitSAC, ConduitTQC
    from conduit_rllib.learner import ConduitSACTorchLearner, ConduitTQCTorchLearner
    cfg = conduit_rllib.enable(small_sac(tqc=tqc, uniform=uniform))
    once = copy.deepcopy(cfg.replay_buffer_config), cfg.learner_class, cfg.algo_class
    assert once[1] is (ConduitTQCTorchLearner if tqc else ConduitSACTorchLearner)
    assert once[2] is (ConduitTQC if tqc else ConduitSAC)
    assert once[0]["type"] == ("EpisodeReplayBuffer" if uniform else "PrioritizedEpisodeReplayBuffer")
    assert once[0]["prioritized"] is (not uniform)
    again = conduit_rllib.enable(cfg)
    assert (again.replay_buffer_config, again.learner_class, again.algo_class) == once


def test_a_users_sac_learner_must_derive_from_conduits():
    from ray.rllib.algorithms.sac.torch.sac_torch_learner import SACTorchLearner

    from conduit_rllib.learner import ConduitSACTorchLearner

    class Mine(SACTorchLearner):
        pass

    class MineOnConduit(ConduitSACTorchLearner):
        pass

    with pytest.raises(ConfigError, match=r"Mine from conduit_rllib.learner.ConduitSACTorchLearner .* instead of SACTorchLearner"):
        conduit_rllib.enable(small_sac().learners(learner_class=Mine))
    assert conduit_rllib.enable(small_sac().learners(learner_class=MineOnConduit)).learner_class is MineOnConduit


def test_rllibs_own_sac_class_is_refused_at_the_first_update_not_run_on_its_buffer(ray_session):
    """``SAC(config)`` (or ``tune.Tuner("SAC", ...)``) builds RLlib's buffer, which takes Conduit's
    options as unknown keywords and ignores them: the learner refuses the first update of
    RLlib's episodes instead of training as if Conduit were there."""
    from ray.rllib.algorithms.sac import SAC
    algo = SAC(config=conduit_rllib.enable(small_sac()))
    try:
        assert not isinstance(algo.local_replay_buffer, ConduitEpisodeReplayBuffer)
        with pytest.raises(ConfigError, match="config.build_algo"):
            for _ in range(3):
                algo.train()
    finally:
        algo.stop()


def test_a_sac_checkpoint_restores_the_buffer_exactly(ray_session, tmp_path):
    from ray.rllib.algorithms.algorithm import Algorithm
    algo = conduit_rllib.enable(small_sac(n_step=(2, 5))).build_algo()
    try:
        algo.train()
        algo.train()
        path = algo.save_to_path(str(tmp_path / "ckpt"))
        restored = Algorithm.from_checkpoint(path)
        try:
            assert type(restored.local_replay_buffer) is ConduitEpisodeReplayBuffer
            assert len(restored.local_replay_buffer) == len(algo.local_replay_buffer) > 0
            x = algo.local_replay_buffer.sample(32, sample_episodes=True, n_step=(2, 5), gamma=0.99)[0].batch
            y = restored.local_replay_buffer.sample(32, sample_episodes=True, n_step=(2, 5), gamma=0.99)[0].batch
            assert x.size == 32 and all(torch.equal(x[k], y[k]) for k in x)   # the same state, the same draw
            restored.train()
        finally:
            restored.stop()
    finally:
        algo.stop()


def test_sac_with_ingestion_at_the_source(ray_session):
    """``source_ingest=True``: SAC's remote env runner writes its steps where it runs (DQN's
    writers, handed out by the same algorithm hook); the driver's buffer takes receipts."""
    cfg = small_sac(n_step=(2, 5)).env_runners(num_env_runners=1)
    algo = conduit_rllib.enable(cfg, source_ingest=True).build_algo()
    try:
        for _ in range(3):
            res = algo.train()
        buf = algo.local_replay_buffer
        assert len(algo.conduit_writers) == 1 and buf.unwritten_adds == 0   # every add came as a receipt
        assert len(buf) == buf.get_added_timesteps() > 0
        assert res["learners"]["default_policy"]["num_module_steps_trained"] > 0
    finally:
        algo.stop()
