"""The ingestion control point: accept rollouts, then store each exactly once, in order.

    actors --ingest()--> [ accept: ticket, count rows ] --> inline: hooks -> validate -> encode -> write
                                                        \\-> overlapped: bounded queue -> the worker

Acceptance hands out the ticket (the acceptance number) and counts the rollout's rows;
storing writes it into the buffer. The two counts, ``accepted_rows`` and
``committed_rows``, are what the staleness guard and ``flush`` measure: an accepted row
not yet committed is one a delivery may be missing.

Sequential: a rollout is stored before ``ingest`` returns. Overlapped: it is queued (at
most ``Schedule.queue_size``; a full queue makes the caller wait) and the background
worker takes groups off the queue (``take_group_locked``), stores them with ``commit``
and reports them done (``group_done_locked``).

Methods ending in ``_locked`` expect the caller to hold the data plane's condition; the
others take it themselves where they need it.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable, Mapping

from ..buffer.experience_buffer import ExperienceBuffer
from ..buffer.routes import DECLINED, NATIVE
from ..errors import CapacityError, ClosedError, ExperienceTimeout, SpecError, require_ids
from ..planning.schedule import Schedule
from ..selection.rate_gate import BufferCondition
from .background_errors import BackgroundErrors
from .hooks import Rollout
from .metrics import MetricsRecorder
from .workers import Encoded, InlineTransformer, as_numpy_rows, encode_rollouts, encode_unhooked


class IngestionPoint:
    """Accepts and stores rollouts for one buffer.

    Public contract:

    - ``ingest(...)`` / ``ingest_many_inline(...)``: accept (and, sequentially, store)
      rollouts; return their tickets. The data plane checks it is usable first.
    - ``commit(encoded, timeout)``: store encoded rollouts in order (inline, and for the worker).
    - ``wait_stored(allowed_missing, timeout, what)``: block until at most that many accepted
      rows are not stored yet (0: until every rollout queued before the call is stored).
    - ``take_group_locked(g)`` / ``group_done_locked(group)``: the worker's side of the queue.
    - ``drop_queued_locked()``: forget what is queued (closing without a flush).
    - ``restore_counts_locked(ticket, rows)``: continue from a loaded state.
    - Read-only for others: ``ticket`` (the next one), ``accepted_rows``, ``committed_rows``,
      ``pending`` (the queue: one deque for the point's life), ``busy`` (the worker is
      storing a group it took off the queue).
    - ``hooks`` (the ingest hooks, run in order) and ``schedule`` (set by the data plane when
      it reschedules) are the data plane's to change.
    """

    def __init__(self, *, buffer: ExperienceBuffer, hooks: list[Callable], schedule: Schedule,
                 metrics: MetricsRecorder, cond: BufferCondition, errors: BackgroundErrors):
        self._buffer = buffer
        self._metrics = metrics
        self._cond = cond
        self._errors = errors
        self.hooks = hooks
        self.schedule = schedule
        self.pending: deque[Rollout] = deque()  # accepted, not yet taken by the worker (overlapped)
        self.ticket = 0
        self.accepted_rows = 0
        self.committed_rows = 0
        self.busy = False
        # set under the condition before the queue is drained: "close" (a rollout that comes after is
        # refused: ClosedError) or "reschedule" (it waits for the switch, then goes the new schedule's
        # way); never queued for a worker that is leaving
        self.refusing: str | None = None
        self.enqueued = self.finished = 0         # rollouts queued, and taken off the queue stored or failed
        self.in_hand: list[Rollout] = []          # the group the worker is storing now (its hooks running)

    def ingest(self, data: Mapping[str, Any], *, source: int, policy_version: int, timeout: float | None) -> int:
        """Accept one rollout: stored before returning (sequential) or queued (overlapped)."""
        rows = as_numpy_rows(data) if isinstance(data, Mapping) else 0
        if not isinstance(data, Mapping):
            raise SpecError("data", "a mapping of field name -> array", type(data).__name__,
                            "pass a dict such as {'obs': obs, 'action': action, ...}")
        source, policy_version = require_ids(source, policy_version)
        validated = None
        if not self.hooks:
            # Nothing will transform it: reject bad input now, in the caller's frame.
            validated = self._buffer.spec.validate(data)
        with self._cond:
            ticket = self.ticket
            self.ticket += 1
        rollout = Rollout(data=data, source=source, policy_version=policy_version,
                          ticket=ticket, rows=rows)
        if not self.schedule.is_overlapped:
            return self._store_now(rollout, validated, timeout)
        limit = self.schedule.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        with self._cond:
            while self.refusing != "close" and (self.refusing == "reschedule" or (
                    self.schedule.is_overlapped and len(self.pending) >= self.schedule.queue_size)):
                self._errors.raise_locked()
                left = deadline - time.monotonic()
                if left <= 0:
                    if self.refusing == "reschedule":
                        raise ExperienceTimeout(f"ingest: a reschedule() did not finish within {limit:g} s; this "
                                                "rollout was not accepted. Fix: ingest it again")
                    raise ExperienceTimeout(
                        f"ingest: the ingestion queue stayed full ({self.schedule.queue_size} rollouts) for "
                        f"{limit:g} s. Fix: the learner must deliver (rate limits / FIFO space), or raise "
                        "Schedule.queue_size.")
                self._cond.wait(min(left, 0.05))
            if self.refusing == "close":
                raise ClosedError("ingest: the data plane is closing; this rollout was not accepted (its ticket "
                                  "number is skipped). Fix: stop ingesting before close(), or build a new "
                                  "ExperienceDataPlane")
            if self.schedule.is_overlapped:   # (checked under the lock: a reschedule may have come in between)
                self.pending.append(rollout)
                self.enqueued += 1
                self.accepted_rows += rows
                self._metrics.set_queue("ingest", len(self.pending))
                self._cond.notify_all()
                return ticket
        return self._store_now(rollout, validated, timeout)   # no worker to queue for now: stored here

    def _store_now(self, rollout: Rollout, validated, timeout: float | None) -> int:
        """``ingest``'s sequential route: the rollout stored before returning. Its rows count as
        accepted while it is stored (a prepared batch drawn meanwhile is stale) and as committed
        once it is; both counts under the lock, as other callers may be storing too."""
        t0 = time.perf_counter()
        rows = rollout.rows
        with self._cond.mutex:
            self.accepted_rows += rows
        try:
            if validated is not None:  # no hooks: encode what was validated, once
                n, cols = validated
                enc = [Encoded(rollout.ticket, rollout.source, rollout.policy_version, rows, n,
                               self._buffer.spec.encode(cols))]
            else:
                enc = InlineTransformer(self._buffer.spec, self.hooks).transform([rollout])
            self.commit(enc, timeout)
        except BaseException:
            with self._cond.mutex:
                self.accepted_rows -= rows  # rejected, not accepted
            raise
        with self._cond.mutex:
            self.committed_rows += rows
        self._metrics.add_busy("ingest", time.perf_counter() - t0, items_in=rows,
                               items_out=sum(e.n for e in enc))
        return rollout.ticket

    def ingest_many_inline(self, rollouts: list[Mapping[str, Any] | Rollout], timeout: float | None) -> list[int]:
        """Accept and store several rollouts in one operator call (sequential schedule), so
        hooks can vectorise across them. Returns their tickets. Records the call's time in the
        metrics in one step, as blocked and busy alike (a failed call: blocked only)."""
        t0 = time.perf_counter()
        try:   # (a call that fails counts as a call, blocked for its time)
            rollouts = list(rollouts)   # (any iterable: its length is the tickets it takes)
            for r in rollouts:   # every id checked before a ticket is taken or a row stored
                if type(r) is Rollout:
                    require_ids(r.source, r.policy_version)
            if not self.hooks:   # the buffer's native insert route, where it takes them (else nothing changed: below)
                stored = self._insert_inline(rollouts)
                if stored is not DECLINED:
                    tickets, rows = stored
                    self._metrics.add_call("ingest", time.perf_counter() - t0, items_in=rows, items_out=rows)
                    return tickets
            with self._cond.mutex:   # the group's tickets, in order
                first_ticket = self.ticket
                self.ticket += len(rollouts)
            if self.hooks:
                group = []
                for ticket, r in enumerate(rollouts, first_ticket):
                    r = r if isinstance(r, Rollout) else Rollout(data=r)
                    group.append(Rollout(r.data, r.source, r.policy_version, ticket, as_numpy_rows(r.data), r.info))
                enc = encode_rollouts(self._buffer.spec, self.hooks, group)
                accepted = group   # rows as accepted (a hook may change a rollout's rows)
            else:   # no hook can change a rollout: each encoded straight from what came
                accepted = enc = encode_unhooked(self._buffer.spec, rollouts, first_ticket)
            rows = sum(r.rows for r in accepted) if len(accepted) > 1 else (accepted[0].rows if accepted else 0)
            try:
                if len(enc) == 1 and enc[0].n <= self._buffer.ring.capacity:   # (commit's lone case, inline)
                    e = enc[0]
                    self._buffer.add_encoded(e.columns, e.n, source=e.source, policy_version=e.policy_version,
                                             timeout=timeout)
                else:
                    self.commit(enc, timeout)
            except BaseException as exc:
                # the rollouts stored before the failure stay stored, and are counted as such
                stored = set(getattr(exc, "stored_tickets", ()))
                done = sum(r.rows for r in accepted if r.ticket in stored)
                with self._cond.mutex:   # (counts under the lock: other callers may be storing too)
                    self.accepted_rows += done
                    self.committed_rows += done
                raise
        except BaseException:
            self._metrics.add_blocked("ingest", time.perf_counter() - t0)
            raise
        with self._cond.mutex:
            self.accepted_rows += rows
            self.committed_rows += rows
        self._metrics.add_call("ingest", time.perf_counter() - t0, items_in=rows,
                               items_out=rows if enc is accepted else sum(e.n for e in enc))
        return [enc[0].ticket] if len(enc) == 1 else [e.ticket for e in enc]   # (the lone case: no frame)

    def _insert_inline(self, rollouts: list):
        """``ingest_many_inline``'s rollouts through the buffer's native insert route (no hook can
        change them; ``routes.py``): (their tickets, rows), the tickets taken and the rows counted
        once they are stored; ``DECLINED`` where that route declines them (nothing taken, counted
        or stored), and the caller runs the reference."""
        if len(rollouts) == 1:   # (an env step's add: no comprehension, which is a frame)
            r = rollouts[0]
            parts = [(r.data, r.source, r.policy_version) if type(r) is Rollout else (r, 0, 0)]
        else:
            parts = [(r.data, r.source, r.policy_version) if type(r) is Rollout else (r, 0, 0) for r in rollouts]
        routes = self._buffer.routes
        if not routes.fast:
            return DECLINED
        for _, source, version in parts:   # (anything but plain ints: the reference converts or names it)
            if type(source) is not int or type(version) is not int:
                return DECLINED
        try:
            stored = routes.inline_insert.insert(parts)
        except BaseException as exc:   # (a copy that failed: the rollouts before it are stored, as commit says)
            k = getattr(exc, "stored_parts", 0)
            done = sum(as_numpy_rows(data) for data, _, _ in parts[:k])
            with self._cond.mutex:
                first_ticket = self.ticket
                self.ticket += len(parts)
                self.accepted_rows += done
                self.committed_rows += done
            if len(parts) > 1:   # (commit's name for them; a lone rollout's route names none)
                exc.stored_tickets = list(range(first_ticket, first_ticket + k))  # type: ignore[attr-defined]
            raise
        if stored is DECLINED:
            return DECLINED
        routes.inserts[NATIVE] += 1
        rows = stored[0][1] if len(stored) == 1 else sum(n for _, n in stored)
        with self._cond.mutex:   # (tickets and counts in one hold: other callers may be storing too)
            first_ticket = self.ticket
            self.ticket += len(stored)
            self.accepted_rows += rows
            self.committed_rows += rows
        return [first_ticket] if len(stored) == 1 else list(range(first_ticket, first_ticket + len(stored))), rows

    def commit(self, encoded: list[Encoded], timeout: float | None) -> None:
        """Store encoded rollouts in order. A rollout larger than the buffer fails the call
        before anything is stored; a later failure (a rate-limit timeout) leaves the earlier
        rollouts stored and names them in the error's ``stored_tickets``."""
        buffer = self._buffer
        for e in encoded:
            if e.n > buffer.ring.capacity:
                raise CapacityError(f"rollout {e.ticket}: expected at most capacity={buffer.capacity} "
                                    f"transitions, got {e.n}. Fix: raise the capacity or ingest it in smaller pieces")
        try:   # one insert where that is the same as one by one (add_encoded_many)
            if len(encoded) == 1:   # (what add_encoded_many does with one)
                e = encoded[0]
                buffer.add_encoded(e.columns, e.n, source=e.source, policy_version=e.policy_version, timeout=timeout)
            else:
                buffer.add_encoded_many([(e.columns, e.n, e.source, e.policy_version) for e in encoded],
                                        timeout=timeout)
        except BaseException as exc:   # (a lone rollout that failed was not stored)
            stored = getattr(exc, "stored_parts", 0) if len(encoded) > 1 else 0
            exc.stored_tickets = [x.ticket for x in encoded[:stored]]  # type: ignore[attr-defined]
            raise

    def wait_stored(self, allowed_missing: int, timeout: float | None, what: str) -> None:
        """Block until at most ``allowed_missing`` accepted rows are not stored yet; with 0,
        until every rollout queued before the call is stored (or failed and reported: a rollout
        may have no rows), however many come meanwhile. Raises a background failure as soon as
        one is reported; ``what`` names the call in a timeout."""
        if not self.schedule.is_overlapped:
            return
        limit = self.schedule.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        with self._cond:
            target = self.enqueued   # with 0: the rollouts queued before the call (not those that come after)
            while True:
                self._errors.raise_locked()
                if (self.finished >= target) if allowed_missing == 0 else \
                        self.accepted_rows - self.committed_rows <= allowed_missing:
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ExperienceTimeout(
                        f"{what}: {self.accepted_rows - self.committed_rows} accepted rows were still not stored "
                        f"after {limit:g} s. Fix: check rate limits / FIFO space, or raise Schedule.timeout.")
                self._cond.wait(min(left, 0.05))

    def take_group_locked(self, g: int) -> list[Rollout]:
        """Up to ``g`` queued rollouts, oldest first, for the worker to store (``busy`` until
        ``group_done_locked``)."""
        pending = self.pending
        group = [pending.popleft() for _ in range(min(g, len(pending)))]
        self.busy = bool(group)
        self.in_hand = group
        self._metrics.set_queue("ingest", len(pending))
        return group

    def group_done_locked(self, group: list[Rollout]) -> None:
        """The worker stored ``group``, or failed for good (the failure is reported): either
        way its rows are no longer missing."""
        self.committed_rows += sum(r.rows for r in group)
        self.finished += len(group)
        self.busy = False
        self.in_hand = []

    def unstored_tickets_locked(self) -> tuple[list[int], list[int]]:
        """(tickets the worker holds, tickets still queued): rollouts accepted and not stored yet."""
        return [r.ticket for r in self.in_hand], [r.ticket for r in self.pending]

    def drop_queued_locked(self) -> None:
        self.finished += len(self.pending)
        self.pending.clear()

    def restore_counts_locked(self, *, ticket: int, rows: int) -> None:
        """Continue from a loaded state: the next ticket, and ``rows`` accepted and stored. Rows
        accepted and not stored yet (a caller storing on another thread) stay counted as such:
        each caller adds its own rows to ``committed_rows`` when they are stored."""
        self.ticket = ticket
        in_flight = self.accepted_rows - self.committed_rows
        self.committed_rows = rows
        self.accepted_rows = rows + in_flight
