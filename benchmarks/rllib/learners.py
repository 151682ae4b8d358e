"""``conduit bench rllib-learners``: RLlib's tuned DQN CartPole with ``num_learners`` 0, 1 and 2,
each unmodified and with Conduit (``conduit_rllib.enable``), as Conduit/RLlib ratios in one run.

Per num_learners both arms are built from the same config and seed (``bench._build``'s
recipe), warmed up, then run in alternating paired blocks (who goes first alternates). Per arm:
iteration time, env steps trained per second, and the exposed experience-path time per training
step (``timing.PathTimer``: ingestion/delivery/priorities/metrics). With num_learners >= 1
the learners are separate Ray actor processes: the buffer calls are still timed on the driver,
and the learner connector (the delivery's batch -> tensors half) is timed inside each learner
process with the same kind of wrapper; since the driver blocks on all learners' update, the
slowest learner's connector time counts as exposed. num_learners values run one after another
(both arms of one value alive at a time), so learner processes of different values never overlap.

    python -m benchmarks.rllib.learners --blocks 3 --json docs/results/rllib-learners/DATE.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from .bench import SYSTEMS, _init_ray, _ratio, _versions
from .timing import PathTimer

TRAINED_KEYS = ("num_env_steps_trained_lifetime", "num_module_steps_trained_lifetime")


def build(system: str, num_learners: int, a) -> object:
    """The tuned DQN CartPole, as ``bench._build`` makes it, with ``num_learners`` set
    before ``conduit_rllib.enable`` (the adapter splits the delivered batch per learner)."""
    import conduit_rllib
    from conduit_rllib import workloads
    cfg = workloads.dqn_cartpole(seed=a.seed)
    if num_learners:
        cfg.learners(num_learners=num_learners, num_cpus_per_learner=a.cpus_per_learner, num_gpus_per_learner=0)
    if a.iteration_steps:
        cfg.reporting(min_sample_timesteps_per_iteration=a.iteration_steps)
    if system == "conduit":
        conduit_rllib.enable(cfg, mode=a.mode, worker=a.worker, staleness=a.staleness)
    algo = cfg.build_algo()
    timer = PathTimer()
    if num_learners == 0:
        timer.instrument(algo)  # buffer methods + the local learner's batch building
    else:
        buf = algo.local_replay_buffer
        for name in ("add", "sample", "update_priorities", "get_metrics"):
            setattr(buf, name, timer.timed(name, getattr(buf, name)))
        algo.learner_group.foreach_learner(_instrument_learner)
    algo._conduit_bench_timer = timer  # type: ignore[attr-defined]
    return algo


def _instrument_learner(learner) -> None:
    """Runs inside a learner process: PathTimer's wrapper of the learner's whole batch building
    (``_create_iterator_if_necessary``: the connector, RLlib's batch wrapping, the iterator), kept
    there (defined here, so Ray ships it by value and the learner needs no import of this module)."""
    import time as _t
    stats = {"seconds": 0.0, "calls": 0}

    class Timed:
        def __init__(self, inner):
            self._inner = inner

        def __call__(self, *args, **kwargs):
            t0 = _t.perf_counter()
            try:
                return self._inner(*args, **kwargs)
            finally:
                stats["seconds"] += _t.perf_counter() - t0
                stats["calls"] += 1

        def __getattr__(self, item):
            return getattr(self._inner, item)
    learner._create_iterator_if_necessary = Timed(learner._create_iterator_if_necessary)
    learner._conduit_bench_stats = stats


def _learner_stats(algo, reset: bool) -> list[dict]:
    def read(learner, reset=False):
        s = getattr(learner, "_conduit_bench_stats", None)
        if s is None:
            return None
        out = dict(s)
        if reset:
            s["seconds"], s["calls"] = 0.0, 0
        return out
    return [r.get() for r in algo.learner_group.foreach_learner(read, reset=reset) if r.get() is not None]


def _trained(result: dict) -> float | None:
    allm = result.get("learners", {}).get("__all_modules__", {})
    for k in TRAINED_KEYS:
        if k in allm:
            return float(allm[k])
    return None


def run_block(algo, num_learners: int, iters: int) -> dict:
    timer: PathTimer = algo._conduit_bench_timer
    timer.reset()
    if num_learners:
        _learner_stats(algo, reset=True)
    t0 = time.perf_counter()
    ret, first, last = None, None, None
    for _ in range(iters):
        r = algo.train()
        ret = r.get("env_runners", {}).get("episode_return_mean", ret)
        last = _trained(r)
        first = last if first is None else first
    dt = time.perf_counter() - t0
    br = timer.per_step_ms()
    steps = max(1, timer.steps)
    if num_learners:
        per = _learner_stats(algo, reset=False)
        conn = max((s["seconds"] for s in per), default=0.0) / steps * 1e3
        br["delivery"] = br.get("delivery", 0.0) + conn
        br["learner_batch_max"] = conn
        br["exposed"] = sum(v for k, v in br.items() if k in ("ingestion", "delivery", "priorities", "metrics"))
    return {"iter_s": dt / iters, "breakdown": br, "exposed_ms": br.get("exposed", 0.0), "returns": ret,
            "steps": timer.steps, "trained_lifetime": last, "_t": dt}


def run(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="conduit bench rllib-learners", description=__doc__.split("\n\n")[0])
    p.add_argument("--learners", default="0,1,2", help="num_learners values, comma separated")
    p.add_argument("--blocks", type=int, default=3, help="alternating blocks per arm (paired for ratios)")
    p.add_argument("--block-iters", type=int, default=1, help="training iterations per block")
    p.add_argument("--warmup", type=int, default=2, help="iterations per arm before measuring")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cpus-per-learner", type=float, default=0.5,
                   help="num_cpus_per_learner for num_learners >= 1 (both arms alive: 2 x 2 x 0.5 = 2 CPUs)")
    p.add_argument("--iteration-steps", type=int, default=0,
                   help="min_sample_timesteps_per_iteration for both arms (0: the workload's 1000)")
    p.add_argument("--mode", default="sequential", choices=["sequential", "overlapped"])
    p.add_argument("--worker", default="thread", choices=["thread", "process"])
    p.add_argument("--staleness", type=int, default=0)
    p.add_argument("--json", default="out/bench_rllib_learners.json", help="where the JSON report goes")
    p.add_argument("--no-progress", action="store_true")
    a = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    _init_ray()
    import ray
    from tqdm import tqdm
    values = [int(x) for x in a.learners.split(",")]
    per_value = len(SYSTEMS) * (a.warmup + a.blocks * a.block_iters)
    bar = tqdm(total=per_value * len(values), desc="rllib-learners", disable=a.no_progress, file=sys.stderr)
    results = {}
    t_all = time.perf_counter()
    for nl in values:
        algos = {s: build(s, nl, a) for s in SYSTEMS}
        rec = {s: {"iter_s": [], "env_steps_trained_per_s": [], "exposed_ms": [], "breakdown": [], "returns": [],
                   "steps": []} for s in SYSTEMS}
        prev = {}
        for s, algo in algos.items():
            for _ in range(a.warmup):
                prev[s] = _trained(algo.train())
                bar.update(1)
        for block in range(a.blocks):
            for s in (SYSTEMS if block % 2 == 0 else SYSTEMS[::-1]):
                b = run_block(algos[s], nl, a.block_iters)
                bar.update(a.block_iters)
                trained = (b["trained_lifetime"] - prev[s]) if None not in (b["trained_lifetime"], prev[s]) else None
                prev[s] = b["trained_lifetime"]
                for k in ("iter_s", "exposed_ms", "breakdown", "returns", "steps"):
                    rec[s][k].append(b[k])
                rec[s]["env_steps_trained_per_s"].append(trained / b["_t"] if trained is not None else None)
        for algo in algos.values():
            algo.stop()
        tput = {s: [x or 0.0 for x in rec[s]["env_steps_trained_per_s"]] for s in SYSTEMS}
        results[str(nl)] = {
            "systems": rec,
            "iteration_ratio": _ratio(rec["conduit"]["iter_s"], rec["rllib"]["iter_s"]),
            "throughput_ratio": _ratio(tput["conduit"], tput["rllib"]),
            "exposed_ratio": _ratio(rec["conduit"]["exposed_ms"], rec["rllib"]["exposed_ms"]),
        }
    bar.close()
    report = {"workload": "rllib-learners", "args": vars(a), "num_learners": results, "cpus": os.cpu_count(),
              "ray_cpus": ray.cluster_resources().get("CPU"), "wall_s": time.perf_counter() - t_all,
              "versions": _versions(), "notes": notes(a)}
    ray.shutdown()
    if a.json:
        os.makedirs(os.path.dirname(a.json) or ".", exist_ok=True)
        with open(a.json, "w") as fh:
            json.dump(report, fh, indent=2, default=float)
    print(render(report))
    if a.json:
        print(f"\nreport: {a.json}")
    return report


def notes(a) -> list[str]:
    n = os.cpu_count() or 0
    return [
        f"this machine has {n} CPU core(s); with num_learners >= 1 each learner is its own process "
        f"(num_cpus_per_learner={a.cpus_per_learner}, a Ray reservation, not a pin), so num_learners=2 runs "
        "2 learner processes of the measured arm, the idle arm's 2 and the driver (env sampling, buffer) "
        + ("on fewer cores than processes: they contend for CPU, and the figures with learners measure "
           "that contention as much as the data path" if n < 4 else "on the same cores"),
        "neither arm is tuned: same config, seed and iteration size; only conduit_rllib.enable differs",
        "exposed (num_learners >= 1): driver-side buffer calls plus the slowest learner's connector time "
        "per training step (the driver blocks on all learners' update); num_learners=0 is rllib.bench's "
        "measure (local learner connector)",
        "env steps trained/s: learners' num_env_steps_trained_lifetime over the block, per wall second",
        "ratios are conduit/rllib over paired blocks (min, median, max); < 1 means Conduit is faster for "
        "iteration time and exposed time, > 1 means Conduit is faster for throughput",
    ]


def render(report: dict) -> str:
    med = statistics.median
    rows = report["num_learners"]
    n_blocks = len(next(iter(rows.values()))["systems"]["rllib"]["iter_s"]) if rows else 0
    lines = [f"rllib-learners: DQN CartPole, {n_blocks} paired blocks per num_learners, medians "
             f"(wall {report['wall_s']:.0f} s)",
             f"  {'learners':>8s} {'arm':8s} {'iter s':>8s} {'trained/s':>10s} {'exposed ms/step':>16s}"]
    for nl, r in rows.items():
        for s in SYSTEMS:
            rec = r["systems"][s]
            tp = [x for x in rec["env_steps_trained_per_s"] if x is not None]
            lines.append(f"  {nl:>8s} {s:8s} {med(rec['iter_s']):8.2f} {med(tp) if tp else float('nan'):10.1f} "
                         f"{med(rec['exposed_ms']):16.3f}")
    lines.append("  conduit/rllib ratios, median (min..max) over paired blocks:")
    lines.append(f"  {'learners':>8s} {'iteration time':>24s} {'env steps trained/s':>24s} {'exposed path':>24s}")
    fmt = lambda d: f"{d['median']:.3f} ({d['min']:.3f}..{d['max']:.3f})" if d else "n/a"
    for nl, r in rows.items():
        lines.append(f"  {nl:>8s} {fmt(r['iteration_ratio']):>24s} {fmt(r['throughput_ratio']):>24s} "
                     f"{fmt(r['exposed_ratio']):>24s}")
    lines += [f"  note: {x}" for x in report.get("notes", [])]
    return "\n".join(lines)


def main(argv=None):
    run(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
