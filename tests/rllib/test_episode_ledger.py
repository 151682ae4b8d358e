"""The ledger's eviction decision (``EpisodeLedger.plan``) against RLlib's rule written out
with sets, as ``PrioritizedEpisodeReplayBuffer.add`` applies it: evict the oldest stored
episodes, whole, while the steps exceed capacity and more than one episode (stored or
arriving) is left; a new chunk of an evicted episode is dropped. ``plan`` skips the pass
over the stored episodes when nothing has to leave; the decisions must be the same."""

from hypothesis import given, settings
from hypothesis import strategies as st

from conduit_rllib.episode_ledger import EpisodeLedger


def reference_plan(episodes: dict[int, int], new: list[tuple[int, int]], capacity: int):
    total = sum(episodes.values()) + sum(n for _, n in new)
    new_sources = [s for s, _ in new]
    remaining = set(episodes) | set(new_sources)
    evict = []
    for src, rows in episodes.items():
        if total <= capacity or len(remaining) == 1:
            break
        evict.append(src)
        remaining.discard(src)
        total -= rows + sum(n for s, n in new if s == src)
    return evict, set(evict) & set(new_sources)


@settings(max_examples=300, deadline=None)
@given(stored=st.lists(st.integers(1, 50), max_size=12),
       new=st.lists(st.tuples(st.integers(0, 20), st.integers(1, 50)), max_size=6),
       capacity=st.integers(1, 300))
def test_plan_is_rllibs_rule(stored, new, capacity):
    ledger = EpisodeLedger()
    seq = 0
    for src, rows in enumerate(stored):       # sources 0..len(stored)-1, oldest first
        ledger.record(src, seq, rows, id_=f"ep{src}", t_started=0)
        seq += rows
    episodes = {src: rows for src, rows in enumerate(stored)}
    assert ledger.plan(new, capacity) == reference_plan(episodes, new, capacity)
