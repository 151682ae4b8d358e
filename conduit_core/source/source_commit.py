"""The driver's side of ingestion at the source: hand out writers, commit their receipts.

``ExperienceBuffer.commit(receipts)`` takes each receipt exactly once, all or nothing:

    1. under the buffer's lock, wait as any insert waits (rate limiter, FIFO space), and
       compute where the rows go: seqs ``inserted ..``, slots ``seq % capacity``, one run per shard;
    2. prepare: every remote destination shard pulls its run from the actor that staged it
       (actor to actor, all runs at once; the staging actor itself copies nothing), a local
       one gathers its run into the driver. A staging actor found gone here means the rows
       were never accepted: nothing changed, the receipt is reported in ``never_accepted``;
    3. insert: ``add_encoded`` with the staged rows as its columns, so the ring, selector,
       rate limiter, migration dual write and shard-loss recovery are those of every insert.
       Each remote shard copies its prepared run into its own storage.

The ledger (``CommitLedger``) remembers every (writer, ticket) taken, compactly
(``TakenReceipts``): a receipt sent twice is counted in ``duplicates`` and changes nothing.
Once committed, the staging actor drops the rows (and refuses a late retry of that stage).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from ..errors import ConfigError, StagedRowsLost, StateError
from ..remote.staging_area import STAGING_GROUP
from ..remote.wire import REMOTE_CALL_TIMEOUT_S, join_reply, reply_layout
from ..selection.rate_gate import wait_to_insert
from .source_writer import Receipt, SourceWriter
from .taken_receipts import TakenReceipts

log = logging.getLogger("conduit")


class StagedRows(Mapping):
    """A receipt's rows as ``add_encoded``'s columns: a remote shard takes them actor to
    actor (it reads ``staged``); the done fields come with the receipt; any other reader
    (a local shard, a migration's new layout) gets the columns gathered from the staging actor."""

    def __init__(self, spec, receipt: Receipt):
        self.spec, self.receipt, self.staged = spec, receipt, self
        self.key, self.actor, self.shard = receipt.key, receipt.actor, receipt.shard
        self.columns: dict[str, np.ndarray] | None = None
        self.pulled_into: set = set()   # actors a piece of the rows was pulled into (released after)
        self.pull_refs: dict = {}       # actor -> its pull calls (a release waits for them: see commit)

    def fetch(self) -> dict[str, np.ndarray]:
        """Every column, gathered from the staging actor once (StagedRowsLost if it is gone)."""
        if self.columns is None:
            import ray

            names, n = list(self.spec.names), self.receipt.n
            layout = reply_layout(self.spec, names, n)
            k = sum(len(p) for _, p in layout)
            try:
                refs = self.actor.staged_slice.options(num_returns=k, concurrency_group="staging").remote(
                    *self.key, 0, n, names)
                self.columns = join_reply(layout, ray.get(refs if k > 1 else [refs], timeout=REMOTE_CALL_TIMEOUT_S))
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError,
                    ray.exceptions.RayTaskError, ray.exceptions.GetTimeoutError) as exc:
                raise StagedRowsLost(f"writer {self.key[0][:8]} ticket {self.key[1]}: the rows staged in shard "
                                     f"{self.shard} are gone ({type(exc).__name__}); they were never accepted. Fix: "
                                     "write them again through a new writer (ExperienceBuffer.writer)") from exc
        return self.columns

    def __getitem__(self, name: str):
        if name in self.receipt.done:
            return self.receipt.done[name]
        return self.fetch()[name]

    def __iter__(self):
        return iter(self.spec.names)

    def __len__(self) -> int:
        return len(self.spec.names)


@dataclass
class CommitLedger:
    """Which receipts a buffer took (exactly once), and what it refused."""

    # this buffer's id, in every writer it hands out: a receipt is committed only to the buffer whose
    # writer made it. A restored buffer gets an id of its own (two buffers restored from one
    # checkpoint must not take each other's receipts) and keeps the ids it continues in ``earlier``:
    # a receipt from a writer handed out before the save is still committed, once
    buffer: str = field(default_factory=lambda: uuid.uuid4().hex)
    earlier: frozenset = frozenset()
    taken: TakenReceipts = field(default_factory=TakenReceipts)   # committed, never accepted or declined
    pending: set = field(default_factory=set)          # being committed now (a concurrent retry waits it out)
    claimed: dict = field(default_factory=dict)        # key -> commit calls holding it (abandon_before skips it)
    duplicates: int = 0
    never_accepted: int = 0                            # rows whose staging actor was gone at commit
    declined: int = 0                                  # rows the caller declined (``decline``), never stored
    abandoned: int = 0                                 # receipts the caller never got (``abandon_before``)

    def state(self) -> dict:
        """The ledger as plain values (saved in ``ExperienceBuffer.state_dict``): a receipt
        committed before a checkpoint is a duplicate after the restore (``TakenReceipts.state``).
        Pending commits are not saved."""
        return {"buffer": self.buffer, "earlier": sorted(self.earlier), "duplicates": self.duplicates,
                "never_accepted": self.never_accepted, "declined": self.declined, "abandoned": self.abandoned,
                **self.taken.state()}

    def made(self, receipt: Receipt) -> bool:
        """Whether a writer of this buffer (or of a buffer it was restored from) made ``receipt``."""
        return receipt.buffer == self.buffer or receipt.buffer in self.earlier

    @staticmethod
    def check_state(state) -> "CommitLedger":
        """A ledger from ``state()``'s output (or an earlier version's), validated (StateError naming the part)."""

        def bad(part: str, expected: str, got) -> StateError:
            return StateError(f"ingest.{part}: expected {expected}, got {got}. Fix: the state is damaged or from "
                              "another buffer; nothing was loaded")
        if not isinstance(state, Mapping):
            raise bad("", "a dict from CommitLedger.state()", type(state).__name__)
        buffer = state.get("buffer")
        if not isinstance(buffer, str) or not buffer:
            raise bad("buffer", "the buffer id (a str)", repr(buffer))
        earlier = state.get("earlier", [])   # (absent from states saved before 2026-12-03)
        if not isinstance(earlier, (list, tuple)) or not all(isinstance(e, str) and e for e in earlier):
            raise bad("earlier", "a list of buffer ids (strs)", repr(earlier))
        taken = TakenReceipts.from_state(state, bad)
        counts = [state.get(k, 0) for k in ("duplicates", "never_accepted", "declined", "abandoned")]
        if not all(isinstance(c, (int, np.integer)) and not isinstance(c, bool) and c >= 0 for c in counts):
            raise bad("duplicates/never_accepted/declined/abandoned", "ints >= 0", counts)
        return CommitLedger(earlier=frozenset(earlier) | {buffer}, taken=taken, duplicates=int(counts[0]),
                            never_accepted=int(counts[1]), declined=int(counts[2]),
                            abandoned=int(counts[3]))   # (a new id: see ``buffer``)


@dataclass
class CommitReport:
    """What one ``commit`` call did: first seq per committed receipt, retries it ignored,
    and receipts whose rows were gone before the buffer took them (with the cause)."""

    committed: list = field(default_factory=list)        # (receipt, first seq)
    duplicates: list = field(default_factory=list)       # receipts committed before
    never_accepted: list = field(default_factory=list)   # (receipt, cause)

    @property
    def rows(self) -> int:
        return sum(r.n for r, _ in self.committed)


def shard_runs(bounds: np.ndarray, capacity: int, start: int, n: int) -> list[tuple[int, int, int, int]]:
    """(shard, local slot, first row, rows) of ``n`` rows written at ring slot ``start``, as
    ``ColumnarStorage.write`` cuts them."""
    runs, done, slot = [], 0, start % capacity
    while done < n:
        shard = int(np.searchsorted(bounds, slot, side="right") - 1)
        lo, hi = int(bounds[shard]), int(bounds[shard + 1])
        run = min(n - done, hi - slot)
        runs.append((shard, slot - lo, done, run))
        done += run
        slot = (slot + run) % capacity
    return runs


def begin_prepare(buf, rows: StagedRows, first_seq: int) -> list:
    """Start making the rows' runs local to their destination shards, as if they got seqs
    from ``first_seq``; returns the calls that finish it."""
    started = []
    for shard, _, first, n in shard_runs(buf.storage.bounds, buf.capacity, first_seq, rows.receipt.n):
        part = buf.storage.parts[shard]
        begin = getattr(part, "begin_pull", None)
        if begin is None:
            started.append(rows.fetch)   # a shard in this process: the driver gathers the rows
        else:
            started.append(begin(rows, first, n))
            if part.actor != rows.actor:
                rows.pulled_into.add(part.actor)
    return started


def prepare(buf, rows: StagedRows, first_seq: int, started: list | None = None) -> None:
    """Every destination shard of the rows makes its run local: ``started`` (begun for these
    seqs ahead of time), else all begun now before any is awaited."""
    for finish in (started if started is not None else begin_prepare(buf, rows, first_seq)):
        finish()


def commit(buf, receipts: Iterable[Receipt], *, timeout: float | None = None) -> CommitReport:
    """``ExperienceBuffer.commit``: store the staged rows of ``receipts``, each exactly once,
    in the order given (one source's receipts in its time order)."""
    report = CommitReport()
    ledger = buf.ingest_ledger
    release: dict = {}
    receipts = list(receipts)
    for r in receipts:
        if not isinstance(r, Receipt):
            raise ConfigError("receipts", "Receipts that SourceWriter.write returned", type(r).__name__,
                              "commit what the buffer's writers returned")
        if not ledger.made(r):
            raise ConfigError("receipt.buffer", f"this buffer's id {ledger.buffer[:8]} (or one it was restored from)",
                              r.buffer[:8], "commit a receipt to the buffer whose writer made it")
        for name, flags in r.done.items():   # a receipt altered after write: refused, nothing taken
            if len(flags) != r.n:
                raise ConfigError(f"receipt.n (writer {r.writer[:8]} ticket {r.ticket})",
                                  f"{len(flags)}, the rows its {name} flags describe", r.n,
                                  "commit the receipt SourceWriter.write returned, unchanged; nothing of this call "
                                  "was committed, and the original receipt still commits once")
    ahead: dict = {}
    claimed: list = []
    try:
        with buf.lock:   # held throughout (waits release it): the seqs guessed below are usually the ones given
            buf.check_open()
            claimed = [r.key for r in receipts]
            for key in claimed:   # this call's receipts, while it waits: not abandoned under it
                ledger.claimed[key] = ledger.claimed.get(key, 0) + 1
            seq, seen = buf.ring.inserted, set()
            for i, r in enumerate(receipts):   # every receipt's pulls at once, for the seqs it gets if none waits
                # (none for a receipt another thread is committing: it ends taken, and a copy pulled
                # for it here would stay in the destination actor)
                if r.n and r.key not in ledger.taken and r.key not in ledger.pending and r.key not in seen \
                        and not buf.storage.pools:
                    seen.add(r.key)
                    rows = StagedRows(buf.spec, r)
                    ahead[i] = (seq, rows, begin_prepare(buf, rows, seq), tuple(buf.storage.parts))
                    seq += r.n
            for i, r in enumerate(receipts):
                commit_one(buf, r, ahead.get(i), timeout, report, release)
    except BaseException as exc:   # what was done before the failure stays done, and is reported with it
        exc.commit_report = report  # type: ignore[attr-defined]
        raise
    finally:
        with buf.lock:
            for key in claimed:
                left = ledger.claimed.pop(key, 0) - 1
                if left > 0:
                    ledger.claimed[key] = left
        after: dict = {}
        for _, rows, _, _ in ahead.values():   # pieces pulled ahead: written or not, done with (a
            for actor in rows.pulled_into:       # receipt not committed is pulled again by its next commit)
                release.setdefault(actor, set()).add(rows.key)
                after.setdefault(actor, []).extend(rows.pull_refs.get(actor, ()))
        for r in report.duplicates:
            release.setdefault(r.actor, set()).add(r.key)
        for actor, keys in release.items():   # nothing waits on it: a lost reply leaves rows a late stage ignores
            try:   # after the pulls begun ahead (Ray runs it once they resolved: a pull never awaited could
                # otherwise land after the release, and its piece stay)
                actor.release.options(concurrency_group="staging").remote(sorted(keys), *after.get(actor, ()))
            except Exception:  # noqa: BLE001 - the staging actor is gone: its rows went with it
                pass
    return report


def decline(buf, receipts: Iterable[Receipt]) -> int:
    """Drop the staged rows of receipts the caller will not commit (an adapter's rule
    refuses them, e.g. RLlib's drops a chunk of an episode evicted in the same add): never
    accepted, counted in the ledger's ``declined``; a later commit of one is a duplicate.
    Returns their rows."""
    ledger, release, rows = buf.ingest_ledger, {}, 0
    with buf.lock:
        for r in receipts:
            if r.key in ledger.taken or r.key in ledger.pending:
                continue
            ledger.taken.add(r.key)   # never stored
            ledger.declined += r.n
            rows += r.n
            release.setdefault(r.actor, set()).add(r.key)
    for actor, keys in release.items():
        try:
            actor.release.options(concurrency_group="staging").remote(sorted(keys))
        except Exception:  # noqa: BLE001 - the staging actor is gone: its rows went with it
            pass
    return rows


def abandon_before(buf, receipt: Receipt) -> int:
    """Every receipt of ``receipt``'s writer with a lower ticket that was neither committed nor
    declined is abandoned: for a caller that gets each writer's receipts in the order written
    (RLlib's env runners: one ``sample()`` at a time each), one missing below a receipt that
    arrived is a result it will never get (RLlib drops a ``sample()`` that outlives its timeout).
    Its rows, still staged in the writer's actor, are released there (they held its memory for
    good); its ticket is taken (it kept every later ticket of the writer listed in the ledger;
    a late commit of it is a duplicate); it is counted in the ledger's ``abandoned`` and logged.
    Returns how many."""
    ledger = buf.ingest_ledger
    if not ledger.made(receipt):
        raise ConfigError("receipt.buffer", f"this buffer's id {ledger.buffer[:8]} (or one it was restored from)",
                          receipt.buffer[:8], "pass a receipt of a writer this buffer handed out")
    with buf.lock:
        gone = [t for t in ledger.taken.missing_below(receipt.writer, receipt.ticket)
                if (receipt.writer, t) not in ledger.pending and (receipt.writer, t) not in ledger.claimed]
        for t in gone:
            ledger.taken.add((receipt.writer, t))
        ledger.abandoned += len(gone)
    if gone:
        log.warning("conduit: writer %s: %d receipt(s) below ticket %d never reached the buffer (tickets %s); "
                    "their staged rows are released, never stored", receipt.writer[:8], len(gone), receipt.ticket,
                    gone[:8])
        try:
            receipt.actor.release.options(concurrency_group="staging").remote([(receipt.writer, t) for t in gone])
        except Exception:  # noqa: BLE001 - the staging actor is gone: its rows went with it
            pass
    return len(gone)


def retire_writer(buf, writer: SourceWriter) -> int:
    """``ExperienceBuffer.retire_writer``: ``writer`` is replaced and will never be committed from
    again. Every rollout it staged and nobody committed (results its caller dropped: RLlib drops a
    ``sample()`` that outlives its timeout, and a runner that then gets a new writer never sends a
    later receipt of the old one to abandon them below) is dropped in its actor, counted in the
    ledger's ``abandoned`` and logged; a later stage through it raises ``StagedRowsLost``. Call it
    once no write through the writer can be in flight. Returns the rollouts dropped."""
    import ray

    try:
        dropped = ray.get(writer.actor.retire_writer.options(concurrency_group=STAGING_GROUP).remote(writer.id),
                          timeout=REMOTE_CALL_TIMEOUT_S)
    except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError):
        return 0   # the actor is gone (its staged rows went with it) or does not answer (its loss is found later)
    with buf.lock:
        buf.ingest_ledger.abandoned += dropped
    if dropped:
        log.warning("conduit: writer %s retired with %d staged rollout(s) nobody committed; dropped", writer.id[:8],
                    dropped)
    return dropped


def commit_one(buf, r: Receipt, ahead, timeout: float | None, report: CommitReport, release: dict) -> None:
    """One receipt, the buffer's lock held: exactly once, all or nothing."""
    ledger = buf.ingest_ledger
    buf.check_open()
    while r.key in ledger.pending:     # the same receipt committing in another thread: wait it out
        buf.lock.wait(0.05)
    if r.key in ledger.taken:
        ledger.duplicates += 1
        report.duplicates.append(r)
        return
    if r.n == 0:
        ledger.taken.add(r.key)
        report.committed.append((r, buf.ring.inserted))
        return
    ledger.pending.add(r.key)
    rows = ahead[1] if ahead is not None else StagedRows(buf.spec, r)
    try:
        first = insert_staged(buf, r, rows, ahead, timeout)
    except StagedRowsLost as lost:
        ledger.taken.add(r.key)   # never stored: a commit of it again is a duplicate, counted once
        ledger.never_accepted += r.n
        report.never_accepted.append((r, str(lost)))
        buf.ring.end_episode(r.source)   # the source's next rows must not link across the missing ones
        log.warning("conduit: %s", lost)
        return
    finally:
        ledger.pending.discard(r.key)
        for actor in rows.pulled_into:   # pieces pulled there and not written (a guess that missed)
            release.setdefault(actor, set()).add(r.key)
        buf.lock.notify_all()
    ledger.taken.add(r.key)
    report.committed.append((r, first))
    release.setdefault(r.actor, set()).add(r.key)


def insert_staged(buf, r: Receipt, rows: StagedRows, ahead, timeout: float | None) -> int:
    """One receipt, the buffer's lock held: wait, prepare, insert. Returns the first seq."""
    if buf.storage.pools:
        raise ConfigError("commit", "a buffer without frame pools", "frame-stacked fields",
                          "add frame-stacked rollouts through ExperienceBuffer.add")
    wait_to_insert(buf, r.n, timeout)        # the lock stays held from here: the seqs below stay ours
    first = buf.ring.inserted
    # pulls begun ahead hold the shard objects of that moment: used only for the seqs they were
    # begun for and while no destination shard was replaced since (a recovery in between)
    same_parts = ahead is not None and all(a is b for a, b in zip(ahead[3], buf.storage.parts))
    started = [ahead[2] if ahead is not None and ahead[0] == first and same_parts else None]

    def op():   # a retry after a lost destination shard begins its pulls again
        ready, started[0] = started[0], None
        prepare(buf, rows, first, ready)
    buf.run_storage(op)
    return buf.add_encoded(rows, r.n, source=r.source, policy_version=r.policy_version, timeout=timeout)


def committed_seqs(report: CommitReport) -> Sequence[int]:
    """Seqs the report's committed receipts got, in order."""
    return [int(s) for r, first in report.committed for s in range(first, first + r.n)]
