"""Removed rows (evict, early eviction by a full frame pool) are counted right, and a failed insert or a background group failing part way changes nothing it should not.
Each test failed before its fix."""

import numpy as np

import pytest

from conduit_core import (ExperienceBuffer, ExperienceDataPlane, RateLimiter, Schedule, Uniform, WorkerError)


from ..helpers import SPEC, rollout

from ..schema.test_framestack import episode, make

def true_size(buf):
    slots = np.arange(buf.capacity)
    return int(buf.ring.live(slots, buf.meta["seq"][slots]).sum())  # the invariant under test


def test_removed_rows_are_counted_right_when_the_frame_pool_and_the_ring_evict_together():
    buf = make(40, budget=1.0, selector=Uniform())
    rng = np.random.default_rng(0)
    gid = 0
    for step in range(300):
        t = 8 if (step // 5) % 2 == 0 else 1
        st = episode(t, rng)
        term = np.zeros(t, bool)
        term[-1] = True
        buf.add({"obs": st[:t], "next_obs": st[1:], "action": np.arange(gid, gid + t),
                 "reward": np.zeros(t, np.float32), "terminated": term, "truncated": np.zeros(t, bool)})
        gid += t
        lo = buf.inserted - len(buf)
        buf.evict([lo + 1, lo + 2])
        assert len(buf) == true_size(buf), step


def test_a_failed_insert_leaves_the_removed_row_count_as_it_was():
    buf = ExperienceBuffer(spec=SPEC, capacity=10, selector=Uniform(), seed=1)
    buf.add(rollout(10, 0))
    buf.evict([0])
    write = buf.storage.write
    buf.storage.write = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("device write failed"))
    with pytest.raises(RuntimeError):
        buf.add(rollout(1, 100))
    buf.storage.write = write
    assert len(buf) == 9
    assert (buf.sample(300).seqs != -1).all()


@pytest.mark.parametrize("limiter, error", [
    # a rate ratio is kept per rollout: the group goes in one by one
    (RateLimiter(samples_per_insert=1.0, min_size=1, tolerance=1e9), TimeoutError),
    # nothing to wait for: the group is one insert, and its copy fails on the 2nd rollout
    (None, MemoryError)], ids=["one-by-one", "one-insert"])
def test_a_background_group_failing_part_way_keeps_what_it_stored(limiter, error):
    """The 2nd of three rollouts fails: the 1st stays stored, only the 2nd and 3rd are reported."""
    buf = ExperienceBuffer(spec=SPEC, capacity=1000, selector=Uniform(), seed=1, rate_limiter=limiter)
    write, calls = buf.storage.write, [0]

    def flaky(*a, **k):
        calls[0] += 1
        if calls[0] == 2:
            raise error("a failure in the 2nd rollout of the group")
        return write(*a, **k)
    buf.storage.write = flaky
    edp = ExperienceDataPlane(buffer=buf, schedule=Schedule.overlapped(ingest_granularity=3))
    with edp._cond:  # noqa: SLF001 - holds the worker so the three rollouts form one group
        for s in (0, 10, 20):
            edp.ingest(rollout(5, s))
    with pytest.raises(WorkerError) as info:
        edp.flush(timeout=30)
    assert info.value.rejected_tickets == [1, 2]
    assert len(buf) == 5 and buf.ring.inserted == 5
    assert sorted(int(x) for x in buf.state_dict()["data"]["obs"][:, 0]) == list(range(5))
    edp.close()
