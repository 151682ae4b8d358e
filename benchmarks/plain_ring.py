"""The floor a user could write in numpy, which ``bench_buffer`` measures Conduit's uniform
ring against (docs/benchmarks.md §1)."""

from __future__ import annotations

import time

import numpy as np

from .common import median, paired_times, ratio_stats
from .gather_limit import sets_for


class PlainRing:
    """The floor a user could write in numpy: preallocated columns, slice-copy inserts, uniform
    draws with ``Generator.integers`` and one ``take`` per column into reused outputs. No
    validation, no metadata, no priorities: what Conduit's uniform ring is compared against.

    ``outputs``: output sets used in turn, so a batch stays valid through ``outputs - 1`` more
    samples: ``ExperienceBuffer(reuse_outputs=outputs - 1)``'s guarantee (its pool cycles k + 1
    sets); compared at equal guarantees (at B=256 Atari, 5 sets of 14 MB do not fit the cache
    that one set fits)."""

    def __init__(self, capacity: int, example: dict, outputs: int = 1):
        self.capacity, self.size, self.pos = capacity, 0, 0
        self.cols = {k: np.empty((capacity, *v.shape[1:]), v.dtype) for k, v in example.items()}
        self.rng = np.random.default_rng(0)
        self.outputs = outputs
        self.outs: dict[int, list[dict]] = {}
        self.turn = 0

    def add(self, cols: dict) -> None:
        n = len(cols["action"])
        head = min(n, self.capacity - self.pos)
        for k, v in cols.items():
            self.cols[k][self.pos:self.pos + head] = v[:head]
            if head < n:
                self.cols[k][:n - head] = v[head:]
        self.pos = (self.pos + n) % self.capacity
        self.size = min(self.capacity, self.size + n)

    def sample(self, batch: int) -> dict:
        idx = self.rng.integers(0, self.size, batch)
        sets = self.outs.get(batch)
        if sets is None:
            sets = self.outs[batch] = [{k: np.empty((batch, *v.shape[1:]), v.dtype) for k, v in self.cols.items()}
                                       for _ in range(self.outputs)]
        self.turn = (self.turn + 1) % self.outputs
        out = sets[self.turn]
        for k, v in self.cols.items():
            np.take(v, idx, axis=0, out=out[k], mode="clip")
        return out


def plain_ring_entry(kind: str, cols: list[dict], fill: int, batch_sizes, *, calls: int, reps: int,
                     depths: tuple[int, ...] = (1, 4)) -> dict:
    """Insert rate and uniform sample time of PlainRing and of a Conduit ring with reused outputs,
    both of ``fill`` slots, filled once (so inserts overwrite resident pages), timed in turns.
    Samples are compared at equal guarantees: for each of ``depths``, Conduit's
    ``reuse_outputs=depth`` (a batch valid through ``depth`` more samples) against the ring's
    ``depth + 1`` output sets in turn (``B{B}``: the first depth; ``B{B}_reuse{depth}``: the
    others). One pair in memory at a time."""
    from .bench_buffer import conduit_buffer
    entry: dict = {"depths": list(depths)}
    for d in depths:
        ring, cb = PlainRing(fill, cols[0], outputs=sets_for(d)), conduit_buffer(kind, fill, False, reuse=d)
        for c in cols:
            ring.add(c)
            cb.add(c)
        if d == depths[0]:
            def rate(add) -> float:
                t0 = time.perf_counter()
                for c in cols:
                    add(c)
                return fill / (time.perf_counter() - t0)
            ins_p, ins_c = [], []
            for _ in range(reps):   # alternated: both see the same machine state
                ins_p.append(rate(ring.add))
                ins_c.append(rate(cb.add))
            entry |= {"insert_per_s": median(ins_p), "conduit_insert_per_s": median(ins_c),
                      "insert_ratio": median(ins_c) / median(ins_p)}
        for B in batch_sizes:
            t = paired_times({"ring": (lambda: ring.sample(B), calls), "conduit": (lambda: cb.sample(B), calls)},
                             reps=reps)   # (repetitions in turns: the ratios are paired)
            t_p, t_c = t["ring"], t["conduit"]
            key = f"B{B}" if d == depths[0] else f"B{B}_reuse{d}"
            entry[key] = {"plain_s": median(t_p), "conduit_s": median(t_c), "ratio": ratio_stats(t_c, t_p),
                          "outputs": sets_for(d), "reuse_outputs": d}
        cb.close()
        del ring, cb
    return entry
