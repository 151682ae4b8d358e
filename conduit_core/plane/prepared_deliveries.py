"""Deliveries prepared ahead of the learner, and the guards that decide whether one may
still be handed out.

A batch prepared ahead (by the overlapped worker, or the spare batches of a ``g_del > 1``
operator call) was selected against the buffer as it was then. It is handed out only if
the learner asks for exactly the same thing and handing it out keeps the guards: no more
than ``staleness`` accepted rows missed, and (with ``staleness=0`` on a weighted
selector) no priority update since it was drawn. Anything else is discarded with its
RNG draw and rate-limit count undone, so what is delivered equals a sequential run.

Every method ending in ``_locked`` expects the caller to hold the data plane's condition
(the one given to the constructor); the class adds no lock of its own, so the delivery
hot path takes no extra lock.
"""

from __future__ import annotations

import logging

import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

from ..buffer.experience_buffer import ExperienceBuffer
from ..schema.batch import Batch
from .metrics import MetricsRecorder

log = logging.getLogger("conduit")


@dataclass(frozen=True)
class DeliveryRequest:
    """What the learner asked for; prepared batches are reused only for an equal request."""

    kind: str                      # "sample" | "sequences" | "take"
    batch_size: int | None
    n_step: int | tuple | None = None
    gamma: float = 0.99
    beta: float | None = None
    length: int | None = None
    policy_version: int | None = None
    device: str | None = None
    episode_end: str = "shorten"
    fields: tuple[str, ...] | None = None  # only these of the spec's fields (None: all)
    in_slot_order: bool = False    # a sample's items sorted by ring slot (``ExperienceBuffer.sample``)


@dataclass
class PreparedBatch:
    """One delivery operator output not yet handed out, with what the guards need to judge it."""

    batch: Batch
    request: DeliveryRequest
    rows_committed: int        # committed input rows when the batch was selected
    priority_version: int
    token: tuple | None        # buffer selection token, if this batch began an operator call
    items: int
    prepared: Any = None       # what the consumer's prepare step made of ``batch`` ahead (None: not yet)


class PreparedDeliveries:
    """The queue of prepared batches, oldest first, plus the request they are prepared for.

    Public contract:

    - ``request``: the last replay request delivered (what the worker prepares ahead for),
      None before the first one and after ``reset_locked``.
    - ``take_locked(request, ...)``: the oldest prepared batch if it may be handed out for
      ``request`` now, else None after discarding (undoing) everything prepared; records
      ``request`` as the one to prepare for. ``take_entry_locked``: the same, as the
      ``PreparedBatch`` (with what was prepared from it).
    - ``add_locked(prepared)``: queue batches behind those already prepared.
    - ``stale_locked(...)``: whether the prepared batches could no longer be handed out
      (for a worker that refreshes them before the learner asks).
    - ``discard_locked()``: discard everything prepared now, undoing the draws (the caller
      holds whatever serialises draws, so no draw is in flight).
    - ``len()``: how many batches are prepared.
    - ``prefetch_started_locked`` / ``prefetch_finished_locked``: bracket a worker draw that
      will be queued here, so ``drop_locked`` can wait for it instead of missing it.
    - ``drop_locked()``: wait for such a draw, then discard everything, undoing the draws.
    - ``reset_locked()``: ``drop_locked`` and forget the request (state saved or loaded,
      schedule changed).
    - ``forget()``: drop everything without undoing it (the buffer is being closed).
    """

    def __init__(self, *, buffer: ExperienceBuffer, metrics: MetricsRecorder, cond: threading.Condition):
        self._buffer = buffer
        self._metrics = metrics
        self._cond = cond
        self._batches: deque[PreparedBatch] = deque()
        self._prefetch_in_flight = False  # the worker is drawing a batch ahead (under the delivery lock)
        self.request: DeliveryRequest | None = None
        self.judged = HitRate()   # handed out vs discarded at hand-out (a warning when most are discarded)

    def __len__(self) -> int:
        return len(self._batches)

    def take_locked(self, request: DeliveryRequest, *, accepted_rows: int, priority_version: int,
                    staleness: int, priority_lag: int | None = None) -> Batch | None:
        """The oldest prepared batch, if it was prepared for ``request`` and handing it out now
        keeps the guards; otherwise None, with every prepared batch discarded: undoing the
        oldest draw puts the RNG back to before it, which undoes the later draws as well.

        ``priority_lag``: priority updates a batch of a weighted selector may have missed
        (0: none, the update before a draw always applies to it). None keeps the data
        plane's rule: none with ``staleness=0``, any number otherwise."""
        p = self.take_entry_locked(request, accepted_rows=accepted_rows, priority_version=priority_version,
                                   staleness=staleness, priority_lag=priority_lag)
        return None if p is None else p.batch

    def take_entry_locked(self, request: DeliveryRequest, *, accepted_rows: int, priority_version: int,
                          staleness: int, priority_lag: int | None = None) -> PreparedBatch | None:
        """``take_locked``, returning the ``PreparedBatch`` itself (the batch and what was
        prepared from it)."""
        self.request = request
        if priority_lag is None:
            priority_lag = 0 if staleness == 0 else None
        batches = self._batches
        while batches:
            p = batches[0]
            if self._still_valid(p, request, accepted_rows, priority_version, staleness, priority_lag):
                batches.popleft()
                self.judged.note(handed=1, discarded=0)
                return p
            self.judged.note(handed=0, discarded=len(batches))
            self.discard_locked()
        return None

    def _still_valid(self, p: PreparedBatch, request: DeliveryRequest, accepted_rows: int,
                     priority_version: int, staleness: int, priority_lag: int | None) -> bool:
        if p.request != request:
            return False
        if accepted_rows - p.rows_committed > staleness:
            return False
        if (self._buffer.selector.weighted and priority_lag is not None
                and priority_version - p.priority_version > priority_lag):
            return False
        return True

    def stale_locked(self, *, accepted_rows: int, priority_version: int, staleness: int,
                     priority_lag: int | None = None) -> bool:
        """Whether the oldest prepared batch could no longer be handed out for the request
        recorded (so none of them could: later ones were drawn later). Changes nothing."""
        if not self._batches or self.request is None:
            return False
        if priority_lag is None:
            priority_lag = 0 if staleness == 0 else None
        return not self._still_valid(self._batches[0], self.request, accepted_rows, priority_version, staleness,
                                     priority_lag)

    def add_locked(self, prepared: list[PreparedBatch]) -> None:
        """Queue ``prepared`` to be handed out after the batches already prepared. Their
        validity is judged when handed out (the guards depend on what happens until then)."""
        self._batches.extend(prepared)

    def prefetch_started_locked(self) -> None:
        """A worker draw has begun; ``drop_locked`` waits until it is queued (or failed)."""
        self._prefetch_in_flight = True

    def prefetch_finished_locked(self) -> None:
        """The worker draw bracketed by ``prefetch_started_locked`` is queued or failed."""
        self._prefetch_in_flight = False
        self._cond.notify_all()

    def drop_locked(self) -> None:
        """Let a prefetch in flight queue its batch (it has drawn from the RNG and the rows already),
        then drop every prepared batch, undoing their draws. For everything that changes what a
        prepared batch would be (state, rows, layout). Only the worker's prefetch is waited for: a
        caller's own deliver hands its draw out, and may wait for data as long as it likes."""
        self._cond.wait_for(lambda: not self._prefetch_in_flight)
        self.discard_locked()

    def reset_locked(self) -> None:
        """``drop_locked``, then forget the request, so nothing is prepared until the learner
        asks again (what it asked before may not fit the new state or schedule)."""
        self.drop_locked()
        self.request = None

    def forget(self) -> None:
        """Drop every prepared batch without undoing its draw: the buffer is closing, so there
        is nothing left to undo it in."""
        self._batches.clear()

    def discard_locked(self) -> None:
        """Drop every prepared batch, undoing their selection as if never made."""
        batches = self._batches
        if not batches:
            return
        first = batches[0]
        items = sum(p.items for p in batches)
        token = first.token
        self._buffer.rollback_selection(token or self._buffer.selection_token(), items=items,
                                        restore_rng=token is not None)
        self._metrics.count("prefetch_discards", len(batches))
        batches.clear()


class HitRate:
    """Prepared batches handed out vs discarded at hand-out, and one warning when most are
    discarded: preparing ahead then costs draws (and the CPU) and saves the learner nothing,
    which the metrics alone would leave unsaid."""

    WARN_AFTER = 20        # judged batches before the rate means anything
    WARN_BELOW = 0.5       # hit rate under which preparing ahead does not pay

    def __init__(self):
        self.handed = self.discarded = 0
        self.warned = False

    def note(self, *, handed: int, discarded: int) -> None:
        self.handed += handed
        self.discarded += discarded
        judged = self.handed + self.discarded
        if not self.warned and judged >= self.WARN_AFTER and self.handed < self.WARN_BELOW * judged:
            self.warned = True
            log.warning("conduit: %d of %d batches prepared ahead were discarded when the learner asked (hit rate "
                        "%.0f%%): between two deliveries the learner ingests or updates priorities, so a batch "
                        "drawn earlier is no longer what it would draw now. Fix: Schedule.sequential() for this "
                        "loop, or allow staleness (Schedule.overlapped(staleness=k)) where the algorithm may "
                        "miss the last k inserts", self.discarded, judged, 100.0 * self.handed / judged)
