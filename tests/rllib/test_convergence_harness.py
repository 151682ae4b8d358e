"""The convergence harness's native arm: RLlib's own replay buffer seeded from the run's seed
(RLlib 2.60 draws it from an unseeded generator), so a CI run's native curves repeat."""

import types

import numpy as np


def test_rllib_replay_buffers_get_the_runs_seed_and_conduits_is_left_alone():
    from ray.rllib.utils.replay_buffers.episode_replay_buffer import EpisodeReplayBuffer
    from ray.rllib.utils.replay_buffers.prioritized_episode_buffer import PrioritizedEpisodeReplayBuffer

    from conduit_rllib.conformance import _seed_rllib_replay
    from conduit_rllib.replay_buffer import ConduitEpisodeReplayBuffer

    for cls in (EpisodeReplayBuffer, PrioritizedEpisodeReplayBuffer):
        draws = []
        for _ in range(2):
            algo = types.SimpleNamespace(local_replay_buffer=cls(capacity=100))
            _seed_rllib_replay(algo, 7)
            draws.append(algo.local_replay_buffer.rng.random(4))
        assert np.array_equal(draws[0], draws[1]), cls.__name__
        assert np.array_equal(draws[0], np.random.default_rng(7).random(4))
    conduit = ConduitEpisodeReplayBuffer(capacity=100)
    before = dict(vars(conduit))
    _seed_rllib_replay(types.SimpleNamespace(local_replay_buffer=conduit), 7)
    assert vars(conduit).keys() == before.keys() and all(vars(conduit)[k] is v for k, v in before.items())
    _seed_rllib_replay(types.SimpleNamespace(), 7)                       # no buffer (PPO): nothing to do
    unseeded = types.SimpleNamespace(local_replay_buffer=EpisodeReplayBuffer(capacity=10))
    rng = unseeded.local_replay_buffer.rng
    _seed_rllib_replay(unseeded, None)                                   # no seed given: left as RLlib made it
    assert unseeded.local_replay_buffer.rng is rng
