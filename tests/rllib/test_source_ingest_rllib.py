"""Ingestion at the source with RLlib's real env runners (issue 16): episodes written by
writers and committed by the driver give the same stored rows, ledger and samples as the
same episodes through ``add``; a retried add of written chunks changes nothing; a DQN
CartPole run with 2 remote env runners trains with every transition accounted for."""

import numpy as np
import pytest

import conduit_rllib
from conduit_core import ConfigError
from conduit_rllib import workloads
from conduit_rllib.replay_buffer import ConduitEpisodeReplayBuffer
from conduit_rllib.source_ingest import WrittenChunk, write_chunks


def sampled_rounds(rounds: int, steps: int) -> list:
    """Episode chunks from RLlib's own env runner (CartPole, random-ish policy), per sample call."""
    from ray.rllib.algorithms.dqn import DQNConfig
    algo = DQNConfig().environment("CartPole-v1").env_runners(num_env_runners=0).debugging(seed=5).build_algo()
    try:
        return [algo.env_runner.sample(num_timesteps=steps) for _ in range(rounds)]
    finally:
        algo.stop()


def state_without_ledger(buf) -> dict:
    s = buf.edp.buffer.state_dict()
    s.pop("ingest")
    return s


def assert_same_state(a, b) -> None:
    sa, sb = state_without_ledger(a), state_without_ledger(b)
    assert sa["counters"] == sb["counters"] and sa["open_tail"] == sb["open_tail"]
    for part in ("data", "meta"):
        for k in sa[part]:
            np.testing.assert_array_equal(sa[part][k], sb[part][k], err_msg=f"{part}.{k}")
    np.testing.assert_array_equal(np.asarray(sa["selector_state"].get("tree", [])),
                                  np.asarray(sb["selector_state"].get("tree", [])))
    la, lb = a.get_state(), b.get_state()
    for k in ("sources", "next_source", "added", "source_ids", "ledger"):
        assert la[k] == lb[k], k


@pytest.mark.parametrize("prioritized", [True, False])
def test_written_chunks_store_and_sample_as_the_driver_path(ray_session, prioritized):
    rounds = sampled_rounds(8, 37)      # 296 steps into 60 (ring 75): RLlib's eviction runs many times
    kw = dict(capacity=60, prioritized=prioritized, seed=3)
    a = ConduitEpisodeReplayBuffer(**kw)
    b = ConduitEpisodeReplayBuffer(**kw, conduit={"source_ingest": True})
    try:
        a.add(rounds[0])
        b.add(rounds[0])                # the first add builds the buffer (its spec from the data)
        writer = b.edp.buffer.writer(source=1)
        for eps in rounds[1:]:
            a.add(eps)
            chunks = write_chunks(writer, eps, store_infos=True)
            assert all(isinstance(c, WrittenChunk) for c in chunks)
            b.add(chunks)
            assert_same_state(a, b)
            b.add(chunks)               # a retried add: every receipt taken before, nothing changes
            assert_same_state(a, b)
        assert a.get_num_episodes_evicted() > 0 and a.eviction_report() == b.eviction_report()
        assert b.ingest.duplicates == sum(len([e for e in r if len(e)]) for r in rounds[1:])
        ledger = b.edp.buffer.ingest_ledger
        assert len(ledger.taken) > 0 and ledger.never_accepted == 0   # (declined: chunks RLlib's eviction drops)
        for n_step in (1, 3, (2, 5)):   # n-step windows follow episodes across chunks
            sa = a.sample(num_items=16, sample_episodes=True, n_step=n_step, gamma=0.9)[0].batch
            sb = b.sample(num_items=16, sample_episodes=True, n_step=n_step, gamma=0.9)[0].batch
            assert sa.seqs.tolist() == sb.seqs.tolist()
            for k in sa.keys():
                np.testing.assert_array_equal(np.asarray(sa[k]), np.asarray(sb[k]), err_msg=k)
    finally:
        a.close()
        b.close()


def test_source_ingest_needs_remote_env_runners():
    with pytest.raises(ConfigError, match="num_env_runners"):
        conduit_rllib.enable(workloads.dqn_cartpole(num_env_runners=0), source_ingest=True)
    with pytest.raises(ConfigError, match="source_ingest"):
        conduit_rllib.enable(workloads.dqn_cartpole(num_env_runners=2), source_ingest=True, mode="overlapped")


def _two_runner_source_ingest_dqn():
    """DQN on CartPole, two env runners writing at the source, learning from step 100."""
    cfg = workloads.dqn_cartpole(seed=1, num_env_runners=2, capacity=5000)
    cfg.reporting(min_sample_timesteps_per_iteration=300)
    cfg.training(num_steps_sampled_before_learning_starts=100)
    return conduit_rllib.enable(cfg, source_ingest=True).build_algo()


def test_dqn_cartpole_with_two_env_runners_writing_at_the_source(ray_session):
    from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME
    algo = _two_runner_source_ingest_dqn()
    try:
        for _ in range(3):
            res = algo.train()
        buf = algo.local_replay_buffer
        core = buf.edp.buffer
        sampled = res[ENV_RUNNER_RESULTS][NUM_ENV_STEPS_SAMPLED_LIFETIME]
        assert len(algo.conduit_writers) == 2 and len(core.ingest_ledger.taken) > 0 and core.ingest_ledger.declined == 0
        # every transition sampled is stored once: the first step's through the driver, the rest committed
        assert buf.get_added_timesteps() == sampled == core.ring.inserted == len(buf)
        assert core.ingest_ledger.duplicates == 0 and core.ingest_ledger.never_accepted == 0
        assert buf.ingest.lost_rows == 0 and buf.ingest.duplicates == 0
        stats = [p.actor.staging_stats.remote() for p in core.storage.parts]
        import ray
        assert all(s["rollouts"] == 0 for s in ray.get(stats))   # nothing left staged
        assert res["learners"]["default_policy"]["num_module_steps_trained"] > 0
        assert buf.get_num_episodes() == len(buf.ledger.episodes) > 0
    finally:
        algo.stop()


def test_a_dropped_sample_is_abandoned_and_runners_whose_shard_is_lost_get_writers_again(ray_session):
    """One DQN run (an algorithm costs ~25 s to build and train here), two faults in turn.
    1. A runner's ``sample()`` whose result the driver never gets (RLlib drops one that outlives
       ``sample_timeout_s``): its receipts are abandoned at the runner's next result, their staged
       rows released (they stayed in the shard's actor for good).
    2. The shard's actor dies (found by a review, session 23): writers stayed bound to it (each
       runner's sample() then failed, the buffer emptied, the run failed after 60 s), and a runner
       without a writer was never handed one while the runner count stayed the same."""
    import time

    import ray
    algo = _two_runner_source_ingest_dqn()
    try:
        for _ in range(2):
            algo.train()
        buf = algo.local_replay_buffer
        core = buf.edp.buffer
        dropped = algo.env_runner_group.foreach_env_runner(lambda w: len(w.sample()), local_env_runner=False)
        assert min(dropped) > 0 and core.ingest_ledger.abandoned == 0   # written, staged, never returned
        algo.train()
        assert core.ingest_ledger.abandoned == sum(dropped) and not core.ingest_ledger.taken.above
        time.sleep(0.5)
        assert all(s["rollouts"] == 0 for s in ray.get([p.actor.staging_stats.remote() for p in core.storage.parts]))

        before, taken = dict(algo.conduit_writers), len(core.ingest_ledger.taken)
        (remote,) = [p for p in core.storage.parts if getattr(p, "actor", None) is not None]
        ray.kill(remote.actor)
        res = algo.train()                       # the runners' writes fail: their episodes go to the driver
        assert buf.unwritten_adds >= 1 and core.losses
        algo.train()
        assert set(algo.conduit_writers.values()).isdisjoint(before.values())   # new writers, new shard
        assert len(core.ingest_ledger.taken) > taken                          # written at the source again
        assert res["learners"]["default_policy"]["num_module_steps_trained"] > 0
    finally:
        algo.stop()


def test_source_ingest_is_refused_for_ppo_not_ignored():
    """Env runners write at the source for the replay algorithms only: PPO must say so, not accept and ignore it."""
    from ray.rllib.algorithms.ppo import PPOConfig

    import conduit_rllib
    from conduit_core import ConfigError
    config = PPOConfig().environment("CartPole-v1").env_runners(num_env_runners=1)
    with pytest.raises(ConfigError, match="source_ingest.*DQN, SAC and TQC only"):
        conduit_rllib.enable(config, source_ingest=True)
