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
tests/core/buffer/test_inline_insert.py compares the two buffers' whole state call after call (rows,
metadata, episode links, priorities, holes).

It applies where the general route stores the rows in one step: every field a plain numpy column
of one host shard (no codec, no frame pool), no rate limit or FIFO to wait on, no migration's
dual writer, no remote shard that may be lost, rows that fit the ring, and rollouts the native
check accepts as they are (exact dicts of C-contiguous arrays of the spec's dtypes and shapes,
finite where they must be, at least one row each). Elsewhere ``insert`` returns
``routes.DECLINED`` having changed nothing, and the caller runs the reference, which gives every
error its precise message.
"""

from __future__ import annotations

from .insertion import insert_together, stores_at_once
from .routes import DECLINED, NATIVE, choose_insert

try:
    from .._native._rows import check_columns as _c_check_columns
except ImportError:  # pragma: no cover - no C compiler where it was installed: the reference inserts
    _c_check_columns = None


class InlineInsert:
    """One buffer's native inserts of rollouts (see the module docstring): the ``native`` insert
    route of ``routes.py``.

    Public contract: ``insert(parts)``, ``parts`` a list of ``(columns, source, policy_version)``
    with int source and version, stores them in order as ``buffer.add_encoded_many`` stores
    them once ``buffer.encode`` accepted each, and returns each one's ``(first seq, rows)``; or
    returns ``routes.DECLINED`` with nothing changed where the native check does not take the
    rollouts as they are or, judged under the buffer's lock, the insert would have to wait or
    evict first (``routes.choose_insert``); its caller, an insert dispatcher, then runs the
    reference. ``insert_one(columns, source, version)`` is ``insert`` of one rollout in one
    native call. The caller has checked the data plane is usable."""

    def __init__(self, buffer):
        self._buffer = buffer
        # (storage, plan): the spec's native check where that storage is one plain host shard (the
        # route's layout), else None. One tuple, replaced whole: a caller on another thread never
        # pairs one storage's answer with another storage.
        self._planned = (None, None)

    def _plan_for(self, storage):
        check = self._buffer.spec.native_row_check() if _c_check_columns is not None else None
        plan = check if storage.row_copy_targets() is not None else None
        self._planned = (storage, plan)
        return plan

    def insert(self, parts: list):
        buf = self._buffer
        if len(parts) == 1 and not buf.ring.holes:   # one rollout: one native call (holes: judged again under the lock)
            got = self.insert_one(*parts[0])
            return got if got is DECLINED else [got]
        storage = buf.storage
        planned = self._planned
        check = planned[1] if planned[0] is storage else self._plan_for(storage)
        if check is None or not parts:
            return DECLINED
        checked, total = [], 0
        for columns, source, version in parts:   # every rollout checked before any is stored
            got = _c_check_columns(columns, check) if type(columns) is dict else None
            if got is None or not got[0]:
                return DECLINED   # (a tensor, a view, no rows, or bad input: the reference takes it or names the error)
            checked.append((got[1], got[0], source, version))
            total += got[0]
        with buf.lock.mutex:   # decided and stored in one hold: a migration or a new layout may come in
            if buf.closed or buf.storage is not storage or choose_insert(
                    True, len(checked), total <= buf.ring.capacity and stores_at_once(buf)) != NATIVE:
                return DECLINED
            firsts = insert_together(buf, checked)
        return [(first, part[1]) for first, part in zip(firsts, checked)]

    def insert_one(self, columns, source: int, version: int):
        """One rollout checked, copied and its metadata written in one native call under the
        buffer's lock (``Ring.insert_native``): ``(first seq, rows)``, as ``insert`` answers for
        one part, or ``DECLINED`` with nothing changed. ``ExperienceBuffer.add``'s route where it
        applies (no initial priorities): with ~1 us of work in a CartPole rollout, the reference's
        dozen Python frames and three native calls were most of an insert's time."""
        buf = self._buffer
        storage = buf.storage
        planned = self._planned
        check = planned[1] if planned[0] is storage else self._plan_for(storage)
        if check is None or type(columns) is not dict:
            return DECLINED
        with buf.lock.mutex:
            ring = buf.ring
            # judged here, on the layout the check was planned for; a removed row (a hole) the
            # insert may overwrite takes the reference
            if buf.closed or buf.storage is not storage or ring.holes \
                    or choose_insert(True, 1, stores_at_once(buf)) != NATIVE:
                return DECLINED
            stored = ring.insert_native(columns, check, storage.row_copy_targets(), buf.done_fields, source, version)
            if stored is None:   # (the native check did not take it as it is: nothing written)
                return DECLINED
            cap = ring.capacity
            buf.selector.on_insert(stored[0] % cap, stored[1], min(ring.inserted, cap))
            cond = buf.lock
            if cond.waiters:
                cond.notify_all()
            return stored
