"""n-step windows drawn with the redraw rule straight into the output pool: a sequential
replay step's delivery (RLlib's prioritized DQN asks for one each training step) in a few
Python frames around its native calls.

Why a route of its own: with the caches cold after the learner's update, each Python frame
of a delivery costs a few microseconds, and ``ExperienceBuffer.sample``'s general route takes
about two dozen of them to draw one batch of windows (argument forms, the pool's entry, the
window plan, the walk, two gathers, the hand-out; measured in docs/benchmarks.md §2). This
route does the same work with the same native calls, through the same redraw loop
(``episodes.draw_windows``, so the buffer's RNG is drawn alike by construction), keeping what it can reuse (the plans, the walk's views, its scratch arrays) for the storage's
life. ``delivery.sample``'s redraw branch is the reference: tests/core/test_window_draw.py
compares the two batch by batch (values, weights, provenance, RNG state, counts) across inserts,
priority updates, wraps, a migration and the fallbacks.

It applies where the general route would fill the output pool: host batches of one plain host
shard, the native walk and gather built, no rate limit to wait on, no remote shard that may be
lost. Elsewhere ``sample`` returns None before anything changed, and the caller takes
``ExperienceBuffer.sample``.
"""

from __future__ import annotations

import numpy as np

from ..schema.batch import Batch
from .episodes import NATIVE_WALK, draw_windows, n_step_range, window_source

try:
    from .._native._rows import gather_rows as _c_gather_rows
except ImportError:  # pragma: no cover (the general route gathers in numpy)
    _c_gather_rows = None
try:
    from .._native._rows import gather_batch as _c_gather_batch
except ImportError:  # pragma: no cover (a build from before it: the rows, then the provenance)
    _c_gather_batch = None


class PooledWindowDraw:
    """One buffer's redraw-rule window deliveries into its output pool (see the module docstring).

    Public contract: ``sample(batch_size, n_step, gamma, beta, fields)`` returns the ``Batch``
    that ``buffer.sample(batch_size, n_step=n_step, gamma=gamma, beta=beta, fields=fields,
    episode_end='redraw')`` would, or None (nothing drawn, nothing changed) where this route does
    not apply. Arguments in the forms ``sampling_args.replay_args`` gives; the caller serialises
    deliveries (the data plane's delivery lock), as for ``sample``."""

    def __init__(self, buffer, pool):
        self._buffer, self._pool = buffer, pool
        self._storage = None   # the storage the plans below were made for (a migration swaps it)
        self._plans: dict = {}    # (batch size, fields, n_step) -> what a draw of those reuses
        self._scratch: dict = {}  # batch size -> (returns, last slots): read by this draw only

    def _plan(self, storage, walk, key: tuple):
        """What draws of ``key`` = (batch size, fields, n_step) reuse from ``storage``, or None
        where the route does not apply to it (fixed for the storage's life: one host shard of
        plain columns, which a lost shard's replacement keeps, never a storage that may lose one)."""
        if storage is not self._storage:
            self._storage, self._plans = storage, {}
        if storage.may_lose_shards or not storage.takes_into():
            return None
        views = storage.walk_views(walk.done_fields) if NATIVE_WALK else None
        if views is None:
            return None   # (the general route walks in numpy)
        walk.check_n_step_fields()   # (the spec is fixed: once per plan)
        batch_size, fields, n_step = key
        names, last_fields, first_fields = walk.window_plan(fields)
        n_lo, n_hi = n_step_range(n_step)
        if len(self._plans) >= 64:
            self._plans.clear()
        plan = self._plans[key] = (names, first_fields + last_fields, first_fields, last_fields,
                                   storage.into_plan(first_fields),
                                   storage.into_plan(last_fields), views, n_lo, n_hi)
        return plan

    def sample(self, batch_size: int, n_step, gamma: float, beta, fields) -> Batch | None:
        buf = self._buffer
        if _c_gather_rows is None or buf.selector.consumes:
            return None   # (the general route gathers in numpy; it refuses FIFO selectors, naming take())
        buf.sampling_checks.check(buf, batch_size, n_step, gamma, beta, "redraw", fields)
        ring, selector, walk, rng, pool = buf.ring, buf.selector, buf.walk, buf.rng, self._pool
        cond = buf.lock
        with cond.mutex:   # (entered in C; what delivery.sample holds)
            if buf.closed:
                buf.check_open()
            storage, limiter = buf.storage, buf.rate_limiter
            size = ring.stored_count()
            if limiter.samples_per_insert is not None or size < limiter.min_size:
                return None   # (the general route waits for rows)
            key = (batch_size, fields, n_step)
            plan = self._plans.get(key) if storage is self._storage else None
            if plan is None:
                plan = self._plan(storage, walk, key)
                if plan is None:
                    return None   # (the general route recovers shards, or gathers fresh)
            names, pooled, first_fields, last_fields, first_plan, last_plan, views, n_lo, n_hi = plan
            source, beta = window_source(ring, selector, beta, size)
            b = batch_size
            entry = pool.windows(b, pooled)
            scratch = self._scratch.get(b)
            if scratch is None:
                scratch = self._scratch[b] = (np.empty(b, dtype=np.float64), np.empty(b, dtype=np.int64))
            ret, last = scratch
            slots = np.empty(b, dtype=np.int64)
            walked = entry.walk
            drawn = draw_windows(views, rng, source, n_lo, n_hi, float(gamma), beta, True,
                                 (slots, walked["weights"], ret, last, walked["n_step"]))
            columns = entry.columns
            # the first rows and the provenance in one native pass (their cache misses overlap)
            taken = None if _c_gather_batch is None else _c_gather_batch(
                slots, first_plan, columns, ring.provenance_columns())
            if taken is None and not _c_gather_rows(slots, first_plan, columns):   # (take_into names a slot out of range)
                storage.take_into(slots, first_fields, columns)
            if not _c_gather_rows(last, last_plan, columns):
                storage.take_into(last, last_fields, columns)
            walked["reward"][:] = ret   # (float64 -> float32 as window_columns rounds it)
            data = entry.hand_out(names)
            pool.took_windows(b, pooled)
            out_weights = entry.weights_tensor() if source[0] else None
            buf.counts.sampled += b
            if cond.waiters:
                cond.notify_all()
            seqs, versions, sources = ring.gather_meta(slots) if taken is None else taken
            batch = Batch(data, slots=slots, seqs=seqs, versions=versions, weights=out_weights,
                          inserted_at_selection=ring.inserted, sources=sources, n_steps=walked["n_step"],
                          redraws=drawn - b)
            pool.bind(batch)
            return batch
