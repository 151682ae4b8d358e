"""Which slots a batch reads: a selector's draw mapped onto the ring's stored rows.

A weighted selector draws slots from its own index; any other names positions among the
stored rows, oldest first (removed rows are not positions). An order-free one (plain
uniform: its distribution is the same under any reordering of the rows) may have its
positions read as slots where that is the same set, which spares the mapping on the hot path.
"""

from __future__ import annotations

import numpy as np
import torch


def select_slots(ring, selector, rng: np.random.Generator, batch_size: int, size: int, beta: float | None,
                 weights_out: np.ndarray | None = None):
    """(slots, importance weights or None) for one batch; ``size``: rows stored now. A weighted
    selector that ``fills_weights_out`` writes its weights into ``weights_out`` (float32
    ``[batch_size]``) when one is given."""
    if selector.weighted:
        if weights_out is None or not selector.fills_weights_out:
            return selector.select(batch_size, size, rng, beta=beta)
        return selector.select(batch_size, size, rng, beta=beta, weights_out=weights_out)
    lo = ring.lo()
    if not selector.order_free:
        if ring.holes:
            live = ring.live_seqs()
            off, weights = selector.select(batch_size, int(live.size), rng)
            return live[off] % ring.capacity, weights
        off, weights = selector.select(batch_size, ring.inserted - lo, rng)
        return (lo + off) % ring.capacity, weights
    off, weights = selector.select(batch_size, ring.inserted - lo, rng)
    if ring.holes:
        return redraw_holes(ring, rng, lo, off), weights
    if ring.floor > max(ring.inserted - ring.capacity, 0):  # early eviction: a shifted window
        return (lo + off) % ring.capacity, weights
    return off, weights


def redraw_holes(ring, rng: np.random.Generator, lo: int, off: np.ndarray) -> np.ndarray:
    """Uniform over the stored rows when some were removed: offsets that fall on a removed
    row are drawn again (each round keeps the live ones, so the result is uniform)."""
    window = ring.inserted - lo
    seqs = lo + off
    stored_seq = ring.meta["seq"]
    for _ in range(1000):
        dead = stored_seq[seqs % ring.capacity] != seqs
        if not dead.any():
            return seqs % ring.capacity
        seqs[dead] = lo + rng.integers(0, window, int(dead.sum()))
    live = ring.live_seqs()
    dead = stored_seq[seqs % ring.capacity] != seqs
    seqs[dead] = live[rng.integers(0, live.size, int(dead.sum()))]
    return seqs % ring.capacity


def weights_tensor(weights: np.ndarray | torch.Tensor | None, device=None) -> torch.Tensor | None:
    """A selection's importance weights as a fresh tensor on ``device`` (a pooled batch's come from
    the output pool, written in place)."""
    if weights is None or isinstance(weights, torch.Tensor):
        return weights
    return torch.from_numpy(weights) if device is None else torch.from_numpy(weights).to(device)
