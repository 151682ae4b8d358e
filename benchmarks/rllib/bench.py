"""``conduit bench rllib-dqn | rllib-dqn-mountaincar | rllib-ppo | rllib-sac | rllib-sac-metaworld |
rllib-dqn-atari``: unmodified RLlib vs RLlib with Conduit, same config and seeds, alternating
blocks of iterations in one run.

Per workload it prints the exposed experience-path latency per training step (see
``timing.py``: the same wrappers around both), the end-to-end iteration time, their
ratios (min/median/max over paired blocks) and the episode returns; writes a JSON
report and a PNG of the latency breakdown per control point.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from ..buffer.replay_rss import measure
from .timing import PathTimer

SYSTEMS = ("rllib", "conduit")


def _init_ray() -> None:
    import ray
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if not ray.is_initialized():
        from conduit_core.remote.ray_local import init_local
        init_local(num_cpus=max(2, os.cpu_count() or 2), object_store_memory=256 << 20, log_to_driver=False,
                   configure_logging=False)


def _build(workload: str, system: str, args) -> object:
    import conduit_rllib
    from conduit_rllib import workloads
    if workload == "dqn":
        cfg = workloads.dqn_cartpole(seed=args.seed)
    elif workload == "ppo":
        cfg = workloads.ppo_cartpole(seed=args.seed)
    elif workload == "dqn-mountaincar":
        cfg = workloads.dqn_mountaincar(seed=args.seed)
    elif workload == "sac":
        cfg = workloads.sac_pendulum(seed=args.seed)
    elif workload == "sac-metaworld":
        cfg = workloads.sac_metaworld(task=args.task, seed=args.seed)
    elif workload == "ppo-multi-agent":
        cfg = workloads.ppo_multi_agent_cartpole(seed=args.seed, num_agents=2, shared=False)
    elif workload == "dqn-atari":
        from conduit_rllib.atari import dqn_atari
        cfg = dqn_atari(seed=args.seed, game=args.game, learning_starts=args.atari_learning_starts,
                        iteration_steps=args.atari_iteration_steps)
    else:  # pragma: no cover
        raise ValueError(workload)
    if system == "conduit":
        conduit_rllib.enable(cfg, mode=args.mode, worker=args.worker, staleness=args.staleness)
    algo = cfg.build_algo()
    timer = PathTimer()
    timer.instrument(algo)
    algo._conduit_bench_timer = timer  # type: ignore[attr-defined]
    return algo


def _ratio(a: list[float], b: list[float]) -> dict:
    r = [x / y for x, y in zip(a, b) if y > 0]
    return {"min": min(r), "median": statistics.median(r), "max": max(r)} if r else {}


def iteration_floor(rec: dict, block_iters: int) -> dict:
    """Per block, the iteration ratio Conduit's arm would have had if its whole exposed path had
    cost nothing: (its iteration minus its exposed time per iteration) / RLlib's iteration. What
    is left is RLlib's env runner, learner and metrics (the same code in both arms) and the
    machine's spread: no data plane gets below this in that block."""
    c, r = rec["conduit"], rec["rllib"]
    rest = [it - ms * steps / 1e3 / max(block_iters, 1)
            for it, ms, steps in zip(c["iter_s"], c["exposed_ms"], c["steps"])]
    return _ratio(rest, r["iter_s"])


def run(workload: str, argv: list[str] | None) -> dict:
    p = argparse.ArgumentParser(prog=f"conduit bench rllib-{workload}", description=__doc__.split("\n\n")[0])
    p.add_argument("--blocks", type=int, default=5, help="alternating blocks per system (paired for ratios)")
    p.add_argument("--block-iters", type=int, default=1, help="training iterations per block")
    p.add_argument("--warmup", type=int, default=2, help="iterations per system before measuring")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mode", default="sequential", choices=["sequential", "overlapped"])
    p.add_argument("--worker", default="thread", choices=["thread", "process"])
    p.add_argument("--staleness", type=int, default=0)
    p.add_argument("--game", default="ale_py:ALE/Qbert-v5", help="Atari game (dqn-atari)")
    p.add_argument("--task", default="reach-v3", help="Meta-World task (sac-metaworld)")
    p.add_argument("--atari-learning-starts", type=int, default=500)
    p.add_argument("--atari-iteration-steps", type=int, default=100,
                   help="env steps per iteration (dqn-atari; ~25 training steps of ~0.6 s each on CPU)")
    p.add_argument("--out", default=f"out/bench_rllib_{workload}")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--rss-fill", type=int, default=None,
                   help="transitions each replay buffer is filled with, in a fresh process, for the replay memory "
                        "by RSS (default: the bench's capacity, at most 20,000 for Atari; 0: skip)")
    a = p.parse_args(argv)
    if a.rss_fill is not None and a.rss_fill != 0 and a.rss_fill < 200:
        p.error(f"--rss-fill: expected 0 (skip) or at least 200 transitions (one episode of the fill), "
                f"got {a.rss_fill}")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    _init_ray()
    from tqdm import tqdm
    algos = {s: _build(workload, s, a) for s in SYSTEMS}
    total = len(SYSTEMS) * (a.warmup + a.blocks * a.block_iters)
    bar = tqdm(total=total, desc=f"rllib-{workload}", disable=a.no_progress, file=sys.stderr)
    rec = {s: {"iter_s": [], "exposed_ms": [], "breakdown": [], "returns": [], "steps": []} for s in SYSTEMS}
    for s, algo in algos.items():
        for _ in range(a.warmup):
            algo.train()
            bar.update(1)
    fill = {"before_blocks": {s: replay_fill(algo) for s, algo in algos.items()}}
    for block in range(a.blocks):
        order = SYSTEMS if block % 2 == 0 else SYSTEMS[::-1]  # alternate who goes first
        for s in order:
            algo = algos[s]
            timer: PathTimer = algo._conduit_bench_timer
            timer.reset()
            t0 = time.perf_counter()
            ret = None
            for _ in range(a.block_iters):
                r = algo.train()
                ret = r.get("env_runners", {}).get("episode_return_mean", ret)
                bar.update(1)
            dt = (time.perf_counter() - t0) / a.block_iters
            br = timer.per_step_ms()
            rec[s]["iter_s"].append(dt)
            rec[s]["exposed_ms"].append(br.get("exposed", 0.0))
            rec[s]["breakdown"].append(br)
            rec[s]["returns"].append(ret)
            rec[s]["steps"].append(timer.steps)
    bar.close()
    memory = {s: buffer_bytes_per_transition(algo) for s, algo in algos.items()}
    fill["after_blocks"] = {s: replay_fill(algo) for s, algo in algos.items()}
    capacity = algos["rllib"].config.replay_buffer_config.get("capacity") if workload in RSS_KIND else None
    for algo in algos.values():
        algo.stop()
    rss = replay_rss(workload, capacity, a.rss_fill)
    report = {
        "workload": f"rllib-{workload}", "args": vars(a), "systems": rec,
        "exposed_ratio": _ratio(rec["conduit"]["exposed_ms"], rec["rllib"]["exposed_ms"]),
        "iteration_ratio": _ratio(rec["conduit"]["iter_s"], rec["rllib"]["iter_s"]),
        "iteration_floor": iteration_floor(rec, a.block_iters),
        "versions": _versions(), "buffer_bytes_per_transition": memory, "replay_rss": rss, "replay_fill": fill,
    }
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "report.json"), "w") as fh:
        json.dump(report, fh, indent=2, default=float)
    png = _plot(report, os.path.join(a.out, "latency_breakdown.png"))
    print(render(report))
    print(f"\nreport: {os.path.join(a.out, 'report.json')}" + (f"\nplot:   {png}" if png else ""))
    return report


# the replay memory by RSS: buffer.replay_rss's workload for each bench, and its largest fill
RSS_KIND = {"dqn": "cartpole", "dqn-atari": "atari"}
RSS_FILL_LIMIT = {"cartpole": 1_000_000, "atari": 20_000}   # Atari: RLlib's float32 stacks take 115 KB each


def replay_rss(workload: str, capacity: int | None, fill: int | None) -> dict | None:
    """Replay memory per transition by resident memory (``buffer.replay_rss``): each buffer of the
    bench's kind filled with ``fill`` transitions (default: the bench's capacity, up to
    ``RSS_FILL_LIMIT``) in a fresh process, the same episodes for both. What a user's process
    holds: RLlib's episode objects and trees, Conduit's columns, metadata, trees and frame pool.
    None for a workload without replay, or ``fill`` 0."""
    kind = RSS_KIND.get(workload)
    if kind is None or fill == 0 or (fill is None and not capacity):
        return None
    n = fill if fill is not None else min(int(capacity), RSS_FILL_LIMIT[kind])
    try:
        return {"kind": kind, **measure(kind, n)}
    except Exception as exc:   # (a timeout): the run's timings are still written and printed
        return {"kind": kind, "n": n, "error": f"{type(exc).__name__}: {exc}"}


def replay_fill(algo) -> dict | None:
    """{"stored": transitions in the replay buffer, "capacity": its capacity}: whether the blocks
    ran on a full ring (a short run measures a partly filled one; ``--warmup`` fills it first)."""
    buf = getattr(algo, "local_replay_buffer", None)
    if buf is None:
        return None
    return {"stored": int(buf.get_num_timesteps()), "capacity": int(algo.config.replay_buffer_config["capacity"])}


def buffer_bytes_per_transition(algo) -> float | None:
    """Replay memory per stored transition as the arrays count it (kept in the report; the
    printed figure is ``replay_rss``'s): RLlib's episodes' observation, action and reward arrays
    only (not its Python objects or priority trees) or Conduit's columns, metadata and frame
    pool per slot of its ring, reserved whether filled or not. Not comparable with each other."""
    buf = getattr(algo, "local_replay_buffer", None)
    if buf is None:
        return None
    if hasattr(buf, "edp"):
        if buf.edp is None:
            return None
        b = buf.edp.buffer
        meta = sum(a.itemsize for a in b.meta.values())
        return (b.storage.pool_bytes() + b.capacity * (b.spec.stored_bytes_per_transition + meta)) / b.capacity
    steps = buf.get_num_timesteps()
    if not steps:
        return None
    total = 0
    for ep in buf.episodes:
        for name in ("observations", "actions", "rewards"):
            data = getattr(getattr(ep, name), "data", None)
            total += getattr(data, "nbytes", 0)
    return total / steps


def _versions() -> dict:
    import ray
    import torch

    import conduit_core
    return {"conduit": conduit_core.__version__, "ray": ray.__version__, "torch": torch.__version__}


def _median_breakdown(rows: list[dict]) -> dict:
    keys = sorted({k for r in rows for k in r})
    return {k: statistics.median([r.get(k, 0.0) for r in rows]) for k in keys}


def render(report: dict) -> str:
    rec = report["systems"]
    lines = [f"{report['workload']}: {len(rec['rllib']['iter_s'])} paired blocks, medians "
             f"(mode={report['args'].get('mode', report['args'].get('schedule'))})"]
    for s in SYSTEMS:
        br = _median_breakdown(rec[s]["breakdown"])
        parts = ", ".join(f"{k} {v:.3f}" for k, v in br.items() if k != "exposed")
        lines.append(f"  {s:8s} exposed {statistics.median(rec[s]['exposed_ms']):7.3f} ms/step ({parts})  "
                     f"iteration {statistics.median(rec[s]['iter_s']):6.2f} s")
    rss = report.get("replay_rss") or {}
    if "ratio" in rss:
        fmt = lambda b: f"{b / 1e3:.1f} KB" if b >= 1000 else f"{b:.0f} B"
        per = lambda arm: fmt(rss[arm]["bytes_per_transition"])
        lines.append(f"  replay memory per transition by RSS: rllib {per('rllib')}, conduit {per('conduit')} "
                     f"-> {rss['ratio']:.3f}x (each buffer filled with {rss['n']:,} transitions in a fresh "
                     "process: conduit bench replay-rss)")
    elif rss:
        why = rss.get("error") or rss.get("rllib", {}).get("error") or rss.get("conduit", {}).get("error") \
            or "no error recorded"
        lines.append(f"  replay memory by RSS: failed ({why})")
    before = (report.get("replay_fill") or {}).get("before_blocks") or {}
    if all(before.get(s) for s in SYSTEMS):
        share = {s: before[s]["stored"] / max(before[s]["capacity"], 1) for s in SYSTEMS}
        lines.append("  replay fill when the blocks began (stored / capacity): " + ", ".join(
            f"{s} {before[s]['stored']:,} / {before[s]['capacity']:,} ({share[s]:.0%})" for s in SYSTEMS)
            + ("" if min(share.values()) >= 0.95   # (whole episodes leave: a full buffer holds a little less)
               else "; a partly filled ring: --warmup N fills it first"))
    e, it = report["exposed_ratio"], report["iteration_ratio"]
    if e:
        lines.append(f"  exposed experience-path latency, conduit/rllib: {e['median']:.3f}x "
                     f"(min {e['min']:.3f}, max {e['max']:.3f})")
    if it:
        lines.append(f"  end-to-end iteration time,      conduit/rllib: {it['median']:.3f}x "
                     f"(min {it['min']:.3f}, max {it['max']:.3f})")
    fl = report.get("iteration_floor")
    if fl:
        lines.append(f"    with Conduit's exposed path at zero:   {fl['median']:.3f}x "
                     f"(min {fl['min']:.3f}, max {fl['max']:.3f}): no data plane's iteration ratio is lower")
    # One seed's return after a few iterations says nothing about learning speed (seed to
    # seed it varies more than any data-plane effect): learning is compared over seeds, both
    # directions, by the convergence check.
    goal, check = LEARNING.get(report["workload"], ("return 150", "convergence/*"))
    lines.append(f"  learning (steps to {goal} over seeds, both directions): CONDUIT_CONVERGENCE_SEEDS=0,1,2,3,4 "
                 f"conduit conformance rllib --level convergence -k '{check}'")
    if report["workload"] in NOT_LEARNED_HERE:
        lines.append(f"    (on {NOT_LEARNED_HERE[report['workload']]})")
    return "\n".join(lines)


#: what the convergence check asks of each bench's workload, and its check's id
LEARNING = {"rllib-sac": ("return -250", "convergence/sac_pendulum"),
            "rllib-sac-metaworld": ("return -250", "convergence/sac_pendulum"),
            "rllib-dqn": ("return 150", "convergence/dqn_cartpole"),
            "rllib-dqn-mountaincar": ("return 150", "convergence/dqn_cartpole"),
            "rllib-ppo": ("return 150", "convergence/ppo_cartpole")}


#: benches whose learning check runs on another task (learning a Meta-World task takes far more steps)
NOT_LEARNED_HERE = {"rllib-dqn-mountaincar": "CartPole: the same DQN and replay path (MountainCar's sparse reward "
                                             "needs far more steps than a check over seeds can run here)",
                    "rllib-sac-metaworld": "Pendulum: the same SAC and replay path; Meta-World is checked "
                                           "exactly, batch for batch (tests/rllib/test_sac_adapter.py)"}


def _plot(report: dict, path: str) -> str | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    cats = ["ingestion", "delivery", "priorities", "metrics"]
    fig, ax = plt.subplots(figsize=(6, 4))
    bottoms = [0.0, 0.0]
    for c in cats:
        vals = [_median_breakdown(report["systems"][s]["breakdown"]).get(c, 0.0) for s in SYSTEMS]
        ax.bar(SYSTEMS, vals, bottom=bottoms, label=c)
        bottoms = [b + v for b, v in zip(bottoms, vals)]
    ax.set_ylabel("ms per training step (median)")
    ax.set_title(f"{report['workload']}: exposed experience-path latency")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main_dqn(argv=None):
    return run("dqn", argv)


def main_dqn_mountaincar(argv=None):
    return run("dqn-mountaincar", argv)


def main_sac(argv=None):
    return run("sac", argv)


def main_sac_metaworld(argv=None):
    return run("sac-metaworld", argv)


def main_ppo(argv=None):
    return run("ppo", argv)


def main_ppo_multi_agent(argv=None):
    return run("ppo-multi-agent", argv)


def main_dqn_atari(argv=None):
    return run("dqn-atari", argv)
