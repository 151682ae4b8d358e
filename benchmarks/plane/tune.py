"""``conduit tune``: profile briefly, predict every configuration with the cost model, measure
them all, and compare: predicted vs measured step time, top-8 order, the auto-pick.

The workload is a DQN-shaped loop on the data plane with synthetic transitions of
``--dims`` float32 features (as the paper's Table 4): per step an actor produces a
4-step rollout (with an n-step-style ingestion hook), the learner takes a batch of 32
(n-step (2,5) delivery with priorities) and runs an MLP update.

    conduit tune dqn-synthetic --dims 128 256 512 1000 2000 [--steps 150]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch

from conduit_core import (
    ExperienceBuffer,
    ExperienceDataPlane,
    ExperienceSpec,
    Prioritized,
    Rollout,
    Schedule,
)
from conduit_core.planning.costmodel import (
    Config,
    Profile,
    enumerate_configs,
    fit_operator,
    operator_times,
    predict,
)
from conduit_core.planning.topology import probe

from ..common import fmt_table, machine, write_json

ROLLOUT, BATCH = 4, 32
STALENESS = 16  # inserts a delivery may miss: a workload property, the same for every configuration


def scale_rewards(rollouts: list[Rollout]) -> list[Rollout]:
    """An ingestion hook with per-rollout Python work (reward scaling and bookkeeping)."""
    out = []
    for r in rollouts:
        d = dict(r.data)
        d["reward"] = (np.sign(d["reward"]) * np.log1p(np.abs(d["reward"]))).astype(np.float32)
        out.append(Rollout(d, r.source, r.policy_version, r.ticket, r.rows, r.info))
    return out


class Loop:
    def __init__(self, dims: int, config: Config, seed: int = 0):
        self.dims, self.config = dims, config
        spec = ExperienceSpec.transition(obs_shape=(dims,))
        tier = {"host": "pageable", "shm": "shared"}[config.placement]
        buf = ExperienceBuffer(spec=spec, capacity=100_000, selector=Prioritized(), tier=tier, seed=seed)
        g = {"delivery_granularity": config.delivery_granularity, "staleness": STALENESS}
        sched = (Schedule.sequential(**g) if config.mode == "sequential" else
                 Schedule.overlapped(worker=config.worker, ingest_granularity=config.ingest_granularity, **g))
        self.edp = ExperienceDataPlane(buffer=buf, schedule=sched, ingest_hooks=[scale_rewards])
        rng = np.random.default_rng(seed)
        self.rollouts = [{"obs": rng.standard_normal((ROLLOUT, dims)).astype(np.float32),
                          "next_obs": rng.standard_normal((ROLLOUT, dims)).astype(np.float32),
                          "action": rng.integers(0, 4, ROLLOUT), "reward": rng.standard_normal(ROLLOUT).astype(np.float32),
                          "terminated": rng.random(ROLLOUT) < 0.05, "truncated": np.zeros(ROLLOUT, bool)}
                         for _ in range(32)]
        torch.manual_seed(seed)
        self.net = torch.nn.Sequential(torch.nn.Linear(dims, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))
        self.opt = torch.optim.SGD(self.net.parameters(), lr=1e-4)
        self.env_state = rng.standard_normal((64, 64))
        self.i = 0
        self.pending: list = []

    def env_step(self) -> None:  # the actor's own work (not experience path)
        self.env_state = np.tanh(self.env_state @ self.env_state.T * 1e-3)

    def learner_step(self, b) -> np.ndarray:
        q = self.net(b["obs"]).gather(1, b["action"].long().unsqueeze(1)).squeeze(1)
        loss = ((q - b["reward"]) ** 2 * b.weights).mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return (q - b["reward"]).abs().detach().numpy()

    def step(self) -> None:
        self.env_step()
        self.pending.append(Rollout(self.rollouts[self.i % 32], source=self.i % 4))
        self.i += 1
        if len(self.pending) >= self.config.ingest_granularity or self.config.mode != "sequential":
            self.edp.ingest_many(self.pending)
            self.pending = []
        b = self.edp.deliver(BATCH, n_step=(2, 5), gamma=0.99)
        td = self.learner_step(b)
        self.edp.update_priorities(b, td + 1e-3)

    def run(self, steps: int) -> dict:
        self.edp.ingest_many([Rollout(r, source=4) for r in self.rollouts[:8]])  # learning starts
        for _ in range(20):
            self.step()
        self.edp.flush()
        self.edp.reset_metrics()
        t0 = time.perf_counter()
        for _ in range(steps):
            self.step()
        wall = (time.perf_counter() - t0) / steps
        m = self.edp.metrics()
        self.edp.close()
        return {"step_s": wall, "exposed_s": m.exposed_s / steps}


def _measure(dims: int, config: Config, steps: int) -> tuple[dict, object]:
    loop = Loop(dims, config)
    res = loop.run(steps)
    return res, loop.edp.metrics()


def profile(dims: int, steps: int) -> Profile:
    """Short runs: sequential at granularity 1 and 4 (twice each) fit the operators (fixed per
    call, per row, per byte) and the base step; three thread and three process runs calibrate
    the overlap terms (caller hand-off, interference; medians)."""
    b = 2 * dims * 4 + 8 + 4 + 2
    ing_samples, del_samples = [], []
    base, prio = [], []
    for g in (1, 4, 1, 4):
        res, m = _measure(dims, Config.of("host", "sequential", g, g), steps)
        ing_samples.append((m.ingest.calls / steps, m.ingest.items_in / steps, m.ingest.items_in / steps * b,
                            m.ingest.busy_s / steps))
        del_samples.append((1.0 / g, BATCH, BATCH * b, m.deliver.busy_s / steps))
        base.append(res["step_s"] - res["exposed_s"])
        prio.append(m.priorities.blocked_s / steps)
    ing = fit_operator(ing_samples)
    dlv = fit_operator(del_samples)
    p0 = Profile(base_s=statistics.median(base), priorities_s=statistics.median(prio), ingest=ing, deliver=dlv,
                 rows_per_step=ROLLOUT, rollouts_per_step=1.0, batch_size=BATCH, transition_bytes=b, staleness=STALENESS)
    calib = {}
    for kind in ("thread", "process"):  # three calibration runs each: the machine is noisy
        cfg = Config.of("host", kind, 1, 1)
        i_s, d_s = operator_times(cfg, p0)
        extra = p0.process_s_per_byte * ROLLOUT * b * 2 if kind == "process" else 0.0
        work = i_s + d_s + extra
        hs, its = [], []
        for _ in range(3):
            res, m = _measure(dims, cfg, steps)
            handoff = max(0.0, res["exposed_s"] - p0.priorities_s)
            hs.append(handoff)
            its.append((res["step_s"] - p0.base_s - handoff - p0.priorities_s) / work if work > 0 else 1.0)
        calib[kind] = (statistics.median(hs), float(np.clip(statistics.median(its), 0.0, 3.0)))
    return Profile(base_s=p0.base_s, priorities_s=p0.priorities_s, ingest=ing, deliver=dlv, rows_per_step=ROLLOUT,
                   rollouts_per_step=1.0, batch_size=BATCH, transition_bytes=b, staleness=STALENESS,
                   thread_handoff_s=calib["thread"][0], thread_interference=calib["thread"][1],
                   process_handoff_s=calib["process"][0], process_interference=calib["process"][1])


def spearman_top(pred: list[str], meas: list[str], k: int = 8) -> float:
    ranks = {c: i for i, c in enumerate(meas)}
    a = np.arange(k)
    b = np.array([ranks[c] for c in pred[:k]])
    return float(np.corrcoef(a, b)[0, 1]) if k > 1 else 1.0


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="conduit tune dqn-synthetic", description=__doc__.split("\n\n")[0])
    p.add_argument("--dims", type=int, nargs="+", default=[128, 256, 512, 1000, 2000])
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--rounds", type=int, default=3, help="measurements per configuration (median)")
    p.add_argument("--json", default="out/tune.json")
    a = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    topo = probe(nbytes=32 << 20, reps=3)
    configs = enumerate_configs()
    report = {"machine": machine(), "configs": len(configs), "dims": {}}
    for dims in a.dims:
        prof = profile(dims, 2 * a.steps)
        preds = {c.label: predict(c, prof, cores=topo.cores) for c in configs}
        runs: dict[str, list[float]] = {c.label: [] for c in configs}
        for rnd in range(a.rounds):  # interleaved rounds, each in another order: the median per config
            order = configs if rnd % 2 == 0 else configs[::-1]
            for c in order:
                runs[c.label].append(Loop(dims, c).run(a.steps)["step_s"])
        meas = {k: statistics.median(v) for k, v in runs.items()}
        order_p = sorted(preds, key=lambda k: preds[k].step_s)
        order_m = sorted(meas, key=meas.get)
        best_m = order_m[0]
        pick = order_p[0]
        err_best = abs(preds[best_m].step_s - meas[best_m]) / meas[best_m]
        top8_same = order_p[:8] == order_m[:8]
        top8_overlap = len(set(order_p[:8]) & set(order_m[:8]))
        rows = [[c, f"{preds[c].step_s * 1e3:.3f}", f"{meas[c] * 1e3:.3f}",
                 f"{(preds[c].step_s - meas[c]) / meas[c]:+.0%}"] for c in order_m]
        print(f"\ndims {dims}: {len(configs)} configurations, measured order (best first)")
        print(fmt_table(rows, ["config", "predicted ms", "measured ms", "error"]))
        print(f"best measured {best_m}: predicted within {err_best:.1%}; auto-pick {pick} is "
              f"{meas[pick] / meas[best_m] - 1:+.1%} from the best; top-8 identical: {top8_same} "
              f"(overlap {top8_overlap}/8, rank correlation {spearman_top(order_p, order_m):.2f})")
        report["dims"][dims] = {"profile": prof.to_dict(), "predicted": {k: v.step_s for k, v in preds.items()},
                                "measured": meas, "best_measured": best_m, "auto_pick": pick,
                                "best_error": err_best, "pick_vs_best": meas[pick] / meas[best_m] - 1,
                                "top8_identical": top8_same, "top8_overlap": top8_overlap}
    write_json(a.json, report)
    return report


if __name__ == "__main__":
    main()
