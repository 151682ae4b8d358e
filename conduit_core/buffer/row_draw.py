"""1-step batches of every field drawn straight into the output pool: a replay step's delivery
(uniform or prioritized ``sample(batch_size)``) in a few Python frames around its native calls.

Why a route of its own: the draw's native work (the selection, the row gather, the provenance)
is about half of a prioritized CartPole step; the rest was the general route's Python frames
(argument forms, the pool's entries, the gather's layers). This route does the same work with
the same selection (``selection.select_slots``, or the weighted selector's ``select`` it calls,
so the buffer's RNG is drawn alike by construction), then gathers the rows into the pool and
the provenance into fresh arrays in one native pass (``_rows.gather_batch``: the values of
``ColumnarStorage.gather_reused`` and ``Ring.gather_meta``, which it falls back to, with the
cache misses of both overlapping). ``delivery.sample``'s 1-step branch is the reference:
tests/core/test_row_draw.py compares the two batch by batch (values, weights, provenance, RNG
state, counts) across inserts, priority updates, wraps, removals and the fallbacks.

It applies where the general route would fill the output pool: host batches of every field from
one plain host shard, no rate limit to wait on, no remote shard that may be lost. Elsewhere
``sample`` returns None before anything changed, and the caller takes the general route.
"""

from __future__ import annotations

from ..memory.output_pool import handed_out
from ..schema.batch import Batch
from .selection import select_slots

try:
    from .._native._rows import gather_batch as _c_gather_batch
except ImportError:  # pragma: no cover (the storage and the ring gather in turn)
    _c_gather_batch = None


class PooledRowDraw:
    """One buffer's 1-step deliveries into its output pool (see the module docstring).

    Public contract: ``sample(batch_size, gamma, beta, episode_end)`` returns the ``Batch`` that
    ``buffer.sample(batch_size, gamma=gamma, beta=beta, episode_end=episode_end)`` would, or None
    (nothing drawn, nothing changed) where this route does not apply."""

    def __init__(self, buffer, pool):
        self._buffer, self._pool = buffer, pool
        self._storage = None     # the storage `_applies` was decided for (a migration swaps it)
        self._applies = False
        self._names = None   # its fields, in the order of its (name, column) pairs

    def _decide(self, storage) -> None:
        """Whether draws from ``storage`` fill the pool here (fixed for the storage's life: one
        plain host shard, which a lost shard's replacement keeps, never one that may be lost)."""
        self._storage = storage
        self._applies = storage.fills_outputs() and storage.takes_into() and not storage.may_lose_shards
        targets = storage.row_copy_targets() if self._applies else None
        self._names = None if targets is None else tuple(name for name, _ in targets)

    def sample(self, batch_size: int, gamma: float, beta, episode_end: str) -> Batch | None:
        buf = self._buffer
        selector = buf.selector
        if selector.consumes:
            return None   # (the general route refuses it, naming take())
        buf.sampling_checks.check(buf, batch_size, None, gamma, beta, episode_end, None)
        cond = buf.lock
        with cond.mutex:   # (entered in C; what delivery.sample holds)
            if buf.closed:
                buf.check_open()
            storage, limiter, ring = buf.storage, buf.rate_limiter, buf.ring
            if storage is not self._storage:
                self._decide(storage)
            size = ring.stored_count()
            if limiter.samples_per_insert is not None or size < limiter.min_size or not self._applies:
                return None   # (the general route waits for rows, or gathers otherwise)
            pool = self._pool
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
            targets = storage.row_copy_targets()
            taken = None if targets is None or _c_gather_batch is None else _c_gather_batch(
                slots, targets, out, ring.provenance_columns())
            if taken is not None:   # rows and provenance in one native pass (gather_reused's and gather_meta's values)
                data = handed_out(self._names, out, views)
                seqs, versions, sources = taken
            else:
                data = storage.gather_reused(slots, out, views)
                seqs, versions, sources = ring.gather_meta(slots)
            buf.counts.sampled += batch_size
            if cond.waiters:
                cond.notify_all()
            if weights_out is not None and weights is weights_out[0]:   # written in place: the entry's tensor
                weights = weights_out[1]
            elif weights is not None:
                weights = buf.weights_tensor(weights)
            batch = Batch(data, slots=slots, seqs=seqs, versions=versions, weights=weights,
                          inserted_at_selection=ring.inserted, sources=sources)
            pool.bind(batch)
            return batch
