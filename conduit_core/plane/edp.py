"""The Experience Data Plane: one facade over the three control points.

    actors --ingest()--> [ ingestion: hooks -> validate -> encode -> write once ]
                                          |
                                   ExperienceBuffer (placed on tiers)
                                          |
    learner <--deliver()-- [ delivery: select -> gather -> hooks -> to device ]

Sequential schedule: each call runs its operator inline (exactly the framework's
semantics, minus the framework's per-item Python). Overlapped schedule: ``ingest``
enqueues into a bounded queue and returns; one background thread (the worker)
commits rollouts in acceptance order (running the transform inline or in a child
process) and, when idle, prepares up to ``depth`` deliveries ahead. Prepared batches
are checked at hand-out against the guards and discarded (with their RNG draws and
rate-limit counts rolled back) when they would break them, so with ``staleness=0``
an overlapped run delivers exactly what a sequential run delivers.

Guards, always on: every accepted rollout is written exactly once and in acceptance
order; an off-policy delivery misses at most ``staleness`` accepted rows; FIFO data
goes only to its policy version, once; ``flush()`` makes everything accepted visible.

This class wires the parts (one module each, with a public contract, all under this
object's condition) and keeps the facade: ``ingestion`` (accept, queue, store),
``delivery_operator`` (select, gather, hooks), ``prepared_deliveries`` (batches prepared ahead,
judged by the guards), ``background_worker`` and ``background_errors`` (its failures).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import torch
from numpy.typing import ArrayLike

from ..buffer.episodes import EPISODE_END_RULES
from ..buffer.delivery import reserve_prepared_outputs
from ..buffer.experience_buffer import ExperienceBuffer
from ..buffer.migration import DEFAULT_DEADLINE_S, MAX_CHUNK_BYTES, BackgroundMigration, begin_migration, check_deadline
from ..buffer.sampling_args import PLAIN_FIELDS, PLAIN_N_STEP, replay_args
from ..errors import ClosedError, ConfigError, WorkerError
from ..planning.placement import shard_specs
from ..planning.schedule import Schedule
from ..schema.batch import Batch
from ..selection.rate_gate import BufferCondition
from .background_errors import BackgroundErrors, combine_shutdown_errors
from .background_worker import BackgroundWorker
from .delivery_operator import DeliveryOperator, InlineDelivery
from .edp_state import EDP_STATE_VERSION, checked_counters
from .hooks import Rollout
from .ingestion import IngestionPoint
from .metrics import MetricsRecorder, MetricsSnapshot
from .prepared_deliveries import DeliveryRequest, PreparedBatch, PreparedDeliveries
from .workers import make_transformer

if TYPE_CHECKING:
    from ..planning.placement import Plan
    from ..planning.topology import Topology
    from ..storage.shards import ShardSpec

log = logging.getLogger("conduit")


class ExperienceDataPlane:
    """The facade adapters drive. Keyword-only; see the module docstring."""

    def __init__(self, *, buffer: ExperienceBuffer, schedule: Schedule | None = None,
                 device: torch.device | str | None = None, ingest_hooks: list[Callable] | None = None,
                 delivery_hooks: list[Callable] | None = None):
        if not isinstance(buffer, ExperienceBuffer):
            raise ConfigError("buffer", "an ExperienceBuffer", type(buffer).__name__,
                              "build one with conduit_core.ExperienceBuffer(spec=..., capacity=...)")
        self.buffer = buffer
        self.schedule = schedule or Schedule()
        if not isinstance(self.schedule, Schedule):
            raise ConfigError("schedule", "a Schedule", type(self.schedule).__name__,
                              "use Schedule.sequential() or Schedule.overlapped(...)")
        self.device = None if device is None else str(torch.device(device))
        reserve_prepared_outputs(buffer, self.schedule.max_prepared)   # prepared batches get pool entries of their own
        self._metrics = MetricsRecorder()
        # Guards every count and queue the parts share (ingestion, prepared deliveries,
        # background errors, the worker); none of them adds a lock of its own.
        self._cond = BufferCondition()   # (``mutex``: the same lock, entered in C on hot paths)
        # Held by whoever runs the delivery operator (caller inline, or worker prefetch), so
        # selections never interleave and the RNG sequence equals the sequential one.
        self._op_lock = threading.Lock()
        self._errors = BackgroundErrors()
        # the ingestion part (its ``commit`` is the ingestion operator the worker and inline stores call)
        self.ingestion = IngestionPoint(buffer=buffer, hooks=list(ingest_hooks or []), schedule=self.schedule,
                                         metrics=self._metrics, cond=self._cond, errors=self._errors)
        self._delivery = DeliveryOperator(buffer, list(delivery_hooks or []))
        self._inline_delivery = InlineDelivery(buffer, metrics=self._metrics, op_lock=self._op_lock, cond=self._cond)
        self._prepared = PreparedDeliveries(buffer=buffer, metrics=self._metrics, cond=self._cond)
        self._priority_version = 0
        self.closed = False   # (read-only for others)
        self._transformer = None  # kept across reschedules to the same worker kind (a child costs ~1 s)
        self._thread: BackgroundWorker | None = None  # the overlapped schedule's worker thread
        self._choose_routes()
        if self.schedule.is_overlapped:
            self._start_worker()
        s = self.schedule
        log.info("conduit: data plane built over a %s buffer of %d: schedule %s (g_ing %d, g_del %d, staleness %d)%s",
                 buffer.selector.name, buffer.capacity, s.mode, s.ingest_granularity, s.delivery_granularity,
                 s.staleness, f", delivering to {self.device}" if self.device else "")

    def _choose_routes(self) -> None:   # the short routes: ingest inline; deliver drawn in the call
        self._inline_ingest = not self.schedule.is_overlapped
        self._draws_now = (self.schedule.draws_at_once and not self._delivery.hooks
                           and not self.buffer.selector.consumes)

    # ---------------------------------------------------------------- hooks
    def add_ingest_hook(self, hook: Callable[[list[Rollout]], list[Rollout]]) -> None:
        self._require_no_worker("add_ingest_hook")
        self.ingestion.hooks.append(hook)

    def add_delivery_hook(self, hook: Callable[[Batch], Batch]) -> None:
        self._require_no_worker("add_delivery_hook")
        self._delivery.hooks.append(hook)
        self._choose_routes()

    def _require_no_worker(self, what: str) -> None:
        if self._thread is not None:
            raise ConfigError(what, "hooks registered before the worker starts", "a running overlapped worker",
                              "pass ingest_hooks=/delivery_hooks= to the constructor")

    # ------------------------------------------------------------- ingestion
    def ingest(self, data: Mapping[str, Any], *, source: int = 0, policy_version: int = 0,
               timeout: float | None = None) -> int:
        """Accept one rollout (a time-ordered batch of one source's transitions).

        Sequential: stored before returning. Overlapped: queued (bounded) and stored in
        acceptance order by the worker; a failure is raised on a later call. Returns
        the rollout's ticket (its acceptance number)."""
        with self._metrics.blocked("ingest"):
            self._check_usable()
            return self.ingestion.ingest(data, source=source, policy_version=policy_version, timeout=timeout)

    def ingest_many(self, rollouts: list[Mapping[str, Any] | Rollout], *, timeout: float | None = None) -> list[int]:
        """Accept several rollouts at once (granularity g_ing: one operator call for the group,
        so hooks can vectorise across them). Items are dicts of columns or ``Rollout``s
        (with their own source and policy_version). Returns their tickets. A call that fails part
        way names what it took: ``stored_tickets`` (sequential) or ``accepted_tickets`` (queued)."""
        if self._inline_ingest:
            if self.closed or self._errors.kept:
                with self._metrics.blocked("ingest"):   # (a refused call counts, as on every route)
                    self._check_usable()
            return self.ingestion.ingest_many_inline(rollouts, timeout)   # (it records the call's time)
        tickets: list[int] = []
        try:
            for r in rollouts:
                tickets.append(self.ingest(r.data if isinstance(r, Rollout) else r,
                                           source=r.source if isinstance(r, Rollout) else 0,
                                           policy_version=r.policy_version if isinstance(r, Rollout) else 0,
                                           timeout=timeout))
        except BaseException as exc:   # the ones before it were accepted (queued): named, so a retry sends only the rest
            exc.accepted_tickets = tickets  # type: ignore[attr-defined]
            raise
        return tickets

    def flush(self, timeout: float | None = None) -> None:
        """Block until every rollout accepted before the call is stored (visible to delivery)."""
        self._check_usable()
        self.ingestion.wait_stored(0, timeout, "flush")

    # --------------------------------------------------------------- delivery
    def deliver(self, batch_size: int | None = None, *, policy_version: int | None = None,
                n_step: int | tuple[int, int] | None = None, gamma: float = 0.99, beta: float | None = None,
                sequence_length: int | None = None, timeout: float | None = None,
                episode_end: str = "shorten", fields: Sequence[str] | None = None) -> Batch:
        """A training-ready batch on the learner's device.

        Replay (uniform/prioritized): ``batch_size`` items, optionally as n-step returns
        (``episode_end``: 'shorten' or 'redraw' windows cut by an episode's end; see ``ExperienceBuffer.sample``)
        or as sequences of ``sequence_length``. FIFO: the next ``batch_size`` items of ``policy_version`` (``None``:
        everything of that version accepted so far). ``fields``: only these of the spec's fields (replay; None: all)."""
        if self._draws_now and batch_size is not None and not sequence_length and episode_end in EPISODE_END_RULES \
                and not (self.closed or self._errors.kept):   # sequential replay, no hook: drawn by this call
            return self._inline_delivery.deliver(batch_size, n_step=n_step, gamma=gamma, beta=beta, device=self.device,
                                                 episode_end=episode_end, fields=fields, timeout=timeout)
        with self._metrics.blocked("deliver"):
            self._check_usable()
            if episode_end not in EPISODE_END_RULES:
                raise ConfigError("episode_end", f"one of {EPISODE_END_RULES}", repr(episode_end),
                                  "'redraw' for RLlib's prioritized buffer, 'shorten' for its uniform one")
            kind = "take" if self.buffer.selector.consumes else ("sequences" if sequence_length else "sample")
            if kind != "take" and batch_size is None:
                raise ConfigError("batch_size", "a positive int for replay delivery", None,
                                  "pass batch_size=...; only FIFO delivery may take everything")
            if type(fields) not in PLAIN_FIELDS or type(n_step) not in PLAIN_N_STEP:
                fields, n_step = replay_args(fields, n_step)   # one form for both routes below
            req = DeliveryRequest(kind, batch_size, n_step, gamma, beta, sequence_length, policy_version, self.device,
                                  episode_end, fields)
            if kind == "take":
                if batch_size is None:
                    self.ingestion.wait_stored(0, timeout, "deliver")
                self._raise_error()
                t0 = time.perf_counter()
                batch = self.buffer.take(batch_size, policy_version=policy_version, device=self.device, timeout=timeout)
                batch = self._delivery.run_hooks(batch)
                self._metrics.add_busy("deliver", time.perf_counter() - t0, items_out=batch.size)
                return batch
            self.ingestion.wait_stored(self.schedule.staleness, timeout, "deliver")
            with self._op_lock:
                with self._cond.mutex:
                    batch = self._prepared.take_locked(req, accepted_rows=self.ingestion.accepted_rows,
                                                       priority_version=self._priority_version,
                                                       staleness=self.schedule.staleness)
                if batch is None:
                    t0 = time.perf_counter()
                    prepared = self._run_delivery_operator(req, timeout)
                    self._metrics.add_busy("deliver", time.perf_counter() - t0,
                                           items_out=sum(p.items for p in prepared))
                    batch = prepared[0].batch
                    with self._cond.mutex:
                        self._prepared.add_locked(prepared[1:])
                else:
                    self._metrics.count("prefetch_hits")
            if self.buffer.output_pool is not None:   # kept for the learner's next batches, whatever is redrawn
                self.buffer.output_pool.hold(batch)
            with self._cond.mutex:
                self._cond.notify_all()
            return batch

    def _run_delivery_operator(self, req: DeliveryRequest, timeout: float | None) -> list[PreparedBatch]:
        """The delivery operator for ``req``, stamped with what was stored and the priority
        version before it selects (the guards judge prepared batches against them). The
        caller holds ``_op_lock``."""
        with self._cond.mutex:
            rows_committed = self.ingestion.committed_rows
            pv = self._priority_version
        g = self.schedule.delivery_granularity
        return self._delivery.run(req, timeout, granularity=g, speculative=self.schedule.is_overlapped or g > 1,
                                  rows_committed=rows_committed, priority_version=pv)

    # ------------------------------------------------------------- priorities
    def update_priorities(self, batch: Batch, priorities: Any, *, abs_floor: float | None = None) -> int:
        """New priorities for a delivered batch's rows, skipping rows overwritten since (``abs_floor``: buffer's)."""
        t0 = time.perf_counter()   # (blocked and busy alike: the call waits for nothing but the lock)
        try:
            if self.closed or self._thread is not None or self._errors.kept:
                self._check_usable()
            with self._cond.mutex:
                n = self.buffer.update_priorities(batch.slots, priorities, seqs=batch.seqs, abs_floor=abs_floor)
                self._priority_version += 1
        except BaseException:
            self._metrics.add_blocked("priorities", time.perf_counter() - t0)
            raise
        self._metrics.add_call("priorities", time.perf_counter() - t0, items_in=n)
        return n

    def reschedule(self, schedule: Schedule) -> None:
        """Switch to another schedule without losing anything: flush what was accepted, stop
        and join the worker, drop prepared batches (undoing their draws), start the new one.
        A child process of the same worker kind is kept (spawning one costs ~1 s), so a
        change of granularity or depth is cheap."""
        if not isinstance(schedule, Schedule):
            raise ConfigError("schedule", "a Schedule", type(schedule).__name__, "use Schedule.sequential() ...")
        self._check_usable(restarting=True)
        if schedule == self.schedule:
            return
        with self._cond:   # rollouts that come during the switch wait for it (not queued for a worker that leaves)
            self.ingestion.refusing = "reschedule"
        try:
            self.flush()
            if self._thread is not None:
                with self._cond:
                    self._thread.request_stop_locked()
                self._thread.join(timeout=self.schedule.timeout)
                self._thread = None
            keep = (self._transformer is not None and schedule.is_overlapped
                    and schedule.worker == self.schedule.worker and schedule.timeout == self.schedule.timeout)
            if self._transformer is not None and not keep:
                self._transformer.close()
                self._transformer = None
            with self._cond:
                self._prepared.reset_locked()
                self.schedule = self.ingestion.schedule = schedule
                self._choose_routes()   # (the old worker is joined; a new one starts below)
                reserve_prepared_outputs(self.buffer, schedule.max_prepared)
            if schedule.is_overlapped:   # (before rollouts are let in: one that fails to start refuses them)
                self._start_worker()
        finally:
            with self._cond:
                if self.ingestion.refusing == "reschedule":   # (a close() that came meanwhile keeps refusing)
                    self.ingestion.refusing = None
                self._cond.notify_all()
        self._raise_error()

    # ----------------------------------------------------------------- worker
    def _start_worker(self) -> None:
        if self._transformer is None:
            self._transformer = make_transformer(self.schedule.worker, self.buffer.spec, self.ingestion.hooks,
                                                 timeout=self.schedule.timeout)
        self._thread = BackgroundWorker(
            schedule=self.schedule, transformer=self._transformer, buffer=self.buffer, cond=self._cond,
            ingestion=self.ingestion, prepared=self._prepared, errors=self._errors, delivery_lock=self._op_lock,
            metrics=self._metrics, run_delivery_operator=self._run_delivery_operator)
        self._thread.start()

    # ------------------------------------------------------- rows and losses
    losses = property(lambda self: self.buffer.losses, doc="Remote shards lost so far (``ExperienceBuffer.losses``).")

    def evict(self, seqs: ArrayLike) -> int:
        """Remove stored rows by seq (``ExperienceBuffer.evict``), after storing what was
        accepted; batches prepared ahead are discarded, so none can deliver a removed row."""
        self._check_usable()
        self.flush()
        with self._cond:
            self._prepared.drop_locked()
            return self.buffer.evict(seqs)

    def read(self, seqs: ArrayLike, *, fields: Sequence[str] | None = None, device: Any = None) -> Batch:
        """Stored rows by seq (``ExperienceBuffer.read``), after storing what was accepted:
        no selection, no draw, nothing counted as delivered."""
        self._check_usable()
        self.flush()
        return self.buffer.read(seqs, fields=fields, device=device)

    # ------------------------------------------------------------ errors/state
    def _raise_error(self) -> None:
        if not self._errors.kept:   # nothing reported: a failure reported after this read is raised by the next call
            return
        with self._cond:
            self._errors.raise_locked()

    # -- placement: move the buffer to other shards while ingestion and delivery go on --

    def migrate(self, *, shards: Sequence[ShardSpec], capacity: int | None = None, background: bool = True,
                max_hold_s: float = 0.002, chunk_bytes: int | None = None,
                deadline_s: float = DEFAULT_DEADLINE_S) -> BackgroundMigration | None:
        """Move the buffer to ``shards`` (optionally growing ``capacity``) while ingestion and
        delivery go on. Returns a handle whose ``wait()`` joins the copy (background), or
        None after a blocking migration. Prepared deliveries are dropped (their rows may move).
        In the background, each chunk of the copy holds the buffer's lock about ``max_hold_s``
        (the longest a delivery or insert waits for it); ``chunk_bytes`` fixes the chunk size
        instead. A blocking migration copies in the largest chunks, since everything waits
        for it anyway. A background copy that is still running ``deadline_s`` after it began (a
        busy learner can starve it) copies the rest at once under the lock: the handle's
        ``finished_at_deadline`` says so."""
        check_deadline(deadline_s)
        self._check_usable()
        with self._cond:
            self._prepared.drop_locked()
        m = begin_migration(self.buffer, shards=shards, capacity=capacity, max_hold_s=max_hold_s,
                            chunk_bytes=chunk_bytes if background else MAX_CHUNK_BYTES, start=not background)
        if background:
            return BackgroundMigration(m, deadline_s=deadline_s)
        try:
            m.finish()
        except BaseException:   # before the swap: the buffer keeps its layout, the new one (its actors) goes
            if not m.done:
                m.abort()
            raise
        return None

    def replan(self, plan: Plan, topology: Topology, *, background: bool = True, max_hold_s: float = 0.002,
               chunk_bytes: int | None = None, deadline_s: float = DEFAULT_DEADLINE_S) -> BackgroundMigration | None:
        """Carry out a placement ``Plan`` (see placement.plan) on ``topology``: one shard per
        assigned tier (a 'remote' tier's name is the Ray custom resource of its node)."""
        return self.migrate(shards=shard_specs(plan, topology), capacity=sum(a.slots for a in plan.assignments),
                            background=background, max_hold_s=max_hold_s, chunk_bytes=chunk_bytes,
                            deadline_s=deadline_s)

    def _check_usable(self, *, restarting: bool = False) -> None:
        if self.closed:
            raise ClosedError("the data plane is closed. Fix: build a new ExperienceDataPlane.")
        if self._thread is not None and not self._thread.is_alive() and not self._thread.stop_requested:
            raise WorkerError("the background worker is gone. Fix: close() and build a new data plane.")
        if self._thread is None and self.schedule.is_overlapped and self.ingestion.refusing is None \
                and not restarting:
            raise WorkerError("the background worker did not start (reschedule() raised why). Fix: reschedule() "
                              "to a schedule whose worker starts (e.g. Schedule.sequential()), or close()")
        if self._errors.kept:   # (every data-plane call comes here: no call when nothing was reported)
            self._raise_error()

    def metrics(self) -> MetricsSnapshot:
        b = self.buffer
        return self._metrics.snapshot(dropped_stale=b.dropped_stale, buffer_size=b.size, inserted=b.inserted)

    def reset_metrics(self) -> None:
        self._metrics.reset()

    def state_dict(self) -> dict:
        """Flush, drop prepared batches (undoing their draws), then the buffer's state plus
        the data plane's counters. ``rows`` counts the rows stored (committed), not those
        accepted: a rollout another thread queues meanwhile is not in the state, nor counted."""
        self.flush()
        with self._cond:
            self._prepared.reset_locked()  # before the RNG is saved
            return {"edp_version": EDP_STATE_VERSION, "buffer": self.buffer.state_dict(),
                    "ticket": self.ingestion.ticket, "rows": self.ingestion.committed_rows,
                    "priority_version": self._priority_version}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        counters = checked_counters(state)   # before anything changes
        self.flush()
        with self._cond:
            # undo prepared draws first: undoing them after the load would put back the old RNG state
            self._prepared.reset_locked()
            self.buffer.load_state_dict(state["buffer"])  # all or nothing: raises before it changes anything
            self.ingestion.restore_counts_locked(ticket=counters["ticket"], rows=counters["rows"])
            self._priority_version = counters["priority_version"]

    # ------------------------------------------------------------------ close
    def close(self, *, flush: bool = True, timeout: float | None = None) -> None:
        """Store what was accepted (``flush``), stop and join the worker (and its process),
        then free the buffer's memory, shared segments included. Idempotent."""
        if self.closed:
            return
        first_error: BaseException | None = None
        with self._cond:   # from here a rollout that comes is refused: what is queued is all there is to store
            self.ingestion.refusing = "close"
            self._cond.notify_all()
        if flush and self._thread is not None:
            try:
                self.flush(timeout)
            except BaseException as exc:  # noqa: BLE001 - still shut down, then report
                first_error = exc
        with self._cond:
            if self._thread is not None:
                self._thread.request_stop_locked()
            if not flush:
                self.ingestion.drop_queued_locked()
        if self._thread is not None:
            self._thread.join(timeout=self.schedule.timeout)
            if self._thread.is_alive():   # its memory stays: freed under a running worker, a store would write into freed pages
                with self._cond:
                    held, queued = self.ingestion.unstored_tickets_locked()
                err = WorkerError(
                    f"close(): the worker thread did not stop within {self.schedule.timeout:g} s (a hook or a store "
                    f"still running); the buffer was left open. Accepted and not stored: tickets {held} in the "
                    f"worker's hands, {queued} queued; they are stored if the hook returns and close() is called "
                    "again, and never otherwise. Fix: call close() again once it returns, or make the hook return")
                err.unstored_tickets = held + queued   # type: ignore[attr-defined]
                raise err from first_error
        if self._transformer is not None:
            self._transformer.close()
        self.closed = True
        self._prepared.forget()
        self.buffer.close()
        with self._cond:
            later = self._errors.take_locked()
        error = combine_shutdown_errors(first_error, later)
        if error is not None:
            raise error

    @property
    def worker_process_id(self) -> int | None:
        """The ingestion child's process id with ``worker='process'`` (else None): for
        monitoring, and for tests that kill it."""
        return getattr(self._transformer, "pid", None)

    def __enter__(self) -> "ExperienceDataPlane":
        return self

    def __exit__(self, *exc) -> None:
        self.close(flush=exc[0] is None)
