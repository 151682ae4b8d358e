"""ExperienceBuffer.evict: rows removed before the ring overwrites them (a framework's own
eviction rule on top of the ring's) are never delivered again, the size stays true, and the
removal survives the ring, a state round trip and a migration."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit_core import ExperienceBuffer, Prioritized, Uniform

from ..helpers import SPEC, rollout


def filled(selector, capacity=100, rows=80, seed=0):
    buf = ExperienceBuffer(spec=SPEC, capacity=capacity, selector=selector, seed=seed)
    for i in range(0, rows, 10):
        buf.add(rollout(10, i, done_at=9), source=i)
    return buf


def delivered_ids(buf, draws=4000, **kw):
    return buf.sample(draws, **kw)["obs"][:, 0].numpy().astype(int)


@pytest.mark.parametrize("selector", [Uniform, Prioritized])
@pytest.mark.parametrize("n_step", [None, 1, (2, 5)])
def test_evicted_rows_are_never_delivered_and_the_rest_stay_uniform(selector, n_step):
    buf = filled(selector())
    assert buf.evict(np.arange(20, 40)) == 20 and len(buf) == 60
    assert buf.evict(np.arange(25, 45)) == 5 and len(buf) == 55          # already gone: skipped
    kw = {} if n_step is None else {"n_step": n_step, "gamma": 0.9}
    for end in (("shorten", "redraw") if n_step is not None else ("shorten",)):
        ids = delivered_ids(buf, episode_end=end, **kw)
        assert not np.isin(ids, np.arange(20, 45)).any()
        counts = np.bincount(ids, minlength=80)
        kept = np.setdiff1d(np.arange(80), np.arange(20, 45))
        if n_step is None:
            assert counts[kept].min() > 0.5 * counts[kept].mean()


def test_the_ring_reuses_removed_slots_and_the_count_stays_true():
    buf = filled(Uniform(), capacity=100, rows=100)
    buf.evict(np.arange(0, 30))
    assert len(buf) == 70
    buf.add(rollout(20, 100, done_at=19), source=100)       # overwrites seqs 0..19: all removed already
    assert len(buf) == 90
    buf.add(rollout(20, 120, done_at=19), source=120)       # 20..29 removed, 30..39 live: overwritten
    assert len(buf) == 100
    assert set(delivered_ids(buf)) <= set(range(40, 140))


def test_a_window_never_runs_into_a_removed_row():
    buf = filled(Uniform(), rows=20)
    buf.evict([5])                                           # a hole in the middle of episode 0..9
    b = buf.sample(2000, n_step=3, gamma=1.0)
    ids = b["obs"][:, 0].numpy().astype(int)
    last = b["next_obs"][:, 0].numpy().astype(int) - 1
    assert not ((ids < 5) & (last >= 5)).any()


def test_removal_survives_a_state_round_trip():
    a = filled(Prioritized())
    a.evict(np.arange(10, 30))
    b = ExperienceBuffer(spec=SPEC, capacity=100, selector=Prioritized())
    b.load_state_dict(a.state_dict())
    assert len(b) == 60 and not np.isin(delivered_ids(b), np.arange(10, 30)).any()


def test_removal_during_and_after_a_migration():
    from conduit_core.buffer.migration import begin_migration
    from conduit_core.storage.columnar import ShardSpec
    buf = filled(Prioritized(), capacity=100, rows=80)
    buf.evict(np.arange(0, 10))
    mig = begin_migration(buf, shards=[ShardSpec("pageable", 200)], capacity=200, chunk_bytes=512)
    mig.step()                                              # some rows copied
    buf.evict(np.arange(10, 20))                            # copied ones and not-yet-copied ones
    buf.evict(np.arange(70, 75))
    mig.finish()
    assert len(buf) == 55
    assert not np.isin(delivered_ids(buf), np.r_[0:20, 70:75]).any()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 30), st.lists(st.integers(0, 400), max_size=12)), min_size=1,
                max_size=25),
       st.sampled_from([Uniform, Prioritized]))
def test_size_is_always_the_rows_that_can_be_delivered(ops, selector):
    """Property: after any interleaving of inserts and removals, len() equals the rows that
    are stored and not removed, and sampling returns only those."""
    cap = 64
    buf = ExperienceBuffer(spec=SPEC, capacity=cap, selector=selector(), seed=1)
    removed: set[int] = set()
    nxt = 0
    for n, kill in ops:
        buf.add(rollout(n, nxt), source=nxt)
        nxt += n
        removed |= {k for k in kill if k < nxt}
        buf.evict(np.array(kill, dtype=np.int64))
        in_ring = set(range(max(0, nxt - cap), nxt))
        alive = in_ring - removed
        assert len(buf) == len(alive)
        if alive:
            ids = set(delivered_ids(buf, draws=256).tolist())
            assert ids <= alive


def test_a_load_while_a_migration_copies_the_buffer_is_refused_and_changes_nothing():
    """Found in review: the load wrote the old layout while the migration kept its copy of the
    rows from before it, and finish() brought those back under the restored seqs."""
    from conduit_core import ConfigError, ShardSpec
    from conduit_core.buffer.migration import begin_migration
    saved = ExperienceBuffer(spec=SPEC, capacity=8)
    saved.add(rollout(3, start=500))
    state = saved.state_dict()
    buf = ExperienceBuffer(spec=SPEC, capacity=8)
    buf.add(rollout(6))
    before = buf.state_dict()
    mig = begin_migration(buf, shards=[ShardSpec("pageable", 8)], capacity=8, chunk_bytes=1)
    mig.step()
    with pytest.raises(ConfigError, match="migration.*wait for the migration to finish"):
        buf.load_state_dict(state)
    mig.finish()
    after = buf.state_dict()
    assert np.array_equal(after["data"]["obs"], before["data"]["obs"]) and after["counters"] == before["counters"]
    buf.load_state_dict(state)   # once it is done, the load goes ahead
    assert len(buf) == 3 and buf.read(np.arange(3))["obs"][:, 0].tolist() == [500.0, 501.0, 502.0]
    buf.close()
    saved.close()
