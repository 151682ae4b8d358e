"""Replay deliveries prepared ahead for a buffer its owner writes inline.

The data plane (``edp.py``) prepares deliveries ahead for rows it ingests itself. Some
owners write the buffer on their own thread instead (an adapter whose framework calls
``put`` and wants it stored when the call returns) and only want delivery ahead of the
learner. This part gives them the same machinery: the delivery operator selects and
gathers, ``PreparedDeliveries`` keeps the prepared batches and judges them by the same
guards when the learner asks, and a worker thread prepares ahead::

    owner's thread:   with lock: buffer.add(...)          (rows counted by the ring)
                      with lock: update_priorities(...); priorities_updated_locked()
    learner:          deliver(request)  -> oldest prepared batch if the guards keep it,
                                           else discard all (undo their draws), draw inline
    worker (thread):  prepare ``delivery_granularity`` batches per call for the last request,
                      while fewer than ``depth`` are prepared; redraw them when they went
                      stale (looked at after each deliver and priority update, and every
                      ``REFRESH_S`` for the owner's stores)

The schedule is the core's ``Schedule``: ``sequential`` draws inline only (with
``delivery_granularity`` g > 1 one call draws g batches and keeps g - 1 for the next
calls), ``overlapped`` (worker 'thread') prepares in the worker. Each prepared batch is its
own draw of ``batch_size`` items, in the RNG order a sequential run uses, never one large
draw split (for draws without replacement or stratified draws that would change what a
batch can contain).

Guards (``PreparedDeliveries``): a prepared batch is handed out only for an equal request,
when at most ``staleness`` rows were stored since its selection (the ring's insert count,
exact), and, for a weighted selector, at most ``priority_lag`` priority updates were made
since (0: update k always applies before draw k + 1; more changes the algorithm: opt-in).
Otherwise every prepared batch is discarded with its RNG draw and sample count undone, so
with ``staleness=0, priority_lag=0`` the learner gets exactly what a sequential run gives.

Never blocks on data: the inline draw does not wait (``timeout=0``). A worker draw in flight
is waited for by ``deliver`` (it holds the next draw of the RNG) and then handed out. A
failure in the worker is kept and raised by the next ``deliver`` (or ``close``); ``close``
joins the worker.

Locks, always taken in this order: the delivery lock (whoever draws: ``deliver`` or the
worker), then the owner's ``lock`` (``deliver`` only: no store is half done while the guards
read the insert count), then the condition (the prepared queue, the errors, the stop flag).
The worker never takes the owner's lock, so the owner's writes never wait for a prepare.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Callable

from ..buffer.delivery import reserve_prepared_outputs
from ..buffer.experience_buffer import ExperienceBuffer
from ..errors import ConfigError, WorkerError
from ..planning.schedule import Schedule
from ..schema.batch import Batch
from .background_errors import BackgroundErrors
from .delivery_operator import DeliveryOperator
from .metrics import MetricsRecorder, MetricsSnapshot
from .prepared_deliveries import DeliveryRequest, PreparedBatch, PreparedDeliveries

# how often an idle worker looks whether its prepared batches went stale (rows stored by the
# owner, which does not signal): a bound on the redraws a stream of stores can cause
REFRESH_S = 0.01


class PreparedReplay:
    """Replay batches for ``buffer``, drawn inline or prepared ahead per ``schedule``.

    Public contract: ``deliver(request, on_handout=None) -> (PreparedBatch, handout value)``;
    ``priorities_updated_locked()`` after each priority update (owner's lock held);
    ``paused()`` a context in which nothing is prepared and nothing prepared is left (draws
    undone: for state capture); ``metrics()`` (learner time, hits, discards); ``len()`` (batches prepared now);
    ``close()``.
    ``prepare(batch)``: what the learner is handed, made from a batch (in the worker when
    prepared ahead, on the learner's thread otherwise).
    """

    def __init__(self, *, buffer: ExperienceBuffer, schedule: Schedule, lock, priority_lag: int = 0,
                 prepare: Callable[[Batch], Any] | None = None):
        if not isinstance(schedule, Schedule):
            raise ConfigError("schedule", "a conduit_core.Schedule", type(schedule).__name__,
                              "use Schedule.sequential() or Schedule.overlapped(delivery_granularity=..., depth=...)")
        if schedule.is_overlapped and schedule.worker != "thread":
            raise ConfigError("schedule.worker", "'thread'", repr(schedule.worker),
                              "prepare replay deliveries in a thread: the buffer lives in this process")
        if isinstance(priority_lag, bool) or not isinstance(priority_lag, int) or priority_lag < 0:
            raise ConfigError("priority_lag", "an int >= 0", repr(priority_lag),
                              "use 0 (every priority update applies before the next draw)")
        self.schedule, self.priority_lag = schedule, priority_lag
        self._buffer, self._owner_lock, self._prepare = buffer, lock, prepare
        reserve_prepared_outputs(buffer, schedule.max_prepared)   # prepared batches get pool entries of their own
        self._cond = threading.Condition()
        self._op_lock = threading.Lock()
        self._metrics = MetricsRecorder()
        self._prepared = PreparedDeliveries(buffer=buffer, metrics=self._metrics, cond=self._cond)
        self._operator = DeliveryOperator(buffer, [])
        self._errors = BackgroundErrors()
        self._priority_version = 0
        self._stop = False
        self._thread: threading.Thread | None = None
        if schedule.is_overlapped:
            self._thread = threading.Thread(target=self._run, name="conduit-prepared-replay", daemon=True)
            self._thread.start()

    def __len__(self) -> int:
        """Batches prepared now (not yet handed out or discarded)."""
        return len(self._prepared)

    # ------------------------------------------------------------ learner side
    def deliver(self, request: DeliveryRequest, on_handout: Callable[[Batch], Any] | None = None):
        """The next batch for ``request``: the oldest prepared one if the guards keep it, else
        one drawn now (never waiting for data: a buffer without enough rows raises at once).
        ``on_handout(batch)`` runs under the owner's lock as the batch is handed out (counts
        that must agree with the stores). Returns ``(PreparedBatch, on_handout's value)``,
        its ``prepared`` filled in."""
        self._raise_error()
        with self._metrics.blocked("deliver"):
            with self._owner_lock:   # a batch ready now is handed out without waiting for a worker draw
                p = self._take_ready_locked(request)
                value = None if p is None or on_handout is None else on_handout(p.batch)
            if p is None:
                with self._op_lock:
                    with self._owner_lock:
                        with self._cond:
                            p = self._prepared.take_entry_locked(request, **self._guards_locked())
                        if p is None:
                            ps = self._draw(request, self.schedule.delivery_granularity, prepare=False)
                            p = ps[0]
                            with self._cond:
                                self._prepared.add_locked(ps[1:])
                        else:
                            self._metrics.count("prefetch_hits")
                        value = None if on_handout is None else on_handout(p.batch)
            if p.prepared is None and self._prepare is not None:
                p.prepared = self._prepare(p.batch)
        if self._buffer.output_pool is not None:   # kept for the learner's next batches, whatever is redrawn
            self._buffer.output_pool.hold(p.batch)
        with self._cond:
            self._cond.notify_all()  # the worker prepares the next ones
        return p, value

    def priorities_updated_locked(self) -> None:
        """Count a priority update (call with the owner's lock held, after the update): batches
        drawn before it are stale unless ``priority_lag`` allows; the worker redraws at once."""
        with self._cond:
            self._priority_version += 1
            self._cond.notify_all()

    def metrics(self) -> MetricsSnapshot:
        """Learner time in ``deliver`` (``deliver.blocked_s``, ``calls``), draws made
        (``deliver.busy_s``, ``items_out``: inline and ahead), batches handed out from those
        prepared ahead (``prefetch_hits``) and discarded (``prefetch_discards``)."""
        return self._metrics.snapshot()

    @contextlib.contextmanager
    def paused(self):
        """Nothing prepared while inside (every prepared draw undone, the request forgotten):
        the buffer's state, RNG included, is what a sequential run would have."""
        with self._op_lock:
            with self._cond:
                self._prepared.reset_locked()
            yield

    def close(self) -> None:
        """Stop and join the worker, drop what was prepared; raise a failure not yet raised."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
        self._prepared.forget()
        self._raise_error()

    # ----------------------------------------------------------------- internals
    def _raise_error(self) -> None:
        with self._cond:
            self._errors.raise_locked()

    def _take_ready_locked(self, request: DeliveryRequest):
        """The oldest prepared batch if the guards let it go to ``request`` now, else None with
        nothing discarded (owner's lock held; no delivery lock: a worker draw in flight comes after
        every queued batch in RNG order, and discarding waits for the delivery lock)."""
        with self._cond:
            if self._prepared.request != request or not len(self._prepared) or \
                    self._prepared.stale_locked(**self._guards_locked()):
                return None
            p = self._prepared.take_entry_locked(request, **self._guards_locked())
        self._metrics.count("prefetch_hits")
        return p

    def _guards_locked(self) -> dict:
        return dict(accepted_rows=self._buffer.inserted, priority_version=self._priority_version,
                    staleness=self.schedule.staleness, priority_lag=self.priority_lag)

    def _draw(self, request: DeliveryRequest, n: int, *, prepare: bool) -> list[PreparedBatch]:
        """``n`` batches, each its own selection in sequential RNG order (delivery lock held).
        All or nothing: a failure undoes the draws made. A single batch handed out at once
        needs no undo token."""
        speculative = n > 1 or prepare
        out: list[PreparedBatch] = []
        t0 = time.perf_counter()
        try:
            for _ in range(n):
                with self._cond:
                    pv = self._priority_version  # read before the selection: a later update makes it stale
                (p,) = self._operator.run(request, 0, granularity=1, speculative=speculative,
                                          rows_committed=0, priority_version=pv)
                p.rows_committed = p.batch.inserted_at_selection  # exactly the rows the selection saw
                out.append(p)
                if prepare and self._prepare is not None:
                    p.prepared = self._prepare(p.batch)
        except BaseException:
            if out and out[0].token is not None:
                self._buffer.rollback_selection(out[0].token, items=sum(p.items for p in out), restore_rng=True)
            raise
        self._metrics.add_busy("deliver", time.perf_counter() - t0, items_out=sum(p.items for p in out))
        return out

    def _want_locked(self) -> bool:
        """Prepare when a request is known, no failure is unreported, and fewer than ``depth``
        batches are prepared or those prepared went stale (rows stored, priorities updated)."""
        if self._prepared.request is None or self._errors:
            return False
        return len(self._prepared) < self.schedule.depth or self._prepared.stale_locked(**self._guards_locked())

    def _run(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while not self._stop and not self._want_locked():
                    cond.wait(REFRESH_S)
                if self._stop:
                    return
            try:
                with self._op_lock:
                    with cond:
                        if self._stop or not self._want_locked():
                            continue
                        if self._prepared.stale_locked(**self._guards_locked()):
                            self._prepared.discard_locked()  # undone in RNG order before the redraw
                        request = self._prepared.request
                    ps = self._draw(request, self.schedule.delivery_granularity, prepare=True)
                    with cond:
                        self._prepared.add_locked(ps)
            except BaseException as exc:  # noqa: BLE001 - reported to the learner's next call
                with cond:
                    err = WorkerError(f"preparing replay deliveries failed in the background: "
                                      f"{type(exc).__name__}: {exc}. Fix: see the cause; the next deliver "
                                      "draws inline again")
                    err.__cause__ = exc
                    self._errors.report_locked(err)
                    cond.notify_all()
