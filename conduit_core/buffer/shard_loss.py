"""What the buffer does when a remote shard is lost (its actor died, or its node left).

Its rows leave the buffer (they are no longer in ``len()`` and are never delivered), the loss
is recorded with the rows' count and their exact seqs (as runs), a new empty shard takes its
place, and the operation that found the loss runs again. Nothing is silently lost: every loss is in
``ExperienceBuffer.losses`` and in the log. A FIFO buffer loses only rows not yet consumed; the
queue passes over them and keeps the survivors' order (a consumer waiting for a full batch
waits for more rows).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass

import numpy as np

from ..errors import ShardLost

log = logging.getLogger("conduit")


@dataclass(frozen=True)
class ShardLoss:
    """A remote shard lost: its rows left the buffer (they are not in len(), never delivered).
    ``shard`` -1: the rows an insert that failed after a lost shard may have written over."""

    shard: int
    node_resource: str | None
    rows: int
    seq_range: tuple[int, int] | None   # (lowest, highest) lost seq: a span, rows inside it may be stored elsewhere
    cause: str
    replaced_on: str
    at: float
    seq_runs: tuple[tuple[int, int], ...] = ()   # exactly the lost seqs, as runs (first, last), ascending

    def describe(self) -> str:
        runs = ", ".join(f"{a}..{b}" if a != b else f"{a}" for a, b in self.seq_runs[:4])
        more = f" and {len(self.seq_runs) - 4} more runs" if len(self.seq_runs) > 4 else ""
        where = f"seqs {runs}{more}" if self.seq_runs else "no stored rows"
        if self.shard < 0:   # no shard of its own: rows a failed insert may have written over
            return f"{self.rows} rows ({where}) left the buffer: {self.cause}"
        return (f"remote shard {self.shard} (node resource {self.node_resource!r}) lost {self.rows} rows ({where}): "
                f"{self.cause}; replaced by an empty shard on node {self.replaced_on[:12]}")


def seq_runs(seqs: np.ndarray) -> tuple[tuple[int, int], ...]:
    """``seqs`` (any order, unique) as runs of consecutive seqs, ascending: exact where the
    ring wrapped through a shard (its slots hold seqs of two passes, and rows between them are
    stored in other shards)."""
    s = np.sort(np.asarray(seqs, dtype=np.int64))
    if not s.size:
        return ()
    cut = np.flatnonzero(np.diff(s) != 1)
    firsts, lasts = np.concatenate([s[:1], s[cut + 1]]), np.concatenate([s[cut], s[-1:]])
    return tuple(zip(firsts.tolist(), lasts.tolist()))


class ShardLossRecovery:
    """Runs storage operations for one buffer (under its lock) and recovers from lost shards,
    through the buffer's public parts: its ring, storage, selector, dual writer and ``evict``."""

    def __init__(self, buffer):
        self.buffer = buffer
        self.losses: list[ShardLoss] = []

    def run(self, op, *, keep_from: int | None = None, then=None):
        """``op()``; when a remote shard turns out lost, recover and run it again (after
        ``then()``, e.g. waiting until enough rows are left to sample). ``keep_from``: rows
        below this seq are being overwritten by the operation itself, so they are not
        counted as lost."""
        try:
            return op()   # the usual case: nothing lost, one call
        except ShardLost as lost:
            first = lost
        buf = self.buffer
        for _ in range(len(buf.storage.shards) + 1):   # each shard lost once, and a replacement once more
            if first.part is None or buf.storage.parts[first.shard] is first.part:
                self.recover(first, buf.ring.lo() if keep_from is None else max(buf.ring.lo(), keep_from))
            # else: a handle from before that shard was replaced; its rows already left, and the
            # replacement (which holds rows stored since) must not be evicted or replaced again
            if then is not None:
                then()
            try:
                return op()
            except ShardLost as lost:
                first = lost
        raise first

    def recover(self, lost: ShardLost, keep_from: int) -> None:
        buf, s = self.buffer, lost.shard
        slots = np.arange(int(buf.storage.bounds[s]), int(buf.storage.bounds[s + 1]), dtype=np.int64)
        seqs = buf.meta["seq"][slots]
        if buf.selector.consumes:   # consumed rows were delivered already: only queued ones are lost
            keep_from = max(keep_from, buf.ring.head)
        gone = seqs[buf.ring.live(slots, seqs) & (seqs >= keep_from)]
        self._remove(gone)
        loss = ShardLoss(shard=s, node_resource=lost.node, rows=int(gone.size),
                         seq_range=(int(gone.min()), int(gone.max())) if gone.size else None,
                         cause=f"{type(lost.cause).__name__}: {lost.cause}", replaced_on="(not replaced)",
                         at=time.time(), seq_runs=seq_runs(gone))
        self.losses.append(loss)  # recorded before the replacement, which may fail in turn
        log.warning("conduit: %s", loss.describe())
        node = buf.storage.replace_shard(s)
        self.losses[-1] = dataclasses.replace(loss, replaced_on=node)

    def drop_overwritten(self, first: int, n: int, cause: BaseException) -> None:
        """An insert of ``n`` rows from seq ``first`` failed after a lost shard: part of its rows
        may be written over the stored rows of its slots (and ``recover`` kept those rows, as
        the insert was to overwrite them), so they leave the buffer, recorded as a loss."""
        buf = self.buffer
        slots = (first + np.arange(n, dtype=np.int64)) % buf.capacity
        seqs = buf.meta["seq"][slots]
        live = buf.ring.live(slots, seqs)
        if buf.selector.consumes:   # consumed rows were delivered already: only queued ones are lost (as recover)
            live &= seqs >= buf.ring.head
        gone = seqs[live]
        if not gone.size:
            return
        self._remove(gone)
        loss = ShardLoss(shard=-1, node_resource=None, rows=int(gone.size),
                         seq_range=(int(gone.min()), int(gone.max())),
                         cause=f"an insert that failed after a lost shard may have written over them "
                               f"({type(cause).__name__}: {cause})", replaced_on="(none)", at=time.time(),
                         seq_runs=seq_runs(gone))
        self.losses.append(loss)
        log.warning("conduit: %s", loss.describe())

    def _remove(self, gone: np.ndarray) -> None:
        buf = self.buffer
        if buf.selector.consumes:   # the queue passes over them, in order (evict() is replay's)
            removed, removed_slots = buf.ring.remove(np.unique(gone))
            buf.selector.on_evict(removed_slots)
            if buf.dual_writer is not None:
                buf.dual_writer.on_evict(removed)
            buf.ring.skip_leading_holes()              # gaps at the head free their slots at once
            buf.counts.lost += int(removed.size)        # they will never be taken: the limiter counts them out
        else:
            buf.evict(gone)
