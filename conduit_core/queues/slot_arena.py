"""Preallocated slots for an :class:`~conduit_core.queues.entry_queue.EntryQueue`'s entries, and the
leases that keep served ones intact.

Why slots: each put is one strided copy per field into its column of the entry's slot, so a batch
is formed as its samples arrive and ``get`` hands out views without copying (SRL stacks all ``B``
samples when the last one arrives, on the thread that receives data). Slots are allocated
``_CHUNK`` at a time, lazily, up to a bound the owner computes (so memory follows what is used,
never more than the bound).

Why leases: the trainer computes on served views while puts go on, so a slot is reused only when
nobody can still read it: neither its owner (a queued entry, or the one being filled: from
:meth:`SlotArena.take` to :meth:`SlotArena.release`) nor one of the last ``lease_depth`` serves
(:meth:`SlotArena.lease`). That is the whole contract between the two; which entry is served or
dropped is the queue's business (:class:`~conduit_core.queues.reuse_order.ReuseOrder`), what a sample may
be is :mod:`conduit_core.queues.sample_layout`'s. No lock: the owner calls under its own, except that
:meth:`write`/:meth:`write_many`/:meth:`view` of a slot the writer holds (taken, not yet an entry
anyone is served) may run beside the other calls: they touch only that slot's keys of the per-slot
dicts (single dict operations) and its memory, never the free list or the leases.

Missing values (a sample that leaves an array field ``None``): the slot's memory for it is zeroed
and the field is served ``None`` when no sample of the entry gave it, the way SRL's
``recursive_aggregate`` batches ``None`` (all ``None``: ``None``; some: zeros for the others).
Each slot counts the samples written to it and, per array field, the ones that left it out
(``_written``, ``_absent``: the common put pays one count, not one per field), reset when it is taken.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Mapping

import numpy as np

from .sample_layout import FieldLayout, WithMissing, as_array, stack_objects

_CHUNK = 32  # slots allocated together; storage grows lazily up to the bound


class SlotArena:
    """One slot per entry, shaped by one sample layout.

    Args:
        bound: the most slots ever held at once (the owner's queued + filling + leased entries).
        batch_size: samples per entry; ``None`` = one sample per entry with no batch axis.
        time_major: entries ``[T, B, ...]`` (True) or ``[B, T, ...]``.
        adopt: an entry keeps the arrays it was written with (no slot memory; ``batch_size=None`` only).
        lease_depth: how many of the last served slots stay unreused.

    Contract: :meth:`set_layout` once, before the first :meth:`take`; a slot from :meth:`take` is
    the caller's until :meth:`release`, and is reused only once released and out of the last
    ``lease_depth`` :meth:`lease` calls. :meth:`view` returns views into the slot's memory, valid
    as long as that holds.
    """

    def __init__(self, *, bound: float, batch_size: int | None, time_major: bool, adopt: bool, lease_depth: int):
        self.bound = bound
        self.batch_size, self.time_major, self.adopt, self.lease_depth = batch_size, time_major, adopt, lease_depth
        self.layout: dict[str, FieldLayout] | None = None
        self._chunks: list[dict[str, np.ndarray]] = []
        self._views: dict[int, dict[str, np.ndarray]] = {}      # slot -> its array views
        self._bm_views: dict[int, dict[str, np.ndarray]] = {}   # slot -> the same, batch axis first
        self._objects: dict[int, dict[str, list]] = {}       # slot -> name -> per-sample Python objects
        self._written: dict[int, int] = {}                   # slot -> samples written to it
        self._absent: dict[int, dict[str, int]] = {}         # slot -> array field -> samples that left it out
        self._free: list[int] = []
        self._next_slot = 0
        self._held: set[int] = set()                          # slots taken and not released
        self._leased: deque[int] = deque()                    # slots of the last served entries

    def set_layout(self, layout: dict[str, FieldLayout] | None) -> None:
        """The layout every slot is shaped by (learned from the first sample, so not known at
        construction), or a wider one (``sample_layout.widened``: fields ``None`` so far now
        arrays, new names as ``None`` fields): storage for the new array fields is added to every
        allocated slot, zeroed, so the samples written before count as missing them."""
        old, self.layout = self.layout, layout
        if old is None or self.adopt:
            return   # (an adopting slot serves None for a field its sample's arrays lack)
        grown = [name for name, f in layout.items() if f.kind == "array"
                 and (name not in old or old[name].kind != "array")]
        if not grown:
            return
        for i, chunk in enumerate(self._chunks):   # chunk i holds slots i*_CHUNK.. (as take() allocated it)
            chunk.update(self._allocate(int(min(_CHUNK, self.bound - i * _CHUNK)), grown))
        for slot, n in self._written.items():     # every sample written so far left the new fields out
            if n:
                absent = self._absent.setdefault(slot, {})
                for name in grown:
                    absent[name] = n
        self._views.clear()      # rebuilt with the new fields on next use (served columns keep theirs)
        self._bm_views.clear()

    # ------------------------------------------------------------- ownership
    def take(self) -> int:
        """A free slot (a released one first, else the next new one), held until :meth:`release`."""
        if self._free:
            slot = self._free.pop()
        else:
            slot = self._next_slot
            if slot >= self.bound:  # pragma: no cover - the owner's bound makes this unreachable
                raise RuntimeError(f"EntryQueue: slot {slot} beyond the bound {self.bound}")
            self._next_slot += 1
            if not self.adopt and slot // _CHUNK >= len(self._chunks):
                self._chunks.append(self._allocate(int(min(_CHUNK, self.bound - slot))))
        self._held.add(slot)
        self._written[slot] = 0
        self._absent.pop(slot, None)
        return slot

    def release(self, slot: int) -> None:
        """The owner is done with ``slot`` (its entry left); it is free once no lease holds it."""
        self._held.remove(slot)
        self._free_if_unused(slot)

    def lease(self, slot: int) -> None:
        """``slot`` was served: it stays unreused until ``lease_depth`` later leases (a slot served
        again moves to the newest place). The lease that ages out frees its slot if released."""
        if slot in self._leased:
            self._leased.remove(slot)
        self._leased.append(slot)
        while len(self._leased) > self.lease_depth:
            self._free_if_unused(self._leased.popleft())

    # ------------------------------------------------------------- data
    def write(self, slot: int, b: int, cols: Mapping[str, Any]) -> None:
        """Sample ``b`` of the slot's entry (``cols`` conformed to the layout): one copy per array field."""
        if self.adopt:
            self._views[slot] = {name: as_array(cols[name]) for name, f in self.layout.items()
                                 if f.kind == "array" and cols[name] is not None}
            for name, f in self.layout.items():
                if f.kind == "object":
                    self._objects.setdefault(slot, {})[name] = [cols[name]]
            return
        views = self._slot_views(slot)
        self._written[slot] += 1
        for name, f in self.layout.items():
            value = cols[name]
            if f.kind == "array":
                dst = views[name]
                if value is None:    # missing from this sample: zeros, in case another sample gives it
                    value = 0
                    absent = self._absent.setdefault(slot, {})
                    absent[name] = absent.get(name, 0) + 1
                if self.batch_size is None:
                    dst[...] = value
                elif self.time_major and f.shape:
                    dst[:, b] = value
                else:
                    dst[b] = value
            elif f.kind == "object":
                self._objects.setdefault(slot, {}).setdefault(name, [None] * (self.batch_size or 1))[b] = value

    def write_many(self, slot: int, b: int, group: list[Mapping[str, Any]]) -> None:
        """Samples ``b, b+1, ...`` of the slot's entry (each conformed to the layout), in one copy per
        array field: the group's arrays stacked straight into the entry's columns ``b:b+len(group)``."""
        if len(group) == 1 or self.adopt or self.batch_size is None:
            for k, cols in enumerate(group):
                self.write(slot, b + k, cols)
            return
        views, m = self._batch_views(slot), len(group)
        self._written[slot] += m
        gappy = any(type(cols) is WithMissing for cols in group)   # (conform marks the samples with a None)
        for name, f in self.layout.items():
            if f.kind == "array":
                values = [cols[name] for cols in group]
                if gappy and any(v is None for v in values):   # missing from some: zeros there
                    zeros = np.zeros(f.shape, f.dtype)
                    absent = self._absent.setdefault(slot, {})
                    absent[name] = absent.get(name, 0) + sum(v is None for v in values)
                    values = [zeros if v is None else v for v in values]
                # numpy assigns the list of same-shaped arrays in one call (np.stack(out=) costs twice
                # as much per field as 16 single assignments: it is Python per array)
                views[name][b:b + m] = values
            elif f.kind == "object":
                objs = self._objects.setdefault(slot, {}).setdefault(name, [None] * self.batch_size)
                objs[b:b + m] = [cols[name] for cols in group]

    def view(self, slot: int) -> dict[str, Any]:
        """The entry's columns in layout order: array views (no copy), ``None`` (a ``None`` field, or
        an array field no sample of the entry gave), or its objects (stacked on the batch axis when
        they are arrays)."""
        views = self._slot_views(slot)
        absent, written = self._absent.get(slot), self._written.get(slot, 0)
        out = {}
        for name, f in self.layout.items():
            if f.kind == "array":
                if self.adopt:
                    out[name] = views.get(name)
                else:   # None when every sample written left it out
                    out[name] = None if absent and absent.get(name, 0) >= written else views[name]
            elif f.kind == "none":
                out[name] = None
            else:
                objs = self._objects.get(slot, {}).get(name, [None])
                if self.batch_size is None:
                    out[name] = objs[0]
                else:
                    out[name] = stack_objects(objs, axis=1 if self.time_major else 0)
        return out

    def saved(self, slot: int) -> dict[str, Any]:
        """A copy of the slot's data (arrays and per-sample objects, not ``None`` fields; ``None`` for an
        array field no sample gave), for pickling."""
        columns = self.view(slot)
        objects = self._objects.get(slot, {})
        return {name: ((None if columns[name] is None else columns[name].copy()) if f.kind == "array"
                       else list(objects.get(name, [])))
                for name, f in self.layout.items() if f.kind != "none"}

    def fill_from(self, slot: int, saved: Mapping[str, Any]) -> None:
        """Restore what :meth:`saved` returned into ``slot`` (an adopting arena keeps the arrays)."""
        if self.adopt:
            self._views[slot] = {name: saved[name] for name, f in self.layout.items()
                                 if f.kind == "array" and saved.get(name) is not None}
        views = self._slot_views(slot)
        self._written[slot] = 1   # what was saved counts as one sample: left out (None) or given
        for name, f in self.layout.items():
            if f.kind == "array" and not self.adopt:
                if saved.get(name) is None:   # no sample gave it (or saved before the field was learned)
                    views[name][...] = 0
                    self._absent.setdefault(slot, {})[name] = 1
                    continue
                views[name][...] = saved[name]
            elif f.kind == "object" and saved[name]:
                self._objects.setdefault(slot, {})[name] = list(saved[name])

    @property
    def nbytes(self) -> int:
        """Array memory held: every allocated chunk, or (adopting) the adopted arrays."""
        if self.adopt:
            return sum(a.nbytes for views in self._views.values() for a in views.values())
        return sum(a.nbytes for chunk in self._chunks for a in chunk.values())

    def close(self) -> None:
        """Drop the storage. Views handed out before stay valid (numpy keeps them alive)."""
        self._chunks, self._objects, self._views, self._bm_views = [], {}, {}, {}
        self._written, self._absent = {}, {}

    # ------------------------------------------------------------- internals
    def _free_if_unused(self, slot: int) -> None:
        if slot in self._leased or slot in self._held:
            return
        self._objects.pop(slot, None)
        if self.adopt:
            self._views.pop(slot, None)  # the adopted arrays go with their entry
        self._free.append(slot)

    def _allocate(self, n: int, names=None) -> dict[str, np.ndarray]:
        per_entry = self.batch_size
        out = {}
        for name, f in self.layout.items():
            if f.kind != "array" or (names is not None and name not in names):
                continue
            t, rest = f.shape[:1], f.shape[1:]
            if per_entry is None:
                shape = (n, *f.shape)
            elif self.time_major and t:
                shape = (n, *t, per_entry, *rest)
            else:
                shape = (n, per_entry, *f.shape)
            out[name] = np.zeros(shape, dtype=f.dtype)
        return out

    def _batch_views(self, slot: int) -> dict[str, np.ndarray]:
        """The slot's array views batch axis first (``[B, T, ...]`` views of a time-major slot), cached."""
        views = self._bm_views.get(slot)
        if views is None:
            views = self._bm_views[slot] = {
                name: (np.moveaxis(v, 1, 0) if self.time_major and self.layout[name].shape else v)
                for name, v in self._slot_views(slot).items()}
        return views

    def _slot_views(self, slot: int) -> dict[str, np.ndarray]:
        """The slot's array views (cached: a slot's memory never moves)."""
        views = self._views.get(slot)
        if views is None:
            chunk, i = self._chunks[slot // _CHUNK], slot % _CHUNK
            views = self._views[slot] = {name: a[i] for name, a in chunk.items()}
        return views
