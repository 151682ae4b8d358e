"""The np.take-into-output limit of an Atari gather (issue 18's "at least 75% of the
np.take-into-output limit"), on a Conduit ring's own columns: ``bench_buffer`` and
``bench_atari_gather`` compare Conduit's gathers with it."""

from __future__ import annotations

import numpy as np

from conduit_core import ExperienceBuffer

from .common import median, time_per_call


def sets_for(reuse_outputs: int) -> int:
    """Output sets a gather must cycle to give ``ExperienceBuffer(reuse_outputs=k)``'s guarantee
    (a batch valid through k more deliveries: k + 1 batches alive, the pool's steady state); 0:
    fresh outputs (the caller owns each batch)."""
    return reuse_outputs + 1 if reuse_outputs > 0 else 0


def take_call(cb: ExperienceBuffer, B: int, fill: int, depth: int = 5):
    """(one call, bytes it delivers) of the least a gather of obs and next obs can cost on this
    ring: one ``np.take`` per column, of uniform random rows, nothing else (no selection, no other
    fields, no batch): the issue's "np.take-into-output limit". ``depth`` output sets are used in
    turn (``sets_for(k)`` gives a pool of ``reuse_outputs=k`` the same guarantee); with
    ``depth=1`` the one output stays in cache; ``depth=0``: a fresh output per call, as
    ``reuse_outputs=0`` hands out."""
    rng = np.random.default_rng(1)
    cols = [cb.storage.host_view(name) for name in ("obs", "next_obs")]
    outs = [[np.empty((B, *c.shape[1:]), c.dtype) for c in cols] for _ in range(max(depth, 1))]
    draws = [rng.integers(0, fill, B) for _ in range(64)]   # drawn beforehand: the gather alone
    turn = [0]

    def take():
        idx, out = draws[turn[0] % 64], outs[turn[0] % depth]
        turn[0] += 1
        for c, o in zip(cols, out):
            np.take(c, idx, axis=0, out=o, mode="clip")   # numpy buffers out= under mode='raise'

    def take_fresh():
        idx = draws[turn[0] % 64]
        turn[0] += 1
        return [np.take(c, idx, axis=0) for c in cols]
    return (take if depth > 0 else take_fresh), sum(o.nbytes for o in outs[0])


def take_limit(cb: ExperienceBuffer, B: int, fill: int, *, calls: int, reps: int, depth: int = 5) -> float:
    """GB/s of ``take_call``'s gather on this ring (medians of ``reps``)."""
    take, nbytes = take_call(cb, B, fill, depth)
    return nbytes / median(time_per_call(take, calls=calls, reps=reps)) / 1e9
