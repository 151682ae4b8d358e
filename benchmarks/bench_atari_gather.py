"""Atari gather on a full ring (issue 18: "at least 75% of the np.take-into-output limit at B=32 and
B=256 on a full 200k ring"), which ``bench_buffer`` cannot hold next to its other arms.

    python -m benchmarks.bench_atari_gather [--capacity 200000] [--batch 32 256] [--reps 5] [--calls 100]

One Conduit ring of ``--capacity`` Atari transitions (84x84x4 uint8 obs and next obs, 56 KB each:
11.3 GB at 200k) is filled to the last slot, then timed; then the next arm's ring is built (one ring
in memory at a time). The rows cycle through a pool of 20k distinct generated transitions (the
content does not change a gather's cost; every slot is written). Arms, each at B=32 and B=256:
uniform and prioritized (sample + priority update, as DQN does), with reused outputs
(``reuse_outputs=4``) and with fresh outputs per batch. The limit, on the first (uniform) ring:
one ``np.take`` per column of uniform random rows of the full ring into existing outputs, 4 output
sets in turn (as Conduit's pool) and 1 cache-hot set; the figure is GB/s of obs + next obs delivered
per step, as a share of that limit. Medians of ``--reps`` repetitions.
"""

from __future__ import annotations

import argparse
import gc
import time

import numpy as np

from .bench_buffer import SHAPES, conduit_buffer, conduit_columns, make_rollouts, take_limit
from .common import machine, median, memcpy_bandwidth, time_per_call, write_json


def fill_full(buf, pool: list[dict]) -> float:
    """Write every slot of ``buf`` (cycling through ``pool``); returns rows per second."""
    t0, i = time.perf_counter(), 0
    while buf.ring.inserted < buf.capacity:
        cols = pool[i % len(pool)]
        n = min(len(cols["action"]), buf.capacity - buf.ring.inserted)
        buf.add(cols if n == len(cols["action"]) else {k: v[:n] for k, v in cols.items()}, source=i)
        i += 1
    return buf.capacity / (time.perf_counter() - t0)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_atari_gather", description=__doc__.split("\n\n")[0])
    p.add_argument("--capacity", type=int, default=200_000)
    p.add_argument("--batch", type=int, nargs="+", default=[32, 256])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--json", default="out/bench_atari_gather.json")
    a = p.parse_args(argv)
    row = 2 * int(np.prod(SHAPES["atari"][0]))
    pool = [conduit_columns(r) for r in make_rollouts("atari", min(a.capacity, 20_000), 200)]
    report = {"machine": machine(), "memcpy_GBps": memcpy_bandwidth(), "args": vars(a), "limit": {}, "arms": {}}
    for prioritized, reuse in ((False, 4), (True, 4), (False, 0), (True, 0)):
        name = f"{'prioritized' if prioritized else 'uniform'}, {'reused' if reuse else 'fresh'} outputs"
        buf = conduit_buffer("atari", a.capacity, prioritized, reuse=reuse)
        fill_rate = fill_full(buf, pool)
        arm = report["arms"][name] = {"fill_rows_per_s": fill_rate}
        for B in a.batch:
            if not report["limit"].get(f"B{B}"):
                report["limit"][f"B{B}"] = {
                    "take_4_outs_GBps": take_limit(buf, B, a.capacity, calls=a.calls, reps=a.reps),
                    "take_1_hot_out_GBps": take_limit(buf, B, a.capacity, calls=a.calls, reps=a.reps, depth=1)}
            pr = np.random.default_rng(B).random(B)

            def step(buf=buf, B=B, pr=pr):
                b = buf.sample(B)
                if prioritized:
                    buf.update_priorities(b.slots, pr, seqs=b.seqs)
                return b
            t = median(time_per_call(step, calls=a.calls, reps=a.reps))
            lim = report["limit"][f"B{B}"]
            arm[f"B{B}"] = {"step_s": t, "GBps": B * row / t / 1e9,
                            "of_take_4_outs": B * row / t / 1e9 / lim["take_4_outs_GBps"],
                            "of_take_1_hot_out": B * row / t / 1e9 / lim["take_1_hot_out_GBps"]}
            print(f"{name:36s} B={B:<4d} {t * 1e6:8.1f} us  {arm[f'B{B}']['GBps']:5.2f} GB/s  "
                  f"{arm[f'B{B}']['of_take_4_outs']:.0%} of np.take into 4 outs in turn "
                  f"({lim['take_4_outs_GBps']:.2f} GB/s), {arm[f'B{B}']['of_take_1_hot_out']:.0%} of into 1 hot out",
                  flush=True)
        buf.close()
        del buf
        gc.collect()
    print(f"memcpy {report['memcpy_GBps']:.1f} GB/s; ring {a.capacity:,} slots full "
          f"({a.capacity * row / 1e9:.1f} GB of obs + next obs); target >= 75% of np.take into 4 outs")
    write_json(a.json, report)
    print(f"JSON: {a.json}")
    return report


if __name__ == "__main__":
    main()
