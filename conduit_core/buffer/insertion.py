"""The buffer's insert side: store an encoded batch at the ring's head, all or nothing.

Every step is checked or planned before the first byte is written (initial priorities, the
rate limiter's wait, the frames a pooled field needs and the rows they evict), so a rejected
insert leaves the buffer as it was. A migration in progress (the buffer's ``dual_writer``)
gets every insert too. Uses only the buffer's public parts; ``ExperienceBuffer.add`` and
``add_encoded`` are the documented entry points.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from ..errors import INT64_MAX, CapacityError, ConfigError, require_ids
from ..schema.framestack import first_surviving_seq
from ..selection.rate_gate import wait_to_insert
from .routes import DECLINED, NATIVE, REFERENCE, TOGETHER, choose_insert


def add(buf, batch: Mapping[str, Any], *, source: int = 0, policy_version: int = 0,
        timeout: float | None = None, priorities: Any = None) -> int:
    """``ExperienceBuffer.add``: store a batch of transitions (one source's, in time order).
    Returns the first seq.

    ``priorities`` (prioritized selectors only): one initial priority per item instead of the
    running max (e.g. from a TD error the actor computed, as SRL's buffer does). Validation and
    encoding happen before anything is written: a rejected batch leaves the buffer untouched.

    The insert dispatcher of one rollout (``routes.py``): plain host columns with nothing to
    wait for or evict first are checked and stored in one native call
    (``InlineInsert.insert_one``); what it declines, and every error, takes the reference,
    ``encode`` and ``add_encoded``."""
    routes = buf.routes
    if priorities is None and type(source) is int and type(policy_version) is int \
            and 0 <= source <= INT64_MAX and 0 <= policy_version <= INT64_MAX and routes.fast:
        stored = routes.inline_insert.insert_one(batch, source, policy_version)
        if stored is not DECLINED:
            routes.inserts[NATIVE] += 1
            return stored[0]
    routes.inserts[REFERENCE] += 1
    n, enc = buf.encode(batch)
    return add_encoded(buf, enc, n, source=source, policy_version=policy_version, timeout=timeout,
                       priorities=priorities)


def add_encoded(buf, enc: Mapping[str, torch.Tensor], n: int, *, source: int = 0, policy_version: int = 0,
                timeout: float | None = None, priorities: Any = None) -> int:
    """``ExperienceBuffer.add_encoded``: store ``n`` rows of one source, in time order, that
    ``encode`` already validated and encoded. Returns the first seq."""
    source, policy_version = require_ids(source, policy_version)
    if n == 0:
        return buf.ring.inserted
    if priorities is not None:
        if buf.dual_writer is not None:
            raise ConfigError("priorities", "no initial priorities while a migration runs", "priorities",
                              "wait for the migration to finish, or add without priorities")
        priorities = buf.selector.check_initial_priorities(n, priorities)  # before anything is written
    with buf.lock.mutex:   # the condition's own RLock, entered in C (the hot path; notify works under it)
        if buf.closed:
            buf.check_open()
        if buf.rate_limiter.samples_per_insert is not None or buf.selector.consumes:   # (else: nothing to wait for)
            wait_to_insert(buf, n, timeout)
        ring, storage = buf.ring, buf.storage
        cap, first = ring.capacity, ring.inserted
        start = first % cap
        if storage.pools:
            enc = dict(enc)
            pending = storage.plan_frames(enc, n)
            evict_for_frames(buf, pending, n)
            storage.commit_frames(pending)
        leaving = ring.holes_leaving(n) if ring.holes else 0  # removed rows the ring now overwrites leave the window
        if storage.may_lose_shards:   # a lost remote shard: recover, then write again
            try:
                buf.run_storage(lambda: buf.storage.write(start, enc, n), keep_from=first + n - cap)
            except BaseException as exc:   # part of it may be written: the rows it covered leave, recorded
                buf.recovery.drop_overwritten(first, n, exc)
                raise
        else:
            storage.write(start, enc, n)
        ring.holes -= leaving  # only once the write happened: a failed insert changes nothing
        prev_tail = ring.write(first, n, enc, buf.done_fields, source, policy_version)
        if buf.dual_writer is not None:  # dual write: the new layout gets every insert too
            buf.dual_writer.on_insert(first, enc, n, source, policy_version, prev_tail)
        ring.advance(n)
        buf.selector.on_insert(start, n, min(ring.inserted, cap))
        if priorities is not None:
            buf.selector.set_initial_priorities((start + np.arange(n)) % buf.capacity, priorities)
        cond = buf.lock
        if cond.waiters:
            cond.notify_all()
        return first


def add_encoded_many(buf, parts: list, *, timeout: float | None = None) -> list[int]:
    """``ExperienceBuffer.add_encoded_many``: several encoded rollouts, each ``(columns, n,
    source, policy_version)``, stored in order. Returns each one's first seq.

    Where adding them one by one could not wait or evict anything (no rate ratio, not FIFO,
    no frame pool, no migration, no shard that can be lost; judged under the buffer's lock,
    as ``add_encoded`` judges it), they are one insert (``insert_together``); otherwise one
    ``add_encoded`` each, the reference. The insert dispatcher of encoded rollouts (``routes.py``).
    A failure says how many of the rollouts were stored before it in the error's
    ``stored_parts``, as one by one would have left them."""
    for _, _, src, v in parts:   # every id checked before anything is stored (as add_encoded checks its own)
        require_ids(src, v)
    routes = buf.routes
    if len(parts) >= 2 and routes.fast:
        total = sum(p[1] for p in parts)
        with buf.lock.mutex:   # decided and stored in one hold: a migration or a new layout may come in
            if buf.closed:
                buf.check_open()
            if choose_insert(False, len(parts), total <= buf.capacity and stores_at_once(buf)) == TOGETHER:
                routes.inserts[TOGETHER] += 1
                return insert_together(buf, parts)
    routes.inserts[REFERENCE] += 1
    firsts = []
    for cols, n, src, v in parts:
        try:
            firsts.append(add_encoded(buf, cols, n, source=src, policy_version=v, timeout=timeout))
        except BaseException as exc:
            exc.stored_parts = len(firsts)  # type: ignore[attr-defined]
            raise
    return firsts


def insert_together(buf, parts: list) -> list[int]:
    """Encoded rollouts ``(columns, n, source, policy_version)`` in one insert: each rollout's
    rows copied and its metadata written, the ring advanced once; the same stored rows, seqs and
    links as one by one. The caller holds the buffer's lock and has judged, under it, that the
    rows fit the ring and that the buffer ``stores_at_once`` (``routes.choose_insert``'s
    ``together`` and ``native`` routes). A failure says how many rollouts were stored before it
    in the error's ``stored_parts``, as one by one would have left them."""
    ring, storage = buf.ring, buf.storage
    cap, first = ring.capacity, ring.inserted
    firsts, at, failure = [], first, None
    for cols, n, _, _ in parts:
        try:
            if n:
                storage.write(at % cap, cols, n)
        except BaseException as exc:   # the rollouts copied before it stay stored, as one by one
            failure = exc
            break
        firsts.append(at)
        at += n
    stored = at - first
    if ring.holes:   # only the rows written: a failed rollout changes nothing more
        ring.holes -= ring.holes_leaving(stored)
    for (cols, n, src, v), at in zip(parts, firsts):
        if n:
            ring.write(at, n, cols, buf.done_fields, int(src), int(v))
    ring.advance(stored)
    if stored:
        buf.selector.on_insert(first % cap, stored, min(ring.inserted, cap))
        buf.lock.notify_all()
    if failure is not None:
        if len(parts) > 1:   # (add_encoded, a lone rollout's route, names none)
            failure.stored_parts = len(firsts)  # type: ignore[attr-defined]
        raise failure
    return firsts


def stores_at_once(buf) -> bool:
    """Whether an insert stores its rows as they come, with nothing to wait for or evict first:
    no frame pool, no migration's dual writer, no shard that may be lost, not FIFO, no rate ratio.
    Judged under the buffer's lock (the caller holds it): the routes that store in one step
    (``insert_together``, ``InlineInsert``) apply only where it holds (``routes.choose_insert``)."""
    storage = buf.storage
    return not (storage.pools or buf.dual_writer is not None or storage.may_lose_shards or buf.selector.consumes
                or buf.rate_limiter.samples_per_insert is not None)


def evict_for_frames(buf, pending: list, n: int) -> None:
    """Evict (oldest first) the rows whose frames the pending frame writes overwrite."""
    a = max(buf.ring.lo(), buf.ring.inserted + n - buf.capacity)  # rows that survive the ring
    new_floor = first_surviving_seq(pending, lambda name: stored_ids(buf.storage, name), a, buf.ring.inserted,
                                    buf.capacity)
    if new_floor <= a:
        return
    if buf.selector.consumes and new_floor > buf.ring.head:
        raise CapacityError(f"frame pool full: storing this rollout would evict {new_floor - buf.ring.head} "
                            "unconsumed on-policy rows. Fix: consume first or raise frame_budget.")
    buf.selector.on_evict(buf.ring.raise_floor(a, new_floor))


class _GatheredIds:
    """A pooled field's stored frame ids read slot by slot through the storage's gather: a
    layout of several shards has no one array to index (``first_surviving_seq`` reads a few)."""

    def __init__(self, storage, name: str):
        self._storage, self._name = storage, name

    def __getitem__(self, slot: int) -> int:
        return int(self._storage.gather_stored(self._name, np.array([slot], dtype=np.int64))[0])


def stored_ids(storage, name: str):
    """Field ``name``'s stored values by slot: the host column itself, or a reader that gathers."""
    view = storage.host_view(name)
    return view if view is not None else _GatheredIds(storage, name)
