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
Thread-safe, with two locks so that ``get`` (the training thread) never waits behind a put's copies:
puts are serialized by a put lock and copy into the slot being filled (which no get can see)
outside the state lock; the state lock is held only for index updates (taking a slot, counting,
queueing a formed entry, the overflow drop) and for ``get``'s own. The order of formed entries and
gets on the state lock is the order of the outcome, exactly as with one lock held for the whole put.

``prepare`` (optional): an object built once per entry when it forms, on the putting thread and
outside the state lock (a framework's batch object over the entry's views), handed back as
``Entry.prepared`` on every serve of that entry, so the serving thread only hands it over.

Three parts, each with its own module: what a sample may be (:mod:`~conduit_core.queues.sample_layout`,
learned from the first put), where entries live and when a slot may be reused
(:class:`~conduit_core.queues.slot_arena.SlotArena`: slots and leases), and which entry is served or
dropped (:class:`ReuseOrder`). This module composes them: the counters, the staleness window,
the lock and pickling.

``None`` batches as in SRL's ``recursive_aggregate``: an array field every sample of an entry left
``None`` is served ``None``, zeros where only some did; a field ``None`` so far is learned from the
first sample that gives it, and a put's ``new_fields`` adds the names a grown nesting brings.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import CapacityError, ClosedError, ConfigError, SpecError
from .queue_args import check_put_many_args, check_queue_args
from .reuse_order import ReuseOrder
from .sample_layout import FieldLayout, check_field_names, conform, layout_for
from .slot_arena import SlotArena

# a queue pickled before the layout had a module of its own names its fields' class by this name
_Field = FieldLayout


@dataclass
class Entry:
    """One served entry. ``columns`` are views valid until ``lease_depth`` more gets (see module doc)."""

    columns: dict[str, Any]         # flat (dotted) names, in the first put's order
    reuses_left: int
    reuses: int                     # times served, this one included
    receive_time: float             # wall time the entry was formed (time.time())
    policy_version: int | None      # the oldest policy version among its samples (None: not given)
    order: int                      # insertion number: larger is fresher
    prepared: Any = None            # what ``prepare`` built for this entry when it formed (None: no prepare)


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
        prepare: called once per entry as it forms, with the :class:`Entry` its first get would see
            before its counters move (``reuses_left=reuses``, ``reuses=0``); its result is ``Entry.prepared``
            on every serve. Not pickled: set it again with :meth:`set_prepare` after unpickling.
    """

    def __init__(self, *, max_entries: float, batch_size: int | None = None, reuses: int = 1,
                 serve: str = "freshest", overflow: str = "drop_lowest", max_version_lag: float | None = None,
                 lease_depth: int = 2, time_major: bool = True, adopt: bool = False,
                 prepare: Callable[[Entry], Any] | None = None):
        check_queue_args(serve=serve, overflow=overflow, max_entries=max_entries, batch_size=batch_size,
                         reuses=reuses, max_version_lag=max_version_lag, lease_depth=lease_depth, adopt=adopt,
                         prepare=prepare)
        self.max_entries = max_entries
        self.batch_size, self.reuses = batch_size, reuses
        self.max_version_lag, self.lease_depth, self.time_major = max_version_lag, lease_depth, time_major
        # adopt: an entry of one sample keeps the arrays the caller put (handed over, not copied), as a
        # framework's own queue keeps the object; for samples that arrive already batched (SRL's
        # buffer_zero_copy stream) a copy into a slot would only cost bandwidth
        self.adopt = bool(adopt)
        self._order = ReuseOrder(serve, overflow)
        self._lock = threading.Lock()       # state: indices, counters (short holds; get takes only this one)
        self._formed = threading.Condition(self._lock)   # notified when an entry forms (or the queue closes)
        self._put_lock = threading.Lock()   # puts, one at a time: layout, the slot being filled (taken first)
        self._prepare = prepare
        self._ready: dict[int, tuple[dict, Any]] = {}         # order -> (columns, prepared), built as it formed
        self._layout: dict[str, FieldLayout] | None = None
        self._none_fields: tuple[str, ...] = ()               # the layout's "none" fields (a put may give one)
        # slots: queued (+1 formed before the overflow drop) + the one being filled + leased
        self._arena = SlotArena(bound=max_entries + 2 + lease_depth, batch_size=batch_size, time_major=time_major,
                                adopt=self.adopt, lease_depth=lease_depth)
        self._slot_of: dict[int, int] = {}                    # order -> slot, for queued entries
        self._info: dict[int, tuple[float, int | None, int]] = {}   # order -> (receive_time, version, reuses)
        self._filling: int | None = None                      # slot being filled
        self._filled = 0
        self._filling_version: int | None = None
        self._next_order = 0
        self._closed = False
        self._counts = dict(samples_put=0, entries_formed=0, served=0, retired=0, dropped_overflow=0,
                            dropped_overflow_samples=0, dropped_stale=0, dropped_stale_samples=0, rejected=0)

    # ------------------------------------------------------------------ public
    def put(self, sample: Mapping[str, Any], *, policy_version: int | None = None,
            new_fields: Sequence[str] = ()) -> bool:
        """Store one sample (flat names -> ``[T, ...]`` arrays, ``None`` or other objects).
        Returns True when it completed an entry. Never blocks; with ``overflow='reject'`` a put
        that would overflow raises :class:`CapacityError` and stores nothing. ``new_fields``: names
        the sample brings that earlier ones did not have (an adapter whose nesting grew: SRL's
        ``info=None``, then a ``NamedArray``); earlier samples left them out. A refused put adds none."""
        if not isinstance(sample, Mapping):
            raise SpecError("sample", "a mapping of field name -> array", type(sample).__name__,
                            "flatten nested samples first (conduit_core.schema.nested.flatten)")
        with self._put_lock:
            if self._closed:
                raise ClosedError("EntryQueue.put: the queue is closed. Fix: create a new queue.")
            layout = self._layout_for([sample], new_fields)
            cols = conform(sample, layout)
            with self._lock:
                if (self._filled + 1 == (self.batch_size or 1) and self._order.overflow == "reject"
                        and len(self._order) >= self.max_entries):
                    self._counts["rejected"] += 1
                    raise CapacityError(
                        f"EntryQueue.put: expected at most max_entries={self.max_entries} queued entries, the put "
                        f"would form entry {len(self._order) + 1}. Fix: get() entries faster, raise max_entries, or "
                        "use overflow='drop_lowest'/'drop_oldest' to drop (counted) instead of refusing.")
            return self._store(layout, [cols], None if policy_version is None else [int(policy_version)]) == 1

    def put_many(self, samples: Sequence[Mapping[str, Any]], *,
                 policy_versions: Sequence[int | None] | None = None, new_fields: Sequence[str] = ()) -> int:
        """Store ``samples`` in order, as that many :meth:`put` calls would (the same entries, overflow
        drops, counters and serve order), with one copy per array field per entry the group writes
        into instead of one per sample. Returns the entries the group formed.

        All or nothing: every sample is checked before anything is written, and a bad one raises
        :class:`SpecError` naming ``samples[i].<field>`` with the queue unchanged. With
        ``overflow='reject'`` the group is refused whole (:class:`CapacityError`, ``rejected`` counts
        its samples) when any of its puts would be refused; single puts would keep the ones before."""
        versions = check_put_many_args(samples, policy_versions)
        n = len(samples)
        if n == 0:
            return 0
        with self._put_lock:
            if self._closed:
                raise ClosedError("EntryQueue.put_many: the queue is closed. Fix: create a new queue.")
            layout = self._layout_for(samples, new_fields)
            cols = []
            for i, sample in enumerate(samples):
                try:
                    cols.append(conform(sample, layout))
                except SpecError as e:
                    raise SpecError(f"samples[{i}].{e.field}", e.expected, e.actual, e.fix) from None
            forms = (self._filled + n) // (self.batch_size or 1)
            with self._lock:
                if self._order.overflow == "reject" and len(self._order) + forms > self.max_entries:
                    self._counts["rejected"] += n
                    raise CapacityError(
                        f"EntryQueue.put_many: expected at most max_entries={self.max_entries} queued entries, the "
                        f"group of {n} would form {forms} more on top of {len(self._order)} (nothing was stored). "
                        "Fix: get() entries faster, put smaller groups, raise max_entries, or use "
                        "overflow='drop_lowest'/'drop_oldest' to drop (counted) instead of refusing.")
            return self._store(layout, cols, versions)

    def _store(self, layout: dict[str, FieldLayout], cols: list, versions: list | None) -> int:
        """Write conformed samples in order (put lock held): copies into the slot being filled outside
        the state lock (no get sees that slot), indices and counters under it. Returns entries formed."""
        per_entry, n, i, forms = self.batch_size or 1, len(cols), 0, 0
        if self._layout is not layout:   # the first sample's, or a wider one (a field None so far given)
            self._set_layout(layout)
        while i < n:   # one segment per entry the group writes into
            if self._filling is None:
                with self._lock:
                    self._filling, self._filled, self._filling_version = self._arena.take(), 0, None
            m = min(per_entry - self._filled, n - i)
            self._arena.write_many(self._filling, self._filled, cols[i:i + m])
            for v in (versions[i:i + m] if versions is not None else ()):
                if v is not None:
                    self._filling_version = v if self._filling_version is None else min(self._filling_version, v)
            with self._lock:
                self._filled += m
                self._counts["samples_put"] += m
            i += m
            if self._filled == per_entry:
                self._form(per_entry)
                forms += 1
        return forms

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
            self._arena.lease(slot)
            columns, prepared = self._ready[order]
            if reuses_left > 0:
                self._order.add(order, reuses_left)
            else:
                self._depart(order)
                self._counts["retired"] += 1
            self._counts["served"] += 1
            return Entry(columns=columns, reuses_left=reuses_left, reuses=reuses,
                         receive_time=receive_time, policy_version=version, order=order,
                         prepared=prepared)

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

    def wait_nonempty(self, timeout: float) -> bool:
        """Whether an entry is queued, waiting up to ``timeout`` seconds for one to form when none is:
        a consumer thread wakes when a put forms an entry, not at its next poll. Returns at once
        when one is queued (or the queue is closed)."""
        with self._formed:
            if not self._order and not self._closed and timeout > 0:
                self._formed.wait_for(lambda: len(self._order) > 0 or self._closed, timeout)
            return len(self._order) > 0

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
        with self._put_lock, self._lock:
            return self._arena.nbytes

    def set_prepare(self, prepare: Callable[[Entry], Any] | None) -> None:
        """Set (or clear) ``prepare`` and build its object for every queued entry now (an unpickled
        queue has none: ``prepare`` is not pickled)."""
        if prepare is not None and not callable(prepare):
            raise ConfigError("prepare", "a callable (Entry -> object) or None", repr(prepare)[:80],
                              "pass a function that builds the object each serve of an entry hands back")
        with self._put_lock, self._lock:
            self._prepare = prepare
            for order, reuses_left in self._order.orders():
                receive_time, version, reuses = self._info[order]
                columns = self._ready[order][0]
                self._ready[order] = (columns, None if prepare is None else prepare(Entry(
                    columns=columns, reuses_left=reuses_left, reuses=reuses, receive_time=receive_time,
                    policy_version=version, order=order)))

    def close(self) -> None:
        """Release the storage. Views handed out before stay valid (numpy keeps them alive)."""
        with self._put_lock, self._lock:
            self._closed = True
            self._formed.notify_all()
            self._arena.close()
            self._order, self._slot_of, self._info = ReuseOrder(self._order.serve, self._order.overflow), {}, {}
            self._ready = {}

    # ---------------------------------------------------------------- pickling
    def __getstate__(self) -> dict:
        """Queued entries (copied, in serve order), the partial entry and the counters: what
        SRL's ``save_buffer_on_exit`` pickles. Leases are not kept (no trainer holds views)."""
        with self._put_lock, self._lock:
            if self._closed:
                raise ClosedError("EntryQueue: a closed queue has no data to save. Fix: save it before close().")
            queued = [(order, r, self._info[order], self._arena.saved(self._slot_of[order]))
                      for order, r in self._order.orders()]
            partial = None
            if self._filling is not None and self._filled:
                partial = (self._filled, self._filling_version, self._arena.saved(self._filling))
            cfg = dict(max_entries=self.max_entries, batch_size=self.batch_size, reuses=self.reuses,
                       serve=self._order.serve, overflow=self._order.overflow,
                       max_version_lag=self.max_version_lag, lease_depth=self.lease_depth, time_major=self.time_major,
                       adopt=self.adopt)
            return dict(config=cfg, layout=self._layout, queued=queued, partial=partial,
                        next_order=self._next_order, counts=dict(self._counts), closed=self._closed)

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state["config"])
        self._set_layout(state["layout"])
        for order, reuses_left, info, cols in state["queued"]:
            slot = self._arena.take()
            self._arena.fill_from(slot, cols)
            self._slot_of[order], self._info[order] = slot, info
            self._ready[order] = (self._arena.view(slot), None)
            self._order.add(order, reuses_left)
        if state["partial"] is not None:
            filled, version, cols = state["partial"]
            self._filling = self._arena.take()
            self._arena.fill_from(self._filling, cols)
            self._filled, self._filling_version = filled, version
        self._next_order, self._counts, self._closed = state["next_order"], state["counts"], state["closed"]

    # ---------------------------------------------------------------- internals
    def _layout_for(self, samples: Sequence[Mapping[str, Any]], new_fields: Sequence[str]) -> dict[str, FieldLayout]:
        """The layout these samples are stored by, ``new_fields`` added as ``None`` fields (put lock
        held; adopted by ``_store`` only when the put is stored)."""
        base, none = self._layout, self._none_fields
        if base is not None and not none and not new_fields:
            return base   # the common put: nothing to learn
        if new_fields and base is not None:
            new = [n for n in check_field_names(new_fields) if n not in base]
            base, none = dict(base, **{n: FieldLayout("none") for n in new}), none + tuple(new)
        return layout_for(base, none, samples)

    def _set_layout(self, layout: dict[str, FieldLayout] | None) -> None:
        """Store by ``layout`` from now on (put lock held; the first one, a wider one, or an unpickled one)."""
        with self._lock:
            self._layout = layout
            self._none_fields = () if layout is None else tuple(n for n, f in layout.items() if f.kind == "none")
            self._arena.set_layout(layout)

    def _form(self, per_entry: int) -> None:
        """The entry being filled is complete (put lock held): build its ``prepare`` object outside the
        state lock, then queue it and apply the overflow rule under it (a put's last step)."""
        order, receive_time, prepared, failed = self._next_order, time.time(), None, None
        columns = self._arena.view(self._filling)   # served as they are on every get (the slot never moves)
        if self._prepare is not None:
            try:
                prepared = self._prepare(Entry(columns=columns, reuses_left=self.reuses,
                                               reuses=0, receive_time=receive_time,
                                               policy_version=self._filling_version, order=order))
            except Exception as e:  # the entry still forms (nothing put is lost); the put raises after
                failed = e
        with self._lock:
            self._form_locked(order, receive_time, columns, prepared, per_entry)
        if failed is not None:
            raise failed

    def _form_locked(self, order: int, receive_time: float, columns: dict, prepared: Any, per_entry: int) -> None:
        self._next_order += 1
        self._slot_of[order] = self._filling  # the arena holds the slot until the entry departs
        self._info[order] = (receive_time, self._filling_version, 0)
        self._ready[order] = (columns, prepared)
        self._order.add(order, self.reuses)
        self._filling, self._filled, self._filling_version = None, 0, None
        self._counts["entries_formed"] += 1
        self._formed.notify_all()
        while len(self._order) > self.max_entries:
            victim = self._order.victim()
            self._order.remove(victim)
            self._depart(victim)
            self._counts["dropped_overflow"] += 1
            self._counts["dropped_overflow_samples"] += per_entry

    def _depart(self, order: int) -> None:
        """The entry leaves the queue (spent or dropped); its slot is reused once no lease holds it."""
        slot = self._slot_of.pop(order)
        del self._info[order]
        del self._ready[order]
        self._arena.release(slot)
