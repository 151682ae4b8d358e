"""The ring: which row (seq) lives in which slot, and which rows are still stored.

One part owns the invariants that every other part relies on:

- seq ``s`` (the s-th row ever inserted) lives in slot ``s % capacity``; a slot holds the
  row whose seq its ``meta['seq']`` names;
- the live window is ``[lo, inserted)`` with ``lo = max(inserted - capacity, floor, 0)``:
  the ring overwrote what is below it, or the floor moved past it (rows evicted early,
  or not carried over by a migration); inside it, rows removed by ``remove`` are holes
  (``meta['seq']`` is -1) and are counted in ``holes``;
- per source, the seq of its last row whose episode goes on (``open_tail``): the next
  insert of that source links to it (``meta['next_seq']``), so n-step windows and
  sequences follow episodes across inserts, and a link to an overwritten or removed row
  is seen as broken (the successor's slot no longer holds that seq);
- FIFO: ``head`` is the seq of the oldest row not yet consumed.

The ring holds no column data (storage does) and makes no selection (selectors do); the
buffer composes the three under its lock. Metadata arrays are lazy zero pages (or shared
memory segments when a shard is shared): an empty ring of any capacity costs almost
nothing, and a never-written slot holds 0, which no check takes for a row.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence


import numpy as np
import torch

from ..errors import SemanticError
from ..memory.tiers import SharedSegment, host_zeros

META_FIELDS = ("seq", "version", "source", "next_seq")

try:
    from .._native._rows import insert_rows as _c_insert_rows
    from .._native._rows import take_rows as _c_take_rows
    from .._native._rows import write_meta as _c_write_meta
except ImportError:  # pragma: no cover - no C compiler where it was installed: the Python routes
    _c_insert_rows = _c_take_rows = _c_write_meta = None


def write_meta_rows(meta: dict, cap: int, first: int, n: int, enc: Mapping[str, Any],
                    done_fields: Sequence[str], source: int, version: int, prev_tail: int | None) -> np.ndarray | None:
    """Write the per-row metadata of seqs ``first .. first+n`` into ring ``meta`` of
    ``cap`` slots, linking the source's previous open row ``prev_tail`` to ``first``.
    Returns the rows' done flags (None without done fields). A pure function of its
    arguments: a migration writes its new layout's metadata with it too."""
    start = first % cap
    seqs = np.arange(first, first + n, dtype=np.int64)
    done = None
    for f in done_fields:
        d = enc[f]
        # an item that is a chunk of steps (a done field of shape (T,) or (T, 1)) ends its episode
        # when its last step does: the link to the source's next item follows the last step
        d = (d.cpu().numpy() if isinstance(d, torch.Tensor) else d).reshape(n, -1)[:, -1]
        if d.dtype != np.bool_:
            d = d.astype(bool)
        done = d if done is None else (done | d)
    nxt = seqs + 1
    if done is not None:
        nxt[done] = -1
    nxt[-1] = -1  # the successor of the chunk's last item is not known yet
    head = min(n, cap - start)  # the run before the ring wraps
    if head == n:
        meta["seq"][start:start + n] = seqs
        meta["next_seq"][start:start + n] = nxt
        meta["version"][start:start + n] = version
        meta["source"][start:start + n] = source
    else:
        for name, values in (("seq", seqs), ("next_seq", nxt)):
            arr = meta[name]
            arr[start:start + head] = values[:head]
            arr[:n - head] = values[head:]
        for name, value in (("version", version), ("source", source)):
            arr = meta[name]
            arr[start:start + head] = value
            arr[:n - head] = value
    if prev_tail is not None and meta["seq"][prev_tail % cap] == prev_tail:
        meta["next_seq"][prev_tail % cap] = first
    return done


class Ring:
    def __init__(self, capacity: int, *, shared: bool = False):
        self.capacity = int(capacity)
        self.segments: list = []  # shared-memory segments behind meta (a shared shard's workers read them)
        self.meta: dict[str, np.ndarray] = {}
        try:
            for name in META_FIELDS:
                if shared:
                    seg = SharedSegment((self.capacity,), torch.int64)
                    self.segments.append(seg)
                    self.meta[name] = seg.tensor.numpy()
                else:
                    self.meta[name] = host_zeros(self.capacity, np.int64)  # zero pages until written, huge when large
        except BaseException:  # a constructor that fails part-way returns what it took, at once
            self.close()
            raise
        self.inserted = 0         # rows ever inserted (== next seq)
        self.head = 0             # FIFO: seq of the oldest unconsumed row
        self.floor = 0            # rows with seq < floor left early (frame pool full) or at a migration
        self.holes = 0            # rows inside [lo, inserted) removed by remove(): not stored any more
        self.evicted_early = 0    # rows that left below the floor before the ring reached them
        self.open_tail: dict[int, int] = {}  # source -> seq of its last row if its episode goes on

    # ---------------------------------------------------------------- window
    def lo(self) -> int:
        """Seq of the oldest row that may still be stored."""
        return max(self.inserted - self.capacity, self.floor, 0)

    def stored_count(self) -> int:
        """Rows stored now in the live window (``lo()`` inline: a delivery's hot path asks)."""
        return self.inserted - max(self.inserted - self.capacity, self.floor, 0) - self.holes

    def live(self, slots: np.ndarray, seqs: np.ndarray) -> np.ndarray:
        """Which of ``slots`` (holding ``seqs`` in the metadata) hold a stored row."""
        return (seqs >= self.lo()) & (seqs < self.inserted) & (seqs % self.capacity == slots)

    def provenance_columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The metadata columns a batch's provenance comes from, (seq, version, source), each one
        entry per slot: what ``gather_meta`` reads, and what a route that gathers the provenance
        with its rows in one native pass (``_rows.gather_batch``) reads."""
        meta = self.meta
        return meta["seq"], meta["version"], meta["source"]

    def gather_meta(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(seq, version, source) of each of ``slots`` (1-D int64), in fresh arrays: a batch's
        provenance. One native pass that fetches every row's entries before reading them, where it can."""
        seq, version, source = columns = self.provenance_columns()
        if _c_take_rows is not None:
            taken = _c_take_rows(slots, columns)
            if taken is not None:
                return taken
        return seq[slots], version[slots], source[slots]

    def stored(self, seqs: np.ndarray) -> np.ndarray:
        """Which of ``seqs`` are stored now (in the window, in their slot, not removed)."""
        slots = seqs % self.capacity
        return (self.meta["seq"][slots] == seqs) & self.live(slots, seqs)

    def live_seqs(self) -> np.ndarray:
        """Every stored seq, oldest first."""
        seqs = np.arange(self.lo(), self.inserted, dtype=np.int64)
        return seqs[self.meta["seq"][seqs % self.capacity] == seqs] if self.holes else seqs

    def count_holes(self, lo: int, hi: int) -> int:
        """Removed rows among seqs [lo, hi) (each slot holds its seq while the row is stored)."""
        seqs = np.arange(lo, hi, dtype=np.int64)
        return int(np.count_nonzero(self.meta["seq"][seqs % self.capacity] != seqs))

    def recount_holes(self) -> None:
        """Recompute the removed-row count from the metadata (after a layout change)."""
        lo = self.lo()
        self.holes = self.count_holes(lo, self.inserted) if self.inserted > lo else 0

    def holes_leaving(self, n: int) -> int:
        """Removed rows the ring overwrites when ``n`` more rows come in (they leave the window)."""
        if not self.holes:
            return 0
        lo, new_lo = self.lo(), max(self.inserted + n - self.capacity, self.floor, 0)
        return self.count_holes(lo, new_lo) if new_lo > lo else 0

    # ---------------------------------------------------------------- FIFO
    def queued_seqs(self, k: int | None = None) -> np.ndarray:
        """The first ``k`` (all if None) rows not yet consumed, oldest first: seqs from ``head``,
        skipping removed rows (a lost shard's)."""
        if not self.holes:
            return np.arange(self.head, self.inserted if k is None else self.head + k, dtype=np.int64)
        seqs = np.arange(self.head, self.inserted, dtype=np.int64)
        seqs = seqs[self.meta["seq"][seqs % self.capacity] == seqs]
        return seqs if k is None else seqs[:k]

    def queued(self, policy_version: int | None = None) -> int:
        """Rows not yet consumed; with ``policy_version``, the leading ones of that version."""
        if policy_version is None:
            return self.inserted - self.head if not self.holes else int(self.queued_seqs().size)
        vers = self.meta["version"][self.queued_seqs() % self.capacity]
        bad = np.flatnonzero(vers != policy_version)
        return int(bad[0]) if bad.size else int(vers.shape[0])

    def consume(self, seqs: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """The queued rows ``seqs`` (distinct, from ``queued_seqs``) were delivered: they leave. The
        front of the queue moves the head (None returned); rows taken from behind it become removed
        rows, passed over by the queue and overwritten in turn (a LIFO's, or any consuming
        selector's): returned as (seqs, slots), for the parts that must forget them too."""
        if not seqs.size:
            return None
        front = self.queued_seqs(int(seqs.size))
        if front.size == seqs.size and (seqs == front).all():
            self.consume_through(int(seqs[-1]))
            return None
        removed = self.remove(seqs)
        self.skip_leading_holes()
        return removed

    def consume_through(self, seq: int) -> None:
        """Rows up to ``seq`` are consumed (removed rows among them, and right after, are passed over)."""
        self.head = max(self.head, int(seq) + 1)
        self.skip_leading_holes()

    def skip_leading_holes(self) -> None:
        """Move ``head`` past removed rows at the front of the queue: their slots are free."""
        if not self.holes or self.head == self.inserted or self.meta["seq"][self.head % self.capacity] == self.head:
            return   # the usual case: the head row is stored
        seqs = np.arange(self.head, self.inserted, dtype=np.int64)   # one vectorized scan, not a loop per gap
        live = self.meta["seq"][seqs % self.capacity] == seqs
        self.head = int(seqs[np.argmax(live)]) if live.any() else self.inserted

    def drop_stale_prefix(self, policy_version: int) -> int:
        """Consume (without delivering) the leading rows of versions older than
        ``policy_version``; returns how many. Only a prefix: dropping from the middle would
        reorder what stays. A row of a newer version is the caller's error."""
        if self.head == self.inserted:
            return 0
        seqs = self.queued_seqs()
        vers = self.meta["version"][seqs % self.capacity]
        newer = vers > policy_version
        if newer.any():
            raise SemanticError(
                f"policy_version: expected data of version <= {policy_version} in the queue, found "
                f"version {int(vers[newer][0])}. Fix: deliver with the learner's current policy version.")
        stale = vers < policy_version
        n = int(stale.shape[0]) if stale.all() else int(np.argmin(stale))
        if n:
            self.consume_through(int(seqs[n - 1]))
        return n

    # ---------------------------------------------------------------- change
    def write(self, first: int, n: int, enc: Mapping[str, Any], done_fields: Sequence[str], source: int,
              version: int) -> int | None:
        """The metadata of rows ``first .. first+n`` of ``source`` (not yet counted in
        ``inserted``: ``advance`` does that once every part took the rows). Returns the seq
        of the source's previous open row, which the new rows continue (or None)."""
        prev = self.open_tail.pop(source, None)
        last_done = None
        if _c_write_meta is not None:   # one C call for numpy bool done fields (the usual case)
            m = self.meta
            last_done = _c_write_meta(m["seq"], m["next_seq"], m["version"], m["source"], first, n,
                                      tuple(map(enc.__getitem__, done_fields)), source, version, -1 if prev is None else prev)
        if last_done is None:
            done = write_meta_rows(self.meta, self.capacity, first, n, enc, done_fields, source, version, prev)
            last_done = done is not None and bool(done[-1])
        if not last_done:
            self.open_tail[source] = first + n - 1
        return prev

    def insert_native(self, batch: dict, check: tuple, targets: tuple, done_fields: tuple, source: int,
                      version: int) -> tuple[int, int] | None:
        """A whole insert at the head in one native call (``_rows.insert_rows``): ``batch``
        checked against the spec's plan ``check`` (``spec.native_row_check()``), copied into the
        storage's ``targets`` (``storage.row_copy_targets()``), its metadata written and the
        rows counted; what ``storage.write``, ``write`` and ``advance`` do, with the same values.
        Returns (first seq, rows), or None with nothing changed where the call declines (no C
        helper, a batch the check does not accept, no rows, more rows than the ring): the caller
        then takes the general route, which names every error. The caller holds the buffer's lock
        and has made sure nothing has to wait or be evicted first (``InlineInsert.insert_one``)."""
        if _c_insert_rows is None:   # (no C compiler where it was installed)
            return None
        prev = self.open_tail.get(source)
        first, meta = self.inserted, self.meta
        got = _c_insert_rows(batch, check, targets, (meta["seq"], meta["next_seq"], meta["version"], meta["source"]),
                             first, done_fields, source, version, -1 if prev is None else prev)
        if got is None:
            return None
        n, last_done = got
        self.open_tail.pop(source, None)   # (as write: the source's entry moves to the end)
        if not last_done:
            self.open_tail[source] = first + n - 1
        self.inserted = first + n
        return first, n

    def end_episode(self, source: int) -> None:
        """``source``'s open episode ends here: its next rows start a new one. For rows that
        never arrived (a staged chunk lost before it was committed): no episode link may
        bridge the gap, or n-step windows would run across missing steps."""
        self.open_tail.pop(source, None)

    def advance(self, n: int) -> None:
        self.inserted += n

    def remove(self, seqs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Remove the stored ones of ``seqs`` (unique): their slots stop naming them, so no
        part delivers or links to them again. Returns (removed seqs, their slots)."""
        slots = seqs % self.capacity
        live = (self.meta["seq"][slots] == seqs) & self.live(slots, seqs)
        seqs, slots = seqs[live], slots[live]
        self.meta["seq"][slots] = -1
        self.meta["next_seq"][slots] = -1
        self.holes += int(seqs.size)
        return seqs, slots

    def raise_floor(self, start: int, new_floor: int) -> np.ndarray:
        """Rows ``start .. new_floor`` leave now, before the ring reaches them (early
        eviction; rows below ``start`` are the ones an insert overwrites anyway). Returns
        their slots."""
        seqs = np.arange(start, new_floor, dtype=np.int64)
        slots = seqs % self.capacity
        if self.holes:  # from the current low end: the rows the ring overwrites now count here too
            self.holes -= self.count_holes(self.lo(), new_floor)
        self.meta["seq"][slots] = -1
        self.meta["next_seq"][slots] = -1
        self.evicted_early += new_floor - start
        self.floor = new_floor
        return slots

    def successors(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Slot of each row's successor in its episode, and whether it exists (is stored and
        was not overwritten)."""
        return stored_successors(self.meta["seq"], self.meta["next_seq"], self.capacity)(slots)

    def adopt(self, meta: dict[str, np.ndarray], capacity: int) -> None:
        """A new layout's metadata holding every live row at ``seq % capacity`` (a finished
        migration): the window now starts at the oldest row live at this moment."""
        lo = self.lo()
        self.close()
        self.meta, self.capacity = meta, int(capacity)
        self.floor = max(self.floor, lo)
        # rows copied early and overwritten in the old ring during the copy are below the window
        # now: their slots name no stored row (a state then holds only live rows and loads again)
        seq = self.meta["seq"]
        stale = (seq >= 0) & (seq < self.floor)
        if stale.any():
            seq[stale] = -1
            self.meta["next_seq"][stale] = -1
        self.recount_holes()

    def close(self) -> None:
        for seg in self.segments:
            seg.close()
        self.segments = []


def stored_successors(seq: np.ndarray, next_seq: np.ndarray,
                      capacity: int) -> Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """The episode link rule over seq and next_seq columns (``Ring.successors``'s, and a walk
    source's own): the slot of each row's successor and whether it is still stored (one
    overwritten or removed ends the walk). One rule for every walk that follows the links."""
    def successors(slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        nseq = next_seq[slots]
        nslot = np.where(nseq >= 0, nseq, 0) % capacity
        return nslot, (nseq >= 0) & (seq[nslot] == nseq)
    return successors
