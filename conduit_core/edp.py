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
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np
import torch

from .batch import Batch
from .buffer import ExperienceBuffer
from .errors import CapacityError, ClosedError, ConfigError, ExperienceTimeout, SpecError, WorkerError
from .hooks import Rollout
from .metrics import MetricsRecorder, MetricsSnapshot
from .schedule import Schedule
from .episodes import EPISODE_END_RULES
from .workers import Encoded, InlineTransformer, as_numpy_rows, make_transformer

EDP_STATE_VERSION = 1


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


@dataclass
class _Prepared:
    batch: Batch
    request: DeliveryRequest
    rows_committed: int        # committed input rows when the batch was selected
    priority_version: int
    token: tuple | None        # buffer selection token, if this batch began an operator call
    items: int


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
        self._ingest_hooks: list[Callable] = list(ingest_hooks or [])
        self._delivery_hooks: list[Callable] = list(delivery_hooks or [])
        self._metrics = MetricsRecorder()
        self._cond = threading.Condition()
        # Held by whoever runs the delivery operator (caller inline, or worker prefetch), so
        # selections never interleave and the RNG sequence equals the sequential one.
        self._op_lock = threading.Lock()
        self._pending: deque[Rollout] = deque()
        self._prepared: deque[_Prepared] = deque()
        self._request: DeliveryRequest | None = None
        self._prefetch_in_flight = False  # the worker is drawing a batch ahead (under _op_lock)
        self._accepted_rows = 0
        self._committed_rows = 0
        self._ticket = 0
        self._priority_version = 0
        self._errors: list[BaseException] = []   # background failures not yet raised, every one kept
        self._busy = False
        self._closed = False
        self._stop = False
        self._transformer = None
        self._thread: threading.Thread | None = None
        if self.schedule.is_overlapped:
            self._start_worker()

    # ---------------------------------------------------------------- hooks
    def add_ingest_hook(self, hook: Callable[[list[Rollout]], list[Rollout]]) -> None:
        self._require_no_worker("add_ingest_hook")
        self._ingest_hooks.append(hook)

    def add_delivery_hook(self, hook: Callable[[Batch], Batch]) -> None:
        self._require_no_worker("add_delivery_hook")
        self._delivery_hooks.append(hook)

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
            rows = as_numpy_rows(data) if isinstance(data, Mapping) else 0
            if not isinstance(data, Mapping):
                raise SpecError("data", "a mapping of field name -> array", type(data).__name__,
                                "pass a dict such as {'obs': obs, 'action': action, ...}")
            validated = None
            if not self._ingest_hooks:
                # Nothing will transform it: reject bad input now, in the caller's frame.
                validated = self.buffer.spec.validate(data)
            with self._cond:
                ticket = self._ticket
                self._ticket += 1
            rollout = Rollout(data=data, source=int(source), policy_version=int(policy_version),
                              ticket=ticket, rows=rows)
            if not self.schedule.is_overlapped:
                t0 = time.perf_counter()
                self._accepted_rows += rows
                try:
                    if validated is not None:  # no hooks: encode what was validated, once
                        n, cols = validated
                        enc = [Encoded(ticket, rollout.source, rollout.policy_version, rows, n,
                                       self.buffer.spec.encode(cols))]
                    else:
                        enc = InlineTransformer(self.buffer.spec, self._ingest_hooks).transform([rollout])
                    self._commit(enc, timeout)
                except BaseException:
                    self._accepted_rows -= rows  # rejected, not accepted
                    raise
                finally:
                    self._committed_rows = self._accepted_rows
                self._metrics.add_busy("ingest", time.perf_counter() - t0, items_in=rows,
                                       items_out=sum(e.n for e in enc))
                return ticket
            limit = self.schedule.timeout if timeout is None else timeout
            deadline = time.monotonic() + limit
            with self._cond:
                while len(self._pending) >= self.schedule.queue_size:
                    self._raise_error_locked()
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise ExperienceTimeout(
                            f"ingest: the ingestion queue stayed full ({self.schedule.queue_size} rollouts) for "
                            f"{limit:g} s. Fix: the learner must deliver (rate limits / FIFO space), or raise "
                            "Schedule.queue_size.")
                    self._cond.wait(min(left, 0.05))
                self._pending.append(rollout)
                self._accepted_rows += rows
                self._metrics.set_queue("ingest", len(self._pending))
                self._cond.notify_all()
            return ticket

    def ingest_many(self, rollouts: list[Mapping[str, Any] | Rollout], *, timeout: float | None = None) -> list[int]:
        """Accept several rollouts at once (granularity g_ing: one operator call for the group,
        so hooks can vectorise across them). Items are dicts of columns or ``Rollout``s
        (with their own source and policy_version). Returns their tickets."""
        if not self.schedule.is_overlapped:
            with self._metrics.blocked("ingest"):
                self._check_usable()
                t0 = time.perf_counter()
                group = []
                for r in rollouts:
                    r = r if isinstance(r, Rollout) else Rollout(data=r)
                    with self._cond:
                        ticket = self._ticket
                        self._ticket += 1
                    group.append(Rollout(r.data, r.source, r.policy_version, ticket, as_numpy_rows(r.data), r.info))
                rows = sum(r.rows for r in group)
                enc = InlineTransformer(self.buffer.spec, self._ingest_hooks).transform(group)
                try:
                    self._commit(enc, timeout)
                except BaseException as exc:
                    # the rollouts stored before the failure stay stored, and are counted as such
                    stored = set(getattr(exc, "stored_tickets", ()))
                    self._accepted_rows += sum(r.rows for r in group if r.ticket in stored)
                    self._committed_rows = self._accepted_rows
                    raise
                self._accepted_rows += rows
                self._committed_rows = self._accepted_rows
                self._metrics.add_busy("ingest", time.perf_counter() - t0, items_in=rows,
                                       items_out=sum(e.n for e in enc))
                return [r.ticket for r in group]
        return [self.ingest(r.data if isinstance(r, Rollout) else r,
                            source=r.source if isinstance(r, Rollout) else 0,
                            policy_version=r.policy_version if isinstance(r, Rollout) else 0, timeout=timeout)
                for r in rollouts]

    def _commit(self, encoded: list[Encoded], timeout: float | None) -> None:
        """Store encoded rollouts in order. A rollout larger than the buffer fails the call
        before anything is stored; a later failure (a rate-limit timeout) leaves the earlier
        rollouts stored and names them in the error's ``stored_tickets``."""
        for e in encoded:
            if e.n > self.buffer.capacity:
                raise CapacityError(f"rollout {e.ticket}: expected at most capacity={self.buffer.capacity} "
                                    f"transitions, got {e.n}. Fix: raise the capacity or ingest it in smaller pieces")
        for i, e in enumerate(encoded):
            try:
                self.buffer.add_encoded(e.columns, e.n, source=e.source, policy_version=e.policy_version,
                                        timeout=timeout)
            except BaseException as exc:
                exc.stored_tickets = [x.ticket for x in encoded[:i]]  # type: ignore[attr-defined]
                raise

    def flush(self, timeout: float | None = None) -> None:
        """Block until every accepted rollout is stored (visible to delivery)."""
        self._check_usable()
        self._wait_rows(0, timeout, "flush")

    def _wait_rows(self, allowed_missing: int, timeout: float | None, what: str) -> None:
        if not self.schedule.is_overlapped:
            return
        limit = self.schedule.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        with self._cond:
            while True:
                self._raise_error_locked()
                if self._accepted_rows - self._committed_rows <= allowed_missing and \
                        (allowed_missing > 0 or not self._pending and not self._busy):
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ExperienceTimeout(
                        f"{what}: {self._accepted_rows - self._committed_rows} accepted rows were still not stored "
                        f"after {limit:g} s. Fix: check rate limits / FIFO space, or raise Schedule.timeout.")
                self._cond.wait(min(left, 0.05))

    # --------------------------------------------------------------- delivery
    def deliver(self, batch_size: int | None = None, *, policy_version: int | None = None,
                n_step: int | tuple[int, int] | None = None, gamma: float = 0.99, beta: float | None = None,
                sequence_length: int | None = None, timeout: float | None = None,
                episode_end: str = "shorten", fields=None) -> Batch:
        """A training-ready batch on the learner's device.

        Replay (uniform/prioritized): ``batch_size`` items, optionally as n-step returns
        (``episode_end``: 'shorten' or 'redraw' windows cut by an episode's end; see
        ``ExperienceBuffer.sample``) or as sequences of ``sequence_length``. FIFO: the next ``batch_size`` items of
        ``policy_version`` (``None``: everything of that version accepted so far). ``fields``: gather
        only these of the spec's fields (replay samples; None: all)."""
        with self._metrics.blocked("deliver"):
            self._check_usable()
            if episode_end not in EPISODE_END_RULES:
                raise ConfigError("episode_end", f"one of {EPISODE_END_RULES}", repr(episode_end),
                                  "'redraw' for RLlib's prioritized buffer, 'shorten' for its uniform one")
            kind = "take" if self.buffer.selector.consumes else ("sequences" if sequence_length else "sample")
            if kind != "take" and batch_size is None:
                raise ConfigError("batch_size", "a positive int for replay delivery", None,
                                  "pass batch_size=...; only FIFO delivery may take everything")
            req = DeliveryRequest(kind, batch_size, n_step if isinstance(n_step, (int, type(None))) else tuple(n_step),
                                  gamma, beta, sequence_length, policy_version, self.device, episode_end,
                                  None if fields is None else tuple(fields))
            if kind == "take":
                if batch_size is None:
                    self._wait_rows(0, timeout, "deliver")
                self._raise_error()
                t0 = time.perf_counter()
                batch = self.buffer.take(batch_size, policy_version=policy_version, device=self.device,
                                         timeout=timeout)
                batch = self._run_delivery_hooks(batch)
                self._metrics.add_busy("deliver", time.perf_counter() - t0, items_out=batch.size)
                return batch
            self._wait_rows(self.schedule.staleness, timeout, "deliver")
            with self._op_lock:
                with self._cond:
                    batch = self._take_prepared_locked(req)
                    self._request = req
                if batch is None:
                    t0 = time.perf_counter()
                    prepared = self._run_delivery_operator(req, timeout)
                    self._metrics.add_busy("deliver", time.perf_counter() - t0,
                                           items_out=sum(p.items for p in prepared))
                    batch = prepared[0].batch
                    with self._cond:
                        self._prepared.extend(prepared[1:])
                else:
                    self._metrics.count("prefetch_hits")
            with self._cond:
                self._cond.notify_all()
            return batch

    def _run_delivery_operator(self, req: DeliveryRequest, timeout: float | None) -> list[_Prepared]:
        """Select and gather ``g_del`` batches in one call (one selection, split)."""
        g = self.schedule.delivery_granularity
        with self._cond:
            rows_committed = self._committed_rows
            pv = self._priority_version
        # The token lets a prepared batch be undone; a batch handed out at once needs none.
        speculative = self.schedule.is_overlapped or g > 1
        token = self.buffer.selection_token() if speculative else None
        total = req.batch_size * g
        if req.kind == "sequences":
            big = self.buffer.sample_sequences(total, req.length, device=req.device, timeout=timeout)
        else:
            big = self.buffer.sample(total, device=req.device, n_step=req.n_step, gamma=req.gamma,
                                     beta=req.beta, timeout=timeout, episode_end=req.episode_end,
                                     fields=req.fields)
        batches = _split(big, req.batch_size) if g > 1 else [big]
        out = []
        try:
            for i, b in enumerate(batches):
                b = self._run_delivery_hooks(b)
                out.append(_Prepared(b, req, rows_committed, pv, token if i == 0 else None, req.batch_size))
        except BaseException:
            # nothing of this selection is handed out: it does not count as sampled (rate limits stay true)
            self.buffer.rollback_selection(token, items=total, restore_rng=token is not None)
            raise
        return out

    def _run_delivery_hooks(self, batch: Batch) -> Batch:
        for hook in self._delivery_hooks:
            batch = hook(batch)
            if not isinstance(batch, Batch):
                raise SpecError(f"delivery hook {getattr(hook, '__name__', type(hook).__name__)}",
                                "a conduit_core.Batch", type(batch).__name__,
                                "return the (modified) Batch; add columns with batch['name'] = tensor")
        return batch

    def _valid_locked(self, p: _Prepared, req: DeliveryRequest) -> bool:
        if p.request != req:
            return False
        if self._accepted_rows - p.rows_committed > self.schedule.staleness:
            return False
        if self.buffer.selector.weighted and self.schedule.staleness == 0 \
                and p.priority_version != self._priority_version:
            return False
        return True

    def _take_prepared_locked(self, req: DeliveryRequest) -> Batch | None:
        while self._prepared:
            p = self._prepared[0]
            if self._valid_locked(p, req):
                self._prepared.popleft()
                return p.batch
            self._discard_prepared_locked()
        return None

    def _drop_prepared_locked(self) -> None:
        """Let a prefetch in flight queue its batch (it has drawn from the RNG and the rows already),
        then drop every prepared batch, undoing their draws. For everything that changes what a
        prepared batch would be (state, rows, layout). Only the worker's prefetch is waited for: a
        caller's own deliver hands its draw out, and may wait for data as long as it likes."""
        self._cond.wait_for(lambda: not self._prefetch_in_flight)
        self._discard_prepared_locked()

    def _discard_prepared_locked(self) -> None:
        """Drop every prepared batch, undoing their selection as if never made."""
        if not self._prepared:
            return
        first = self._prepared[0]
        items = sum(p.items for p in self._prepared)
        token = first.token
        self.buffer.rollback_selection(token or self.buffer.selection_token(), items=items,
                                       restore_rng=token is not None)
        self._metrics.count("prefetch_discards", len(self._prepared))
        self._prepared.clear()

    # ------------------------------------------------------------- priorities
    def update_priorities(self, batch: Batch, priorities: Any) -> int:
        """New priorities for a delivered batch's rows (skips rows overwritten since)."""
        with self._metrics.blocked("priorities"):
            self._check_usable()
            t0 = time.perf_counter()
            with self._cond:
                n = self.buffer.update_priorities(batch.slots, priorities, seqs=batch.seqs)
                self._priority_version += 1
            self._metrics.add_busy("priorities", time.perf_counter() - t0, items_in=n)
            return n

    def reschedule(self, schedule: Schedule) -> None:
        """Switch to another schedule without losing anything: flush what was accepted, stop
        and join the worker, drop prepared batches (undoing their draws), start the new one.
        A child process of the same worker kind is kept (spawning one costs ~1 s), so a
        change of granularity or depth is cheap."""
        if not isinstance(schedule, Schedule):
            raise ConfigError("schedule", "a Schedule", type(schedule).__name__, "use Schedule.sequential() ...")
        self._check_usable()
        if schedule == self.schedule:
            return
        self.flush()
        if self._thread is not None:
            with self._cond:
                self._stop = True
                self._cond.notify_all()
            self._thread.join(timeout=self.schedule.timeout)
            self._thread = None
        keep = (self._transformer is not None and schedule.is_overlapped and schedule.worker == self.schedule.worker
                and schedule.timeout == self.schedule.timeout)
        if self._transformer is not None and not keep:
            self._transformer.close()
            self._transformer = None
        with self._cond:
            self._drop_prepared_locked()
            self._request = None
            self._stop = False
            self.schedule = schedule
        if schedule.is_overlapped:
            self._start_worker()
        self._raise_error()

    # -------------------------------------------------------------- placement
    def migrate(self, *, shards, capacity: int | None = None, background: bool = True,
                max_hold_s: float = 0.002, chunk_bytes: int | None = None):
        """Move the buffer to ``shards`` (optionally growing ``capacity``) while ingestion and
        delivery go on. Returns a handle whose ``wait()`` joins the copy (background), or
        None after a blocking migration. Prepared deliveries are dropped (their rows may move).
        In the background, each chunk of the copy holds the buffer's lock about ``max_hold_s``
        (the longest a delivery or insert waits for it); ``chunk_bytes`` fixes the chunk size
        instead. A blocking migration copies in the largest chunks, since everything waits
        for it anyway."""
        from .migration import MAX_CHUNK_BYTES, BackgroundMigration, begin_migration
        self._check_usable()
        with self._cond:
            self._drop_prepared_locked()
        m = begin_migration(self.buffer, shards=shards, capacity=capacity, max_hold_s=max_hold_s,
                            chunk_bytes=chunk_bytes if background else MAX_CHUNK_BYTES, start=not background)
        if background:
            return BackgroundMigration(m)
        m.finish()
        return None

    def replan(self, plan, topology, *, background: bool = True, max_hold_s: float = 0.002,
               chunk_bytes: int | None = None):
        """Carry out a placement ``Plan`` (see placement.plan) on ``topology``: one shard per
        assigned tier (a 'remote' tier's name is the Ray custom resource of its node)."""
        from .placement import shard_specs
        return self.migrate(shards=shard_specs(plan, topology), capacity=sum(a.slots for a in plan.assignments),
                            background=background, max_hold_s=max_hold_s, chunk_bytes=chunk_bytes)

    # ----------------------------------------------------------------- worker
    def _start_worker(self) -> None:
        if self._transformer is None:
            self._transformer = make_transformer(self.schedule.worker, self.buffer.spec, self._ingest_hooks,
                                                 timeout=self.schedule.timeout)
        self._thread = threading.Thread(target=self._worker_loop, name="conduit-edp-worker", daemon=True)
        self._thread.start()

    def _want_prefetch_locked(self) -> bool:
        req = self._request
        if req is None or req.kind == "take" or self._errors or self._pending:
            return False
        if len(self._prepared) >= self.schedule.depth:
            return False
        b = self.buffer
        n = (req.batch_size or 0) * self.schedule.delivery_granularity
        return b.rate_limiter.can_sample(size=b.size, inserts=b.inserted, samples=b.sampled, n=n)

    def _worker_loop(self) -> None:
        g = self.schedule.ingest_granularity
        while True:
            with self._cond:
                while not self._stop and not self._pending and not self._want_prefetch_locked():
                    self._cond.wait(0.05)
                if self._stop and not self._pending:
                    return
                group = [self._pending.popleft() for _ in range(min(g, len(self._pending)))]
                self._busy = bool(group)
                self._metrics.set_queue("ingest", len(self._pending))
                req = self._request
            if group:
                t0 = time.perf_counter()
                out_items = 0
                try:
                    enc = self._transformer.transform(group)
                    self._commit(enc, None)
                    out_items = sum(e.n for e in enc)
                except BaseException as exc:  # noqa: BLE001 - reported to the caller
                    stored = set(getattr(exc, "stored_tickets", ()))  # stored before the failure: not rejected
                    tickets = [r.ticket for r in group if r.ticket not in stored]
                    with self._cond:
                        err = WorkerError(f"ingestion of rollouts {tickets} failed in the background: "
                                          f"{type(exc).__name__}: {exc}")
                        err.__cause__ = exc
                        err.rejected_tickets = tickets  # type: ignore[attr-defined]
                        self._errors.append(err)
                finally:
                    with self._cond:
                        self._committed_rows += sum(r.rows for r in group)
                        self._busy = False
                        self._cond.notify_all()
                self._metrics.add_busy("ingest", time.perf_counter() - t0,
                                       items_in=sum(r.rows for r in group), items_out=out_items)
                continue
            if req is None or self._stop:
                continue
            try:
                with self._op_lock:
                    with self._cond:
                        if not self._want_prefetch_locked() or self._stop:
                            continue
                        self._prefetch_in_flight = True  # _drop_prepared_locked waits for its draw to be queued
                    t0 = time.perf_counter()
                    try:
                        prepared = self._run_delivery_operator(req, 0.001)
                        with self._cond:
                            # Validity is checked when handed out (guards), not here.
                            self._prepared.extend(prepared)
                    finally:
                        with self._cond:
                            self._prefetch_in_flight = False
                            self._cond.notify_all()
                self._metrics.add_busy("deliver", time.perf_counter() - t0,
                                       items_out=sum(p.items for p in prepared))
            except Exception as exc:  # noqa: BLE001
                from .errors import RateLimitError
                if isinstance(exc, RateLimitError):
                    continue  # not allowed yet; the caller's own deliver will wait or raise
                with self._cond:
                    err = WorkerError(f"delivery prefetch failed in the background: {type(exc).__name__}: {exc}")
                    err.__cause__ = exc
                    self._errors.append(err)
                    self._cond.notify_all()

    @property
    def losses(self):
        """Remote shards lost so far, with their rows (``ExperienceBuffer.losses``)."""
        return self.buffer.losses

    # -------------------------------------------------------------- eviction
    def evict(self, seqs) -> int:
        """Remove stored rows by seq (``ExperienceBuffer.evict``), after storing what was
        accepted; batches prepared ahead are discarded, so none can deliver a removed row."""
        self._check_usable()
        self.flush()
        with self._cond:
            self._drop_prepared_locked()
            return self.buffer.evict(seqs)

    def read(self, seqs, *, fields=None, device=None):
        """Stored rows by seq (``ExperienceBuffer.read``), after storing what was accepted:
        no selection, no draw, nothing counted as delivered."""
        self._check_usable()
        self.flush()
        return self.buffer.read(seqs, fields=fields, device=device)

    # ------------------------------------------------------------ errors/state
    def _take_error_locked(self) -> BaseException | None:
        """Every background failure not yet raised, as one error (None if there is none):
        the only one, or a WorkerError listing all of them (``.errors``) with the union of
        their ``rejected_tickets``, so a second failure is never dropped behind a first."""
        errors, self._errors = self._errors, []
        if not errors:
            return None
        if len(errors) == 1:
            return errors[0]
        tickets = [t for e in errors for t in getattr(e, "rejected_tickets", [])]
        err = WorkerError(f"{len(errors)} background failures: " + "; ".join(f"({i + 1}) {e}" for i, e in
                                                                         enumerate(errors)))
        err.errors = errors  # type: ignore[attr-defined]
        err.rejected_tickets = tickets  # type: ignore[attr-defined]
        err.__cause__ = errors[0]
        return err

    def _raise_error_locked(self) -> None:
        err = self._take_error_locked()
        if err is not None:
            raise err

    def _raise_error(self) -> None:
        with self._cond:
            self._raise_error_locked()

    def _check_usable(self) -> None:
        if self._closed:
            raise ClosedError("the data plane is closed. Fix: build a new ExperienceDataPlane.")
        if self._thread is not None and not self._thread.is_alive() and not self._stop:
            raise WorkerError("the background worker is gone. Fix: close() and build a new data plane.")
        self._raise_error()

    def metrics(self) -> MetricsSnapshot:
        b = self.buffer
        return self._metrics.snapshot(dropped_stale=b.dropped_stale, buffer_size=b.size, inserted=b.inserted)

    def reset_metrics(self) -> None:
        self._metrics.reset()

    def state_dict(self) -> dict:
        """Flush, drop prepared batches (undoing their draws), then the buffer's state plus
        the data plane's counters."""
        self.flush()
        with self._cond:
            self._drop_prepared_locked()  # before the RNG is saved
            self._request = None
            return {"edp_version": EDP_STATE_VERSION, "buffer": self.buffer.state_dict(),
                    "ticket": self._ticket, "rows": self._accepted_rows,
                    "priority_version": self._priority_version}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        from .errors import StateError
        if state.get("edp_version") != EDP_STATE_VERSION:
            raise StateError(f"edp_version: expected {EDP_STATE_VERSION}, got {state.get('edp_version')!r}. "
                             "Fix: load with the Conduit version that wrote the state.")
        counters = {}
        for k in ("ticket", "rows", "priority_version"):
            v = state.get(k)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise StateError(f"{k}: expected an int >= 0, got {v!r}. Fix: the state is damaged; nothing was "
                                 "loaded")
            counters[k] = int(v)
        self.flush()
        with self._cond:
            # undo prepared draws first: undoing them after the load would put back the old RNG state
            self._drop_prepared_locked()
            self._request = None
            self.buffer.load_state_dict(state["buffer"])  # all or nothing: raises before it changes anything
            self._ticket = counters["ticket"]
            self._accepted_rows = self._committed_rows = counters["rows"]
            self._priority_version = counters["priority_version"]

    # ------------------------------------------------------------------ close
    def close(self, *, flush: bool = True, timeout: float | None = None) -> None:
        """Store what was accepted (``flush``), stop and join the worker (and its process),
        then free the buffer's memory, shared segments included. Idempotent."""
        if self._closed:
            return
        first_error: BaseException | None = None
        if flush and self._thread is not None:
            try:
                self.flush(timeout)
            except BaseException as exc:  # noqa: BLE001 - still shut down, then report
                first_error = exc
        with self._cond:
            self._stop = True
            if not flush:
                self._pending.clear()
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=self.schedule.timeout)
            if self._thread.is_alive():  # pragma: no cover - defensive
                first_error = first_error or WorkerError("the worker thread did not stop in time")
        if self._transformer is not None:
            self._transformer.close()
        self._closed = True
        self._prepared.clear()
        self.buffer.close()
        with self._cond:
            later = self._take_error_locked()
        if first_error is None:
            first_error = later
        elif later is not None:  # both reach the caller: nothing is dropped at shutdown either
            combined = WorkerError(f"close: {first_error}; and then: {later}")
            combined.errors = [first_error, later]  # type: ignore[attr-defined]
            combined.rejected_tickets = [*getattr(first_error, "rejected_tickets", []),  # type: ignore[attr-defined]
                                         *getattr(later, "rejected_tickets", [])]
            combined.__cause__ = first_error
            first_error = combined
        if first_error is not None:
            raise first_error

    @property
    def worker_process_id(self) -> int | None:
        """The ingestion child's process id with ``worker='process'`` (else None): for
        monitoring, and for tests that kill it."""
        return getattr(self._transformer, "pid", None)

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> "ExperienceDataPlane":
        return self

    def __exit__(self, *exc) -> None:
        self.close(flush=exc[0] is None)


def _split(batch: Batch, size: int) -> list[Batch]:
    n = batch.size
    out = []
    for s in range(0, n, size):
        e = s + size
        data = {k: v[s:e] for k, v in batch.items()}
        out.append(Batch(data, slots=batch.slots[s:e], seqs=batch.seqs[s:e], versions=batch.versions[s:e],
                         weights=None if batch.weights is None else batch.weights[s:e],
                         inserted_at_selection=batch.inserted_at_selection))
    return out
