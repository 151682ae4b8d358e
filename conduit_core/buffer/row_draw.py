"""1-step batches of every field drawn straight into the output pool: a replay step's delivery
(uniform or prioritized ``sample(batch_size)``) in a few Python frames around its native calls.

Why a route of its own: the draw's native work (the selection, the row gather, the provenance)
is about half of a prioritized CartPole step; the rest was the general route's Python frames
(argument forms, the pool's entries, the gather's layers). This route does the same work with
the same selection (``selection.select_slots``, or the weighted selector's ``select`` it calls,
so the buffer's RNG is drawn alike by construction), then gathers the rows into the pool and
the provenance into fresh arrays in one native pass (``_rows.gather_batch``: the values of
``ColumnarStorage.gather_reused`` and ``Ring.gather_meta``, with the cache misses of both
overlapping). ``delivery.draw_reference`` is its specification:
tests/core/buffer/test_row_draw.py compares the two batch by batch (values, weights, provenance, RNG
state, counts) across inserts, priority updates, wraps, removals and the draws the dispatcher sends elsewhere.

It carries out the draws ``routes.choose_draw`` gives it: host batches of every field from one
plain host shard, no rate limit to wait on, no remote shard that may be lost.
"""

from __future__ import annotations

from ..memory.output_pool import handed_out
from ..schema.batch import Batch
from .selection import select_slots, weights_tensor

try:
    from .._native._rows import gather_batch as _c_gather_batch
except ImportError:  # pragma: no cover (no C compiler where it was installed: the reference draws)
    _c_gather_batch = None


def fits(storage) -> bool:
    """Whether draws from ``storage`` can fill the pool on this route: one host shard of plain
    columns (which a lost shard's replacement keeps; never one that may be lost), and the native
    gather built."""
    targets = storage.row_copy_targets()
    return (_c_gather_batch is not None and storage.fills_outputs() and storage.takes_into()
            and not storage.may_lose_shards and targets is not None and len(targets) <= 64)


class PooledRowDraw:
    """One buffer's 1-step deliveries into its output pool (see the module docstring).

    Public contract: ``draw(batch_size, beta, size)`` hands out the ``Batch`` that
    ``delivery.draw_reference`` would for ``sample(batch_size, beta=beta)`` (any gamma and
    episode end: a 1-step draw reads neither). The caller (``delivery.sample``, the draw
    dispatcher) has checked the arguments, holds the buffer's lock, has chosen this route
    (``routes.choose_draw``: the storage ``fits``, nothing to wait for) and passes the stored
    row count it read under that lock."""

    def __init__(self, buffer, pool):
        self._buffer, self._pool = buffer, pool
        self._storage = None   # the storage `_names` was read for (a migration swaps it)
        self._names = None     # its fields, in the order of its (name, column) pairs

    def draw(self, batch_size: int, beta, size: int) -> Batch:
        buf = self._buffer
        selector, storage, ring, pool = buf.selector, buf.storage, buf.ring, self._pool
        if storage is not self._storage:
            self._storage, self._names = storage, tuple(name for name, _ in storage.row_copy_targets())
        if selector.fills_weights_out:   # the weights go in place, into the same pool entry as the rows
            out, views, weights_out = pool.get_weighted(batch_size)
            if selector.weighted:   # (what select_slots calls for it)
                slots, weights = selector.select(batch_size, size, buf.rng, beta=beta, weights_out=weights_out[0])
            else:
                slots, weights = select_slots(ring, selector, buf.rng, batch_size, size, beta, weights_out[0])
        else:
            weights_out = None
            slots, weights = select_slots(ring, selector, buf.rng, batch_size, size, beta)
            out, views = pool.get(slots.shape)
        # rows and provenance in one native pass (ColumnarStorage.gather_reused's and Ring.gather_meta's values)
        taken = _c_gather_batch(slots, storage.row_copy_targets(), out, ring.provenance_columns())
        if taken is None:   # (fits() and the pool's arrays rule this out: a broken invariant, not a route)
            raise RuntimeError("conduit: the pooled 1-step draw's native gather declined its own layout; "
                               "this is a bug: please report it. Fix meanwhile: buffer.routes.fast = False")
        seqs, versions, sources = taken
        data = handed_out(self._names, out, views)
        buf.counts.sampled += batch_size
        cond = buf.lock
        if cond.waiters:
            cond.notify_all()
        if weights_out is not None and weights is weights_out[0]:   # written in place: the entry's tensor
            weights = weights_out[1]
        elif weights is not None:
            weights = weights_tensor(weights)
        batch = Batch(data, slots=slots, seqs=seqs, versions=versions, weights=weights,
                      inserted_at_selection=ring.inserted, sources=sources)
        pool.bind(batch)
        return batch
