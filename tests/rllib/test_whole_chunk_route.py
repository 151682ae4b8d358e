"""An env step's add (one episode chunk, or two where an episode ended) takes a shorter route
where every chunk stays whole (``EpisodeIngest._add_whole``): the same ledger, sources, stored
rows, infos and priorities as the general route, through evictions, episodes cut by the ring
and chunks of evicted episodes, checked add by add against the general route alone."""

import numpy as np
import pytest

from conduit_rllib.episode_ingest import EpisodeIngest
from conduit_rllib.replay_buffer import ConduitEpisodeReplayBuffer

from ..core.helpers import assert_same_state
from .rllib_episodes import make_chunks


def _buffer(capacity):
    return ConduitEpisodeReplayBuffer(capacity=capacity, prioritized=True, alpha=0.6, beta=0.4,
                                      conduit={"seed": 3, "store_infos": True})


@pytest.mark.parametrize("seed, capacity", [(0, 30), (1, 45), (2, 16), (3, 200)])
def test_an_env_steps_chunks_are_stored_as_the_general_route_stores_them(seed, capacity, monkeypatch):
    chunks, _ = make_chunks(seed, episodes=40, with_extras=True)
    calls = []
    rng = np.random.default_rng(seed)
    i = 0
    while i < len(chunks):   # mostly lone chunks, now and then two in one add()
        k = 2 if rng.random() < 0.2 else 1
        calls.append(chunks[i:i + k])
        i += k
    short, general = _buffer(capacity), _buffer(capacity)
    taken = []
    real = EpisodeIngest._add_whole

    def spy(self, *args):
        done = real(self, *args)
        taken.append(done)
        return done

    evicted = 0
    try:
        for call in calls:
            monkeypatch.setattr(EpisodeIngest, "_add_whole", spy)
            short.add(list(call))
            monkeypatch.setattr(EpisodeIngest, "_add_whole", lambda self, chunks: False)
            general.add(list(call))
            assert_same_state(short.get_state(), general.get_state())
        monkeypatch.undo()
        evicted = short.ledger.evicted_episodes
        a = short.sample(16, n_step=(1, 3), include_infos=True)
        b = general.sample(16, n_step=(1, 3), include_infos=True)
        assert [e.get_observations(0).tolist() for e in a] == [e.get_observations(0).tolist() for e in b]
        assert [e.get_infos(0) for e in a] == [e.get_infos(0) for e in b]
    finally:
        short.close()
        general.close()
    assert any(taken) and (capacity > 100 or evicted > 0)   # (evictions happened)
    if capacity == 16:
        assert not all(taken)   # ... and handed some chunks to the general route
