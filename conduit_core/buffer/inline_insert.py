"""An ingest call's rollouts of plain host columns stored in a few Python frames around their
native calls: an env step's insert (RLlib's DQN adds one episode chunk per training step, two
where an episode ended), and ``ExperienceBuffer.add``'s (one rollout, one native call:
``insert_one``).

Why a route of its own: with the caches cold after the learner's update, every Python frame of
an insert costs time (the ones this route removes were 5-10% of RLlib's ``add()``, measured by
turns: docs/benchmarks.md section 2), and the general route (``ingestion.ingest_many_inline`` ->
``encode_unhooked`` -> ``spec.validate_and_encode`` per rollout -> ``insertion.add_encoded`` or
``add_encoded_many``) takes a dozen of them for one rollout of a few rows and two dozen for two.
This route checks every rollout with the spec's native check, before any is stored, then stores
them all with ``insertion.insert_together`` (the general route's own store for a group: one
lock, each rollout copied and its metadata written, the ring advanced once, the selector told).
tests/core/test_inline_insert.py compares the two buffers' whole state call after call (rows,
metadata, episode links, priorities, holes).

It applies where the general route stores the rows in one step: every field a plain numpy column
of one host shard (no codec, no frame pool), no rate limit or FIFO to wait on, no migration's
dual writer, no remote shard that may be lost, rows that fit the ring, and rollouts the native
check accepts as they are (exact dicts of C-contiguous arrays of the spec's dtypes and shapes,
finite where they must be, at least one row each). Elsewhere ``insert`` returns None having
changed nothing, and the caller takes the general route, which gives every error its precise
message.
"""

from __future__ import annotations

from .insertion import insert_together, stores_at_once

try:
    from .._native._rows import check_columns as _c_check_columns
except ImportError:  # pragma: no cover - no C compiler where it was installed: the general route
    _c_check_columns = None


class InlineInsert:
    """One buffer's inline inserts of an ingest call's rollouts (see the module docstring).

    Public contract: ``insert(parts)``, ``parts`` a list of ``(columns, source, policy_version)``
    with int source and version, stores them in order as ``buffer.add_encoded_many`` stores
    them once ``buffer.encode`` accepted each, and returns each one's ``(first seq, rows)``; or
    returns None where this route does not apply, with nothing changed (the caller then takes
    the general route). The caller has checked the data plane is usable."""

    def __init__(self, buffer):
        self._buffer = buffer
        # (storage, plan): the spec's native check where that storage is one plain host shard (the
        # route's layout), else None. One tuple, replaced whole: a caller on another thread never
        # pairs one storage's answer with another storage.
        self._planned = (None, None)

    def _plan_for(self, storage):
        check = self._buffer.spec.native_row_check()
        plan = check if storage.row_copy_targets() is not None else None
        self._planned = (storage, plan)
        return plan

    def insert(self, parts: list) -> list[tuple[int, int]] | None:
        if len(parts) == 1:   # one rollout: one native call where insert_one applies
            one = self.insert_one(*parts[0])
            if one is not None:
                return [one]
        buf = self._buffer
        storage = buf.storage
        planned = self._planned
        check = planned[1] if planned[0] is storage else self._plan_for(storage)
        if check is None or buf.closed:
            return None
        checked = []
        for columns, source, version in parts:   # every rollout checked before any is stored
            got = _c_check_columns(columns, check) if type(columns) is dict else None
            if got is None or not got[0]:
                return None   # (a tensor, a view, no rows, or bad input: the general route takes it or names the error)
            checked.append((got[1], got[0], source, version))
        if not checked:
            return None
        firsts = insert_together(buf, checked)   # (None: judged under its lock, it would wait or evict)
        if firsts is None:
            return None
        if len(checked) == 1:
            return [(firsts[0], checked[0][1])]
        return [(first, part[1]) for first, part in zip(firsts, checked)]

    def insert_one(self, columns, source: int, version: int) -> tuple[int, int] | None:
        """One rollout checked, copied and its metadata written in one native call under the
        buffer's lock (``Ring.insert_native``): ``(first seq, rows)``, as ``insert`` answers for
        one part, or None with nothing changed. ``ExperienceBuffer.add``'s route where it applies
        (no initial priorities): with ~1 us of work in a CartPole rollout, the general route's
        dozen Python frames and three native calls were most of an insert's time."""
        buf = self._buffer
        storage = buf.storage
        planned = self._planned
        check = planned[1] if planned[0] is storage else self._plan_for(storage)
        if check is None or type(columns) is not dict:
            return None
        with buf.lock.mutex:
            ring = buf.ring
            # judged here, as insert_together judges it, on the layout the check was planned for; a
            # removed row (a hole) the insert may overwrite takes the general route
            if buf.closed or buf.storage is not storage or ring.holes or not stores_at_once(buf):
                return None
            stored = ring.insert_native(columns, check, storage.row_copy_targets(), buf.done_fields, source, version)
            if stored is None:
                return None
            cap = ring.capacity
            buf.selector.on_insert(stored[0] % cap, stored[1], min(ring.inserted, cap))
            cond = buf.lock
            if cond.waiters:
                cond.notify_all()
            return stored
