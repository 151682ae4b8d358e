"""n-step windows drawn with the redraw rule straight into the output pool: a sequential
replay step's delivery (RLlib's prioritized DQN asks for one each training step) in a few
Python frames around its native calls.

Why a route of its own: with the caches cold after the learner's update, each Python frame
of a delivery costs a few microseconds, and ``ExperienceBuffer.sample``'s general route takes
about two dozen of them to draw one batch of windows (argument forms, the pool's entry, the
window plan, the walk, two gathers, the hand-out; measured in docs/benchmarks.md §2). This
route does the same work with the same native calls, through the same redraw loop
(``episodes.draw_windows``, so the buffer's RNG is drawn alike by construction), keeping what it can reuse (the plans, the walk's views, its scratch arrays) for the storage's
life. ``delivery.draw_reference`` is its specification: tests/core/buffer/test_window_draw.py
compares the two batch by batch (values, weights, provenance, RNG state, counts) across inserts,
priority updates, wraps, a migration and the draws the dispatcher sends elsewhere.

It carries out the draws ``routes.choose_draw`` gives it: host batches of one plain host shard,
the native walk and gathers built, no rate limit to wait on, no remote shard that may be lost.
"""

from __future__ import annotations

import numpy as np

from ..schema.batch import Batch
from .episodes import draw_windows, n_step_range, window_source

try:
    from .._native._rows import gather_rows as _c_gather_rows
except ImportError:  # pragma: no cover (no C compiler where it was installed: the reference draws)
    _c_gather_rows = None
try:
    from .._native._rows import gather_batch as _c_gather_batch
except ImportError:  # pragma: no cover (as above)
    _c_gather_batch = None


def fits(storage, walk) -> bool:
    """Whether redraw-rule windows from ``storage`` can be drawn on this route: one host shard of
    plain columns (which a lost shard's replacement keeps; never one that may be lost) the native
    walk reads in place, and the native gathers built."""
    targets = storage.row_copy_targets()
    return (_c_gather_rows is not None and _c_gather_batch is not None and not storage.may_lose_shards
            and storage.takes_into() and targets is not None and len(targets) <= 64
            and walk.native_views(storage) is not None)


class PooledWindowDraw:
    """One buffer's redraw-rule window deliveries into its output pool (see the module docstring).

    Public contract: ``draw(batch_size, n_step, gamma, beta, fields, size)`` hands out the
    ``Batch`` that ``delivery.draw_reference`` would for ``sample(batch_size, n_step=n_step,
    gamma=gamma, beta=beta, fields=fields, episode_end='redraw')``. Arguments in the forms
    ``sampling_args.replay_args`` gives, checked; the caller (``delivery.sample``, the draw
    dispatcher) holds the buffer's lock for the whole draw, has chosen this route
    (``routes.choose_draw``: the storage ``fits``, nothing to wait for) and passes the stored row
    count it read under that lock. The batch also carries ``n_steps`` (the reference leaves it None;
    its ``n_step`` column holds the same values)."""

    def __init__(self, buffer, pool):
        self._buffer, self._pool = buffer, pool
        self._storage = None   # the storage the plans below were made for (a migration swaps it)
        self._plans: dict = {}    # (batch size, fields, n_step) -> what a draw of those reuses
        self._scratch: dict = {}  # batch size -> (returns, last slots): read by this draw only

    def _plan(self, storage, walk, key: tuple):
        """What draws of ``key`` = (batch size, fields, n_step) reuse from ``storage`` (fixed for
        the storage's life)."""
        if storage is not self._storage:
            self._storage, self._plans = storage, {}
        walk.check_n_step_fields()   # (the spec is fixed: once per plan)
        batch_size, fields, n_step = key
        names, last_fields, first_fields = walk.window_plan(fields)
        n_lo, n_hi = n_step_range(n_step)
        if len(self._plans) >= 64:
            self._plans.clear()
        plan = self._plans[key] = (names, first_fields + last_fields, first_fields, last_fields,
                                   storage.into_plan(first_fields),
                                   storage.into_plan(last_fields), walk.native_views(storage), n_lo, n_hi)
        return plan

    def draw(self, batch_size: int, n_step, gamma: float, beta, fields, size: int) -> Batch:
        buf = self._buffer
        ring, selector, walk, rng, pool, storage = buf.ring, buf.selector, buf.walk, buf.rng, self._pool, buf.storage
        key = (batch_size, fields, n_step)
        plan = self._plans.get(key) if storage is self._storage else None
        if plan is None:
            plan = self._plan(storage, walk, key)
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
        # the first rows and the provenance in one native pass (their cache misses overlap), then the last rows
        taken = _c_gather_batch(slots, first_plan, columns, ring.provenance_columns())
        if taken is None or (last_plan and not _c_gather_rows(last, last_plan, columns)):   # (fits() rules both out)
            raise RuntimeError("conduit: the pooled window draw's native gather declined its own layout; this "
                               "is a bug: please report it. Fix meanwhile: buffer.routes.fast = False")
        walked["reward"][:] = ret   # (float64 -> float32 as window_columns rounds it)
        data = entry.hand_out(names)
        pool.took_windows(b, pooled)
        out_weights = entry.weights_tensor() if source[0] else None
        buf.counts.sampled += b
        cond = buf.lock
        if cond.waiters:
            cond.notify_all()
        seqs, versions, sources = taken
        batch = Batch(data, slots=slots, seqs=seqs, versions=versions, weights=out_weights,
                      inserted_at_selection=ring.inserted, sources=sources, n_steps=walked["n_step"],
                      redraws=drawn - b)
        pool.bind(batch)
        return batch
