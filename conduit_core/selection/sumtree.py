"""The prioritized-replay index: a binary sum tree and min tree over priorities.

    node 1 = root; node i has children 2i, 2i+1; leaves at [size, 2*size)

The arrays are numpy (state dicts, tests and the fallback see them); the walks run in
a small C helper (``conduit_core._native._sumtree``) with the GIL released: a batch of B
samples or updates costs B * log2(capacity) steps and no Python per item. Without a
compiler at install time the same walks run vectorized in numpy (one round of numpy
calls per tree level: correct, ~5x slower).
"""

from __future__ import annotations

import numpy as np

from ..memory.tiers import host_zeros

try:  # pragma: no cover - which branch runs depends on the build
    from .._native import _sumtree as _c
except ImportError:  # pragma: no cover
    _c = None

HAVE_C = _c is not None
_HAVE_RUN = HAVE_C and hasattr(_c, "update_run")   # (a build older than update_run: the per-slot route)


class PriorityIndex:
    """Sums, minimum and prefix-sum search over ``capacity`` non-negative priorities."""

    def __init__(self, capacity: int, *, use_c: bool | None = None):
        self.capacity = int(capacity)
        self.size = 1 << max(1, (self.capacity - 1).bit_length())
        # Both trees start as zero pages, mapped on first write (an empty index costs nothing).
        # The min tree keeps the smallest *positive* priority; 0 means "no item below".
        # Large trees are mapped with huge pages: a walk's lower levels then cost no TLB miss each.
        self._sum = host_zeros(2 * self.size, np.float64)
        self._min = host_zeros(2 * self.size, np.float64)
        self.use_c = HAVE_C if use_c is None else (use_c and HAVE_C)

    # --------------------------------------------------------------- queries
    @property
    def total(self) -> float:
        return float(self._sum[1])

    @property
    def min(self) -> float:
        """The smallest positive priority (inf when no item has one)."""
        m = float(self._min[1])
        return m if m > 0 else float("inf")

    def trees(self) -> tuple[np.ndarray, np.ndarray, int]:
        """(sum tree, min tree, leaf offset): the arrays native walks read (node 1 is the
        root, leaves start at the offset). Read-only for callers."""
        return self._sum, self._min, self.size

    def leaves(self) -> np.ndarray:
        return self._sum[self.size: self.size + self.capacity]

    def get(self, idx: np.ndarray) -> np.ndarray:
        return self._sum[self.size + idx]

    # --------------------------------------------------------------- updates
    def set(self, idx: np.ndarray, values) -> None:
        """Set priorities of ``idx`` (0 = not sampleable); later duplicates win."""
        idx = np.ascontiguousarray(idx, dtype=np.int64).reshape(-1)
        if idx.size == 0:
            return
        if isinstance(values, np.ndarray) and values.dtype == np.float64 and values.shape == idx.shape:
            vals = np.ascontiguousarray(values)
        else:
            vals = np.ascontiguousarray(np.broadcast_to(np.asarray(values, dtype=np.float64), idx.shape))
        if self.use_c:
            _c.update(self._sum, self._min, self.size, idx, vals)
            return
        if (idx < 0).any() or (idx >= self.size).any():
            raise IndexError("priority index out of range")
        node = idx + self.size
        self._sum[node] = vals  # numpy: the last duplicate wins, as in C
        self._min[node] = self._sum[node]
        node = np.unique(node >> 1)
        while node[0] >= 1:
            self._sum[node] = self._sum[2 * node] + self._sum[2 * node + 1]
            self._min[node] = _min_positive(self._min[2 * node], self._min[2 * node + 1])
            if node[0] == 1:
                break
            node = np.unique(node >> 1)

    def set_range(self, start: int, n: int, value: float) -> None:
        """Set a run of slots (wrapping) to one value: insertion at max priority."""
        if n > 0 and self.use_c and _HAVE_RUN:
            _c.update_run(self._sum, self._min, self.size, start, n, self.capacity, float(value))
        elif n > 0:
            idx = np.arange(start, start + n, dtype=np.int64)
            if start + n > self.capacity:
                idx %= self.capacity
            self.set(idx, np.full(n, value, dtype=np.float64))

    # -------------------------------------------------------------- sampling
    def find_prefixsum(self, values: np.ndarray) -> np.ndarray:
        """For each ``v`` in ``[0, total)``, the slot i with ``sum(p[:i]) <= v < sum(p[:i+1])``;
        never a zero-priority slot."""
        v = np.ascontiguousarray(values, dtype=np.float64).reshape(-1)
        out = np.empty(v.shape[0], dtype=np.int64)
        if self.use_c:
            _c.find(self._sum, self.size, v, out)
            return out
        v = v.copy()
        node = np.ones(v.shape[0], dtype=np.int64)
        while node[0] < self.size if node.size else False:
            left = self._sum[2 * node]
            right = self._sum[2 * node + 1]
            go_left = ((v < left) & (left > 0)) | (right <= 0)
            v = np.where(go_left, v, v - left)
            node = np.where(go_left, 2 * node, 2 * node + 1)
        out[:] = node - self.size
        return out

    # ------------------------------------------------------------------ state
    def rebuild(self, leaves: np.ndarray) -> None:
        """Set every priority at once (state restore), bottom-up in log2(size) numpy passes."""
        self._sum[:] = 0
        self._sum[self.size: self.size + leaves.shape[0]] = leaves
        lv = self._sum[self.size:]
        self._min[:] = 0
        self._min[self.size:] = lv
        n = self.size
        while n > 1:
            half = n // 2
            self._sum[half:n] = self._sum[n:2 * n:2] + self._sum[n + 1:2 * n:2]
            self._min[half:n] = _min_positive(self._min[n:2 * n:2], self._min[n + 1:2 * n:2])
            n = half


def _min_positive(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise: the smaller of a and b ignoring zeros (0 where both are 0)."""
    return np.where(a == 0, b, np.where(b == 0, a, np.minimum(a, b)))
