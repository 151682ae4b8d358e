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
