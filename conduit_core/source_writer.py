"""Ingestion at the source: an actor on any node writes its rollouts into the shard assigned
to it, and the driver only sees counts.

    env runner (node k)                       shard actor (node k)               driver
    writer.write(batch) ── validate, encode ──▶ stage(writer, ticket, rows) ──▶ (nothing)
         └── Receipt(writer, ticket, n, done flags) ─────────────────────────────▶ buf.commit(receipts)
                                                                                  seqs allocated, then each
                                           destination shard ◀── pull staged ──── shard run told to take
                                                                                  the staged rows

Two phases, so that a row is accepted exactly once: ``SourceWriter.write`` validates and
encodes where the data is produced (the same ``ExperienceSpec.validate_and_encode`` as
``ExperienceBuffer.add``: bad input fails in the writer, naming the field) and stages the
encoded rows in its shard's actor under the key (writer id, ticket); staging the same key
again changes nothing. ``ExperienceBuffer.commit`` (source_commit.py) then places the rows
like any insert. Until a receipt is committed nothing counts its rows; once committed, a
second commit of it is a counted no-op.

``StagingArea`` is the actor's side (``remote.ShardActor`` is one): staged rows, the slices
another actor or the driver pulls, and the copy into the actor's own storage.
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import torch

from .errors import CapacityError, ConfigError, ExperienceTimeout, StagedRowsLost

RETIRED = "retired"         # a stage's answer for a writer the buffer retired
PULL_FAILED = "failed"      # a pull's status when it failed for a reason other than lost rows
STAGING_GROUP = "staging"   # the actor's concurrency group for staging calls (another thread than its storage's)


def _check_int(name: str, value) -> None:
    """An id or version: an int (``int()`` would silently truncate 2.7 to 2)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ConfigError(name, "an int", repr(value), f"pass {name} as an int")


@dataclass(frozen=True)
class Receipt:
    """What the driver gets for a staged rollout: counts and the ring's metadata, no rows."""

    writer: str
    ticket: int
    n: int
    source: int
    policy_version: int
    done: Mapping[str, np.ndarray]    # the done fields (the ring links episodes with them)
    actor: Any = field(repr=False)    # the shard actor holding the staged rows
    shard: int                        # that actor's shard index in the buffer
    buffer: str                       # the buffer that handed the writer out

    @property
    def key(self) -> tuple[str, int]:
        return self.writer, self.ticket


def _as_numpy(col) -> np.ndarray:
    return col.numpy() if isinstance(col, torch.Tensor) else np.asarray(col)


class SourceWriter:
    """A small picklable writer an actor holds (``ExperienceBuffer.writer``). Each process's
    copy is its own writer: unpickling gives a fresh id and ticket counter, so two copies
    never stage under the same key."""

    def __init__(self, *, spec_config: list, capacity: int, done_fields: tuple[str, ...], actor, shard: int,
                 source: int, buffer: str):
        from .spec import ExperienceSpec
        _check_int("source", source)
        self.config = dict(spec_config=spec_config, capacity=int(capacity), done_fields=tuple(done_fields),
                           actor=actor, shard=int(shard), source=int(source), buffer=buffer)
        self.spec = ExperienceSpec.from_config(spec_config)
        self.capacity, self.done_fields = int(capacity), tuple(done_fields)
        self.actor, self.shard, self.source, self.buffer = actor, int(shard), int(source), buffer
        self.id = uuid.uuid4().hex
        self.next_ticket = 0

    def __reduce__(self):
        return (_rebuild, (self.config,))

    def write(self, batch: Mapping[str, Any], *, policy_version: int = 0, ticket: int | None = None,
              timeout: float = 60.0) -> Receipt:
        """Validate, encode and stage ``batch`` (one source's transitions, in time order);
        returns the receipt for ``ExperienceBuffer.commit``. ``ticket``: send again the rows
        of a write that raised (its error's ``ticket``): staged once however often sent."""
        _check_int("policy_version", policy_version)
        if ticket is not None:
            _check_int("ticket", ticket)
        n, enc = self.spec.validate_and_encode(batch)
        if n > self.capacity:
            raise CapacityError(f"batch: expected at most capacity={self.capacity} transitions, got {n}. "
                                "Fix: raise the buffer capacity or write the rollout in smaller pieces.")
        if ticket is None:
            ticket, self.next_ticket = self.next_ticket, self.next_ticket + 1
        elif not 0 <= int(ticket) < self.next_ticket:
            raise ConfigError("ticket", f"a ticket this writer issued (0..{self.next_ticket - 1})", ticket,
                              "pass the ticket of the write that raised, or None for a new write")
        cols = {name: _as_numpy(c) for name, c in enc.items()}
        if n:
            self.stage(int(ticket), cols, n, timeout)
        return Receipt(writer=self.id, ticket=int(ticket), n=n, source=self.source, policy_version=int(policy_version),
                       done={f: cols[f] for f in self.done_fields}, actor=self.actor, shard=self.shard,
                       buffer=self.buffer)

    def stage(self, ticket: int, cols: dict[str, np.ndarray], n: int, timeout: float) -> None:
        import ray

        from .remote import cut_columns
        names, pieces = cut_columns(self.spec, cols, n)
        try:
            status = ray.get(self.actor.stage.options(concurrency_group=STAGING_GROUP).remote(
                self.id, ticket, n, names, *pieces), timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            err = ExperienceTimeout(f"writer {self.id[:8]} ticket {ticket}: staging {n} rows in shard {self.shard} "
                                    f"took over {timeout:.3g} s. Fix: write again with ticket={ticket} (staged once "
                                    "however often sent), or raise timeout")
            err.ticket = ticket
            raise err from None
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
            err = StagedRowsLost(f"writer {self.id[:8]} ticket {ticket}: shard {self.shard}, where this writer stages, "
                                 f"is lost ({type(exc).__name__}); these {n} rows were not accepted. Fix: get a new "
                                 "writer from the buffer (ExperienceBuffer.writer) and write them again")
            err.ticket = ticket
            raise err from exc
        if status == RETIRED:
            err = StagedRowsLost(f"writer {self.id[:8]} ticket {ticket}: the buffer retired this writer "
                                 "(ExperienceBuffer.retire_writer); these rows were not accepted. Fix: write them "
                                 "again through the writer that replaced it")
            err.ticket = ticket
            raise err


def _rebuild(config: dict) -> SourceWriter:
    return SourceWriter(**config)


class TicketSet:
    """Tickets of one writer, kept as 'every ticket below ``low``' plus the ones above it."""

    def __init__(self):
        self.low, self.above = 0, set()

    def __contains__(self, ticket: int) -> bool:
        return ticket < self.low or ticket in self.above

    def add(self, ticket: int) -> None:
        self.above.add(ticket)
        while self.low in self.above:
            self.above.discard(self.low)
            self.low += 1


class StagingArea:
    """The staging side of a shard actor: rows staged under (writer, ticket), pieces of them
    pulled in from another actor, and the copy into ``self.storage``. Staging calls run in the
    actor's ``STAGING_GROUP`` thread, storage calls in its default one: an actor that waits for
    another's staged rows never blocks that one's own pull (no cycle can deadlock)."""

    def init_staging(self) -> None:
        self.staging_lock = threading.Lock()
        # key -> [(first row, n, columns, pulled)]: the rollout as staged here (pulled False), or pieces
        # of it pulled from the actor that staged it (dropped once written)
        self.staged: dict[tuple[str, int], list[tuple[int, int, dict, bool]]] = {}
        self.released: dict[str, TicketSet] = {}
        self.retired: set[str] = set()   # writers the buffer replaced: nothing of theirs is staged again

    def stage(self, writer: str, ticket: int, n: int, names: list[str], *pieces) -> str:
        """Hold ``n`` encoded rows under (writer, ticket); again for the same key changes nothing."""
        from .remote import join_reply, reply_layout
        key = (writer, int(ticket))
        with self.staging_lock:
            if writer in self.retired:
                return RETIRED
            if key[1] in self.released.get(writer, ()):
                return "committed"
            if key in self.staged:
                held = self.staged[key][0][1]
                if held != n:
                    raise ConfigError("ticket", f"{held} rows as first staged under writer {writer[:8]} ticket {ticket}",
                                      n, "give each process its own writer (ExperienceBuffer.writer)")
                return "again"
            self.staged[key] = [(0, n, join_reply(reply_layout(self.storage.spec, names, n), list(pieces)), False)]
            return "staged"

    def find_staged(self, writer: str, ticket: int, first: int, n: int) -> dict | None:
        with self.staging_lock:
            for off, m, cols, _ in self.staged.get((writer, int(ticket)), ()):
                if off <= first and first + n <= off + m:
                    return {name: c[first - off: first - off + n] for name, c in cols.items()}
        return None

    def staged_slice(self, writer: str, ticket: int, first: int, n: int, names: list[str]):
        """Rows ``first .. first+n`` of a staged rollout, cut as ``reply_layout`` cuts them
        (call with ``num_returns`` = the layout's length)."""
        from .remote import reply_layout
        cols = self.find_staged(writer, ticket, first, n)
        if cols is None:
            raise KeyError(f"rows {first}..{first + n} of writer {writer[:8]} ticket {ticket} are not staged here")
        out = [cols[name][a:b] for name, cuts in reply_layout(self.storage.spec, names, n) for a, b in cuts]
        return tuple(out) if len(out) > 1 else out[0]

    def pull_staged(self, writer: str, ticket: int, first: int, n: int, src) -> str:
        """Make rows ``first .. first+n`` of (writer, ticket) local: already here (this actor
        staged them), or pulled from ``src``, actor to actor. 'ok', or why not."""
        if self.find_staged(writer, ticket, first, n) is not None:
            return "ok"
        import ray

        from .remote import join_reply, reply_layout
        names = list(self.storage.spec.names)
        layout = reply_layout(self.storage.spec, names, n)
        k = sum(len(p) for _, p in layout)
        try:
            refs = src.staged_slice.options(num_returns=k, concurrency_group=STAGING_GROUP).remote(
                writer, ticket, first, n, names)
            values = ray.get(refs if k > 1 else [refs])
            piece = join_reply(layout, values)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
            return f"lost: {type(exc).__name__}: {exc}"
        except ray.exceptions.RayTaskError as exc:
            return f"missing: {exc}"
        except Exception as exc:  # noqa: BLE001 - any other failure is an answer too: a release that
            # waits on this call (passed as its argument) would otherwise fail unrun, its rows staying
            return f"{PULL_FAILED}: {type(exc).__name__}: {exc}"
        with self.staging_lock:
            self.staged.setdefault((writer, int(ticket)), []).append((first, n, piece, True))
        return "ok"

    def write_staged(self, start: int, writer: str, ticket: int, first: int, n: int, src) -> str:
        """Store rows ``first .. first+n`` of (writer, ticket) at local slots ``start ..``:
        a copy from this actor's staging (pulled from ``src`` first if not here)."""
        status = self.pull_staged(writer, ticket, first, n, src)
        if status != "ok":
            return status
        self.storage.write(start, self.find_staged(writer, ticket, first, n), n)
        with self.staging_lock:   # a piece pulled for this write is done with (a rollout staged here stays)
            parts = self.staged.get((writer, int(ticket)), [])
            parts[:] = [p for p in parts if not (p[3] and p[0] == first and p[1] == n)]
            if not parts:
                self.staged.pop((writer, int(ticket)), None)
        return "ok"

    def release(self, keys: list[tuple[str, int]], *after) -> None:
        """The buffer took these rollouts: drop their rows; staging them again does nothing.
        ``after``: pull calls the caller began here (Ray runs this once they are done)."""
        with self.staging_lock:
            for writer, ticket in keys:
                self.staged.pop((writer, int(ticket)), None)
                self.released.setdefault(writer, TicketSet()).add(int(ticket))

    def retire_writer(self, writer: str) -> int:
        """Drop every rollout ``writer`` staged here and refuse its later stages (its rollouts
        nobody will commit: results its caller dropped); returns how many were dropped."""
        with self.staging_lock:
            keys = [k for k, parts in self.staged.items() if k[0] == writer and not parts[0][3]]
            for k in keys:
                del self.staged[k]
            self.retired.add(writer)
        return len(keys)

    def staging_stats(self) -> dict[str, int]:
        with self.staging_lock:
            return {"rollouts": len(self.staged),
                    "bytes": sum(c.nbytes for parts in self.staged.values() for _, _, cols, _ in parts
                                 for c in cols.values())}
