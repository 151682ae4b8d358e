"""Fresh output arrays whose memory is reused once nothing refers to the array any more.

Why: a batch handed to a learner is fresh memory (the learner may keep it as long as it likes),
and every write to a freshly allocated large array costs a page fault per 4 KB page: glibc gives
blocks of this size back to the kernel when they are freed. A [32, 84, 84, 4] float32 Atari
batch (3.6 MB) decoded into fresh memory took 0.26-0.39 ms of faults per batch when a learner
holds a few batches at a time, as much as the decode itself.

How it stays fresh: each array handed out is a view of a block through an owner object of its
own (a ctypes view, which numpy records as the array's base). Every numpy or torch view derived
from the array keeps that owner alive, so the owner dies only when the last of them is gone; only
then does the block go back to a free list for the next array of its size. Memory someone can
still reach is never handed out again. The free list keeps at most ``keep`` blocks per size and
``max_bytes`` in all, dropping the oldest first. An array from here cannot be resized in place
(``resize_``): its memory is not torch's.
"""

from __future__ import annotations

import ctypes
import math
import os
import threading
import weakref

import numpy as np


class Recycler:
    """``empty(shape, dtype)``: like ``np.empty``, from recycled blocks (see the module doc). Free
    blocks are kept newest last: at most ``keep`` of one size and ``max_bytes`` in all, the oldest
    dropped first, so sizes no longer asked for make room for the ones that are."""

    def __init__(self, *, keep: int = 8, max_bytes: int = 512 << 20):
        self.keep, self.max_bytes = int(keep), int(max_bytes)
        self._reset()
        os.register_at_fork(after_in_child=self._reset)   # a child starts with a free lock and no blocks

    def _reset(self) -> None:
        self._free: list[tuple[int, np.ndarray]] = []   # (nbytes, block), oldest first
        self._free_bytes = 0
        self._lock = threading.RLock()   # a give-back may run on any thread, inside a collection
        self.reused = self.allocated = 0

    def empty(self, shape, dtype) -> np.ndarray:
        shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(shape)
        dtype = np.dtype(dtype)
        count = math.prod(shape)
        nbytes = count * dtype.itemsize
        if nbytes == 0 or dtype.hasobject:
            return np.empty(shape, dtype)
        block = None
        with self._lock:
            for k in range(len(self._free) - 1, -1, -1):   # the newest block of this size
                if self._free[k][0] == nbytes:
                    block = self._free.pop(k)[1]
                    self._free_bytes -= nbytes
                    self.reused += 1
                    break
            else:
                self.allocated += 1
        if block is None:
            block = np.empty(nbytes, np.uint8)
        owner = (ctypes.c_char * nbytes).from_buffer(block)
        weakref.finalize(owner, self._give_back, nbytes, block).atexit = False
        return np.frombuffer(owner, dtype=dtype, count=count).reshape(shape)

    def _give_back(self, nbytes: int, block: np.ndarray) -> None:
        """The last view of an array from ``block`` is gone: the block may be handed out again."""
        if nbytes > self.max_bytes:
            return
        with self._lock:
            self._free.append((nbytes, block))
            self._free_bytes += nbytes
            same = [k for k, (n, _) in enumerate(self._free) if n == nbytes]
            if len(same) > self.keep:
                self._free_bytes -= self._free.pop(same[0])[0]
            while self._free_bytes > self.max_bytes:
                self._free_bytes -= self._free.pop(0)[0]

    def free_bytes(self) -> int:
        with self._lock:
            return self._free_bytes


RECYCLER = Recycler()   # shared by the decoders of every buffer in the process
