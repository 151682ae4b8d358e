"""Atari gather on a full ring (issue 18: "at least 75% of the np.take-into-output limit at B=32 and
B=256 on a full 200k ring"), which ``buffer.bench`` cannot hold next to its other arms.

    python -m benchmarks.buffer.atari_gather [--capacity 200000] [--batch 32 256] [--reps 5] [--calls 100]

One Conduit ring of ``--capacity`` Atari transitions (84x84x4 uint8 obs and next obs, 56 KB each:
11.3 GB at 200k) is filled to the last slot, then timed; then the next arm's ring is built (one ring
in memory at a time). The rows cycle through a pool of 20k distinct generated transitions (the
content does not change a gather's cost; every slot is written). Arms, each at B=32 and B=256:
uniform and prioritized (sample + priority update, as DQN does), with reused outputs
(``reuse_outputs=4`` and ``=1``) and with fresh outputs per batch. The limit is measured on each
arm's own ring, its repetitions in turns with the arm's (paired ratios): one ``np.take`` per
column of uniform random rows. Each arm is compared with the limit of its own guarantee
(``reuse_outputs=k`` keeps a batch valid through k more samples: k + 1 output sets in turn;
fresh outputs: np.take into fresh arrays) and with the strictest, one cache-hot set. The figure is
GB/s of obs + next obs delivered per step, as a share of that limit; medians of ``--reps``
repetitions of paired ratios.
"""

from __future__ import annotations

import argparse
import gc
import time

import numpy as np

from ..common import (
    machine,
    median,
    memcpy_bandwidth,
    paired_times,
    ratio_stats,
    write_json,
)
from .peers import sets_for, take_call
from .workload import SHAPES, conduit_buffer, conduit_columns, make_rollouts


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
    p = argparse.ArgumentParser(prog="python -m benchmarks.buffer.atari_gather", description=__doc__.split("\n\n")[0])
    p.add_argument("--capacity", type=int, default=200_000)
    p.add_argument("--batch", type=int, nargs="+", default=[32, 256])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--json", default="out/bench_atari_gather.json")
    a = p.parse_args(argv)
    row = 2 * int(np.prod(SHAPES["atari"][0]))
    pool = [conduit_columns(r) for r in make_rollouts("atari", min(a.capacity, 20_000), 200)]
    report = {"machine": machine(), "memcpy_GBps": memcpy_bandwidth(), "args": vars(a), "limit": {}, "arms": {}}
    for prioritized, reuse in ((False, 4), (True, 4), (False, 1), (True, 1), (False, 0), (True, 0)):
        name = f"{'prioritized' if prioritized else 'uniform'}, " + (f"reuse_outputs={reuse}" if reuse else "fresh outputs")
        buf = conduit_buffer("atari", a.capacity, prioritized, reuse=reuse)
        fill_rate = fill_full(buf, pool)
        arm = report["arms"][name] = {"fill_rows_per_s": fill_rate}
        for B in a.batch:
            pr = np.random.default_rng(B).random(B)

            def step(buf=buf, B=B, pr=pr):
                b = buf.sample(B)
                if prioritized:
                    buf.update_priorities(b.slots, pr, seqs=b.seqs)
                return b
            sets = sets_for(reuse)   # the same guarantee: reuse_outputs + 1 sets in turn, or fresh outputs
            take_own, nbytes = take_call(buf, B, a.capacity, depth=sets)
            take1, _ = take_call(buf, B, a.capacity, depth=1)
            t = paired_times({"arm": (step, a.calls), "take_own": (take_own, a.calls), "take1": (take1, a.calls)},
                             reps=a.reps)
            own, lim1 = ratio_stats(t["take_own"], t["arm"]), ratio_stats(t["take1"], t["arm"])   # arm GB/s / limit GB/s
            own_name = f"{sets} outs in turn" if sets else "fresh outs"
            arm[f"B{B}"] = {"step_s": median(t["arm"]), "GBps": nbytes / median(t["arm"]) / 1e9,
                            "own_limit": own_name, "take_own_GBps": nbytes / median(t["take_own"]) / 1e9,
                            "take_1_hot_out_GBps": nbytes / median(t["take1"]) / 1e9,
                            "of_own_limit": own, "of_take_1_hot_out": lim1}
            report["limit"].setdefault(f"B{B}", {})[name] = {k: arm[f"B{B}"][k] for k in
                                                             ("own_limit", "take_own_GBps", "take_1_hot_out_GBps")}
            print(f"{name:40s} B={B:<4d} {median(t['arm']) * 1e6:8.1f} us  {arm[f'B{B}']['GBps']:5.2f} GB/s  "
                  f"{own['median']:.0%} of np.take into {own_name} (min {own['min']:.0%}; its guarantee), "
                  f"{lim1['median']:.0%} of into 1 hot out (min {lim1['min']:.0%})", flush=True)
        buf.close()
        del buf
        gc.collect()
    print(f"memcpy {report['memcpy_GBps']:.1f} GB/s; ring {a.capacity:,} slots full "
          f"({a.capacity * row / 1e9:.1f} GB of obs + next obs); target >= 75% of the np.take limit of the same "
          "guarantee (reuse_outputs=k: a batch valid through k more samples, k + 1 outs in turn; fresh: fresh outs)")
    write_json(a.json, report)
    print(f"JSON: {a.json}")
    return report


if __name__ == "__main__":
    main()
