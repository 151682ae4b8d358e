"""``conduit tune rllib-dqn``: the cost model on RLlib's DQN itself, at synthetic observation
sizes (as the paper's Table 4): profile, predict every configuration, measure them all.

The environment is a gymnasium env with a D-feature float observation (random features,
CartPole's reward rule on two of them), so the transition size is the only thing that
changes across D. Configurations: placement {host, shm} x schedule {sequential, thread,
process} x delivery granularity {1, 2, 4, 8} x staleness {0, 32} (48). Each is measured
as the median iteration time of a few RLlib iterations after warm-up.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import time

import numpy as np

ENV = "conduit-synthetic-obs"


class SyntheticObsEnv:
    """A CartPole-like episode structure with a D-dimensional observation."""

    def __new__(cls, config=None):
        import gymnasium as gym

        class _Env(gym.Env):
            def __init__(self, cfg):
                self.d = int((cfg or {}).get("dims", 128))
                self.observation_space = gym.spaces.Box(-1.0, 1.0, (self.d,), np.float32)
                self.action_space = gym.spaces.Discrete(2)
                self.rng = np.random.default_rng(0)
                self.t = 0

            def reset(self, *, seed=None, options=None):
                if seed is not None:
                    self.rng = np.random.default_rng(seed)
                self.t = 0
                return self.rng.uniform(-0.05, 0.05, self.d).astype(np.float32), {}

            def step(self, action):
                self.t += 1
                obs = self.rng.uniform(-1, 1, self.d).astype(np.float32)
                done = self.t >= 50 or abs(float(obs[0]) + 0.1 * (action - 0.5)) > 0.98
                return obs, 1.0, done, False, {}
        return _Env(config)


def configs():
    return list(itertools.product(("host", "shm"), ("sequential", "thread", "process"), (1, 2, 4, 8), (0, 32)))


def build(dims: int, cfg_tuple, seed: int = 0):
    import conduit_rllib
    from ray.tune.registry import register_env

    from .workloads import dqn_cartpole
    register_env(ENV, lambda c: SyntheticObsEnv(c))
    placement, schedule, g_del, staleness = cfg_tuple
    cfg = dqn_cartpole(seed=seed)
    cfg.environment(ENV, env_config={"dims": dims})
    cfg.reporting(min_sample_timesteps_per_iteration=250)
    cfg.training(num_steps_sampled_before_learning_starts=200)
    conduit_rllib.enable(cfg, schedule="sequential" if schedule == "sequential" else "overlapped",
                         worker="process" if schedule == "process" else "thread", staleness=staleness,
                         delivery_granularity=g_del, tier={"host": "pageable", "shm": "shared"}[placement])
    return cfg.build_algo()


def measure(dims: int, cfg_tuple, iters: int) -> dict:
    algo = build(dims, cfg_tuple)
    try:
        algo.train()
        algo.train()  # learning has started
        ts = []
        for _ in range(iters):
            t0 = time.perf_counter()
            algo.train()
            ts.append(time.perf_counter() - t0)
        m = algo.local_replay_buffer.conduit_metrics()
        steps = max(1, m.deliver.calls)
        return {"iter_s": statistics.median(ts), "m": m, "steps": steps}
    finally:
        algo.stop()


def main(argv=None):
    import ray

    from conduit_core.costmodel import Config, Profile, fit_operator, predict
    p = argparse.ArgumentParser(prog="conduit tune rllib-dqn", description=__doc__.split("\n\n")[0])
    p.add_argument("--dims", type=int, nargs="+", default=[128, 256, 512, 1000, 2000])
    p.add_argument("--iters", type=int, default=2)
    p.add_argument("--json", default="out/tune_rllib.json")
    a = p.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if not ray.is_initialized():
        ray.init(num_cpus=2, object_store_memory=256 << 20, include_dashboard=False, log_to_driver=False)
    from benchmarks.common import fmt_table, write_json
    report = {}
    for dims in a.dims:
        meas = {}
        raw = {}
        for c in configs():
            r = measure(dims, c, a.iters)
            meas[c], raw[c] = r["iter_s"], r
        # profile from the sequential runs (as a short profiling phase would): operators and base
        seq = [c for c in configs() if c[0] == "host" and c[1] == "sequential" and c[3] == 0]
        ing, dlv, base = [], [], []
        for c in seq:
            m, steps = raw[c]["m"], raw[c]["steps"]
            ing.append((m.ingest.calls / steps, m.ingest.items_in / steps, 0.0, m.ingest.busy_s / steps))
            dlv.append((1.0 / c[2], 32, 0.0, m.deliver.busy_s / steps))
        m0 = raw[("host", "sequential", 1, 0)]["m"]
        steps0 = raw[("host", "sequential", 1, 0)]["steps"]
        exposed0 = m0.exposed_s / steps0
        iter0 = meas[("host", "sequential", 1, 0)]
        base_s = iter0 / steps0 - exposed0
        calib = {}
        prof0 = Profile(base_s=base_s, priorities_s=m0.priorities.blocked_s / steps0, ingest=fit_operator(ing),
                        deliver=fit_operator(dlv), rows_per_step=m0.ingest.items_in / steps0,
                        rollouts_per_step=m0.ingest.calls / steps0, batch_size=32, transition_bytes=8 * dims + 16)
        from conduit_core.costmodel import operator_times
        for kind in ("thread", "process"):
            c = ("host", kind, 1, 0)
            m, steps = raw[c]["m"], raw[c]["steps"]
            i_s, d_s = operator_times(Config("host", kind, 1, 1), prof0)
            handoff = max(0.0, (m.ingest.blocked_s + m.deliver.blocked_s) / steps)
            step = meas[c] / steps
            calib[kind] = (handoff, float(np.clip((step - base_s - handoff - prof0.priorities_s) / max(i_s + d_s, 1e-9), 0, 3)))
        preds = {}
        for c in configs():
            prof = Profile(**{**prof0.to_dict(), "ingest": prof0.ingest, "deliver": prof0.deliver, "staleness": c[3],
                              "thread_handoff_s": calib["thread"][0], "thread_interference": calib["thread"][1],
                              "process_handoff_s": calib["process"][0], "process_interference": calib["process"][1]})
            pr = predict(Config(c[0], c[1], 1, c[2]), prof, cores=os.cpu_count() or 2)
            preds[c] = pr.step_s * steps0  # per iteration (same number of training steps)
        order_m = sorted(meas, key=meas.get)
        order_p = sorted(preds, key=preds.get)
        best, pick = order_m[0], order_p[0]
        label = lambda c: f"{c[0]}/{c[1]}/del{c[2]}/st{c[3]}"
        rows = [[label(c), f"{preds[c]:.3f}", f"{meas[c]:.3f}", f"{(preds[c] - meas[c]) / meas[c]:+.0%}"] for c in order_m]
        print(f"\ndims {dims}: {len(meas)} configurations (iteration seconds), measured order")
        print(fmt_table(rows, ["config", "predicted s", "measured s", "error"]))
        err = abs(preds[best] - meas[best]) / meas[best]
        print(f"best {label(best)} predicted within {err:.1%}; auto-pick {label(pick)} is "
              f"{meas[pick] / meas[best] - 1:+.1%} from the best; top-8 overlap "
              f"{len(set(order_p[:8]) & set(order_m[:8]))}/8, identical order: {order_p[:8] == order_m[:8]}")
        report[dims] = {"measured": {label(c): v for c, v in meas.items()},
                        "predicted": {label(c): v for c, v in preds.items()}, "best": label(best),
                        "pick": label(pick), "best_error": err, "pick_vs_best": meas[pick] / meas[best] - 1}
        write_json(a.json, report)
    return report
