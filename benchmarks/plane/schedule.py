"""Scheduling benchmark: sequential vs overlapped (thread worker, process worker).

A synthetic actor/learner loop on the data plane, per step:

    ingest(rollout of 128 steps)       with an ingestion hook (GAE over the rollout)
    deliver(256)                       uniform replay
    learner compute                    a torch MLP forward/backward (releases the GIL)

The hook comes in two weights: 'vectorized' (numpy GAE, ~0.1 ms) and 'python' (a per-step
Python loop, ~1-2 ms, typical of framework connectors). Printed per mode: the exposed
experience-path time per step (caller-blocked in ingest + deliver) and the step time,
medians over repetitions, and each as a ratio to sequential.

    python -m benchmarks.plane.schedule [--steps 200] [--reps 3]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch

from conduit_core import (
    ExperienceBuffer,
    ExperienceDataPlane,
    ExperienceSpec,
    Rollout,
    Schedule,
)

from ..common import fmt_table, machine, median, write_json

GAMMA, LAMBDA = 0.99, 0.95


def gae_vectorized(rollouts: list[Rollout]) -> list[Rollout]:
    """GAE with numpy (reverse discounted cumsum via a small loop over 64 steps in numpy)."""
    out = []
    for r in rollouts:
        d = dict(r.data)
        rew, val = d["reward"], d["value"]
        nxt = np.append(val[1:], 0.0).astype(np.float32)
        delta = rew + GAMMA * nxt - val
        adv = np.zeros_like(delta)
        acc = np.float32(0)
        for t in range(len(delta) - 1, -1, -1):
            acc = delta[t] + GAMMA * LAMBDA * acc
            adv[t] = acc
        d["advantage"] = adv
        out.append(Rollout(d, r.source, r.policy_version, r.ticket, r.rows, r.info))
    return out


def gae_python(rollouts: list[Rollout]) -> list[Rollout]:
    """The same GAE as per-step Python objects, as framework connectors often do it."""
    out = []
    for r in rollouts:
        d = dict(r.data)
        rew, val = d["reward"].tolist(), d["value"].tolist()
        steps = [{"r": rew[t], "v": val[t], "obs": d["obs"][t].tolist()} for t in range(len(rew))]
        adv, acc = [0.0] * len(steps), 0.0
        for t in range(len(steps) - 1, -1, -1):
            nv = steps[t + 1]["v"] if t + 1 < len(steps) else 0.0
            acc = steps[t]["r"] + GAMMA * nv - steps[t]["v"] + GAMMA * LAMBDA * acc
            adv[t] = acc
        mean, var, n = [0.0] * 8, [1.0] * 8, 0
        for s in steps:  # a running mean/std filter per step, as connectors' filters do
            n += 1
            for j, x in enumerate(s["obs"]):
                dm = x - mean[j]
                mean[j] += dm / n
                var[j] += dm * (x - mean[j])
            s["obs_n"] = [(x - mean[j]) / (var[j] / n) ** 0.5 for j, x in enumerate(s["obs"])]
        d["advantage"] = np.asarray(adv, dtype=np.float32)
        out.append(Rollout(d, r.source, r.policy_version, r.ticket, r.rows, r.info))
    return out


HOOKS = {"vectorized": gae_vectorized, "python": gae_python}


def spec() -> ExperienceSpec:
    return ExperienceSpec.transition(obs_shape=(8,), extras={"value": ((), torch.float32),
                                                            "advantage": ((), torch.float32)})


def rollout(rng: np.random.Generator, n: int = 128) -> dict:
    return {"obs": rng.standard_normal((n, 8)).astype(np.float32), "action": rng.integers(0, 2, n),
            "reward": rng.standard_normal(n).astype(np.float32),
            "next_obs": rng.standard_normal((n, 8)).astype(np.float32),
            "terminated": np.zeros(n, bool), "truncated": np.zeros(n, bool),
            "value": rng.standard_normal(n).astype(np.float32)}


class Learner:
    def __init__(self):
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                       torch.nn.ReLU(), torch.nn.Linear(512, 1))
        self.opt = torch.optim.SGD(self.net.parameters(), lr=1e-4)

    def step(self, batch) -> None:
        loss = (self.net(batch["obs"]).squeeze(-1) - batch["advantage"]).pow(2).mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()


def run(mode: str, hook: str, *, steps: int, seed: int = 0) -> dict:
    hooks = [HOOKS[hook]]
    sched = {"sequential": Schedule.sequential(),
             "thread": Schedule.overlapped(worker="thread", staleness=128),
             "process": Schedule.overlapped(worker="process", staleness=128)}[mode]
    buf = ExperienceBuffer(spec=spec(), capacity=100_000, seed=seed)
    rng = np.random.default_rng(seed)
    learner = Learner()
    data = [rollout(rng) for _ in range(16)]
    with ExperienceDataPlane(buffer=buf, schedule=sched, ingest_hooks=hooks) as edp:
        for i in range(8):  # warm-up: fill and let a process worker start
            edp.ingest(data[i % 16], source=i % 4)
        edp.flush()
        edp.reset_metrics()
        t0 = time.perf_counter()
        for i in range(steps):
            edp.ingest(data[i % 16], source=i % 4)
            b = edp.deliver(256)
            learner.step(b)
        wall = time.perf_counter() - t0
        m = edp.metrics()
    return {"exposed_ms": (m.ingest.blocked_s + m.deliver.blocked_s) / steps * 1e3, "step_ms": wall / steps * 1e3,
            "ingest_busy_ms": m.ingest.busy_s / steps * 1e3}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.plane.schedule", description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--json", default="out/bench_schedule.json")
    a = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    modes = ("sequential", "thread", "process")
    res: dict = {"machine": machine(), "args": vars(a), "results": {}}
    rows = []
    for hook in HOOKS:
        per = {m: [] for m in modes}
        for _ in range(a.reps):
            for m in modes:  # interleaved repetitions
                per[m].append(run(m, hook, steps=a.steps))
        res["results"][hook] = per
        base_e = median([r["exposed_ms"] for r in per["sequential"]])
        base_s = median([r["step_ms"] for r in per["sequential"]])
        for m in modes:
            e = median([r["exposed_ms"] for r in per[m]])
            s = median([r["step_ms"] for r in per[m]])
            h = median([r["ingest_busy_ms"] for r in per[m]])
            rows.append([hook, m, f"{h:.2f}", f"{e:.2f}", f"{e / base_e:.2f}x", f"{s:.2f}", f"{s / base_s:.2f}x"])
    print(f"{a.steps} steps x {a.reps} reps, medians; staleness 128 for the overlapped modes")
    print(fmt_table(rows, ["hook", "mode", "hook ms/step", "exposed ms/step", "vs seq", "step ms", "vs seq"]))
    write_json(a.json, res)
    return res


if __name__ == "__main__":
    main()
