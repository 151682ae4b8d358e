"""Recycled fresh outputs (conduit_core.recycled): memory anyone can still reach is never handed
out again, whatever views of it they keep; memory nobody reaches is reused (no page faults)."""

import gc
import threading

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit_core.recycled import Recycler

KEEPERS = {
    "array": lambda a: a,
    "numpy slice": lambda a: a[1:],
    "numpy reshape": lambda a: a.reshape(-1),
    "torch tensor": lambda a: torch.from_numpy(a),
    "torch view": lambda a: torch.from_numpy(a)[1:].view(-1),
    "tensor.numpy()": lambda a: torch.from_numpy(a).numpy()[::2],
}


@pytest.mark.parametrize("keeper", list(KEEPERS))
def test_memory_still_reachable_through_any_view_is_never_handed_out(keeper):
    r = Recycler()
    a = r.empty((4, 8), np.float32)
    a[:] = 7.0
    kept = KEEPERS[keeper](a)
    ptr = a.ctypes.data
    del a
    gc.collect()
    b = r.empty((4, 8), np.float32)          # same size: must not be the block `kept` reaches
    b[:] = -1.0
    assert b.ctypes.data != ptr
    values = kept.numpy() if isinstance(kept, torch.Tensor) else kept
    assert (np.asarray(values) == 7.0).all()
    del kept, values
    gc.collect()
    c = r.empty((4, 8), np.float32)          # now nothing reaches it: reused
    assert c.ctypes.data == ptr and r.reused == 1


def test_caps_on_what_the_free_list_keeps():
    r = Recycler(keep=2, max_bytes=1 << 20)
    arrays = [r.empty((1024,), np.uint8) for _ in range(4)]
    del arrays
    gc.collect()
    assert r.free_bytes() == 2 * 1024                       # at most `keep` blocks of a size
    big = r.empty((1 << 20,), np.uint8)
    del big
    gc.collect()
    assert r.free_bytes() == 1 << 20                        # the newest kept, the oldest dropped for room
    huge = r.empty((2 << 20,), np.uint8)
    del huge
    gc.collect()
    assert r.free_bytes() == 1 << 20                        # over max_bytes by itself: freed, not kept


@settings(max_examples=30, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["take", "drop"]), st.integers(0, 5), st.sampled_from([8, 16])),
                    max_size=40))
def test_no_two_live_arrays_share_memory(ops):
    """Any interleaving of takes and drops: the live arrays' memory never overlaps, and each keeps
    the values written into it."""
    r = Recycler(keep=3)
    live: list[tuple[np.ndarray, int]] = []
    tag = 0
    for op, k, n in ops:
        if op == "take":
            tag += 1
            a = r.empty((n,), np.int64)
            a[:] = tag
            live.append((a, tag))
        elif live:
            live.pop(k % len(live))
            gc.collect()
        spans = sorted((a.ctypes.data, a.ctypes.data + a.nbytes) for a, _ in live)
        assert all(e <= s for (_, e), (s, _) in zip(spans, spans[1:]))
        assert all((a == t).all() for a, t in live)


def test_threads_take_and_drop_without_sharing():
    r = Recycler(keep=4)
    errors = []

    def worker(seed):
        rng = np.random.default_rng(seed)
        held = []
        for i in range(300):
            a = r.empty((256,), np.int32)
            a[:] = seed * 1000 + i
            held.append((a, seed * 1000 + i))
            if len(held) > 3:
                held.pop(int(rng.integers(len(held))))
            if not all((x == v).all() for x, v in held):
                errors.append(seed)
    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and r.reused > 0


def test_zero_sized_and_object_arrays_are_plain():
    r = Recycler()
    assert r.empty((0, 3), np.float32).shape == (0, 3)
    assert r.empty((2,), object).dtype == object


def test_sizes_no_longer_asked_for_make_room():
    r = Recycler(keep=8, max_bytes=64 << 10)
    old = [r.empty((8 << 10,), np.uint8) for _ in range(8)]    # 64 KB of one size fills the free list
    del old
    gc.collect()
    assert r.free_bytes() == 64 << 10
    for _ in range(5):                                          # a new size: the oldest blocks make room
        a = r.empty((1 << 10,), np.uint8)
        del a
        gc.collect()
    assert r.reused == 4 and r.free_bytes() <= 64 << 10
    assert r.empty(5, np.int64).shape == (5,)                   # an int shape, as np.empty takes


def test_a_forked_child_starts_with_a_free_lock():
    import os
    r = Recycler()
    r._lock.acquire()   # noqa: SLF001 - a thread holding it at fork time
    pid = os.fork()
    if pid == 0:
        ok = r._lock.acquire(timeout=2)   # noqa: SLF001
        os._exit(0 if ok and r.free_bytes() == 0 else 1)
    r._lock.release()   # noqa: SLF001
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
