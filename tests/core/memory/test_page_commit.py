"""A lazily mapped ring's pages committed ahead of its writer (``page_commit``): the range
decision, contents untouched by a populate, the window following the writer through a frame
pool's writes, ENOMEM reaching the insert before it changes anything, every other failure
just stopping it, and no thread left after close."""

import errno
import threading

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit_core import CapacityError
from conduit_core.memory import page_commit
from conduit_core.schema.framestack import FramePool
from conduit_core.memory.page_commit import CommitAhead, next_commit_range
from conduit_core.memory.tiers import lazy_huge_map


def populate_supported() -> bool:
    mm = lazy_huge_map(1 << 20)
    try:
        return page_commit._c_populate_write is not None and page_commit._c_populate_write(mm, 0, 4096) == 0
    finally:
        mm.close()


needs_populate = pytest.mark.skipif(not populate_supported(),
                                    reason="madvise(MADV_POPULATE_WRITE) needs Linux >= 5.14 and the _pages helper")


def commit_threads(before: set) -> list:
    return [t for t in threading.enumerate() if t.name.startswith("conduit-commit-") and t not in before]


def add(pool, stacks):
    """Plan and write ``stacks`` [m, 4, 84, 84] as an insert does; the last frame id per stack."""
    last, sel, count = pool.plan(stacks)
    pool.write(stacks, sel, count, last)
    return last


def in_forked_child(body) -> bool:
    """Whether ``body()`` runs without an error in a forked child (reported by exit code only)."""
    import os
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            body()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


@settings(max_examples=500, deadline=None)
@given(total=st.integers(0, 10_000), requested=st.integers(0, 10_000), written=st.integers(0, 10_000),
       ahead=st.integers(2, 3_000))
def test_next_range_keeps_between_half_a_window_and_a_window_ahead(total, requested, written, ahead):
    """Nothing is asked for while the writer is more than half a window behind what was asked
    for, nor past the end; otherwise the range picks up where the last one ended (or where the
    writer is, if it ran past), ends a window past the writer (or at the end), and is not empty."""
    written = min(written, total)
    rng = next_commit_range(written, requested, total, ahead=ahead)
    if requested >= total or written + ahead // 2 < requested:
        assert rng is None
        return
    if rng is None:
        assert written >= total
        return
    start, stop = rng
    assert start == max(requested, written) and start < stop
    assert stop == min(total, written + ahead) and stop - written <= ahead


@needs_populate
def test_a_populate_changes_no_byte_of_written_or_unwritten_pages():
    """The populate call on written pages and on pages never written: the written bytes stay,
    the unwritten ones read zero."""
    mm = lazy_huge_map(8 << 20)
    view = np.frombuffer(mm, dtype=np.uint8)
    pattern = np.random.default_rng(0).integers(1, 256, 3 << 20, dtype=np.uint8)
    view[:3 << 20] = pattern
    assert page_commit._c_populate_write(mm, 0, 8 << 20) == 0
    assert np.array_equal(view[:3 << 20], pattern) and not view[3 << 20:].any()
    del view
    mm.close()


@needs_populate
def test_the_window_follows_a_writer_and_the_bytes_stay():
    """A writer of 64 KB at a time, waiting for the committer every 1 MB (as a training step's
    few frames would): the committed frontier stays ahead of it, reaches the end, every byte it
    wrote reads back, and close joins."""
    before = set(threading.enumerate())
    total = 12 << 20
    mm = lazy_huge_map(total)
    view = np.frombuffer(mm, dtype=np.uint8)
    ahead = CommitAhead(mm, total, name="test", ahead=2 << 20, chunk=512 << 10)
    step = 64 << 10
    pattern = np.random.default_rng(0).integers(1, 256, step, dtype=np.uint8)
    for lo in range(0, total, step):
        view[lo:lo + step] = pattern
        ahead.note_written(lo + step)
        if (lo + step) % (1 << 20) == 0:
            ahead.wait()
            assert ahead.committed >= min(total, lo + step + (1 << 20))   # at least half a window ahead
    ahead.close()
    assert not commit_threads(before)
    assert (view.reshape(-1, step) == pattern).all() and ahead.committed == total
    del view
    mm.close()


def test_an_atari_sized_pool_commits_as_its_frames_arrive(monkeypatch):
    """A frame pool of 2,000 Qbert frames (14 MB) under a 1 MB window: nothing is committed
    before the first write; after 396 frames (2.8 MB) the committed pages cover them and run
    ahead, but not to the end (the window follows the writes); the frames read back; close
    joins."""
    before = set(threading.enumerate())
    monkeypatch.setattr(page_commit, "AHEAD_BYTES", 1 << 20)
    monkeypatch.setattr(page_commit, "CHUNK_BYTES", 256 << 10)
    pool = FramePool(name="obs", frames=2_000, frame_shape=(84, 84), dtype=torch.uint8, k=4)
    try:
        ahead = pool.commit_ahead
        assert ahead is not None and ahead.committed == 0 and not commit_threads(before)
        frames = np.random.default_rng(2).integers(0, 256, (400, 84, 84), dtype=np.uint8)
        for t in range(0, 396, 4):
            stacks = np.stack([frames[t + i:t + i + 4] for i in range(4)])
            add(pool, stacks)
            ahead.wait()
        written = pool.cursor * pool.frame_bytes
        if populate_supported():
            assert written <= ahead.committed < ahead.total
        assert np.array_equal(pool.gather(np.array([pool.last_id])), frames[None, pool.last_id - 3:pool.last_id + 1])
    finally:
        pool.close()
    assert not commit_threads(before)


@pytest.mark.parametrize("err", [errno.ENOMEM, errno.EINVAL, errno.EPERM, errno.EFAULT])
def test_only_a_refused_memory_commit_reaches_the_insert(err, monkeypatch):
    """ENOMEM (the machine could not back the pages the writer is about to write) is raised by
    the next plan, once, before the pool changes, naming the pool and the fix; the insert after
    it goes on. Any other failure (a kernel without the advice, a sandbox refusing it) stops
    committing ahead and raises nothing: the pages fault on write as without it."""
    before = set(threading.enumerate())
    calls = []

    def refuse(mapping, offset, length):
        calls.append((offset, length))
        return err

    monkeypatch.setattr(page_commit, "_c_populate_write", refuse)
    pool = FramePool(name="obs", frames=1_000, frame_shape=(84, 84), dtype=torch.uint8, k=4)   # 7 MB: lazily mapped
    try:
        frames = np.random.default_rng(1).integers(0, 256, (12, 84, 84), dtype=np.uint8)
        stacks = [np.stack([frames[4 * j + i:4 * j + i + 4] for i in range(2)]) for j in range(2)]
        add(pool, stacks[0])       # the first write asks for the first range
        pool.commit_ahead.wait()
        assert calls and calls[0][0] == 5 * pool.frame_bytes   # from the writer on: below it, its own writes
        if err == errno.ENOMEM:
            with pytest.raises(CapacityError, match=r"frame pool 'obs'.*could not commit memory.*Fix"):
                pool.plan(stacks[1])
            assert (pool.cursor, pool.last_id) == (5, 4)
        else:
            assert not pool.commit_ahead.supported
        last = add(pool, stacks[1])
        assert pool.cursor == 10
        assert np.array_equal(pool.gather(last), stacks[1])
    finally:
        pool.close()
    assert not commit_threads(before)


def test_no_thread_to_be_had_leaves_the_write_whole(monkeypatch):
    """Where no thread can be started the write still completes (cursor and last id agree, the
    frames read back), committing ahead stops, and close does not fail."""
    monkeypatch.setattr(threading.Thread, "start", lambda self: (_ for _ in ()).throw(RuntimeError("can't start")))
    pool = FramePool(name="obs", frames=1_000, frame_shape=(84, 84), dtype=torch.uint8, k=4)
    try:
        frames = np.random.default_rng(3).integers(0, 256, (8, 84, 84), dtype=np.uint8)
        stacks = np.stack([frames[i:i + 4] for i in range(3)])
        last = add(pool, stacks)
        assert (pool.cursor, pool.last_id) == (6, 5) and not pool.commit_ahead.supported
        assert np.array_equal(pool.gather(last), stacks)
    finally:
        pool.close()


@needs_populate
def test_close_stops_between_populate_calls(monkeypatch):
    """close() during a long range returns after the call in progress, not at the range's end."""
    started, release = threading.Event(), threading.Event()
    real = page_commit._c_populate_write
    calls = []

    def slow(mapping, offset, length):
        calls.append(offset)
        started.set()
        release.wait(5)
        return real(mapping, offset, length)

    monkeypatch.setattr(page_commit, "_c_populate_write", slow)
    mm = lazy_huge_map(64 << 20)
    ahead = CommitAhead(mm, 64 << 20, name="test", ahead=64 << 20, chunk=1 << 20)
    ahead.note_written(0)
    assert started.wait(5)
    threading.Timer(0.05, release.set).start()
    ahead.close()
    assert len(calls) == 1 and ahead.committed == 1 << 20
    mm.close()


def test_a_forked_child_stops_committing_ahead_and_still_writes():
    """The parent's committing thread does not exist in a forked child: the child's pool stops
    committing ahead (no join of a thread it does not have) and its writes and close work."""
    pool = FramePool(name="obs", frames=1_000, frame_shape=(84, 84), dtype=torch.uint8, k=4)
    frames = np.random.default_rng(4).integers(0, 256, (8, 84, 84), dtype=np.uint8)
    stacks = np.stack([frames[i:i + 4] for i in range(3)])
    last = add(pool, stacks)

    def child() -> None:
        assert not pool.commit_ahead.supported
        more = np.stack([frames[i:i + 4] for i in range(3, 5)])
        assert np.array_equal(pool.gather(add(pool, more)), more)
        pool.close()

    try:
        assert in_forked_child(child)
        assert np.array_equal(pool.gather(last), stacks)
    finally:
        pool.close()


def test_a_populate_that_raises_stops_committing_ahead_and_nothing_else(monkeypatch):
    """A Python error out of the populate call (a mapping gone under it) stops committing ahead
    like any failure other than ENOMEM: no error reaches the writer, no thread is started again."""
    calls = []

    def broken(mapping, offset, length):
        calls.append(offset)
        raise BufferError("the mapping is gone")

    monkeypatch.setattr(page_commit, "_c_populate_write", broken)
    pool = FramePool(name="obs", frames=1_000, frame_shape=(84, 84), dtype=torch.uint8, k=4)
    try:
        frames = np.random.default_rng(6).integers(0, 256, (12, 84, 84), dtype=np.uint8)
        for j in range(2):
            add(pool, np.stack([frames[4 * j + i:4 * j + i + 4] for i in range(2)]))
            pool.commit_ahead.wait()
        assert len(calls) == 1 and not pool.commit_ahead.supported and pool.cursor == 10
    finally:
        pool.close()


def test_a_refusal_pending_at_a_fork_is_not_the_childs(monkeypatch):
    """An ENOMEM the parent's thread met, not yet raised, is not raised in a forked child (which
    commits nothing ahead); the parent still gets it at its next insert."""
    monkeypatch.setattr(page_commit, "_c_populate_write", lambda mapping, offset, length: errno.ENOMEM)
    pool = FramePool(name="obs", frames=1_000, frame_shape=(84, 84), dtype=torch.uint8, k=4)
    frames = np.random.default_rng(7).integers(0, 256, (12, 84, 84), dtype=np.uint8)
    add(pool, np.stack([frames[i:i + 4] for i in range(2)]))
    pool.commit_ahead.wait()
    second = np.stack([frames[4 + i:4 + i + 4] for i in range(2)])
    try:
        assert in_forked_child(lambda: add(pool, second))    # no CapacityError in the child
        with pytest.raises(CapacityError):
            pool.plan(second)
    finally:
        pool.close()


def _refusing_from(limit):
    real = page_commit._c_populate_write
    return lambda mapping, offset, length: errno.ENOMEM if offset >= limit else real(mapping, offset, length)


@needs_populate
def test_a_refusal_far_ahead_stops_only_the_insert_that_would_write_there(monkeypatch):
    """Found in review: a refusal well ahead of the writer failed the next insert (whatever it
    wrote), and about every other one after. Now the inserts below the refused range go ahead,
    the one that would write into it is refused once (changing nothing), and its retry is stored."""
    monkeypatch.setattr(page_commit, "_c_populate_write", _refusing_from(4 << 20))
    pool = FramePool(name="obs", frames=1_000, frame_shape=(84, 84), dtype=torch.uint8, k=4)   # 7 MB
    rng = np.random.default_rng(3)
    refused_at = []
    try:
        for j in range(240):   # 4 new frames per insert, 6.7 MB in all
            stack = rng.integers(0, 256, (1, 4, 84, 84), dtype=np.uint8)
            pool.commit_ahead.wait()
            try:
                last = add(pool, stack)
            except CapacityError:
                refused_at.append(pool.cursor)
                assert pool.cursor == 4 * j and pool.last_id == 4 * j - 1   # nothing of it stored
                last = add(pool, stack)   # the retry goes ahead
            assert np.array_equal(pool.gather(last)[0], stack[0])
        assert len(refused_at) == 1 and (refused_at[0] + 4) * pool.frame_bytes > 4 << 20
        assert pool.cursor == 960
    finally:
        pool.close()


@needs_populate
def test_a_restore_below_a_pending_refusal_keeps_it(monkeypatch):
    """Found in review: ``wrote_through`` (a restore) dropped a refusal above what it wrote, and
    the refused range was never asked for again."""
    monkeypatch.setattr(page_commit, "_c_populate_write", _refusing_from(1 << 20))
    pool = FramePool(name="obs", frames=1_000, frame_shape=(84, 84), dtype=torch.uint8, k=4)
    frames = np.random.default_rng(4).integers(0, 256, (8, 84, 84), dtype=np.uint8)
    try:
        add(pool, frames[:4][None])
        pool.commit_ahead.wait()
        pool.commit_ahead.wrote_through(8 * pool.frame_bytes)      # below the refusal (at 1-3 MB)
        pool.commit_ahead.check(8 * pool.frame_bytes, 12 * pool.frame_bytes)   # below it: goes ahead
        with pytest.raises(CapacityError):                         # into it: refused, once
            pool.commit_ahead.check(8 * pool.frame_bytes, 7 << 20)
        pool.commit_ahead.check(8 * pool.frame_bytes, 7 << 20)
    finally:
        pool.close()


@needs_populate
def test_a_fork_during_a_populate_leaves_the_child_a_mapping_it_can_close():
    """Found in review: the populate held an export of the mapping while the GIL was let go, so
    a child forked meanwhile inherited an export nothing there releases and could never unmap it."""
    from conduit_core.memory.tiers import LazyHostSegment
    seg = LazyHostSegment((128 << 20,), torch.uint8)
    committer = CommitAhead(seg._mm, 128 << 20, name="fork", ahead=256 << 20, chunk=128 << 20)
    try:
        committer.note_written(1)   # one populate of the whole 128 MB, off this thread

        def child():
            committer.close()
            mm = seg._mm
            seg.close()
            assert mm.closed
        assert in_forked_child(child)
    finally:
        committer.close()
        seg.close()
