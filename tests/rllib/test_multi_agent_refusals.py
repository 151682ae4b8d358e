"""Multi-agent DQN is not served by conduit_rllib's buffer (it stands in for RLlib's
single-agent episode buffers): a multi-agent DQN config is refused at ``enable()``, naming the
policies and what to run instead, and a MultiAgentEpisode reaching the buffer (``multi_agent()``
set after ``enable()``) is refused before anything is stored, instead of the raw
``AttributeError`` of the first ``train()``. No Ray session: configs and buffers, not algorithms."""

import pytest
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode

import conduit_rllib
from conduit_core import ConfigError
from conduit_rllib import workloads
from conduit_rllib.replay_buffer import ConduitEpisodeReplayBuffer

from .rllib_episodes import make_chunks


def test_a_multi_agent_dqn_config_is_refused_at_enable():
    cfg = workloads.dqn_cartpole(seed=0).multi_agent(policies={"p0", "p1"},
                                                     policy_mapping_fn=lambda aid, ep, **kw: f"p{aid}")
    with pytest.raises(ConfigError, match=r"multi_agent.*\['p0', 'p1'\].*MultiAgentEpisodeReplayBuffer"):
        conduit_rllib.enable(cfg)
    assert cfg.replay_buffer_config["type"] == "PrioritizedEpisodeReplayBuffer"   # nothing of the config changed


def test_a_multi_agent_episode_reaching_the_buffer_is_refused_untouched():
    buf = ConduitEpisodeReplayBuffer(capacity=1000, prioritized=True)
    try:
        chunks, _ = make_chunks(0, episodes=5)
        buf.add(chunks)
        before = buf.get_num_timesteps()
        with pytest.raises(ConfigError, match="MultiAgentEpisode"):
            buf.add([MultiAgentEpisode()])
        assert buf.get_num_timesteps() == before
    finally:
        buf.close()
