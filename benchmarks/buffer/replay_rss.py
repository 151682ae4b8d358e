"""Replay memory per transition by resident memory (issue 18's "memory by RSS after the fill"):
RLlib's prioritized episode buffer vs Conduit's, each filled in a fresh process.

    python -m benchmarks.buffer.replay_rss [--cartpole 1000000] [--atari 20000] [--json out/replay_rss.json]

Each arm runs in its own Python process: after the imports, the process's VmRSS is read, the
buffer is built with capacity N, N transitions are added as RLlib's DQN hands them over (200-step
``SingleAgentEpisode``s, made one at a time and dropped after the ``add``), ``gc.collect()`` runs,
and VmRSS is read again. The increase, divided by N, is the figure: everything the buffer keeps
(RLlib: the episode objects, their observation lists and its priority trees; Conduit: the ring's
columns, metadata, priority trees and, for Atari, its frame pool), plus whatever the allocator did not
give back from the temporary episodes (which counts against Conduit, the arm that copies and lets
them go). Workloads: CartPole (4 float32 obs) and Atari (RLlib's Atari layout: 84x84x4 float32 stacks
q/128 - 1 of consecutive uint8 frames, which Conduit's ``obs_codec='auto'`` recognises and stores as a
frame pool). Both arms get the same episodes (same seed). Target (issue 18): Conduit at most 0.10x.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from ..common import machine, write_json

CASE = r"""
import gc, json, sys
import numpy as np

def rss():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024

arm, kind, n, ep_len = sys.argv[1], sys.argv[2], int(sys.argv[3]), 200
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.utils.replay_buffers.prioritized_episode_buffer import PrioritizedEpisodeReplayBuffer
from conduit_rllib.replay_buffer import ConduitEpisodeReplayBuffer

rng = np.random.default_rng(0)

def episode(i):
    if kind == "cartpole":
        obs = list(rng.standard_normal((ep_len + 1, 4)).astype(np.float32))
    else:   # consecutive frames stacked on the last axis, as RLlib's Atari wrappers give them
        frames = rng.integers(0, 256, (ep_len + 4, 84, 84), dtype=np.uint8)
        idx = np.arange(ep_len + 1)[:, None] + np.arange(4)
        stacks = np.moveaxis(frames[idx], 1, -1).astype(np.float32) / 128.0 - 1.0
        obs = list(stacks)
    ep = SingleAgentEpisode(observations=obs, actions=list(rng.integers(0, 2, ep_len)),
                            rewards=list(np.ones(ep_len, np.float32)), terminated=True, len_lookback_buffer=0)
    return ep.to_numpy()

gc.collect()
r0 = rss()
if arm == "rllib":
    buf = PrioritizedEpisodeReplayBuffer(capacity=n, alpha=0.6)
else:
    buf = ConduitEpisodeReplayBuffer(capacity=n, prioritized=True, alpha=0.6)
for i in range(n // ep_len):
    buf.add([episode(i)])
gc.collect()
r1 = rss()
print(json.dumps({"arm": arm, "kind": kind, "transitions": int(buf.get_num_timesteps()), "rss_bytes": r1 - r0,
                  "bytes_per_transition": (r1 - r0) / max(1, buf.get_num_timesteps())}))
"""


def run_arm(arm: str, kind: str, n: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_AUTH_MODE": "disabled"}
    r = subprocess.run([sys.executable, "-c", CASE, arm, kind, str(n)], capture_output=True, text=True, env=env,
                       timeout=1800)
    if r.returncode != 0:
        return {"arm": arm, "kind": kind, "error": r.stderr.strip().splitlines()[-3:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def measure(kind: str, n: int) -> dict:
    """Both arms for one workload ('cartpole' or 'atari'), each filled with ``n`` transitions in a
    fresh process: ``{"n", "rllib", "conduit"[, "ratio"]}`` (an arm that failed holds its error)."""
    arms = {arm: run_arm(arm, kind, n) for arm in ("rllib", "conduit")}
    w = {"n": n, **arms}
    if all("bytes_per_transition" in x for x in arms.values()):
        w["ratio"] = arms["conduit"]["bytes_per_transition"] / arms["rllib"]["bytes_per_transition"]
    return w


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.buffer.replay_rss", description=__doc__.split("\n\n")[0])
    p.add_argument("--cartpole", type=int, default=1_000_000, help="transitions (and capacity), CartPole")
    p.add_argument("--atari", type=int, default=20_000, help="transitions (and capacity), Atari")
    p.add_argument("--json", default="out/replay_rss.json")
    a = p.parse_args(argv)
    report = {"machine": machine(), "args": vars(a), "workloads": {}}
    for kind, n in (("cartpole", a.cartpole), ("atari", a.atari)):
        if n <= 0:
            continue
        w = report["workloads"][kind] = measure(kind, n)
        for arm in ("rllib", "conduit"):
            x = w[arm]
            what = (f"{x['bytes_per_transition']:,.0f} B per transition ({x['rss_bytes'] / 2**20:,.0f} MB for "
                    f"{x['transitions']:,})" if "bytes_per_transition" in x else f"failed: {x.get('error')}")
            print(f"{kind:8s} {arm:8s} {what}")
        if "ratio" in w:
            print(f"{kind:8s} conduit / rllib = {w['ratio']:.3f}x" + (" (target <= 0.10x)" if kind == "atari" else ""))
    write_json(a.json, report)
    print(f"JSON: {a.json}")
    return report


if __name__ == "__main__":
    main()
