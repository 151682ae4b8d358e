"""One rollout of plain host columns stored in a few Python frames around its native calls:
an env step's insert (RLlib's DQN adds one or two episode chunks per training step).

Why a route of its own: with the caches cold after the learner's update, each Python frame of
an insert costs a few microseconds, and the general route (``ingestion.ingest_many_inline`` ->
``encode_unhooked`` -> ``spec.validate_and_encode`` -> ``insertion.add_encoded`` ->
``storage.write`` -> ``ring.write`` -> ``ring.advance`` -> ``selector.on_insert``) takes a dozen
of them for a rollout of a few rows. This route makes the same native calls (the spec's check,
the ring's copy, its metadata, the selector's insert) in the order ``add_encoded`` makes them, so
what it stores is what that route stores; tests/core/test_lone_insert.py compares the two
buffers' whole state insert after insert (rows, metadata, episode links, priorities, holes).

It applies where ``add_encoded`` would store the rows in one step: every field a plain numpy
column of one host shard (no codec, no frame pool), no rate limit or FIFO to wait on, no
migration's dual writer, no remote shard that may be lost, and a batch the native check accepts
as it is (an exact dict of C-contiguous arrays of the spec's dtypes and shapes, finite where it
must be). Elsewhere ``insert`` returns None having checked nothing and changed nothing, and the
caller takes the general route, which gives every error its precise message.
"""

from __future__ import annotations

try:
    from ._rows import check_columns as _c_check_columns
    from ._rows import copy_rows as _c_copy_rows
except ImportError:  # pragma: no cover - no C compiler where it was installed: the general route
    _c_check_columns = _c_copy_rows = None


class LoneInsert:
    """One buffer's single-rollout inserts (see the module docstring).

    Public contract: ``insert(columns, source, policy_version)`` stores ``columns`` as
    ``buffer.add(columns, source=source, policy_version=policy_version)`` would and returns
    ``(first seq, rows)``, or returns None where this route does not apply, with nothing checked
    or changed (the caller then takes the general route). ``source`` and ``policy_version`` are
    ints; the caller has checked the data plane is usable."""

    def __init__(self, buffer):
        self._buffer = buffer
        self._storage = None   # the storage the plan below was made for (a migration swaps it)
        self._plan = None      # (the spec's native check, the storage's copy targets) or None

    def _make_plan(self, storage):
        self._storage = storage
        check = self._buffer.spec.native_row_check()
        targets = storage.row_copy_targets()
        self._plan = None if check is None or targets is None or _c_copy_rows is None else (check, targets)
        return self._plan

    def insert(self, columns, source: int, policy_version: int) -> tuple[int, int] | None:
        buf = self._buffer
        storage = buf.storage
        plan = self._plan if storage is self._storage else self._make_plan(storage)
        if plan is None or type(columns) is not dict:
            return None
        checked = _c_check_columns(columns, plan[0])
        if checked is None:
            return None   # (a tensor, a view, or bad input: the general route accepts it or names the error)
        n, cols = checked
        cond = buf.lock
        with cond.mutex:   # (the condition's own lock, entered in C, as add_encoded enters it)
            ring, selector = buf.ring, buf.selector
            cap = ring.capacity
            if buf.closed or not 0 < n <= cap or buf.storage is not storage or storage.pools \
                    or storage.may_lose_shards or buf.dual_writer is not None or selector.consumes \
                    or buf.rate_limiter.samples_per_insert is not None:
                return None   # (judged under the lock, as add_encoded judges it)
            first = ring.inserted
            start = first % cap
            leaving = ring.holes_leaving(n) if ring.holes else 0
            if not _c_copy_rows(cols, plan[1], start, n):
                return None   # (declined before copying anything)
            ring.holes -= leaving
            ring.write(first, n, cols, buf.done_fields, source, policy_version)
            ring.inserted = first + n   # (ring.advance)
            selector.on_insert(start, n, min(first + n, cap))
            if cond.waiters:
                cond.notify_all()
            return first, n
