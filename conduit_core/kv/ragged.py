"""Keyed rows of variable length, stored by column: the storage of a key-value experience store.

verl's stages (rollout, reward, old/ref log-prob, advantage) each write some fields of the same
rows, addressed by integer keys that the store does not choose; a row's fields are sequences of
different lengths (a prompt, a response, its log-probs). A ``RaggedStore`` keeps each field in
one flat byte arena, rows back to back, with per-slot (start, bytes, length) arrays, so writing a
batch is one copy per field and reading a batch is one gather per field (``_segments`` in C, one
memcpy per row) plus its offsets: no per-row Python either way. Fields that are not tensors
(strings, dicts) are kept as object arrays.

A batch travels as a ``Column``: the rows' bytes back to back, each row's byte count and its
length along the first dimension (what a jagged tensor's offsets are made of), and the element
dtype and inner shape. The store copies what it is given and hands out fresh arrays.

Arenas come from a provider (``arenas=``): private memory by default (``HeapArenas``), or
segments other processes map (``conduit_core.kv.shared_arena``). For those, ``reserve`` hands out
room that the caller fills itself and ``put`` then records rows on it without a copy; ``locate``
says where rows lie instead of copying them. Bytes below an arena's end are never written again.

Overwriting or clearing a row leaves its old bytes dead in the arena. When a write does not fit,
the arena is compacted (live rows copied in slot order) into one sized 2x to 4x (live + new), so
the arena never holds more than ~4x the bytes live at its last compaction; clearing rows frees
their bytes at the next compaction, not before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np
from numpy.typing import ArrayLike

from ..errors import ConfigError
from .byte_segments import copy_segments, gather_segments  # noqa: F401 - copy_segments: re-exported
from .ragged_column import Column, HeapArenas, Located  # noqa: F401 - re-exported: the store's vocabulary

if TYPE_CHECKING:
    from .shared_arena import SharedArenas


class _TensorField:
    def __init__(self, dtype: str, inner: tuple[int, ...], scalar: bool, slots: int, arenas):
        self.dtype, self.inner, self.scalar = dtype, inner, scalar
        self.arenas = arenas
        self.arena = arenas.new(1 << 16)
        self.end = 0                                   # bytes used in the arena
        self.start = np.full(slots, -1, dtype=np.int64)  # -1: this slot has no value for the field
        self.nbytes = np.zeros(slots, dtype=np.int64)
        self.length = np.zeros(slots, dtype=np.int64)
        self.live = 0                                  # bytes of rows still referenced

    def grow_slots(self, slots: int) -> None:
        pad = slots - self.start.size
        self.start = np.concatenate([self.start, np.full(pad, -1, dtype=np.int64)])
        self.nbytes = np.concatenate([self.nbytes, np.zeros(pad, dtype=np.int64)])
        self.length = np.concatenate([self.length, np.zeros(pad, dtype=np.int64)])

    def drop(self, slots: np.ndarray) -> None:
        had = self.start[slots] >= 0
        self.live -= int(self.nbytes[slots][had].sum())
        self.start[slots] = -1
        self.nbytes[slots] = 0
        self.length[slots] = 0

    def reserve(self, need: int) -> int:
        """Room for ``need`` bytes at the arena's end, for the caller to write; returns its offset.
        The bytes are dead (not live, not any slot's) until ``write`` records rows on them."""
        if self.end + need > self.arena.size:
            self._compact(extra=need)
        at = self.end
        self.end += need
        return at

    def _placed(self, data: np.ndarray) -> int | None:
        """The offset of ``data`` in this arena when it lies there below ``end`` (reserved and
        written in place), else None."""
        if data.size == 0 or not data.flags.c_contiguous:
            return None
        at = data.__array_interface__["data"][0] - self.arena.__array_interface__["data"][0]
        return at if 0 <= at and at + data.size <= self.end else None

    def write(self, slots: np.ndarray, col: Column) -> None:
        need = int(col.data.size)
        at = self._placed(col.data)
        if at is None:
            at = self.reserve(need)
            self.arena[at:at + need] = col.data   # the copy first: if it fails, nothing changed
        self.drop(slots)
        self.start[slots] = at + np.cumsum(col.nbytes) - col.nbytes
        self.nbytes[slots] = col.nbytes
        self.length[slots] = col.lengths
        self.live += need

    def _compact(self, extra: int) -> None:
        """Copy the live rows, in slot order, into an arena with room for ``extra`` more bytes
        (at least twice live + extra: a compaction pays for itself before the next one)."""
        held = np.nonzero(self.start >= 0)[0]
        size = 1 << 16
        while size < 2 * (self.live + extra):
            size *= 2
        arena = self.arenas.new(size)
        live = int(self.nbytes[held].sum())
        gather_segments(self.arena, self.start[held], self.nbytes[held], out=arena[:live])
        self.start[held] = np.cumsum(self.nbytes[held]) - self.nbytes[held]
        old, self.arena, self.end = self.arena, arena, live
        self.arenas.release(old)   # its bytes stay as they were: a reader still mapping it reads them

    def locate(self, slots: np.ndarray) -> Located:
        return Located(self.arena, self.start[slots], self.nbytes[slots].copy(), self.length[slots].copy(),
                       self.dtype, self.inner, self.scalar)

    def read(self, slots: np.ndarray) -> Column:
        return Column("tensor", gather_segments(self.arena, self.start[slots], self.nbytes[slots]),
                      self.nbytes[slots].copy(), self.length[slots].copy(), self.dtype, self.inner, self.scalar)


class KeyNotStored(KeyError):
    """A requested (key, field) has no value in the store."""


class RaggedStore:
    """Rows addressed by non-negative integer keys; per field, variable-length tensor rows or objects.

    ``put(keys, {field: Column})`` writes those fields of those rows (creating the rows, or
    overwriting the fields); ``get(keys, fields)`` returns one Column per field, rows in the
    order of ``keys``, and raises ``KeyNotStored`` naming the first missing (key, field);
    ``clear(keys)`` forgets rows. A field keeps the dtype, inner shape and scalar-ness of its
    first write; a later write that differs is refused with the field named.
    """

    def __init__(self, slots: int = 1024, *, arenas: HeapArenas | SharedArenas | None = None) -> None:
        self._arenas = arenas if arenas is not None else HeapArenas()
        self._slot_of = np.full(slots, -1, dtype=np.int64)   # key -> slot (-1: absent); keys are dense ints
        self._free = np.arange(slots - 1, -1, -1, dtype=np.int64)  # a stack: the top is _free[_nfree - 1]
        self._nfree = slots
        self._slots = slots
        self._tensors: dict[str, _TensorField] = {}
        self._objects: dict[str, np.ndarray] = {}
        self._object_set: dict[str, np.ndarray] = {}

    def __len__(self) -> int:
        return self._slots - self._nfree

    @property
    def fields(self) -> list[str]:
        return [*self._tensors, *self._objects]

    def nbytes(self) -> int:
        """Bytes held by tensor arenas and slot tables (object fields not counted)."""
        return sum(f.arena.nbytes + 3 * f.start.nbytes for f in self._tensors.values()) + self._slot_of.nbytes

    # ------------------------------------------------------------------ keys
    def _check_keys(self, keys) -> np.ndarray:
        keys = np.asarray(keys, dtype=np.int64).reshape(-1)
        if keys.size and keys.min() < 0:
            raise ConfigError("keys", "non-negative integers", int(keys.min()), "pass TransferQueue's global indexes")
        if np.unique(keys).size != keys.size:
            raise ConfigError("keys", "distinct keys in one call", "a repeated key", "write each row once per call")
        return keys

    def _slots_for_write(self, keys: np.ndarray) -> np.ndarray:
        if keys.size and keys.max() >= self._slot_of.size:
            size = self._slot_of.size
            while size <= keys.max():
                size *= 2
            self._slot_of = np.concatenate([self._slot_of, np.full(size - self._slot_of.size, -1, dtype=np.int64)])
        slots = self._slot_of[keys]
        new = np.nonzero(slots < 0)[0]
        if new.size > self._nfree:
            self._grow(self._slots + max(self._slots, new.size - self._nfree))
        slots[new] = self._free[self._nfree - new.size:self._nfree][::-1]
        self._nfree -= new.size
        self._slot_of[keys[new]] = slots[new]
        return slots

    def _grow(self, slots: int) -> None:
        free = np.empty(slots, dtype=np.int64)
        added = slots - self._slots
        free[:added] = np.arange(slots - 1, self._slots - 1, -1)
        free[added:added + self._nfree] = self._free[:self._nfree]
        self._free, self._nfree = free, self._nfree + added
        for f in self._tensors.values():
            f.grow_slots(slots)
        for name in self._objects:
            pad = slots - self._slots
            self._objects[name] = np.concatenate([self._objects[name], np.empty(pad, dtype=object)])
            self._object_set[name] = np.concatenate([self._object_set[name], np.zeros(pad, dtype=bool)])
        self._slots = slots

    def _slots_for_read(self, keys: np.ndarray) -> np.ndarray:
        inside = keys < self._slot_of.size
        slots = np.full(keys.size, -1, dtype=np.int64)
        slots[inside] = self._slot_of[keys[inside]]
        if (slots < 0).any():
            raise KeyNotStored(f"key {int(keys[np.argmax(slots < 0)])} is not stored")
        return slots

    # ------------------------------------------------------------ operations
    def check_put(self, keys: ArrayLike, columns: dict[str, Column]) -> np.ndarray:
        """Every check ``put`` makes, writing nothing; returns the keys as an array."""
        keys = self._check_keys(keys)
        for name, col in columns.items():
            col.check(name, keys.size)
            if col.kind == "tensor":
                f = self._tensors.get(name)
                if name in self._objects or (f is not None and (f.dtype, f.inner, f.scalar) != (col.dtype, col.inner, col.scalar)):
                    was = "objects" if f is None else f"{f.dtype} rows of inner shape {f.inner}" + (" (scalars)" if f.scalar else "")
                    raise ConfigError(f"field {name!r}", was, f"{col.dtype} rows of inner shape {col.inner}"
                                      + (" (scalars)" if col.scalar else ""),
                                      "write a field with one dtype and inner shape, or use a new field name")
            elif name in self._tensors:
                raise ConfigError(f"field {name!r}", "tensor rows", "objects", "use a new field name")
        return keys

    def put(self, keys: ArrayLike, columns: dict[str, Column]) -> None:
        keys = self.check_put(keys, columns)   # every check before any write: a refused put changes nothing
        slots = self._slots_for_write(keys)
        for name, col in columns.items():
            if col.kind == "tensor":
                f = self._tensors.get(name)
                if f is None:
                    f = self._tensors[name] = _TensorField(col.dtype, col.inner, col.scalar, self._slots, self._arenas)
                f.write(slots, col)
            else:
                if name not in self._objects:
                    self._objects[name] = np.empty(self._slots, dtype=object)
                    self._object_set[name] = np.zeros(self._slots, dtype=bool)
                self._objects[name][slots] = col.data
                self._object_set[name][slots] = True

    def reserve(self, keys: ArrayLike, columns: dict[str, Column]) -> tuple[dict[str, tuple[np.ndarray, int]], list[str]]:
        """Room in the arenas for a put's tensor columns, checked as ``put`` checks them (their
        ``data`` need only have the right size, e.g. ``np.broadcast_to(np.uint8(0), n)``): returns
        per tensor field (arena, offset) and the fields this call created. The caller writes each
        column's bytes at its offset, then calls ``put`` with columns whose data are those arena
        regions: they are recorded where they lie, without a copy (copied if a compaction has
        moved the field to another arena since). Until then the room is dead bytes."""
        self.check_put(keys, columns)
        room, created = {}, []
        for name, col in columns.items():
            if col.kind != "tensor":
                continue
            f = self._tensors.get(name)
            if f is None:
                f = self._tensors[name] = _TensorField(col.dtype, col.inner, col.scalar, self._slots, self._arenas)
                created.append(name)
            at = f.reserve(int(col.data.size))
            room[name] = (f.arena, at)
        return room, created

    def locate(self, keys: ArrayLike, fields: Sequence[str]) -> dict[str, Located | Column]:
        """Like ``get``, with tensor fields located (arena, starts) rather than copied out."""
        keys = np.asarray(keys, dtype=np.int64).reshape(-1)
        if keys.size and keys.min() < 0:
            raise ConfigError("keys", "non-negative integers", int(keys.min()), "pass TransferQueue's global indexes")
        slots = self._slots_for_read(keys)
        out = {}
        for name in fields:
            if name in self._tensors:
                f = self._tensors[name]
                missing = f.start[slots] < 0
                col = None if missing.any() else f.locate(slots)
            elif name in self._objects:
                missing = ~self._object_set[name][slots]
                col = None if missing.any() else Column("object", self._objects[name][slots])
            else:
                missing = np.ones(keys.size, dtype=bool)
                col = None
            if col is None:
                raise KeyNotStored(f"field {name!r} of key {int(keys[np.argmax(missing)])} is not stored")
            out[name] = col
        return out

    def get(self, keys: ArrayLike, fields: Sequence[str]) -> dict[str, Column]:
        """Rows of ``fields`` for ``keys``, in that order, copied out (``KeyNotStored`` names the first missing)."""
        out = self.locate(keys, fields)
        for name, at in out.items():
            if isinstance(at, Located):
                out[name] = Column("tensor", gather_segments(at.arena, at.starts, at.nbytes), at.nbytes, at.lengths,
                                   at.dtype, at.inner, at.scalar)
        return out

    def arenas_in_use(self) -> list[np.ndarray]:
        return [f.arena for f in self._tensors.values()]

    def release(self) -> None:
        """Hand every arena back to its provider (the store is not used after this)."""
        for f in self._tensors.values():
            self._arenas.release(f.arena)
        self._tensors = {}

    def held(self, keys: ArrayLike, field: str | None = None) -> np.ndarray:
        """Which of ``keys`` are stored (and, with ``field``, hold a value for it)."""
        keys = np.asarray(keys, dtype=np.int64).reshape(-1)
        slots = np.full(keys.size, -1, dtype=np.int64)
        inside = (keys >= 0) & (keys < self._slot_of.size)
        slots[inside] = self._slot_of[keys[inside]]
        out = slots >= 0
        if field is not None:
            has = self._tensors[field].start[slots[out]] >= 0 if field in self._tensors else (
                self._object_set[field][slots[out]] if field in self._objects else np.zeros(int(out.sum()), bool))
            out[out] = has
        return out

    def drop_field(self, name: str) -> None:
        """Forget a field no stored row holds (so a later put may give it another dtype)."""
        if self.held(np.nonzero(self._slot_of >= 0)[0], name).any():
            raise ConfigError(f"field {name!r}", "a field no stored row holds", "rows holding it",
                              "unset it on those rows first")
        f = self._tensors.pop(name, None)
        if f is not None:
            self._arenas.release(f.arena)
        self._objects.pop(name, None), self._object_set.pop(name, None)

    def unset(self, keys: ArrayLike, fields: Sequence[str]) -> None:
        """Forget ``fields`` of the stored rows of ``keys`` (the rows themselves stay)."""
        keys = np.asarray(keys, dtype=np.int64).reshape(-1)
        slots = self._slot_of[keys[self.held(keys)]]
        for name in fields:
            if name in self._tensors:
                self._tensors[name].drop(slots)
            elif name in self._objects:
                self._objects[name][slots] = None
                self._object_set[name][slots] = False

    def clear(self, keys: ArrayLike) -> int:
        """Forget the rows of ``keys`` (absent keys are ignored); returns how many were stored."""
        keys = np.unique(np.asarray(keys, dtype=np.int64).reshape(-1))   # a key named twice is freed once
        keys = keys[(keys >= 0) & (keys < self._slot_of.size)]
        slots = self._slot_of[keys]
        held = slots >= 0
        keys, slots = keys[held], slots[held]
        for f in self._tensors.values():
            f.drop(slots)
        for name in self._objects:
            self._objects[name][slots] = None
            self._object_set[name][slots] = False
        self._slot_of[keys] = -1
        self._free[self._nfree:self._nfree + slots.size] = slots
        self._nfree += slots.size
        return int(slots.size)

    # ------------------------------------------------------------------ state
    def state(self) -> dict:
        """Every stored row, packed (keys ascending; per field its rows' bytes, lengths and which
        keys hold it): numpy arrays, lists and strings, for a checkpoint."""
        keys = np.nonzero(self._slot_of >= 0)[0].astype(np.int64)
        slots = self._slot_of[keys]
        tensors = {}
        for name, f in self._tensors.items():
            held = f.start[slots] >= 0
            col = f.read(slots[held])
            tensors[name] = {"dtype": f.dtype, "inner": list(f.inner), "scalar": f.scalar, "held": held,
                             "data": col.data, "nbytes": col.nbytes, "lengths": col.lengths}
        objects = {name: {"held": self._object_set[name][slots], "values": list(vals[slots][self._object_set[name][slots]])}
                   for name, vals in self._objects.items()}
        return {"keys": keys, "tensors": tensors, "objects": objects}

    @classmethod
    def from_state(cls, state: dict, *, arenas: HeapArenas | SharedArenas | None = None) -> "RaggedStore":
        """A store holding what ``state()`` saved (the caller swaps it in: a failed load changes nothing)."""
        keys = np.asarray(state["keys"], dtype=np.int64)
        if keys.size and (keys.min() < 0 or np.unique(keys).size != keys.size):
            raise ConfigError("state['keys']", "distinct non-negative keys", "repeated or negative keys",
                              "load a state written by RaggedStore.state()")
        store = cls(slots=max(1024, int(keys.size)), arenas=arenas)
        try:
            store._fill(state, keys)
        except BaseException:
            store.release()        # arenas made for a state that did not load go back at once
            raise
        return store

    def _fill(self, state: dict, keys: np.ndarray) -> None:
        store = self
        if keys.size:
            store._slots_for_write(keys)                # every saved row, fields added below
        slots = store._slot_of[keys] if keys.size else np.empty(0, np.int64)
        for name, t in state["tensors"].items():
            held = np.asarray(t["held"], dtype=bool)
            col = Column("tensor", np.asarray(t["data"], dtype=np.uint8), np.asarray(t["nbytes"], np.int64),
                         np.asarray(t["lengths"], np.int64), t["dtype"], tuple(t["inner"]), bool(t["scalar"]))
            if held.shape != keys.shape:
                raise ConfigError(f"state['tensors'][{name!r}]", "rows matching the saved keys", f"{col.rows} rows",
                                  "load a state written by RaggedStore.state()")
            col.check(name, int(held.sum()), where=f"state['tensors'][{name!r}]")
            f = store._tensors[name] = _TensorField(col.dtype, col.inner, col.scalar, store._slots, self._arenas)
            f.write(slots[held], col)
        for name, o in state["objects"].items():
            held = np.asarray(o["held"], dtype=bool)
            if held.shape != keys.shape or len(o["values"]) != int(held.sum()):
                raise ConfigError(f"state['objects'][{name!r}]", "one value per saved key that holds it",
                                  f"{len(o['values'])} values", "load a state written by RaggedStore.state()")
            values = np.empty(int(held.sum()), dtype=object)
            values[:] = [None] * values.size
            for i, v in enumerate(o["values"]):
                values[i] = v
            store._objects[name] = np.empty(store._slots, dtype=object)
            store._object_set[name] = np.zeros(store._slots, dtype=bool)
            store._objects[name][slots[held]] = values
            store._object_set[name][slots[held]] = True
