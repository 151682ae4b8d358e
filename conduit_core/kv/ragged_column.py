"""The pieces a ``RaggedStore`` (``conduit_core.kv.ragged``) trades in: a batch of one field's rows
as a ``Column`` (bytes back to back with per-row byte counts and lengths), where stored rows lie
(``Located``), and the default arena provider (``HeapArenas``: private memory)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import ConfigError
from .byte_segments import gather_segments


class HeapArenas:
    """Where a RaggedStore's arenas live by default: private memory of this process. Another
    provider (``conduit_core.kv.shared_arena.SharedArenas``) gives the same two calls over memory
    other processes can map: ``new(size)`` an arena, ``release(arena)`` when the store no longer
    uses it (after a compaction, a dropped field, the store's ``release()``)."""

    def new(self, size: int) -> np.ndarray:
        return np.empty(size, dtype=np.uint8)

    def release(self, arena: np.ndarray) -> None:
        pass


@dataclass
class Located:
    """Where a stored tensor field's rows lie, without copying them: in ``arena`` at ``starts``,
    with the rows' ``nbytes`` and ``lengths`` and the field's dtype, inner shape and scalar-ness.
    Valid while the arena holds them: a RaggedStore never writes over bytes below its arena's end,
    so the rows stay as located until the arena is released."""

    arena: np.ndarray
    starts: np.ndarray
    nbytes: np.ndarray
    lengths: np.ndarray
    dtype: str
    inner: tuple[int, ...]
    scalar: bool


@dataclass
class Column:
    """Rows of one field, back to back: ``data`` (uint8 bytes, or an object array for
    ``kind="object"``), ``nbytes`` and ``lengths`` per row (int64), the element ``dtype`` (a
    name such as 'float32' or 'bfloat16'), the ``inner`` shape after the first dimension and
    ``scalar`` (rows are single elements, delivered stacked rather than jagged)."""

    kind: str
    data: np.ndarray
    nbytes: np.ndarray | None = None
    lengths: np.ndarray | None = None
    dtype: str = ""
    inner: tuple[int, ...] = ()
    scalar: bool = False

    @property
    def rows(self) -> int:
        return len(self.data) if self.kind == "object" else len(self.nbytes)

    def check(self, name: str, rows: int, *, where: str | None = None) -> None:
        """Raise ConfigError unless this Column is ``rows`` well-formed rows (before any write)."""
        where = where or f"columns[{name!r}]"
        if self.kind == "object":
            if not (isinstance(self.data, np.ndarray) and self.data.ndim == 1 and self.data.shape[0] == rows):
                raise ConfigError(f"{where}.data", f"a 1-D object array of {rows} values (one per key)",
                                  getattr(self.data, "shape", type(self.data).__name__), "give every field one row per key")
            return
        if self.kind != "tensor":
            raise ConfigError(f"{where}.kind", "'tensor' or 'object'", repr(self.kind), "build it with encode()")
        for part, arr in (("nbytes", self.nbytes), ("lengths", self.lengths)):
            if not (isinstance(arr, np.ndarray) and arr.shape == (rows,) and arr.dtype.kind == "i"):
                raise ConfigError(f"{where}.{part}", f"{rows} integers (one per key)",
                                  getattr(arr, "shape", type(arr).__name__), "give every field one row per key")
        if not (isinstance(self.data, np.ndarray) and self.data.ndim == 1 and self.data.dtype == np.uint8):
            raise ConfigError(f"{where}.data", "a 1-D uint8 array (the rows' bytes)",
                              getattr(self.data, "dtype", type(self.data).__name__), "view the values as bytes")
        if rows and (self.lengths.min() < 0 or (self.scalar and (self.lengths != 1).any())):
            raise ConfigError(f"{where}.lengths", "lengths >= 0 (1 for scalar rows)", int(self.lengths.min()),
                              "give each row's length along its first dimension")
        try:
            itemsize = getattr(torch, self.dtype).itemsize
        except (AttributeError, TypeError):
            raise ConfigError(f"{where}.dtype", "a torch dtype name such as 'float32'", repr(self.dtype),
                              "name the element type") from None
        per = math.prod(self.inner) * itemsize
        if not np.array_equal(self.nbytes, self.lengths * per) or int(self.nbytes.sum()) != self.data.size:
            raise ConfigError(f"{where}.nbytes", f"length x {per} bytes per row, summing to the data's "
                              f"{self.data.size} bytes", f"{int(self.nbytes.sum())} bytes in all",
                              "build the Column with its rows' byte counts")

    def select(self, positions: np.ndarray) -> "Column":
        """The rows at ``positions`` (in that order), as a new Column."""
        if self.kind == "object":
            return Column("object", self.data[positions])
        starts = np.cumsum(self.nbytes) - self.nbytes
        return Column("tensor", gather_segments(self.data, starts[positions], self.nbytes[positions]),
                      self.nbytes[positions], self.lengths[positions], self.dtype, self.inner, self.scalar)
