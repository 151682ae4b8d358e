"""What a buffer costs in memory: empty, after 1e5 writes, and after close(), per tier and
capacity (CartPole transitions, prioritized: the largest per-slot metadata).

    python -m benchmarks.buffer.memory            # ~1 min; docs/benchmarks.md section 11

Each case runs in a fresh Python process, so the figures are that buffer's alone: the
process's resident memory (VmRSS, which includes the shared pages it touched) and the
bytes used in /dev/shm, each as the increase over the process before the buffer was built.
A capacity the tier cannot hold when full is refused at construction (CapacityError); the
table shows the message. Pinned and device tiers need CUDA and are reported as skipped
without it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CASE = r"""
import json, os, sys
import numpy as np
from conduit_core import CapacityError, ExperienceBuffer, ExperienceSpec, Prioritized

def rss():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
def shm():
    st = os.statvfs("/dev/shm")
    return (st.f_blocks - st.f_bfree) * st.f_frsize

tier, capacity, writes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
spec = ExperienceSpec.transition(obs_shape=(4,))
n = 1000
chunk = {"obs": np.random.rand(n, 4).astype(np.float32), "action": np.zeros(n, np.int64),
         "reward": np.ones(n, np.float32), "next_obs": np.random.rand(n, 4).astype(np.float32),
         "terminated": np.zeros(n, bool), "truncated": np.zeros(n, bool)}
r0, s0 = rss(), shm()
out = {"tier": tier, "capacity": capacity, "row_bytes": spec.stored_bytes_per_transition}
try:
    buf = ExperienceBuffer(spec=spec, capacity=capacity, selector=Prioritized(), tier=tier)
except CapacityError as exc:
    out["refused"] = str(exc)
    print(json.dumps(out)); sys.exit(0)
out["empty"] = {"rss": rss() - r0, "shm": shm() - s0}
for i in range(0, min(writes, capacity), n):
    buf.add(chunk, source=i // n)
out["written"] = {"rows": len(buf), "rss": rss() - r0, "shm": shm() - s0}
buf.close()
del buf
out["closed"] = {"rss": rss() - r0, "shm": shm() - s0}
print(json.dumps(out))
"""


def run_case(tier: str, capacity: int, writes: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", CASE, tier, str(capacity), str(writes)], capture_output=True,
                       text=True, env=env, timeout=600)
    if r.returncode != 0:
        return {"tier": tier, "capacity": capacity, "error": r.stderr.strip().splitlines()[-1:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def mb(n: int) -> str:
    return f"{n / 2**20:,.1f} MB"


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.buffer.memory", description=__doc__.split("\n\n")[0])
    p.add_argument("--capacities", type=float, nargs="+", default=[1e6, 1e8, 1e9])
    p.add_argument("--writes", type=int, default=100_000)
    p.add_argument("--json", default="out/bench_memory.json")
    a = p.parse_args(argv)
    import torch
    tiers = ["pageable", "shared"] + (["pinned", "device"] if torch.cuda.is_available() else [])
    rows = [run_case(t, int(c), a.writes) for t in tiers for c in a.capacities]
    print(f"CartPole transitions, prioritized; increase in resident memory (RSS) and /dev/shm use; "
          f"{a.writes:,} writes")
    print(f"{'tier':9s} {'capacity':>14s}  {'empty RSS':>11s} {'empty shm':>10s}  {'written RSS':>12s} "
          f"{'written shm':>11s}  {'closed RSS':>11s} {'closed shm':>10s}")
    for r in rows:
        head = f"{r['tier']:9s} {r['capacity']:>14,d}  "
        if "refused" in r:
            print(head + "refused: " + r["refused"][:150])
        elif "error" in r:
            print(head + f"error: {r['error']}")
        else:
            e, w, c = r["empty"], r["written"], r["closed"]
            print(head + f"{mb(e['rss']):>11s} {mb(e['shm']):>10s}  {mb(w['rss']):>12s} {mb(w['shm']):>11s}  "
                         f"{mb(c['rss']):>11s} {mb(c['shm']):>10s}")
    if "pinned" not in tiers:
        print("pinned, device: skipped (no CUDA on this machine)")
    os.makedirs(os.path.dirname(a.json) or ".", exist_ok=True)
    with open(a.json, "w") as fh:
        json.dump({"args": vars(a), "rows": rows}, fh, indent=2)
    print(f"JSON: {a.json}")
    return {"rows": rows}


if __name__ == "__main__":
    main()
