"""What SRL's replay buffers store for a field a sample leaves out (``None``), and for one the
first sample left out: SRL's ``buffer[:, ptr] = x`` (``NamedArray.__setitem__``) skips ``None``
fields, so the slot keeps the previous sample's values there (zeros in a slot never written); its
storage is allocated from the first sample, so a field ``None`` there has none, and values later
samples give it are dropped. Conduit's replay kinds store the same (:func:`keep_previous`) and say
what they drop (:class:`UnstoredFields`), which SRL does not.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import numpy as np


def keep_previous(rows: list[dict[str, Any]], missing: list[list[str]], *, first_seq: int, capacity: int,
                  stored_row: Callable[[int, list[str]], dict[str, Any]], zeros: Callable[[str], np.ndarray]) -> None:
    """Fill, in place, the fields ``missing[i]`` row ``i`` leaves out (``None``) with what its slot holds
    before the write. Row ``i`` goes to seq ``first_seq + i`` (slot ``seq % capacity``): a row of the
    same call ``capacity`` earlier wrote that slot last, else the stored row ``seq - capacity``
    (``stored_row(seq, names)``: those of its fields, a batch of one), else the slot was never written
    (``zeros(name)``). Writes nothing; a row with nothing missing costs one test."""
    for i, names in enumerate(missing):
        if not names:
            continue
        row, seq = rows[i], first_seq + i
        if i >= capacity:                      # this call wrote the slot already
            for name in names:
                row[name] = rows[i - capacity][name]
        elif seq >= capacity:                  # the slot holds row seq - capacity
            held = stored_row(seq - capacity, names)
            for name in names:
                row[name] = np.asarray(held[name][0]).copy()
        else:                                  # never written: zeros, as SRL's fresh buffer
            for name in names:
                row[name] = zeros(name)


class UnstoredFields:
    """Values for fields with no storage, dropped as SRL drops them, said once per field (a warning)
    and counted (``samples``: the samples that had any)."""

    def __init__(self, kind: str):
        self.kind, self.samples, self._warned = kind, 0, set()

    def drop(self, names: list[str]) -> None:
        self.samples += 1
        new = [n for n in names if n not in self._warned]
        if new:
            self._warned.update(new)
            warnings.warn(f"{self.kind}: {new} were None in the first sample, so the buffer has no storage "
                          "for them (SRL's replay buffers allocate from the first sample too): their values in "
                          "this and later samples are dropped, as SRL's buffer drops them. Fix: give the field a "
                          "value (zeros) in the first sample to keep it", RuntimeWarning, stacklevel=5)
