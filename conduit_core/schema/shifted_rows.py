"""Two fields whose rows are one array's rows shifted by one (a framework's ``obs[:-1]`` and
``obs[1:]``, as RLlib's episodes hand over observations and next observations): found once per
batch and encoded once, n + 1 rows instead of 2n. The spec asks ``shifted_pairs`` before
encoding and ``encode_shifted`` for each pair found."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..errors import CodecError


def shift_partners(fields) -> dict[str, frozenset[str]]:
    """Field -> the other fields with an equal row-wise codec (``Codec.rowwise_encode``): the
    pairs ``shifted_pairs`` may find, worked out once per spec."""
    rowwise = [f for f in fields if f.codec.rowwise_encode]
    return {f.name: frozenset(g.name for g in rowwise if g.name != f.name and (g.codec is f.codec or g.codec == f.codec))
            for f in rowwise}


def shifted_pairs(spec, columns: Mapping[str, Any]) -> dict[str, tuple[str, np.ndarray]]:
    """Field a -> (field b, the union of their rows) where b's rows are a's shifted by one in
    memory (b[i] is a[i + 1], as a framework's ``obs[:-1]`` and ``obs[1:]`` of one array, both
    views of it) and both have the same row-wise codec: their n + 1 distinct rows are then
    encoded once, not 2n. (Two rows at least: then b[0] is a[1], one allocation.)"""
    partners = spec.shift_partners
    found: dict[str, tuple[str, np.ndarray]] = {}
    if not partners:
        return found
    names = [name for name in columns if name in partners]
    taken: set[str] = set()    # fields already some pair's b
    for name_a in names:
        if name_a in taken:
            continue
        for name_b in names:
            if name_b in partners[name_a] and name_b not in taken and name_b not in found:   # no chains
                union = _union_if_shifted(columns[name_a], columns[name_b])
                if union is not None:
                    found[name_a] = (name_b, union)
                    taken.add(name_b)
                    break
    return found


def _union_if_shifted_py(a, b) -> np.ndarray | None:
    """``_rows.shifted_union`` where it was not built: the same test, the same view."""
    if type(a) is not np.ndarray or type(b) is not np.ndarray or a is b or a.ndim < 1 or a.shape != b.shape \
            or a.shape[0] < 2 or a.dtype != b.dtype or a.base is None or a.base is not b.base:
        return None
    if not all(x.flags.c_contiguous and x.flags.aligned and x.dtype.isnative for x in (a, b)):
        return None
    if b.__array_interface__["data"][0] != a.__array_interface__["data"][0] + a.strides[0]:
        return None
    return np.lib.stride_tricks.as_strided(a, shape=(a.shape[0] + 1, *a.shape[1:]), strides=a.strides,
                                           writeable=False)


try:
    from .._native._rows import shifted_union as _union_if_shifted
except ImportError:  # pragma: no cover - no C compiler where it was installed
    _union_if_shifted = _union_if_shifted_py


def encode_shifted(codec, name_a: str, name_b: str, a: np.ndarray, b: np.ndarray,
                    union: np.ndarray) -> dict[str, Any]:
    """Both fields from one encode of their union (a's rows, then b's last): every row of the
    union is a row of a or of b. A refused value is named by the field it is in (encoded apart)."""
    try:
        enc = codec.encode(name_a, union)
    except CodecError:
        codec.encode(name_a, a)
        codec.encode(name_b, b)
        raise
    return {name_a: enc[:-1], name_b: enc[1:]}
