"""The native row gather alone, on a full ring: how far ahead it prefetches, and rows plus
provenance in one call or two.

    python -m benchmarks.bench_row_gather [--kind cartpole|atari] [--capacity N] [--batch 32 256] [--reps 7]
                                           [--calls N]

What a 1-step draw spends in ``_rows`` once its slots are drawn: every column's rows into reused
outputs (5 sets in turn, as ``reuse_outputs=4``) and the batch's seq, version and source into fresh
arrays. Arms, each on the same pre-drawn random slots, in turns (``paired_times``):

- ``gather_batch`` with the whole batch prefetched first (``set_rows_ahead(0)``: the code before
  session 31), and with 4, 8 (the default) and 16 rows ahead;
- ``gather_rows`` then ``take_rows`` at the default distance: the same work in two calls.

Ratios are per repetition against the first arm; medians over ``--reps``.
"""

from __future__ import annotations

import argparse

import numpy as np

from .bench_buffer import conduit_buffer, conduit_columns, make_rollouts
from .common import fmt_table, machine, median, paired_times, ratio_stats, write_json


def full_ring(kind: str, capacity: int):
    """A uniform ring of ``capacity`` slots, every slot written (rows cycle through a pool)."""
    buf = conduit_buffer(kind, capacity, False, reuse=0)
    pool = [conduit_columns(r) for r in make_rollouts(kind, min(capacity, 20_000), 200)]
    i = 0
    while buf.ring.inserted < capacity:
        cols = pool[i % len(pool)]
        n = min(len(cols["action"]), capacity - buf.ring.inserted)
        buf.add(cols if n == len(cols["action"]) else {k: v[:n] for k, v in cols.items()})
        i += 1
    return buf


def main(argv=None) -> dict:
    from conduit_core._native import _rows
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_row_gather", description=__doc__.split("\n\n")[0])
    p.add_argument("--kind", default="cartpole", choices=["cartpole", "atari"])
    p.add_argument("--capacity", type=int, default=None, help="default: 1,000,000 (cartpole), 40,000 (atari)")
    p.add_argument("--batch", type=int, nargs="+", default=[32, 256])
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--calls", type=int, default=None, help="calls per repetition (default: 2000 cartpole, 100 atari)")
    p.add_argument("--json", default="out/bench_row_gather.json")
    a = p.parse_args(argv)
    capacity = a.capacity or (1_000_000 if a.kind == "cartpole" else 40_000)
    buf = full_ring(a.kind, capacity)
    targets = buf.storage.row_copy_targets()
    provenance = buf.ring.provenance_columns()
    rng = np.random.default_rng(0)
    report: dict = {"machine": machine(), "args": vars(a), "capacity": capacity, "batches": {}}
    rows = []
    for B in a.batch:
        outs = [{name: np.empty((B, *col.shape[1:]), col.dtype) for name, col in targets} for _ in range(5)]
        draws = [rng.integers(0, capacity, B) for _ in range(4096)]
        turn = [0]

        def fused(ahead: int):
            def call():
                turn[0] += 1
                _rows.gather_batch(draws[turn[0] % 4096], targets, outs[turn[0] % 5], provenance)
            return call, ahead

        def two_calls():
            turn[0] += 1
            slots = draws[turn[0] % 4096]
            _rows.gather_rows(slots, targets, outs[turn[0] % 5])
            _rows.take_rows(slots, provenance)

        arms = {"gather_batch, whole batch first": fused(0), "gather_batch, 4 rows ahead": fused(4),
                "gather_batch, 8 rows ahead": fused(8), "gather_batch, 16 rows ahead": fused(16),
                "gather_rows + take_rows, 8 rows ahead": (two_calls, 8)}
        calls = a.calls or (2000 if a.kind == "cartpole" else 100)

        def with_distance(call, ahead):
            def run():
                before = _rows.set_rows_ahead(ahead)
                try:
                    call()
                finally:
                    _rows.set_rows_ahead(before)
            return run

        times = paired_times({name: (with_distance(call, ahead), calls) for name, (call, ahead) in arms.items()},
                             reps=a.reps)
        base = times["gather_batch, whole batch first"]
        entry = report["batches"][B] = {}
        for name, ts in times.items():
            entry[name] = {"us": median(ts) * 1e6, "vs_whole_batch_first": ratio_stats(ts, base)}
            r = entry[name]["vs_whole_batch_first"]
            rows.append([a.kind, B, name, f"{median(ts) * 1e6:.1f} us",
                         f"{r['median']:.3f}x (min {r['min']:.3f}, max {r['max']:.3f})"])
    buf.close()
    print(fmt_table(rows, ["kind", "B", "arm", "median", "vs whole batch first"]))
    print(f"ring: {capacity:,} slots, every slot written; outputs: 5 sets in turn; JSON: {a.json}")
    write_json(a.json, report)
    return report


if __name__ == "__main__":
    main()
