"""A bounded queue of batched entries for on-policy and reuse-based training (IMPALA/SRL style).

Samples of ``T`` steps arrive one at a time (``put``); every ``batch_size`` of them form one
entry, stored *time-major* ``[T, B, ...]`` (or batch-major ``[B, T, ...]``) in preallocated
slots: each put is one strided copy per field into its column of the entry, so forming a batch
costs nothing at the end (SRL stacks all ``B`` samples when the last one arrives, on the thread
that receives data). ``get`` never waits for data and never copies: it returns views of the entry's slot.

Why leases: the trainer computes on those views while the receiving thread keeps putting. An
entry that leaves the queue (its reuses spent, or dropped on overflow) keeps its slot until
``lease_depth`` later gets have happened, so memory the trainer may still read is never
overwritten. The contract counts gets, not training steps: a consumer that keeps a served batch
across more than ``lease_depth - 1`` further gets (SRL's MAPPO prefetcher holds one; SRL's trainer
thread also gets and skips stale samples without a step) must copy it or raise ``lease_depth``.

Which entry is served and which is dropped is decided by :class:`ReuseOrder` (pure); staleness
is a version-lag window checked at ``get``. Every drop is counted in :meth:`stats`: nothing
accepted leaves without being counted as served, dropped on overflow, or dropped as stale.
Thread-safe: one lock, held for index updates and the per-put copy only.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from .errors import CapacityError, ClosedError, ConfigError, SpecError
from .reuse_order import ReuseOrder, check_rules

_CHUNK = 32  # slots allocated together; storage grows lazily up to the bound


@dataclass
class Entry:
    """One served entry. ``columns`` are views valid until ``lease_depth`` more gets (see module doc)."""

    columns: dict[str, Any]         # flat (dotted) names, in the first put's order
    reuses_left: int
    reuses: int                     # times served, this one included
    receive_time: float             # wall time the entry was formed (time.time())
    policy_version: int | None      # the oldest policy version among its samples (None: not given)
    order: int                      # insertion number: larger is fresher


@dataclass(frozen=True)
class _Field:
    kind: str                       # "array" | "none" | "object"
    shape: tuple[int, ...] = ()     # per-sample shape, time first
    dtype: Any = None


class EntryQueue:
    """Time-major batched entries, each served up to ``reuses`` times (see module doc).

    Args:
        max_entries: entries kept queued (formed, not yet spent); ``math.inf`` for no bound.
        batch_size: samples per entry; ``None`` = one sample per entry with no batch axis.
        reuses: times each entry is served before it leaves.
        serve / overflow: the rules of :class:`ReuseOrder`.
        max_version_lag: at ``get(current_version=v)``, entries whose oldest sample's policy version
            is below ``v - max_version_lag`` are dropped unserved (counted); ``None`` = no window.
        lease_depth: gets after which a departed entry's slot may be reused.
        time_major: ``[T, B, ...]`` (True) or ``[B, T, ...]`` entries.
    """

    def __init__(self, *, max_entries: float, batch_size: int | None = None, reuses: int = 1,
                 serve: str = "freshest", overflow: str = "drop_lowest", max_version_lag: float | None = None,
                 lease_depth: int = 2, time_major: bool = True, adopt: bool = False):
        check_rules(serve, overflow)
        if adopt and batch_size is not None:
            raise ConfigError("adopt", "False when batch_size is set", True,
                              "adopt=True keeps each put's own arrays as its entry: only for batch_size=None")
        if isinstance(max_entries, bool) or not isinstance(max_entries, (int, float)) or not (
                max_entries == math.inf or (max_entries >= 1 and float(max_entries).is_integer())):
            raise ConfigError("max_entries", "an integer >= 1 or math.inf", repr(max_entries),
                              "pass how many formed entries the queue may hold")
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int)
                                       or batch_size < 1):
            raise ConfigError("batch_size", "an integer >= 1 or None", repr(batch_size),
                              "pass the samples per entry (None: one sample, no batch axis)")
        if isinstance(reuses, bool) or not isinstance(reuses, int) or reuses < 1:
            raise ConfigError("reuses", "an integer >= 1", repr(reuses), "pass how often each entry is served")
        if max_version_lag is not None and not (isinstance(max_version_lag, (int, float)) and max_version_lag >= 0):
            raise ConfigError("max_version_lag", "a number >= 0 or None", repr(max_version_lag),
                              "pass the largest policy-version lag to train on (None: no limit)")
        if isinstance(lease_depth, bool) or not isinstance(lease_depth, int) or lease_depth < 0:
            raise ConfigError("lease_depth", "an integer >= 0", repr(lease_depth),
                              "pass 2 for a trainer with a one-step prefetcher, 1 without one")
        self.max_entries = max_entries
        self.batch_size, self.reuses = batch_size, reuses
        self.max_version_lag, self.lease_depth, self.time_major = max_version_lag, lease_depth, time_major
        # adopt: an entry of one sample keeps the arrays the caller put (handed over, not copied), as a
        # framework's own queue keeps the object; for samples that arrive already batched (SRL's
        # buffer_zero_copy stream) a copy into a slot would only cost bandwidth
        self.adopt = bool(adopt)
        self._order = ReuseOrder(serve, overflow)
        self._lock = threading.Lock()
        self._layout: dict[str, _Field] | None = None
        self._chunks: list[dict[str, np.ndarray]] = []
        self._views: dict[int, dict[str, np.ndarray]] = {}      # slot -> its array views
        self._objects: dict[int, dict[str, list]] = {}       # slot -> name -> per-sample Python objects
        self._free: list[int] = []
        self._next_slot = 0
        self._slot_of: dict[int, int] = {}                    # order -> slot, for queued entries
        self._owner: dict[int, int] = {}                      # slot -> order, the inverse
        self._info: dict[int, tuple[float, int | None, int]] = {}   # order -> (receive_time, version, reuses)
        self._leased: deque[int] = deque()                    # slots of the last served entries
        self._filling: int | None = None                      # slot being filled
        self._filled = 0
        self._filling_version: int | None = None
        self._next_order = 0
        self._closed = False
        self._counts = dict(samples_put=0, entries_formed=0, served=0, retired=0, dropped_overflow=0,
                            dropped_overflow_samples=0, dropped_stale=0, dropped_stale_samples=0, rejected=0)

    # ------------------------------------------------------------------ public
    def put(self, sample: Mapping[str, Any], *, policy_version: int | None = None) -> bool:
        """Store one sample (flat names -> ``[T, ...]`` arrays, ``None`` or other objects).
        Returns True when it completed an entry. Never blocks; with ``overflow='reject'`` a put
        that would overflow raises :class:`CapacityError` and stores nothing."""
        if not isinstance(sample, Mapping):
            raise SpecError("sample", "a mapping of field name -> array", type(sample).__name__,
                            "flatten nested samples first (conduit_core.nested.flatten)")
        with self._lock:
            if self._closed:
                raise ClosedError("EntryQueue.put: the queue is closed. Fix: create a new queue.")
            layout = self._layout if self._layout is not None else _layout_of(sample)
            cols = _check(sample, layout)
            per_entry = self.batch_size or 1
            completes = self._filled + 1 == per_entry
            if completes and self._order.overflow == "reject" and len(self._order) >= self.max_entries:
                self._counts["rejected"] += 1
                raise CapacityError(
                    f"EntryQueue.put: expected at most max_entries={self.max_entries} queued entries, the put would "
                    f"form entry {len(self._order) + 1}. Fix: get() entries faster, raise max_entries, or use "
                    "overflow='drop_lowest'/'drop_oldest' to drop (counted) instead of refusing.")
            if self._layout is None:
                self._layout = layout
            if self._filling is None:
                self._filling, self._filled, self._filling_version = self._take_slot(), 0, None
            self._write(self._filling, self._filled, cols)
            if policy_version is not None:
                v = int(policy_version)
                self._filling_version = v if self._filling_version is None else min(self._filling_version, v)
            self._filled += 1
            self._counts["samples_put"] += 1
            if not completes:
                return False
            order = self._next_order
            self._next_order += 1
            self._slot_of[order], self._owner[self._filling] = self._filling, order
            self._info[order] = (time.time(), self._filling_version, 0)
            self._order.add(order, self.reuses)
            self._filling, self._filled, self._filling_version = None, 0, None
            self._counts["entries_formed"] += 1
            while len(self._order) > self.max_entries:
                victim = self._order.victim()
                self._order.remove(victim)
                self._depart(victim)
                self._counts["dropped_overflow"] += 1
                self._counts["dropped_overflow_samples"] += per_entry
            return True

    def get(self, *, current_version: int | None = None) -> Entry | None:
        """The next entry by the serve rule, or None when none is ready. Never blocks."""
        with self._lock:
            if self._closed:
                raise ClosedError("EntryQueue.get: the queue is closed. Fix: create a new queue.")
            while True:
                nxt = self._order.peek()
                if nxt is None:
                    return None
                order, reuses_left = nxt
                self._order.remove(order)
                receive_time, version, reuses = self._info[order]
                if (current_version is not None and self.max_version_lag is not None and version is not None
                        and current_version - version > self.max_version_lag):
                    self._depart(order)
                    self._counts["dropped_stale"] += 1
                    self._counts["dropped_stale_samples"] += self.batch_size or 1
                    continue
                break
            slot = self._slot_of[order]
            reuses_left, reuses = reuses_left - 1, reuses + 1
            self._info[order] = (receive_time, version, reuses)
            self._lease(slot)
            if reuses_left > 0:
                self._order.add(order, reuses_left)
            else:
                self._depart(order)
                self._counts["retired"] += 1
            self._counts["served"] += 1
            return Entry(columns=self._view(slot), reuses_left=reuses_left, reuses=reuses,
                         receive_time=receive_time, policy_version=version, order=order)

    def __contains__(self, order: int) -> bool:
        """Whether the entry of this ``order`` is still queued (formed, reuses left, not dropped)."""
        with self._lock:
            return order in self._order

    def qsize(self) -> int:
        """Entries queued now (formed and with reuses left)."""
        with self._lock:
            return len(self._order)

    def empty(self) -> bool:
        return self.qsize() == 0

    def pending_samples(self) -> int:
        """Samples put into the entry being formed (not yet servable)."""
        with self._lock:
            return self._filled if self._filling is not None else 0

    def stats(self) -> dict[str, int]:
        """Counters. Samples: ``samples_put = entries_formed * batch + pending_samples``; entries:
        ``entries_formed = retired + queued + dropped_overflow + dropped_stale`` (``retired``: served all
        their reuses); ``served`` counts gets (an entry is served up to ``reuses`` times). An entry dropped
        on overflow may have been served before (drop-lowest picks the one with the fewest reuses left)."""
        with self._lock:
            return dict(self._counts, queued=len(self._order),
                        pending_samples=self._filled if self._filling is not None else 0)

    @property
    def nbytes(self) -> int:
        with self._lock:
            if self.adopt:
                return sum(a.nbytes for views in self._views.values() for a in views.values())
            return sum(a.nbytes for chunk in self._chunks for a in chunk.values())

    def close(self) -> None:
        """Release the storage. Views handed out before stay valid (numpy keeps them alive)."""
        with self._lock:
            self._closed = True
            self._chunks, self._objects, self._views = [], {}, {}
            self._order, self._slot_of, self._owner, self._info = ReuseOrder(self._order.serve, self._order.overflow), \
                {}, {}, {}

    # ---------------------------------------------------------------- pickling
    def __getstate__(self) -> dict:
        """Queued entries (copied, in serve order), the partial entry and the counters: what
        SRL's ``save_buffer_on_exit`` pickles. Leases are not kept (no trainer holds views)."""
        with self._lock:
            if self._closed:
                raise ClosedError("EntryQueue: a closed queue has no data to save. Fix: save it before close().")
            queued = [(order, r, self._info[order], self._saved(self._slot_of[order]))
                      for order, r in self._order.orders()]
            partial = None
            if self._filling is not None and self._filled:
                partial = (self._filled, self._filling_version, self._saved(self._filling))
            cfg = dict(max_entries=self.max_entries, batch_size=self.batch_size, reuses=self.reuses,
                       serve=self._order.serve, overflow=self._order.overflow,
                       max_version_lag=self.max_version_lag, lease_depth=self.lease_depth, time_major=self.time_major,
                       adopt=self.adopt)
            return dict(config=cfg, layout=self._layout, queued=queued, partial=partial,
                        next_order=self._next_order, counts=dict(self._counts), closed=self._closed)

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state["config"])
        self._layout = state["layout"]
        for order, reuses_left, info, cols in state["queued"]:
            slot = self._take_slot()
            self._fill_from(slot, cols)
            self._slot_of[order], self._owner[slot], self._info[order] = slot, order, info
            self._order.add(order, reuses_left)
        if state["partial"] is not None:
            filled, version, cols = state["partial"]
            self._filling = self._take_slot()
            self._fill_from(self._filling, cols)
            self._filled, self._filling_version = filled, version
        self._next_order, self._counts, self._closed = state["next_order"], state["counts"], state["closed"]

    # ---------------------------------------------------------------- internals
    def _bound(self) -> float:
        # queued (+1 formed before the overflow drop) + the one being filled + leased
        return self.max_entries + 2 + self.lease_depth

    def _take_slot(self) -> int:
        if self._free:
            return self._free.pop()
        slot = self._next_slot
        if slot >= self._bound():  # pragma: no cover - the accounting above makes this unreachable
            raise RuntimeError(f"EntryQueue: slot {slot} beyond the bound {self._bound()}")
        self._next_slot += 1
        if not self.adopt and slot // _CHUNK >= len(self._chunks):
            self._chunks.append(self._allocate(int(min(_CHUNK, self._bound() - slot))))
        return slot

    def _allocate(self, n: int) -> dict[str, np.ndarray]:
        per_entry = self.batch_size
        out = {}
        for name, f in self._layout.items():
            if f.kind != "array":
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

    def _cell(self, slot: int) -> tuple[dict[str, np.ndarray], int]:
        return self._chunks[slot // _CHUNK], slot % _CHUNK

    def _slot_views(self, slot: int) -> dict[str, np.ndarray]:
        """The slot's array views (cached: a slot's memory never moves)."""
        views = self._views.get(slot)
        if views is None:
            chunk, i = self._cell(slot)
            views = self._views[slot] = {name: a[i] for name, a in chunk.items()}
        return views

    def _write(self, slot: int, b: int, cols: Mapping[str, Any]) -> None:
        if self.adopt:
            self._views[slot] = {name: _as_array(cols[name]) for name, f in self._layout.items() if f.kind == "array"}
            for name, f in self._layout.items():
                if f.kind == "object":
                    self._objects.setdefault(slot, {})[name] = [cols[name]]
            return
        views = self._slot_views(slot)
        for name, f in self._layout.items():
            value = cols[name]
            if f.kind == "array":
                dst = views[name]
                if self.batch_size is None:
                    dst[...] = value
                elif self.time_major and f.shape:
                    dst[:, b] = value
                else:
                    dst[b] = value
            elif f.kind == "object":
                self._objects.setdefault(slot, {}).setdefault(name, [None] * (self.batch_size or 1))[b] = value

    def _saved(self, slot: int) -> dict[str, Any]:
        views = self._slot_views(slot)
        objects = self._objects.get(slot, {})
        return {name: (views[name].copy() if f.kind == "array" else list(objects.get(name, [])))
                for name, f in self._layout.items() if f.kind != "none"}

    def _fill_from(self, slot: int, saved: Mapping[str, Any]) -> None:
        if self.adopt:
            self._views[slot] = {name: saved[name] for name, f in self._layout.items() if f.kind == "array"}
        views = self._slot_views(slot)
        for name, f in self._layout.items():
            if f.kind == "array" and not self.adopt:
                views[name][...] = saved[name]
            elif f.kind == "object" and saved[name]:
                self._objects.setdefault(slot, {})[name] = list(saved[name])

    def _view(self, slot: int) -> dict[str, Any]:
        views = self._slot_views(slot)
        out = {}
        for name, f in self._layout.items():
            if f.kind == "array":
                out[name] = views[name]
            elif f.kind == "none":
                out[name] = None
            else:
                objs = self._objects.get(slot, {}).get(name, [None])
                if self.batch_size is None:
                    out[name] = objs[0]
                else:
                    out[name] = _stack_objects(objs, axis=1 if self.time_major else 0)
        return out

    def _lease(self, slot: int) -> None:
        if slot in self._leased:
            self._leased.remove(slot)
        self._leased.append(slot)
        while len(self._leased) > self.lease_depth:
            self._release_if_free(self._leased.popleft())

    def _depart(self, order: int) -> None:
        slot = self._slot_of.pop(order)
        del self._owner[slot], self._info[order]
        self._release_if_free(slot)

    def _release_if_free(self, slot: int) -> None:
        if slot in self._leased or slot == self._filling or slot in self._owner:
            return
        self._objects.pop(slot, None)
        if self.adopt:
            self._views.pop(slot, None)  # the adopted arrays go with their entry
        self._free.append(slot)


def _layout_of(sample: Mapping[str, Any]) -> dict[str, _Field]:
    layout = {}
    for name, value in sample.items():
        if not isinstance(name, str) or not name:
            raise SpecError("field name", "a non-empty string", repr(name), "name every field")
        if value is None:
            layout[name] = _Field("none")
            continue
        arr = _as_array(value)
        if arr is None or arr.dtype.kind in "OUSV":
            layout[name] = _Field("object")
        else:
            layout[name] = _Field("array", tuple(arr.shape), arr.dtype)
    return layout


def _check(sample: Mapping[str, Any], layout: Mapping[str, _Field]) -> dict[str, Any]:
    if sample.keys() == layout.keys():  # the common case: exact arrays of the first sample's shape and dtype
        for name, f in layout.items():
            v = sample[name]
            if f.kind == "array":
                if type(v) is not np.ndarray or v.shape != f.shape or v.dtype != f.dtype:
                    break
            elif f.kind == "none" and v is not None:
                break
        else:
            return sample
    if set(sample) != set(layout):
        missing, extra = sorted(set(layout) - set(sample)), sorted(set(sample) - set(layout))
        raise SpecError("sample fields", sorted(layout), f"missing {missing}, extra {extra}",
                        "put samples with the same fields as the first one")
    cols = {}
    for name, f in layout.items():
        value = sample[name]
        if f.kind == "none":
            if value is not None:
                raise SpecError(name, "None (as in the first sample)", type(value).__name__,
                                "keep a field None in every sample, or set it in the first one too")
            cols[name] = None
        elif f.kind == "object":
            cols[name] = value
        else:
            if value is None:
                cols[name] = 0  # as SRL's aggregation fills a missing array with zeros
                continue
            arr = _as_array(value)
            if arr is None or tuple(arr.shape) != f.shape:
                raise SpecError(f"{name}.shape", f.shape, None if arr is None else tuple(arr.shape),
                                "put samples of the same length T and per-step shape as the first one")
            if not np.can_cast(arr.dtype, f.dtype, casting="same_kind"):
                raise SpecError(f"{name}.dtype", str(f.dtype), str(arr.dtype),
                                "put samples with the dtype of the first one")
            cols[name] = arr
    return cols


def _as_array(value: Any) -> np.ndarray | None:
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor, without importing torch here
        return value.detach().cpu().numpy()
    if isinstance(value, (int, float, bool, np.generic)):
        return np.asarray(value)
    return None


def _stack_objects(objs: list, axis: int) -> Any:
    arrays = [_as_array(o) for o in objs]
    if all(a is not None for a in arrays):
        return np.stack(arrays, axis=axis if arrays[0].ndim >= 1 else 0)
    return list(objs)

