"""An add the buffer cannot serve is refused before anything changes: a chunk longer than the
ring does not evict the stored episodes first (it left the buffer empty and the next sample
waiting 60 s), and the message says what RLlib does instead; an extra model output keyed by a
non-str is named, not a raw TypeError. No Ray session: buffers are built directly."""

import gymnasium as gym
import numpy as np
import pytest

from conduit_core import CapacityError, SpecError
from conduit_rllib.replay_buffer import ConduitEpisodeReplayBuffer

from .rllib_episodes import make_chunks


def long_chunk(n: int, *, extras=None):
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode
    ep = SingleAgentEpisode(id_="long", observations=[np.array([99, t], np.float32) for t in range(n + 1)],
                            actions=[0] * n, rewards=[1.0] * n, terminated=True,
                            observation_space=gym.spaces.Box(-1e9, 1e9, (2,), np.float32),
                            action_space=gym.spaces.Discrete(2), len_lookback_buffer=0,
                            **({"extra_model_outputs": extras} if extras else {}))
    ep.to_numpy()
    return ep


@pytest.mark.parametrize("prioritized", [False, True])
def test_a_chunk_longer_than_the_ring_is_refused_before_anything_is_evicted(prioritized):
    buf = ConduitEpisodeReplayBuffer(capacity=100, prioritized=prioritized, alpha=0.6, seed=0)
    for chunk in make_chunks(1, episodes=10, lengths=(4, 9), open_last=0)[0]:
        buf.add([chunk])
    held, episodes, evicted = len(buf), buf.get_num_episodes(), buf.get_num_episodes_evicted()
    with pytest.raises(CapacityError, match="RLlib's buffer would hold") as exc:
        buf.add([long_chunk(200)])              # ring = 125 slots
    assert "Nothing was stored or evicted" in str(exc.value)
    assert len(buf) == held and buf.get_num_episodes() == episodes
    assert buf.get_num_episodes_evicted() == evicted
    batch = buf.sample(num_items=8, n_step=1, sample_episodes=True)  # serves at once what it held
    assert batch is not None
    buf.add([long_chunk(110)])                   # over capacity, within the ring: held, as RLlib holds it
    buf.close()


def test_an_extra_model_output_with_a_non_str_key_is_named():
    buf = ConduitEpisodeReplayBuffer(capacity=100, seed=0)
    buf.add([make_chunks(1, episodes=1, lengths=(4, 5), open_last=0)[0][0]])
    held = len(buf)
    with pytest.raises(SpecError, match=r"extra_model_outputs\[0\].*str key"):
        buf.add([long_chunk(5, extras={0: [np.float32(0.5)] * 5})])
    assert len(buf) == held
    buf.close()
