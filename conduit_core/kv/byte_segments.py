"""Byte segments copied in one call: a batch's variable-length rows out of a flat arena
(``gather_segments``) or from one buffer to their places in another (``copy_segments``), one
memcpy per row in C (``_segments``) with the GIL released; numpy fallbacks where it is not built."""

from __future__ import annotations

import numpy as np

try:
    from .._native._segments import gather_segments as _c_gather_segments
except ImportError:  # pragma: no cover - no C compiler where it was installed
    _c_gather_segments = None
try:
    from .._native._segments import copy_segments as _c_copy_segments
except ImportError:  # pragma: no cover - a C helper built before copy_segments existed
    _c_copy_segments = None


def gather_segments(src: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                    out: np.ndarray | None = None) -> np.ndarray:
    """The byte segments ``src[starts[i] : starts[i] + lengths[i]]``, in order, in one array
    (``out`` when given: exactly their total size, e.g. a region of a shared arena)."""
    starts = np.ascontiguousarray(starts, dtype=np.int64)
    lengths = np.ascontiguousarray(lengths, dtype=np.int64)
    if starts.shape != lengths.shape or (lengths.size and (
            starts.min() < 0 or lengths.min() < 0 or (lengths > src.size - starts).any())):
        raise ValueError("gather_segments: a segment lies outside src")   # before allocating anything
    total = int(lengths.sum())
    if out is None:
        out = np.empty(total, dtype=np.uint8)
    elif out.size != total:
        raise ValueError(f"gather_segments: out holds {out.size} bytes, the segments {total}")
    if _c_gather_segments is not None:
        _c_gather_segments(src, starts, lengths, out)
    elif out.size:
        first = np.cumsum(lengths) - lengths
        out[:] = src[np.repeat(starts - first, lengths) + np.arange(out.size)]
    return out


def copy_segments(src: np.ndarray, src_starts: np.ndarray, lengths: np.ndarray,
                  dst: np.ndarray, dst_starts: np.ndarray) -> None:
    """Copy ``src[src_starts[i] : +lengths[i]]`` to ``dst[dst_starts[i] : +lengths[i]]`` for every i:
    rows of one source put at their places in an output (one memcpy per row, in C)."""
    src_starts = np.ascontiguousarray(src_starts, dtype=np.int64)
    lengths = np.ascontiguousarray(lengths, dtype=np.int64)
    dst_starts = np.ascontiguousarray(dst_starts, dtype=np.int64)
    if _c_copy_segments is not None:
        _c_copy_segments(src, src_starts, lengths, dst, dst_starts)
        return
    if not (src_starts.shape == lengths.shape == dst_starts.shape):
        raise ValueError("copy_segments: src_starts, lengths and dst_starts differ in length")
    if lengths.size and (src_starts.min() < 0 or dst_starts.min() < 0 or lengths.min() < 0
                         or (lengths > src.size - src_starts).any() or (lengths > dst.size - dst_starts).any()):
        raise ValueError("copy_segments: a segment lies outside src or dst")
    # a per-byte index (8 bytes of index per byte moved), built for ~16 MB of rows at a time
    ends = np.cumsum(lengths)
    lo = 0
    while lo < lengths.size:
        hi = max(lo + 1, int(np.searchsorted(ends, (ends[lo - 1] if lo else 0) + (1 << 24), side="right")))
        n, s, d = lengths[lo:hi], src_starts[lo:hi], dst_starts[lo:hi]
        total = int(n.sum())
        if total:
            within = np.arange(total) - np.repeat(np.cumsum(n) - n, n)
            dst[np.repeat(d, n) + within] = src[np.repeat(s, n) + within]
        lo = hi
