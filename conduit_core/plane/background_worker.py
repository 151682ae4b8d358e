"""The overlapped schedule's background worker: one thread that stores queued rollouts in
acceptance order and, when it has nothing to store, prepares deliveries ahead.

Storing always comes first: a rollout waiting in the queue is a row a delivery may have
to wait for, while a prepared batch only saves the learner time it would otherwise spend
itself. Failures cannot be raised in this thread (no caller is waiting for it), so they
are reported to ``BackgroundErrors`` and raised by the data plane's next call.

The worker shares the data plane's condition (every read and write of the queue and of
the prepared batches is under it) and its delivery lock (whoever runs the delivery
operator holds it, so selections never interleave and the RNG sequence equals the
sequential one). It owns nothing but its stop flag; it works through the parts it is
handed at construction (the ingestion point's queue and ``commit``, the prepared
deliveries, the delivery operator).
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from ..buffer.experience_buffer import ExperienceBuffer
from ..errors import RateLimitError, WorkerError
from ..planning.schedule import Schedule
from .background_errors import BackgroundErrors
from .hooks import Rollout
from .ingestion import IngestionPoint
from .metrics import MetricsRecorder
from .prepared_deliveries import DeliveryRequest, PreparedBatch, PreparedDeliveries

PREFETCH_TIMEOUT_S = 0.001  # a prefetch that would wait for data or a rate limit gives way at once


class BackgroundWorker(threading.Thread):
    """The worker thread for one overlapped schedule (a new schedule gets a new worker).

    Public contract: ``start()`` (from ``threading.Thread``) begins the loop;
    ``request_stop_locked()`` asks it to store what is queued and then end (join it
    afterwards); ``stop_requested`` says whether that was asked, so a worker that ended
    without being asked is known to be gone.

    A subclass of Thread rather than the owner of one, so the data plane holds a single
    object that both is joined and answers whether it is gone.
    """

    def __init__(self, *, schedule: Schedule, transformer, buffer: ExperienceBuffer, cond: threading.Condition,
                 ingestion: IngestionPoint, prepared: PreparedDeliveries, errors: BackgroundErrors,
                 delivery_lock: threading.Lock, metrics: MetricsRecorder,
                 run_delivery_operator: Callable[[DeliveryRequest, float | None], list[PreparedBatch]]):
        """``transformer``: runs the ingest hooks, validates and encodes a group of rollouts
        (inline, or in a child process). ``ingestion``: whose queue the worker drains and whose
        ``commit`` stores what it encoded. ``run_delivery_operator``: selects, gathers and runs
        the delivery hooks for one request, called with ``delivery_lock`` held."""
        super().__init__(name="conduit-edp-worker", daemon=True)
        self._schedule = schedule
        self._transformer = transformer
        self._buffer = buffer
        self._cond = cond
        self._ingestion = ingestion
        self._prepared = prepared
        self._errors = errors
        self._delivery_lock = delivery_lock
        self._metrics = metrics
        self._run_delivery_operator = run_delivery_operator
        self.stop_requested = False

    def request_stop_locked(self) -> None:
        """Ask the loop to end once the queue is empty (the caller holds the condition)."""
        self.stop_requested = True
        self._cond.notify_all()

    def run(self) -> None:
        g = self._schedule.ingest_granularity
        cond, ingestion, pending = self._cond, self._ingestion, self._ingestion.pending
        while True:
            with cond:
                while not self.stop_requested and not pending and not self._want_prefetch_locked():
                    cond.wait(0.05)
                if self.stop_requested and not pending:
                    return
                group = ingestion.take_group_locked(g)
                request = self._prepared.request
            if group:
                self._store(group)
            elif request is not None and not self.stop_requested:
                self._prefetch(request)

    def _want_prefetch_locked(self) -> bool:
        """Prepare ahead only for a replay request, with nothing to store and no failure
        unreported, below ``depth``, and when the rate limiter would allow the draw now."""
        req = self._prepared.request
        if req is None or req.kind == "take" or self._errors or self._ingestion.pending:
            return False
        if len(self._prepared) >= self._schedule.depth:
            return False
        b = self._buffer
        n = (req.batch_size or 0) * self._schedule.delivery_granularity
        return b.rate_limiter.can_sample(size=b.size, inserts=b.inserted, samples=b.sampled, n=n)

    def _store(self, group: list[Rollout]) -> None:
        """Transform and store one group; a failure names the rollouts it left unstored."""
        t0 = time.perf_counter()
        out_items = 0
        try:
            enc = self._transformer.transform(group)
            self._ingestion.commit(enc, None)  # looked up per call: a commit replaced for fault injection applies
            out_items = sum(e.n for e in enc)
        except BaseException as exc:  # noqa: BLE001 - reported to the caller
            stored = set(getattr(exc, "stored_tickets", ()))  # stored before the failure: not rejected
            tickets = [r.ticket for r in group if r.ticket not in stored]
            with self._cond:
                err = WorkerError(f"ingestion of rollouts {tickets} failed in the background: "
                                  f"{type(exc).__name__}: {exc}")
                err.__cause__ = exc
                err.rejected_tickets = tickets  # type: ignore[attr-defined]
                self._errors.report_locked(err)
        finally:   # the metrics first: a flush() that sees the group stored sees its counts too
            self._metrics.add_busy("ingest", time.perf_counter() - t0,
                                   items_in=sum(r.rows for r in group), items_out=out_items)
            with self._cond:
                self._ingestion.group_done_locked(group)
                self._cond.notify_all()

    def _prefetch(self, request: DeliveryRequest) -> None:
        """Run the delivery operator for ``request`` and queue its batches; their validity is
        checked when handed out (the guards), not here."""
        try:
            with self._delivery_lock:
                with self._cond:
                    if not self._want_prefetch_locked() or self.stop_requested:
                        return
                    self._prepared.prefetch_started_locked()  # a drop waits for this draw to be queued
                t0 = time.perf_counter()
                try:
                    prepared = self._run_delivery_operator(request, PREFETCH_TIMEOUT_S)
                    self._metrics.add_busy("deliver", time.perf_counter() - t0,
                                           items_out=sum(p.items for p in prepared))   # (before it can be taken)
                    with self._cond:
                        self._prepared.add_locked(prepared)
                finally:
                    with self._cond:
                        self._prepared.prefetch_finished_locked()
        except Exception as exc:  # noqa: BLE001
            if isinstance(exc, RateLimitError):
                return  # not allowed yet; the caller's own deliver will wait or raise
            with self._cond:
                err = WorkerError(f"delivery prefetch failed in the background: {type(exc).__name__}: {exc}")
                err.__cause__ = exc
                self._errors.report_locked(err)
                self._cond.notify_all()
