"""SRL's own experience path vs Conduit's consumer (and buffer), in one run of the integration.

For each seed and each stream (``shm``, ``zmq``), every arm runs ``--seconds`` through SRL's launcher
(``run.launch``, one run at a time, the arm order rotated per seed):

- ``srl``: SRL's consumer and SRL's ``priority_queue`` (SRL unchanged);
- ``conduit-g1``: Conduit's ``SampleConsumer`` at g_ing=1 (SRL's granularity) into Conduit's buffer;
- ``conduit-g16``: the same at g_ing=16 (one buffer call per up to 16 samples received together; before
  2026-12-01 a partial group waited up to 50 ms for more, ``max_delay_s``'s old default).

Reported per stream, medians over seeds: trained frames/s, the trainer's exposed wait for data (ms per
trainer step and fraction of wall time), the put cost, and Conduit's accounting (received == put).

    cd /work/main && PYTHONPATH=.:adapters /work/srl-venv/bin/python -m integrations.srl_cartpole.compare_consumers \\
        --seeds 3 --seconds 60 --json out/srl_consumers.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import replace

from .run import Args, launch

ARMS = {"srl": dict(buffer="srl", consumer="srl", g_ing=1),
        "conduit-g1": dict(buffer="conduit", consumer="conduit", g_ing=1),
        "conduit-g16": dict(buffer="conduit", consumer="conduit", g_ing=16)}
METRICS = ("trained_frames_per_s", "exposed_wait_ms_per_step", "exposed_wait_fraction", "put_ms_per_sample",
           "samples_put_per_s", "return_last20")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--streams", default="shm,zmq")
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--out", default="out/srl_consumers")
    p.add_argument("--json", default="out/srl_consumers.json")
    a = p.parse_args(argv)
    arms, streams = a.arms.split(","), a.streams.split(",")
    runs = []
    for k, seed in enumerate(range(a.first_seed, a.first_seed + a.seeds)):
        for stream in streams:
            order = arms[k % len(arms):] + arms[:k % len(arms)]
            for arm in order:
                args = replace(Args(), stream=stream, seconds=a.seconds, seed=seed, quiet=True,
                               out=os.path.join(a.out, f"{stream}-{arm}-s{seed}"), **ARMS[arm])
                t = time.time()
                s = launch(args)
                row = dict(arm=arm, stream=stream, seed=seed, started=t, **{m: s.get(m) for m in METRICS},
                           consumer=s.get("consumer"), buffer_accounting=s.get("buffer_accounting"))
                runs.append(row)
                print(f"{stream:>3} {arm:<11} seed {seed}: " + "  ".join(
                    f"{m} {row[m]:.3f}" if isinstance(row[m], float) else f"{m} {row[m]}" for m in METRICS),
                    flush=True)
                os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
                with open(a.json, "w") as fh:
                    json.dump(dict(args=vars(a), runs=runs, medians=medians(runs)), fh, indent=1)
    for key, m in medians(runs).items():
        print(key, {k: round(v, 3) for k, v in m.items() if v is not None})


def medians(runs) -> dict:
    out = {}
    for r in runs:
        out.setdefault((r["stream"], r["arm"]), []).append(r)
    return {f"{s}/{arm}": {m: (statistics.median(v) if (v := [r[m] for r in rs if r[m] is not None]) else None)
                           for m in METRICS} for (s, arm), rs in out.items()}


if __name__ == "__main__":
    main()
