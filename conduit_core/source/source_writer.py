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

``remote.staging_area.StagingArea`` is the actor's side (``remote.remote_shard.ShardActor`` is one): staged rows, the slices
another actor or the driver pulls, and the copy into the actor's own storage.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import torch

from ..errors import CapacityError, ConfigError, ExperienceTimeout, StagedRowsLost, require_int
from ..remote.staging_area import RETIRED, STAGING_GROUP
from ..remote.wire import cut_columns
from ..schema.spec import ExperienceSpec


def _check_int(name: str, value) -> None:
    """An id, version or ticket: an int >= 0 (``int()`` would silently truncate 2.7 to 2)."""
    require_int(name, value, fix=f"pass {name} as an int >= 0")


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

    def __init__(self, *, spec_config: list, capacity: int, done_fields: tuple[str, ...], actor: Any, shard: int,
                 source: int, buffer: str) -> None:
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
