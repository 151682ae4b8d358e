"""The RLlib adapter with the real RLlib 2.60: DQN trains through Conduit, checkpoints
carry the buffer, bad options fail at build time, batches look like RLlib's."""

import numpy as np
import pytest
import torch

import conduit_rllib
from conduit_core import ConfigError
from conduit_rllib import workloads
from conduit_rllib.replay_buffer import ConduitEpisodeReplayBuffer, DeliveredBatch


def small_dqn(num_env_runners=0, **kw):
    cfg = workloads.dqn_cartpole(seed=1, num_env_runners=num_env_runners, capacity=kw.pop("capacity", 5000))
    cfg.reporting(min_sample_timesteps_per_iteration=200)
    cfg.training(num_steps_sampled_before_learning_starts=100)
    return conduit_rllib.enable(cfg, **kw)


@pytest.mark.parametrize("num_env_runners", [0, 1])
def test_dqn_trains_through_conduit(ray_session, num_env_runners):
    algo = small_dqn(num_env_runners).build_algo()
    assert algo.local_replay_buffer.seed == 1   # the config's seed (RLlib passes its buffers none)
    try:
        assert isinstance(algo.local_replay_buffer, ConduitEpisodeReplayBuffer)
        for _ in range(2):
            res = algo.train()
        buf = algo.local_replay_buffer
        assert len(buf) >= 400 and buf.get_sampled_timesteps() > 0
        m = buf.conduit_metrics()
        # every delivered batch's TD errors came back once, and every step RLlib added was ingested once
        assert m.deliver.calls >= 1 and m.priorities.calls == m.deliver.calls
        assert m.ingest.items_in == buf.get_added_timesteps()
        assert res["learners"]["default_policy"]["num_module_steps_trained"] > 0
        conduit = res["conduit"]   # the data plane's counters in RLlib's result, where users read the run
        assert conduit["deliver_calls"] == m.deliver.calls and conduit["inserted"] == m.inserted
        assert conduit["buffer_size"] == len(buf) and conduit["exposed_ms"] > 0
        replay = res["replay_buffer"]   # DQN aggregates get_metrics() (it was {}: no entry)
        assert replay["num_env_steps_added_lifetime"] == buf.get_added_timesteps()
        assert replay["num_env_steps_sampled_lifetime"] == buf.get_sampled_timesteps()
    finally:
        algo.stop()


def test_overlapped_schedule_trains(ray_session):
    algo = small_dqn(mode="overlapped").build_algo()
    try:
        algo.train()
        algo.train()
        buf = algo.local_replay_buffer
        m = buf.conduit_metrics()
        assert buf.edp.schedule.mode == "overlapped"
        assert m.deliver.calls >= 1 and m.priorities.calls == m.deliver.calls
        assert m.ingest.items_in == buf.get_added_timesteps()
    finally:
        algo.stop()


def test_auto_schedule_settles_calibrates_and_switches_without_loss(ray_session):
    from conduit_core.planning.tuner import current_placement, schedule_for
    algo = small_dqn(mode="auto", autotune_settle=(5, 30), autotune_steps_per_phase=5).build_algo()
    try:
        buf = algo.local_replay_buffer
        for _ in range(20):
            algo.train()
            if buf.tuner is not None and buf.tuner.done:
                break
        tuner = buf.tuner
        assert tuner.settled and 5 <= len(tuner.settle_steps) <= 30
        assert tuner.done and len(tuner.predictions) >= 32 and "picked" in tuner.report()
        assert buf.edp.schedule == schedule_for(tuner.choice, buf.edp.schedule)  # the pick is in force
        assert current_placement(buf.edp.buffer) == tuner.choice.placement        # placement too
        algo.train()  # and trains on
        buf.edp.flush()
        assert len(buf) == buf.get_added_timesteps()  # nothing lost across five schedule switches
    finally:
        algo.stop()


def test_autotune_options_are_validated():
    with pytest.raises(ConfigError, match="autotune_settle.*least <= most"):
        small_dqn(mode="auto", autotune_settle=(10, 5))
    with pytest.raises(ConfigError, match="autotune_steps_per_phase"):
        small_dqn(mode="auto", autotune_steps_per_phase=0)


def test_buffer_survives_checkpoint_round_trip_exactly(ray_session, tmp_path):
    from ray.rllib.algorithms.algorithm import Algorithm
    algo = small_dqn().build_algo()
    try:
        algo.train()
        algo.train()
        path = algo.save_to_path(str(tmp_path / "ckpt"))
        before = algo.local_replay_buffer.get_state()
        restored = Algorithm.from_checkpoint(path)
        try:
            after = restored.local_replay_buffer.get_state()
            sb, sa = before["edp"]["buffer"], after["edp"]["buffer"]
            assert sb["counters"] == sa["counters"] and sb["rng"] == sa["rng"]
            for k in sb["data"]:
                np.testing.assert_array_equal(sb["data"][k], sa["data"][k])
            np.testing.assert_array_equal(sb["selector_state"]["leaves"], sa["selector_state"]["leaves"])
            # Same state => the next delivered batch is identical.
            x = algo.local_replay_buffer.sample(32, sample_episodes=True, n_step=(2, 5), gamma=0.99)[0].batch
            y = restored.local_replay_buffer.sample(32, sample_episodes=True, n_step=(2, 5), gamma=0.99)[0].batch
            assert all(torch.equal(x[k], y[k]) for k in x)
        finally:
            restored.stop()
    finally:
        algo.stop()


def test_unknown_option_is_a_clear_error():
    with pytest.raises(ConfigError, match=r"bogus.*one of.*Fix"):
        small_dqn(bogus=1)


def test_capacity_smaller_than_train_batch_fails_at_build(ray_session):
    cfg = small_dqn(capacity=16)
    with pytest.raises(Exception) as info:
        cfg.build_algo()
    assert "capacity" in str(info.value) and "train batch size (32)" in str(info.value)


def test_delivered_batch_has_rllibs_columns_dtypes_and_shapes(ray_session):
    """Our connector's output vs RLlib's own learner connector on RLlib's own buffer."""
    from ray.rllib.utils.replay_buffers.prioritized_episode_buffer import PrioritizedEpisodeReplayBuffer
    algo = small_dqn().build_algo()
    try:
        algo.train()
        learner = algo.learner_group._learner
        native = PrioritizedEpisodeReplayBuffer(capacity=5000, alpha=0.6)
        native.add(algo.env_runner.sample(num_timesteps=300))
        eps = native.sample(num_items=32, n_step=(2, 5), gamma=0.99, beta=0.4, sample_episodes=True)
        ours = algo.local_replay_buffer.sample(32, sample_episodes=True, n_step=(2, 5), gamma=0.99, beta=0.4)
        assert isinstance(ours[0], DeliveredBatch)
        ref = learner._learner_connector.inner(rl_module=learner.module, batch={}, episodes=eps,
                                               shared_data={}, metrics=None)["default_policy"]
        got = learner._learner_connector(rl_module=learner.module, batch={}, episodes=ours, shared_data={},
                                         metrics=None)["default_policy"]
        for col in ("obs", "new_obs", "actions", "rewards", "terminateds", "n_step", "weights"):
            assert col in got, col
            r, g = torch.as_tensor(ref[col]), got[col]
            assert tuple(r.shape) == tuple(g.shape), col
            assert r.dtype == g.dtype or (col == "actions" and not g.dtype.is_floating_point), (col, r.dtype, g.dtype)
    finally:
        algo.stop()


def test_episode_chunks_become_columns_exactly(ray_session):
    from ray.rllib.algorithms.dqn import DQNConfig
    from conduit_rllib.columns import episode_columns
    algo = DQNConfig().environment("CartPole-v1").env_runners(num_env_runners=0).build_algo()
    try:
        for _ in range(4):
            for e in algo.env_runner.sample(num_timesteps=37):
                c, n = episode_columns(e), len(e)
                np.testing.assert_array_equal(c["obs"], np.asarray(e.get_observations(slice(0, n))))
                np.testing.assert_array_equal(c["next_obs"], np.asarray(e.get_observations(slice(1, n + 1))))
                np.testing.assert_array_equal(c["action"], np.asarray(e.get_actions(slice(0, n))))
                assert c["terminated"][-1] == e.is_terminated and not c["terminated"][:-1].any()
    finally:
        algo.stop()


def test_chunk_columns_match_rllibs_getters_and_shared_flags_stay_false():
    """Every column of every chunk (ongoing, terminated, truncated, split, 1 to 300 steps, with
    extras) against RLlib's own getters; the read-only flags an ongoing chunk shares are never
    written, by the columns or by a buffer storing them."""
    from conduit_rllib.columns import episode_columns
    from tests.rllib.rllib_episodes import make_chunks
    chunks, _ = make_chunks(3, episodes=30, lengths=(1, 300), open_last=6, split_every=3, with_extras=True)
    assert {c.is_terminated for c in chunks} == {True, False} and any(c.is_truncated for c in chunks)
    rb = ConduitEpisodeReplayBuffer(capacity=20_000, prioritized=True, alpha=0.6)
    shared = []
    for ep in chunks:
        c, n = episode_columns(ep), len(ep)
        np.testing.assert_array_equal(c["obs"], np.asarray(ep.get_observations(slice(0, n))))
        np.testing.assert_array_equal(c["next_obs"], np.asarray(ep.get_observations(slice(1, n + 1))))
        np.testing.assert_array_equal(c["action"], np.asarray(ep.get_actions(slice(0, n))))
        np.testing.assert_array_equal(c["reward"], np.asarray(ep.get_rewards(slice(0, n)), dtype=np.float32))
        np.testing.assert_array_equal(c["extra_model_outputs.logp"],
                                      np.asarray(ep.get_extra_model_outputs("logp", slice(0, n))))
        want_term, want_trunc = np.zeros(n, bool), np.zeros(n, bool)
        want_term[-1], want_trunc[-1] = ep.is_terminated, ep.is_truncated
        np.testing.assert_array_equal(c["terminated"], want_term)
        np.testing.assert_array_equal(c["truncated"], want_trunc)
        assert c["reward"].dtype == np.float32 and c["terminated"].dtype == c["truncated"].dtype == np.bool_
        if not c["terminated"].flags.writeable:
            shared.append(c["terminated"])
        rb.add([ep])
    assert shared and all(not f.any() for f in shared)
    assert len(rb) == sum(len(c) for c in chunks)
    rb.close()


@pytest.mark.parametrize("schedule", ["sequential", "overlapped"])
def test_ingest_granularity_groups_episodes_per_operator_call(ray_session, schedule):
    algo = small_dqn(mode=schedule, ingest_granularity=3).build_algo()
    try:
        algo.train()  # builds the data plane
        buf = algo.local_replay_buffer
        eps = [e for e in algo.env_runner.sample(num_timesteps=200) if len(e)]
        m0, added0 = buf.conduit_metrics(), len(buf)
        buf.add(eps)
        buf.edp.flush()
        m1 = buf.conduit_metrics()
        assert m1.ingest.items_in - m0.ingest.items_in == sum(len(e) for e in eps) == len(buf) - added0
        if schedule == "sequential":  # one inline operator call per group of 3 episodes
            assert m1.ingest.calls - m0.ingest.calls == -(-len(eps) // 3)
        assert buf.edp.schedule.ingest_granularity == 3
    finally:
        algo.stop()


SEEN_BY_PIECE: list = []


def _recording_piece():
    from ray.rllib.connectors.connector_v2 import ConnectorV2

    class RecordRewards(ConnectorV2):
        """A user's learner connector piece: it reads the episodes and adds a column."""

        def __call__(self, *, rl_module, batch, episodes, **kwargs):
            SEEN_BY_PIECE.append([float(np.asarray(e.get_rewards()).reshape(-1)[0]) for e in episodes])
            return batch

    return RecordRewards


def test_a_users_learner_connector_piece_runs_on_the_delivered_rows(ray_session):
    """A piece the user added to the learner pipeline reads episodes: enable() has the
    buffer deliver RLlib's one-step episodes, and RLlib's whole pipeline (the piece
    included) runs on them. Added after enable(), or forced onto columns, it is refused."""
    piece = _recording_piece()
    SEEN_BY_PIECE.clear()
    cfg = workloads.dqn_cartpole(seed=1, capacity=5000)
    cfg.reporting(min_sample_timesteps_per_iteration=200)
    cfg.training(num_steps_sampled_before_learning_starts=100)
    cfg.learners(learner_connector=lambda obs_space, act_space: [piece()])
    with pytest.raises(ConfigError, match="RecordRewards"):
        conduit_rllib.enable(cfg.copy(copy_frozen=False), delivery="columns")
    algo = conduit_rllib.enable(cfg).build_algo()
    try:
        assert algo.local_replay_buffer.options.delivery == "episodes"
        algo.train()
        algo.train()
        assert SEEN_BY_PIECE and all(len(batch) == 32 for batch in SEEN_BY_PIECE)
        assert not algo.local_replay_buffer.eviction_report()["early"]
    finally:
        algo.stop()
    cfg = conduit_rllib.enable(workloads.dqn_cartpole(seed=1))
    cfg.learners(learner_connector=lambda obs_space, act_space: [piece()])   # added after enable()
    with pytest.raises(Exception, match="learner_connector"):
        cfg.build_algo()


def test_episode_delivery_gives_the_learner_the_same_batch_as_columns(ray_session):
    """The same delivered rows, once as columns (Conduit's connector) and once as RLlib
    episodes through RLlib's own learner pipeline: equal train batches, column for column."""
    algo = small_dqn().build_algo()
    try:
        algo.train()
        learner = algo.learner_group._learner
        buf = algo.local_replay_buffer
        cols = buf.sample(32, sample_episodes=True, n_step=(1, 4), gamma=0.99, beta=0.4)
        eps = buf._episodes_of(buf.last_sampled, include_infos=True, include_extras=False, lookback=0)
        got = learner._learner_connector(rl_module=learner.module, batch={}, episodes=cols, shared_data={},
                                         metrics=None)["default_policy"]
        ref = learner._learner_connector(rl_module=learner.module, batch={}, episodes=eps, shared_data={},
                                         metrics=None)["default_policy"]
        for col in ("obs", "new_obs", "actions", "rewards", "terminateds", "truncateds", "n_step", "weights"):
            r, g = torch.as_tensor(ref[col]), got[col]
            assert torch.allclose(r.to(g.dtype), g), col
    finally:
        algo.stop()


def test_a_checkpoint_with_a_missing_or_damaged_buffer_fails_before_anything_is_restored(ray_session, tmp_path):
    import os

    import pyarrow.fs

    from conduit_core import StateError
    from conduit_rllib.checkpointing import BUFFER_FILE
    algo = small_dqn().build_algo()
    other = small_dqn().build_algo()
    try:
        algo.train()
        path = algo.save_to_path(str(tmp_path / "ckpt"))
        # written through the filesystem RLlib is given, not only to local paths
        fs_path = algo.save_to_path(str(tmp_path / "ckpt_fs"), filesystem=pyarrow.fs.LocalFileSystem())
        assert os.path.exists(os.path.join(fs_path, BUFFER_FILE))
        other.train()
        other.train()
        iters, size = other.iteration, len(other.local_replay_buffer)
        f = os.path.join(path, BUFFER_FILE)
        blob = open(f, "rb").read()
        for damage in ("truncated", "flipped", "missing"):
            if damage == "truncated":
                open(f, "wb").write(blob[: len(blob) // 2])
            elif damage == "flipped":
                raw = bytearray(blob)
                raw[-100] ^= 0x04
                open(f, "wb").write(bytes(raw))
            else:
                os.remove(f)
            with pytest.raises(StateError, match="replay buffer") as info:
                other.restore_from_path(path)
            assert "Fix" in str(info.value) or "damaged" in str(info.value)
            assert other.iteration == iters and len(other.local_replay_buffer) == size, damage
    finally:
        algo.stop()
        other.stop()


def test_restore_missing_buffer_is_an_explicit_choice(ray_session, tmp_path, caplog):
    import os

    from conduit_rllib.checkpointing import BUFFER_FILE
    algo = small_dqn().build_algo()
    try:
        algo.train()
        path = algo.save_to_path(str(tmp_path / "ckpt"))
        os.remove(os.path.join(path, BUFFER_FILE))
    finally:
        algo.stop()
    fresh = small_dqn(restore_missing_buffer=True).build_algo()
    try:
        with caplog.at_level("WARNING", logger="conduit_rllib"):
            fresh.restore_from_path(path)
        assert "empty buffer" in caplog.text and len(fresh.local_replay_buffer) == 0
    finally:
        fresh.stop()


def test_a_stateful_module_trains_on_sequence_slices(ray_session):
    """DQN with an LSTM asks the buffer for sequences (batch_length_T=max_seq_len, lookback=1);
    Conduit returns RLlib's slices, the module's state_out stored with them, and RLlib's
    stateful learner pipeline trains on them."""
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    cfg = workloads.dqn_cartpole(seed=1, capacity=5000)
    cfg.rl_module(model_config=DefaultModelConfig(use_lstm=True, max_seq_len=8, lstm_cell_size=16))
    cfg.training(replay_buffer_config={"type": "EpisodeReplayBuffer", "capacity": 5000}, n_step=1,
                 num_steps_sampled_before_learning_starts=100)
    cfg.reporting(min_sample_timesteps_per_iteration=200)
    algo = conduit_rllib.enable(cfg).build_algo()
    try:
        algo.train()
        r = algo.train()
        buf = algo.local_replay_buffer
        assert any(f.startswith("extra_model_outputs.state_out.") for f in buf.edp.buffer.spec.names)
        assert r["learners"]["default_policy"]["num_module_steps_trained"] > 0
        slices = buf.sample(num_items=32, batch_length_T=8, lookback=1, sample_episodes=True, n_step=1)
        assert all(1 <= len(e) <= 8 for e in slices) and "state_out" in slices[0].extra_model_outputs
    finally:
        algo.stop()


def test_the_mode_knob_carries_schedules_name_and_the_old_name_still_works():
    """One vocabulary (issue 14): the adapter's knob is Schedule's ``mode``; the old
    ``schedule=`` spelling is mapped onto it with a DeprecationWarning, never ignored."""
    from conduit_core import ConfigError
    from conduit_rllib.options import ConduitOptions
    assert ConduitOptions.from_kwargs({"mode": "overlapped"}).to_schedule().mode == "overlapped"
    with pytest.warns(DeprecationWarning, match="'schedule' is now 'mode'"):
        old = ConduitOptions.from_kwargs({"schedule": "auto"})
    assert old.mode == "auto"
    with pytest.raises(ConfigError, match="mode"):
        ConduitOptions.from_kwargs({"mode": "eventually"})
