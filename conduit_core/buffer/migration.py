"""Online migration: move the buffer to new shards (and/or a larger capacity) while
ingestion and delivery go on, losing and duplicating nothing.

    begin ........ copy live rows chunk by chunk (each chunk under the buffer's lock) ..... swap
      |                                                                                      |
      +-- from here every insert is written to the old AND the new layout (dual write) ------+

Each chunk copies rows by seq from ``seq % C_old`` to ``seq % C_new``, up to the last row
inserted before ``begin``. A row inserted after ``begin`` is dual-written, never copied; a
row copied before being overwritten is current when copied.
So at the swap the new layout holds exactly the rows live in the old one. Deliveries read
the old layout until the swap, which happens under the lock between two calls. With a
larger capacity, rows the old ring evicted during the migration are not resurrected: the
buffer's floor starts the new window at the oldest row live at the swap.

A chunk holds the buffer's lock while it copies, so a learner's delivery or an actor's
insert can wait for one chunk. By default chunks are sized to hold the lock about
``max_hold_s`` (2 ms): a chunk goes to one destination shard, and ``next_chunk_rows``
rescales that shard's next chunk from the time its last one took, because the same rows cost
microseconds to a host shard and milliseconds to a remote one over Ray. Between chunks the
background thread rests as long as the chunk held the lock, so waiting deliveries and
inserts get the lock (and the GIL) in between. A background migration also allocates the new
layout in its own thread: a remote shard's actor takes about a second to start.

Its progress is bounded: a busy learner can take the lock between every two chunks and starve the
copy (on a machine whose cores are all busy, it ran 28 times longer). So a background migration
has a deadline (``deadline_s``, counted from its first chunk): once past it, the rest is copied at
once under the lock, in the largest chunks, and the swap follows. Deliveries and inserts wait for that
last part; the handle says so (``finished_at_deadline``) and a warning is logged. The new layout is
allocated before the first chunk, and its time is not the copy's: a remote shard's actor is a process
for Ray to start, seconds on a quiet machine and minutes on one whose cores are all busy, which no
deadline on the copy can shorten (the handle reports it apart, ``layout_s``).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import logging
import threading
import time

import numpy as np

from ..errors import ConfigError, StateError
from ..memory.tiers import host_zeros
from ..storage.columnar import ColumnarStorage, ShardSpec
from .experience_buffer import ExperienceBuffer
from .ring import META_FIELDS, write_meta_rows

FIRST_CHUNK_BYTES = 256 << 10   # the first adaptive chunk, before any timing is known
DEFAULT_DEADLINE_S = 30.0       # a background migration's share of the buffer ends here (see above)
MAX_CHUNK_BYTES = 64 << 20

log = logging.getLogger("conduit")


def next_chunk_rows(rows: int, held_s: float, *, target_s: float, most: int) -> int:
    """Rows for the next chunk so that it holds the lock about ``target_s``, from the last
    chunk's ``rows`` and ``held_s``: proportional, growing at most 2x a chunk (one slow
    chunk should not follow a lucky fast one), shrinking at once, within 1..``most``."""
    want = rows * 2 if held_s <= 0 else int(rows * target_s / held_s)
    return max(1, min(most, want, rows * 2))


class Migration:
    """Created by ``begin_migration``; drive it with ``step()`` or ``run()``, end with ``finish()``."""

    def __init__(self, buffer: ExperienceBuffer, *, shards: Sequence[ShardSpec], capacity: int | None = None,
                 chunk_bytes: int | None = None, max_hold_s: float = 0.002, start: bool = True):
        if not isinstance(buffer, ExperienceBuffer):
            raise ConfigError("buffer", "an ExperienceBuffer", type(buffer).__name__, "migrate a buffer")
        self.buffer = buffer
        self.capacity = int(capacity or buffer.capacity)
        if self.capacity < buffer.capacity:
            raise ConfigError("capacity", f">= the current capacity {buffer.capacity}", self.capacity,
                              "a migration can keep or grow the capacity; shrinking would drop accepted data")
        if sum(s.capacity for s in shards) != self.capacity:
            raise ConfigError("shards", f"capacities summing to {self.capacity}", sum(s.capacity for s in shards),
                              "make the new shards add up to the (new) capacity")
        if buffer.storage.pools:
            raise ConfigError("migration", "a spec without frame pools", "FrameStackCodec fields",
                              "frame pools stay on the host; migrate the buffer before enabling frame stacking")
        if max_hold_s <= 0:
            raise ConfigError("max_hold_s", "> 0 seconds", max_hold_s,
                              "give the longest a chunk may hold the buffer's lock, e.g. 0.002")
        row_bytes = max(1, buffer.spec.stored_bytes_per_transition)
        self.adaptive = chunk_bytes is None     # fixed-size chunks when chunk_bytes is given
        self.max_hold_s = max_hold_s
        self.max_rows = max(1, (chunk_bytes or MAX_CHUNK_BYTES) // row_bytes)
        self.first_rows = max(1, min(self.max_rows, FIRST_CHUNK_BYTES // row_bytes))  # adaptive, per shard
        self.rows_for: dict[int, int] = {}    # destination shard -> rows of its next chunk (adaptive)
        self.chunks = 0
        self.longest_hold_s = 0.0
        self.last_hold_s = 0.0
        self.shards = list(shards)
        self.storage: ColumnarStorage | None = None
        self.failure: Exception | None = None   # a failed dual write (see on_insert)
        self.done = False
        self._check_alone()
        if start:
            self.start()

    def _check_alone(self) -> None:
        if self.buffer.migrating:
            raise ConfigError("migration", "one migration at a time", "another one running",
                              "finish() the running migration first")

    def start(self) -> None:
        """Allocate the new layout (waiting for its remote shards' actors to run: about a
        second for a new process), then register for dual writes and start the copy from
        the oldest live row. A background migration does this in its own thread, so the
        learner never waits for an actor to start."""
        self.storage = ColumnarStorage(spec=self.buffer.spec, shards=self.shards)
        self.meta = {k: host_zeros(self.capacity, np.int64) for k in META_FIELDS}  # lazy, as the buffer's
        try:
            # next seq to copy; rows from `until` on are dual-written, so the copy stops there
            self.cursor, self.until = self.buffer.attach_dual_writer(self)
        except BaseException:
            self.storage.close()
            raise

    # ------------------------------------------------------------ copying
    def on_insert(self, first: int, enc: Mapping[str, Any], n: int, source: int, version: int, prev_tail: int | None) -> None:
        """Dual write (called by the buffer under its lock, after the rows are in the old
        layout). The old layout holds what the buffer accepted; the new one is a copy in
        progress. So a dual write that fails (a new remote shard lost) fails the migration, not
        the insert: the migration detaches and keeps the error, which its next ``step()`` or
        ``finish()`` raises (a background migration's ``wait()``), and the insert goes on."""
        try:
            self.storage.write(first % self.capacity, enc, n)
        except Exception as exc:   # noqa: BLE001 - kept, raised to the migration's caller
            self.failure = exc
            self.buffer.detach_dual_writer(self)
            log.warning("conduit: a migration's dual write failed (%s: %s); the buffer keeps its layout, the "
                        "migration raises at its next step", type(exc).__name__, exc)
            return
        write_meta_rows(self.meta, self.capacity, first, n, enc, self.buffer.done_fields, source, version, prev_tail)

    def _check_not_failed(self) -> None:
        if self.failure is not None:
            raise StateError(f"the migration failed: a dual write to its new layout raised "
                             f"{type(self.failure).__name__}: {self.failure}. The buffer keeps its old layout, "
                             f"with every row; abort() this migration and begin a new one") from self.failure

    def step(self) -> bool:
        """Copy one chunk of the rows live at the start; True when all are copied (or evicted).
        Rows inserted since are dual-written, so the copy never chases the ingest rate."""
        b = self.buffer
        with b.lock:
            t0 = time.perf_counter()
            b.check_open()
            self._check_not_failed()
            lo = max(self.cursor, b.live_range()[0])
            # One destination shard per chunk, sized by that shard's own last chunk: the same
            # rows cost microseconds to a host shard and milliseconds to a remote one.
            bounds = self.storage.bounds
            dest = int(np.searchsorted(bounds, lo % self.capacity, side="right") - 1)
            rows = self.rows_for.get(dest, self.first_rows) if self.adaptive else self.max_rows
            end = min(self.until, lo + rows, lo + int(bounds[dest + 1]) - lo % self.capacity)
            if lo < end:
                seqs = np.arange(lo, end, dtype=np.int64)
                old_slots = seqs % b.capacity
                self.storage.write(lo % self.capacity, b.stored_columns(seqs), end - lo)
                new_slots = seqs % self.capacity
                for k in META_FIELDS:
                    self.meta[k][new_slots] = b.meta[k][old_slots]
            self.cursor = max(end, lo)
            held = time.perf_counter() - t0
            if lo < end:
                self.chunks += 1
                self.longest_hold_s = max(self.longest_hold_s, held)
                self.last_hold_s = held
                if self.adaptive:
                    self.rows_for[dest] = next_chunk_rows(end - lo, held, target_s=self.max_hold_s,
                                                          most=self.max_rows)
            return self.cursor >= self.until

    def on_evict(self, seqs: np.ndarray) -> None:
        """Rows removed from the buffer during the migration: removed here too where already
        copied or dual-written (rows not copied yet carry the removal over with the copy)."""
        slots = seqs % self.capacity
        written = self.meta["seq"][slots] == seqs
        for k in ("seq", "next_seq"):
            self.meta[k][slots[written]] = -1

    def run(self) -> None:
        while not self.step():
            pass

    def finish(self) -> None:
        """Copy what is left and swap layouts, atomically with respect to inserts and deliveries
        (in the largest chunks: everything waits for the lock meanwhile anyway)."""
        b = self.buffer
        with b.lock:
            self.adaptive = False
            while not self.step():
                pass
            old_storage = b.adopt_layout(self.storage, self.meta, self.capacity)
            self.done = True
        old_storage.close()

    def abort(self) -> None:
        self.buffer.detach_dual_writer(self)
        if self.storage is not None:
            self.storage.close()


def begin_migration(buffer: ExperienceBuffer, *, shards: Sequence[ShardSpec], capacity: int | None = None,
                    chunk_bytes: int | None = None, max_hold_s: float = 0.002, start: bool = True) -> Migration:
    """A checked migration; started (new layout allocated, dual writes on) unless ``start=False``."""
    return Migration(buffer, shards=shards, capacity=capacity, chunk_bytes=chunk_bytes, max_hold_s=max_hold_s,
                     start=start)


def check_deadline(deadline_s: float) -> None:
    if isinstance(deadline_s, bool) or not isinstance(deadline_s, (int, float)) or not 0 < deadline_s < float("inf"):
        raise ConfigError("deadline_s", "a finite number of seconds > 0", repr(deadline_s),
                          "give how long the copy may share the buffer with the learner, e.g. 30.0")


class BackgroundMigration:
    """Runs a migration in its own thread; ``wait()`` joins it and re-raises its error."""

    def __init__(self, migration: Migration, *, deadline_s: float = DEFAULT_DEADLINE_S):
        check_deadline(deadline_s)
        self.migration = migration
        self.deadline_s = float(deadline_s)
        self.finished_at_deadline = False   # the rest was copied at once under the lock (the deadline passed)
        self.layout_s = 0.0                 # allocating the new layout (starting remote shards' actors)
        self.copy_s = 0.0                   # from the first chunk to the swap, the last part included
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="conduit-migration", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            t0 = time.monotonic()
            if self.migration.storage is None:
                self.migration.start()
            started = time.monotonic()
            self.layout_s = started - t0
            while not self.migration.step():
                if time.monotonic() - started > self.deadline_s:
                    self.finished_at_deadline = True
                    m = self.migration
                    log.warning("conduit: an online migration passed its deadline (%.1f s, %d chunks copied, "
                                "%d rows left): copying the rest at once under the buffer's lock; deliveries and "
                                "inserts wait for it", self.deadline_s, m.chunks, max(0, m.until - m.cursor))
                    break
                # Rest as long as the chunk held the lock: a delivery or insert waiting for the
                # lock (and for the GIL, which the copy also held) gets in between chunks, and
                # the migration takes at most half of the buffer's time.
                time.sleep(self.migration.last_hold_s)
            self.migration.finish()
            self.copy_s = time.monotonic() - started
        except BaseException as exc:  # noqa: BLE001 - reported by wait()
            self.error = exc
            try:
                self.migration.abort()
            except Exception:
                pass

    def wait(self, timeout: float | None = 60.0) -> None:
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise StateError(f"migration still running after {timeout} s ({self.migration.chunks} chunks "
                             f"copied). Fix: wait longer, or give a larger max_hold_s for larger chunks")
        if self.error is not None:
            raise self.error
