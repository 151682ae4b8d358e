"""A chunk that does not start where its episode's stored steps end (RLlib dropped the ``sample()``
in between, after ``sample_timeout_s``) starts a new part: no n-step window runs across the
missing steps (found by a review, session 24: the windows bridged the gap, returns summed over
steps that were never stored; RLlib's own buffer fails there, ``concat_episode`` asserts)."""

import numpy as np
import pytest

from conduit_rllib.replay_buffer import ConduitEpisodeReplayBuffer

from .rllib_episodes import rows_from_conduit


def chunk(t0: int, t1: int, *, last: bool = False):
    import gymnasium as gym
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode
    ep = SingleAgentEpisode(id_="ep0", observations=[np.array([0, t], np.float32) for t in range(t0, t1 + 1)],
                            actions=[0] * (t1 - t0), rewards=[1.0] * (t1 - t0), terminated=last,
                            observation_space=gym.spaces.Box(-1e9, 1e9, (2,), np.float32),
                            action_space=gym.spaces.Discrete(2), t_started=t0, len_lookback_buffer=0)
    ep.to_numpy()
    return ep


@pytest.mark.parametrize("prioritized", [False, True])
def test_a_chunk_after_a_dropped_sample_starts_a_new_part(prioritized):
    buf = ConduitEpisodeReplayBuffer(capacity=100, prioritized=prioritized, alpha=0.6)
    try:
        buf.add([chunk(0, 4)])
        buf.add([chunk(8, 12, last=True)])       # steps 4..8 never arrived
        buf.add([chunk(12, 12)])                 # (an empty chunk changes nothing)
        rows = rows_from_conduit(buf.sample(num_items=2000, n_step=3, beta=0.4, gamma=1.0, sample_episodes=True))
        first = rows.t < 4
        assert first.any() and (~first).any()
        assert (rows.next_t[first] <= 4).all() and (rows.next_t[~first] <= 12).all() and (rows.t[~first] >= 8).all()
        assert np.allclose(rows.ret, rows.next_t - rows.t)   # one reward per step the window covers
        assert buf.get_num_episodes() == 2                    # two parts, as RLlib counts episodes
    finally:
        buf.close()


def test_chunks_that_meet_continue_one_episode_within_and_across_adds():
    buf = ConduitEpisodeReplayBuffer(capacity=100)
    try:
        buf.add([chunk(0, 3)])
        buf.add([chunk(3, 6), ])
        buf.add([chunk(6, 9, last=True)])
        assert buf.get_num_episodes() == 1
        rows = rows_from_conduit(buf.sample(num_items=500, n_step=3, gamma=1.0, sample_episodes=True))
        assert (rows.next_t - rows.t == 3)[rows.t <= 6].all()   # windows run across the chunks' seams
    finally:
        buf.close()


@pytest.fixture(scope="module")
def ray_session():
    """One Ray session for the module, with two node resources: two remote shards on this node."""
    import ray

    from conduit_core.remote.ray_local import init_local
    init_local(num_cpus=2, resources={"gap_a": 1, "gap_b": 1}, object_store_memory=128 << 20, log_to_driver=False,
               configure_logging=False)
    yield
    ray.shutdown()


def test_a_chunk_after_a_lost_chunk_in_the_same_add_starts_a_new_part(ray_session):
    """Env runners writing at the source: chunk A of an episode was staged in a shard actor that
    died, chunk B of the same episode (staged in the other shard) comes in the same ``add()``.
    B was recorded in the episode's ledger entry, after the steps before A: the stored episode
    ran across the missing steps (a review, session 24). Now B starts a new part, and the
    episode's next chunk continues B."""
    import ray

    from conduit_rllib.source_ingest import write_chunks

    def warm(t0, t1):   # the first add goes through the driver (it builds the spec)
        ep = chunk(t0, t1)
        ep.id_ = "warm"
        return ep

    buf = ConduitEpisodeReplayBuffer(capacity=100, conduit={"source_ingest": True, "source_nodes": ("gap_a", "gap_b")})
    try:
        buf.add([warm(0, 3)])
        core = buf.edp.buffer
        a_writer, b_writer = (core.writer(source=1, shard=k) for k in (0, 1))
        buf.add(write_chunks(a_writer, [chunk(0, 4)], store_infos=False))   # steps 0..4: seqs 3..6, shard 0
        lost = write_chunks(b_writer, [chunk(4, 8)], store_infos=False)
        ray.kill(core.storage.parts[1].actor)                                # A's staged rows die with it
        buf.add(lost + write_chunks(a_writer, [chunk(8, 12)], store_infos=False))
        assert buf.ingest.lost_rows == 4 and not core.losses                  # nothing stored was lost
        buf.add(write_chunks(a_writer, [chunk(12, 15, last=True)], store_infos=False))
        parts = [(rec.t_started, rec.rows) for rec in buf.ledger.episodes.values() if rec.id_ == "ep0"]
        assert parts == [(0, 4), (8, 7)]            # before the gap; B and the chunk after it, one part
        assert buf.get_num_episodes() == 3
        rows = rows_from_conduit(buf.sample(num_items=2000, n_step=3, gamma=1.0, sample_episodes=True))
        ep0 = rows.next_t > 3   # (warm's steps are 0..3)
        assert np.allclose(rows.ret, rows.next_t - rows.t)
        assert (rows.next_t[ep0 & (rows.t < 4)] <= 4).all() and (rows.t[rows.next_t > 4] >= 8).all()
        assert ((rows.next_t - rows.t)[rows.t >= 8] == np.minimum(3, 15 - rows.t[rows.t >= 8])).all()
    finally:
        buf.close()


def test_steps_on_a_lost_shard_leave_the_ledger_and_reads_draw_again(ray_session):
    """After a shard is lost, the ledger still listed its rows: RLlib's sample forms that read
    stored rows by seq (the ``[B, T]`` batch form, sequences) failed on them (``ShardLost``, then
    a seq not stored), and the buffer counted steps it no longer held until their episodes were
    evicted (a review, session 24). Now the lost steps leave the ledger (what is left of an episode
    splits into parts at the gaps), and a read that finds the loss draws again from what is left."""
    import ray

    def ep(id_, t0, t1, last=False):
        e = chunk(t0, t1, last=last)
        e.id_ = id_
        return e

    buf = ConduitEpisodeReplayBuffer(capacity=100, batch_length_T=2,
                                     conduit={"source_ingest": True, "source_nodes": ("gap_a", "gap_b")})
    try:
        buf.add([ep("x", 0, 10, last=True)])
        buf.add([ep("y", 0, 70)])               # seqs 10..79: into the second shard; y still runs
        core = buf.edp.buffer
        cut = int(core.storage.bounds[1])
        assert cut < 80 and len(buf) == 80
        ray.kill(core.storage.parts[1].actor)
        out = buf.sample(num_items=64)          # the batch form: reads by seq, finds the loss, draws again
        (loss,) = core.losses
        assert loss.seq_runs == ((cut, 79),)
        parts = [(rec.id_, rec.t_started, rec.rows) for rec in buf.ledger.episodes.values()]
        assert parts == [("x", 0, 10), ("y", 0, cut - 10)]
        assert buf.ledger.lost_rows == 80 - cut and buf.ledger.evicted_episodes == 0
        assert buf.ledger.rows == len(buf) == cut
        t = out["obs"][..., 1]
        assert t.shape == (64, 2) and (t[:, 1] - t[:, 0] == 1).all() and (t <= cut - 10).all()
        buf.add([ep("y", 70, 75, last=True)])   # y's next chunk: a new part (its steps before were lost)
        assert [(rec.id_, rec.t_started, rec.rows) for rec in buf.ledger.episodes.values()][-1] == ("y", 70, 5)
        assert buf.get_metrics()["num_episodes_evicted_lifetime"].peek() == 0
    finally:
        buf.close()
