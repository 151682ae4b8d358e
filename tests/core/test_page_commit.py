"""A lazily mapped ring's pages committed ahead of its writer (``page_commit``): the range
decision, contents untouched while the writer writes, failures reaching the insert before it
changes anything, and no thread left after close."""

import errno
import threading

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit_core import CapacityError, page_commit
from conduit_core.framestack import FramePool
from conduit_core.page_commit import CommitAhead, next_commit_range
from conduit_core.tiers import lazy_huge_map


def commit_threads() -> list:
    return [t for t in threading.enumerate() if t.name.startswith("conduit-commit-")]


@settings(max_examples=300, deadline=None)
@given(total=st.integers(0, 10_000), requested=st.integers(0, 10_000), written=st.integers(0, 10_000),
       ahead=st.integers(2, 3_000))
def test_next_range_follows_the_writer_and_stays_inside(total, requested, written, ahead):
    """The next range starts where the last request ended, ends at most ``ahead`` past the
    writer and never past the end, and is only asked for once the writer is within half the
    window of what was requested."""
    rng = next_commit_range(written, requested, total, ahead=ahead)
    if requested >= total or written + ahead // 2 < requested:
        assert rng is None
        return
    start, stop = rng
    assert start == requested and start < stop <= total
    assert stop == min(total, max(written, requested) + ahead)


def test_a_writer_filling_the_mapping_keeps_its_bytes_and_pages_get_committed_ahead():
    """The writer writes 64 KB at a time while ranges ahead are committed in parallel (it
    waits for the committer every 1 MB, as a training step's few frames would): every byte it
    wrote reads back, the committed frontier ran ahead of it to the end, and close joins."""
    total = 12 << 20
    mm = lazy_huge_map(total)
    view = np.frombuffer(mm, dtype=np.uint8)
    ahead = CommitAhead(mm, total, name="test", ahead=2 << 20, chunk=512 << 10)
    assert ahead.supported   # Linux >= 5.14 here (the CI machine too)
    step = 64 << 10
    rng = np.random.default_rng(0)
    pattern = rng.integers(1, 256, step, dtype=np.uint8)
    furthest_ahead = 0
    for lo in range(0, total, step):
        view[lo:lo + step] = pattern
        ahead.note_written(lo + step)
        if (lo + step) % (1 << 20) == 0:
            ahead.wait()
        furthest_ahead = max(furthest_ahead, ahead.committed - (lo + step))
    ahead.close()
    assert not commit_threads()
    assert (view.reshape(-1, step) == pattern).all()
    assert ahead.committed == total and furthest_ahead > 0
    del view
    mm.close()


@pytest.mark.parametrize("err, supported", [(errno.ENOMEM, True), (errno.EINVAL, False)])
def test_a_failed_commit_reaches_the_next_insert_once_and_changes_nothing(err, supported, monkeypatch):
    """A populate the machine refuses (ENOMEM) is raised by the next plan, before the pool
    changes, naming the pool and the fix; the one after goes on. A kernel without the advice
    (EINVAL) just stops committing ahead: pages fault on write as before, nothing is raised."""
    calls = []

    def refuse(mapping, offset, length):
        calls.append((offset, length))
        return err

    monkeypatch.setattr(page_commit, "_c_populate_write", refuse)
    pool = FramePool(name="obs", frames=1_000, frame_shape=(84, 84), dtype=torch.uint8, k=4)   # 7 MB: lazily mapped
    try:
        assert pool.commit_ahead is not None
        pool.commit_ahead.wait()    # (the first range's thread)
        assert calls and pool.commit_ahead.supported is supported
        stacks = np.random.default_rng(1).integers(0, 256, (2, 4, 84, 84), dtype=np.uint8)
        if supported:
            with pytest.raises(CapacityError, match=r"frame pool 'obs'.*could not commit memory.*Fix"):
                pool.plan(stacks)
            assert (pool.cursor, pool.last_id) == (0, -1)
        last, sel, count = pool.plan(stacks)
        pool.write(stacks, sel, count, last)
        assert pool.cursor == count == 8
        assert np.array_equal(pool.gather(last), stacks)
    finally:
        pool.close()
    assert not commit_threads()


def test_an_atari_sized_pool_commits_ahead_of_its_frames_and_joins_on_close():
    """A frame pool of 2,000 Qbert frames (14 MB, a lazy mapping) written a step at a time:
    the pages ahead of the cursor are committed by then, the frames read back, close joins."""
    pool = FramePool(name="obs", frames=2_000, frame_shape=(84, 84), dtype=torch.uint8, k=4)
    try:
        rng = np.random.default_rng(2)
        frames = rng.integers(0, 256, (400, 84, 84), dtype=np.uint8)
        for t in range(0, 396, 4):
            stacks = np.stack([frames[t + i:t + i + 4] for i in range(4)])
            last, sel, count = pool.plan(stacks)
            pool.write(stacks, sel, count, last)
        ahead = pool.commit_ahead
        ahead.wait()
        assert ahead.committed >= pool.cursor * pool.frame_bytes
        assert np.array_equal(pool.gather(np.array([pool.last_id])), frames[None, pool.last_id - 3:pool.last_id + 1])
    finally:
        pool.close()
    assert not commit_threads()
