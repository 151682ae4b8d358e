"""SRL's two queue kinds, ``simple_queue`` and ``priority_queue``, on an :class:`EntryQueue`.

The queue does the work (slots, reuses, overflow, leases: ``conduit_core.queues.entry_queue``); this
class is SRL's ``Buffer`` interface over it: SRL's defaults per kind, SRL's return values and
exceptions, and SRL's ``ReplayEntry`` (a reused batch comes back as the same object, its counters
updated, as from SRL's priority queue). ``put`` runs on the trainer worker's main thread, ``get``
on its training thread; neither blocks. The batch object SRL's trainer wants is built when the batch
forms, on the putting thread (the queue's ``prepare``), so ``get`` only hands it over: it takes the
queue's state lock for an index update, never waiting behind a put's copies.

``None`` anywhere in a sample (a left-out field or sub-structure, the first sample's included) is
batched as SRL's ``recursive_aggregate`` batches it: ``None`` where every sample of the batch left it
out, zeros where only some did (the codec grows the nesting, :mod:`conduit_core.queues.entry_queue` keeps
the rule per entry).

Deliberate difference from SRL's queues (for correctness; shown in
``tests/srl_venv/test_buffers_vs_srl.py``): entries are views into preallocated slots (no stacking
at the B-th put, no copy at ``get``); a served entry's memory stays valid for ``lease_depth``
further gets. An unbatched entry keeps the put's arrays but comes back in a plain ``NamedArray``
(SRL hands back the object put).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import math
import queue as queue_module
import time

import numpy as np

from conduit_core.queues.entry_queue import EntryQueue
from conduit_core.errors import CapacityError, ClosedError, ConfigError, SpecError

from . import samples

if TYPE_CHECKING:
    from rlsrl.api.trainer import SampleBatch
    from rlsrl.base.buffer import ReplayEntry

_DEFAULT = object()  # SRL's defaults differ per kind; an explicit None means "no batching"
QUEUE_KINDS = ("simple_queue", "priority_queue")


def _max_size(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or not value >= 1:
        raise ConfigError(f"{name}.max_size", "a number >= 1", repr(value), "pass SRL's max_size (entries)")
    return math.inf if value == math.inf else int(value)


def check_empty_wait(empty_wait_s: Any) -> None:
    if isinstance(empty_wait_s, bool) or not isinstance(empty_wait_s, (int, float)) or not 0 <= empty_wait_s <= 1:
        raise ConfigError("empty_wait_s", "seconds in [0, 1]", repr(empty_wait_s),
                          "use 0.05 to hand a forming batch to a waiting trainer, 0 for SRL's behaviour")


class ConduitQueueBuffer:
    """``simple_queue`` and ``priority_queue`` on an :class:`EntryQueue`."""

    def __init__(self, kind: str = "priority_queue", *, max_size: float | None = None, reuses: int = 1,
                 batch_size: Any = _DEFAULT, lease_depth: int = 2, empty_wait_s: float = 0.0):
        if kind not in QUEUE_KINDS:
            raise ConfigError("kind", f"one of {QUEUE_KINDS}", repr(kind), "use ConduitReplayBuffer for replay kinds")
        check_empty_wait(empty_wait_s)
        # numpy integers as SRL takes them (its buffers only do arithmetic with them)
        reuses = int(reuses) if isinstance(reuses, np.integer) else reuses
        batch_size = int(batch_size) if isinstance(batch_size, np.integer) else batch_size
        self.kind = kind
        self.empty_wait_s = float(empty_wait_s)
        if kind == "priority_queue":
            # SRL: PriorityQueueBuffer(max_size=16, reuses=1, batch_size=1); `if self.batch_size:` stacks
            batch_size = 1 if batch_size is _DEFAULT else batch_size
            self._queue = EntryQueue(max_entries=_max_size(16 if max_size is None else max_size, kind),
                                     batch_size=batch_size or None, reuses=reuses, serve="freshest",
                                     overflow="drop_lowest", lease_depth=lease_depth, adopt=not batch_size,
                                     prepare=self._prepare)
        else:
            batch_size = None if batch_size is _DEFAULT else batch_size
            # SRL: SimpleQueueBuffer(batch_size=None, max_size=1e9): FIFO, the oldest dropped beyond max_size
            # without batching (SRL's buffer_zero_copy: the shared-memory stream hands over whole batches)
            # an entry keeps the arrays it was given, as SRL's queue keeps the object: no copy
            self._queue = EntryQueue(max_entries=_max_size(1e9 if max_size is None else max_size, kind),
                                     batch_size=batch_size or None, reuses=1, serve="oldest",
                                     overflow="drop_oldest", lease_depth=lease_depth, adopt=not batch_size,
                                     prepare=self._prepare)
        self.batch_size, self.reuses = batch_size, reuses
        self._codec: samples.SampleCodec | None = None

    def put(self, x: SampleBatch) -> bool | None:
        """Returns what SRL's buffer of this kind returns: the priority queue True when the put formed
        a batch (False without batching), the simple queue None."""
        # SRL's staleness rule runs on its trainer thread (preemption_steps), not in its buffers
        formed = self._store([x], lambda flats, new: self._queue.put(flats[0], new_fields=new))
        if self.kind == "simple_queue":
            return None
        return formed and bool(self.batch_size)

    def put_batch(self, xs: Sequence[SampleBatch]) -> int:
        """Several samples in one call (a consumer's group of ``g_ing``), stored as that many ``put``
        calls in order would store them, with one copy per field per batch the group writes into
        (``EntryQueue.put_many``); all or none: a bad sample raises naming it, nothing stored.
        Returns the batches the group formed."""
        xs = list(xs)
        if not xs:
            return 0
        return self._store(xs, lambda flats, new: self._queue.put_many(flats, new_fields=new))

    def _store(self, xs: list, put):
        """``put(flats, new_names)`` of the samples' flat fields. Where one fills a position every
        sample so far left ``None`` (SRL's ``info`` once an episode ends), the nesting grows: the new
        names go with the put (every sample before, those of this group included, left them out), so
        entries batch as SRL's aggregation. A refused put changes nothing: what the codec learned
        from it is undone (a codec made from a refused first sample is dropped)."""
        created = self._codec is None
        if created:
            self._codec = samples.SampleCodec(xs[0], grow=True)
        codec = self._codec
        before, known = codec.snapshot(), len(codec.names)
        try:
            flats = [codec.flatten(x) for x in xs]
            new = codec.names[known:]
            if new:
                for flat in flats:
                    for name in new:
                        flat.setdefault(name, None)
            elif not codec.grow:
                _refuse_unstorable(flats)
            return put(flats, new)
        except (SpecError, CapacityError, ClosedError):   # raised before anything is stored
            if created:
                self._codec = None
            else:
                codec.restore(before)
            raise

    def get(self) -> ReplayEntry:
        entry = self._queue.get()
        if entry is None:
            if self.kind == "simple_queue":
                raise queue_module.Empty  # what SRL's SimpleQueueBuffer.get raises when empty
            raise AssertionError("attempting to get from empty buffer.")  # SRL's PriorityQueueBuffer
        prepared = entry.prepared if entry.prepared is not None else self._prepare(entry)  # None: prepare failed
        if self.kind == "simple_queue":  # SRL reports these for its FIFO queue
            return samples.replay_entry(reuses_left=0, reuses=0, receive_time=time.time(), sample=prepared)
        # a reused entry comes back as the same ReplayEntry, its counters updated in place, as from
        # SRL's priority queue (what a trainer computed on the sample persists across its reuses)
        prepared.reuses_left, prepared.reuses = entry.reuses_left, entry.reuses
        return prepared

    def _prepare(self, entry):
        """The object ``get`` hands over for ``entry``, built once when it forms (on the putting thread):
        the simple queue's rebuilt sample (its ``ReplayEntry`` is stamped at ``get``, as SRL's), the
        priority queue's ``ReplayEntry`` (the same object on every reuse)."""
        sample = self._codec.rebuild(entry.columns)
        if self.kind == "simple_queue":
            return sample
        return samples.replay_entry(reuses_left=entry.reuses_left, reuses=entry.reuses,
                                    receive_time=entry.receive_time, sample=sample)

    def empty(self) -> bool:
        """Whether no batch is queued. With ``empty_wait_s`` > 0 an empty queue is asked again when a
        batch forms, up to that long, before the answer: SRL's training thread sleeps 5 ms after every
        True (its own comment: because its buffers are not thread-safe; these are), so a batch that
        forms meanwhile waits for the next tick; this hands it over as it forms. The answer is the
        queue's state when ``empty`` returns."""
        if self.empty_wait_s > 0:
            return not self._queue.wait_nonempty(self.empty_wait_s)
        return self._queue.empty()

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("empty_wait_s", 0.0)   # pickled before the option existed
        self._queue.set_prepare(self._prepare)  # the queue does not pickle it; queued entries get theirs now

    def qsize(self) -> int:
        return self._queue.qsize()

    def full(self) -> bool:
        return self._queue.qsize() >= self._queue.max_entries

    def stats(self) -> dict[str, int]:
        """The queue's counters (see ``EntryQueue.stats``): every sample put is in a formed entry or
        pending; every formed entry is retired, queued, or counted as dropped."""
        return self._queue.stats()


def _refuse_unstorable(flats: list[dict]) -> None:
    """A queue saved by a Conduit before its nesting could grow keeps its nesting: a sub-structure
    where it has a leaf is refused (as it was then), not stored as an object."""
    for i, flat in enumerate(flats):
        for name, v in flat.items():
            if samples.is_node(v):
                raise SpecError(f"samples[{i}].{name}", "None or an array (the nesting this queue was saved with)",
                                "a NamedArray", "this queue was pickled by an older Conduit whose nesting cannot "
                                "grow: start from a new buffer, or keep the field None")
