"""An ingest call's rollouts of plain host columns stored in a few Python frames around their
native calls: an env step's insert (RLlib's DQN adds one episode chunk per training step, two
where an episode ended).

Why a route of its own: with the caches cold after the learner's update, every Python frame of
an insert costs time (the dozen this route removes were 5-10% of RLlib's ``add()``, measured by
turns: docs/benchmarks.md section 2), and the general route (``ingestion.ingest_many_inline`` ->
``encode_unhooked`` -> ``spec.validate_and_encode`` per rollout -> ``insertion.add_encoded`` or
``add_encoded_many`` -> ``storage.write`` -> ``ring.write`` -> ``ring.advance`` ->
``selector.on_insert``) takes a dozen of them for one rollout of a few rows and two dozen for
two. This route makes the same native calls (the spec's check, the ring's copy, its metadata,
the selector's insert) in the order those make them: every rollout checked before any is
stored, then all of them stored under one lock as ``insertion._insert_together`` stores a group
(one rollout: as ``add_encoded`` stores it). tests/core/test_inline_insert.py compares the two
buffers' whole state call after call (rows, metadata, episode links, priorities, holes).

It applies where those routes store the rows in one step: every field a plain numpy column of
one host shard (no codec, no frame pool), no rate limit or FIFO to wait on, no migration's dual
writer, no remote shard that may be lost, rows that fit the ring, and rollouts the native check
accepts as they are (exact dicts of C-contiguous arrays of the spec's dtypes and shapes, finite
where they must be, at least one row each). Elsewhere ``insert`` returns None having changed
nothing, and the caller takes the general route, which gives every error its precise message.
"""

from __future__ import annotations

try:
    from ._rows import check_columns as _c_check_columns
    from ._rows import copy_rows as _c_copy_rows
except ImportError:  # pragma: no cover - no C compiler where it was installed: the general route
    _c_check_columns = _c_copy_rows = None


class InlineInsert:
    """One buffer's inline inserts of an ingest call's rollouts (see the module docstring).

    Public contract: ``insert(parts)``, ``parts`` a list of ``(columns, source, policy_version)``
    with int source and version, stores them in order as ``buffer.add_encoded_many`` stores
    them once ``buffer.encode`` accepted each, and returns each one's ``(first seq, rows)``; or
    returns None where this route does not apply, with nothing changed (the caller then takes
    the general route). The caller has checked the data plane is usable."""

    def __init__(self, buffer):
        self._buffer = buffer
        # (storage, plan): the plan, (the spec's native check, the storage's copy targets) or None,
        # made for that storage (a migration swaps it). One tuple, replaced whole: a caller on
        # another thread never pairs one storage's targets with another storage.
        self._planned = (None, None)

    def _plan_for(self, storage):
        check = self._buffer.spec.native_row_check()
        targets = storage.row_copy_targets()
        plan = None if check is None or targets is None or _c_copy_rows is None else (check, targets)
        self._planned = (storage, plan)
        return plan

    def insert(self, parts: list) -> list[tuple[int, int]] | None:
        buf = self._buffer
        storage = buf.storage
        planned = self._planned
        plan = planned[1] if planned[0] is storage else self._plan_for(storage)
        if plan is None:
            return None
        check, targets = plan
        checked, total = [], 0
        for columns, source, version in parts:   # every rollout checked before any is stored
            got = _c_check_columns(columns, check) if type(columns) is dict else None
            if got is None or not got[0]:
                return None   # (a tensor, a view, no rows, or bad input: the general route takes it or names the error)
            checked.append((got[1], got[0], source, version))
            total += got[0]
        cond = buf.lock
        with cond.mutex:   # (the condition's own lock, entered in C, as add_encoded enters it)
            ring, selector = buf.ring, buf.selector
            cap = ring.capacity
            if buf.closed or total > cap or buf.storage is not storage or storage.pools \
                    or storage.may_lose_shards or buf.dual_writer is not None or selector.consumes \
                    or buf.rate_limiter.samples_per_insert is not None or not checked:
                return None   # (judged under the lock, as add_encoded judges it)
            first = at = ring.inserted
            stored = []
            leaving = ring.holes_leaving(total) if ring.holes else 0
            try:
                for cols, n, _, _ in checked:
                    if not _c_copy_rows(cols, targets, at % cap, n):
                        storage.write(at % cap, cols, n)   # (the same copy in numpy: not expected)
                    stored.append((at, n))
                    at += n
            except BaseException as exc:   # the rollouts copied before it stay stored, as _insert_together leaves them
                if len(checked) > 1:   # (add_encoded, a lone rollout's route, names none)
                    exc.stored_parts = len(stored)  # type: ignore[attr-defined]
                raise
            finally:
                if stored:
                    rows = at - first
                    ring.holes -= leaving if rows == total else ring.holes_leaving(rows)
                    for (cols, n, source, version), (seq, _) in zip(checked, stored):
                        ring.write(seq, n, cols, buf.done_fields, source, version)
                    ring.inserted = at   # (ring.advance)
                    selector.on_insert(first % cap, rows, min(at, cap))
                    if cond.waiters:
                        cond.notify_all()
            return stored
