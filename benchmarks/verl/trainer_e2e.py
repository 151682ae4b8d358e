"""verl's own GRPO trainer on CPU, per stage: TransferQueue's SimpleStorage vs Conduit's backend.

Runs ``integrations/verl_cpu/run.py`` (tiny random Qwen2, 4 prompts x 2 samples, ``--steps`` iterations)
``--reps`` times per arm, arms alternating, and reports verl's own per-stage timings (``timing_s/*``:
gen, old_log_prob, adv, update_actor, update_weights, step) as medians over runs, for the iterations after
the first (the first carries start-up). The arms: ``simple`` (verl's default), ``conduit`` (the storage
backend), ``conduit+mode`` (the backend with ``trainer.v1.trainer_mode=conduit``). Rewards and losses are
checked equal across arms, iteration by iteration.

    python -m benchmarks.verl.trainer_e2e [--reps 3] [--steps 3] [--out out/verl_e2e.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from ..common import REPO, fmt_table, machine, write_json

ARMS = {"simple": [], "conduit": ["transfer_queue.backend.storage_backend=Conduit"],
        "conduit+mode": ["transfer_queue.backend.storage_backend=Conduit", "trainer.v1.trainer_mode=conduit"]}
STAGES = ("gen", "old_log_prob", "adv", "update_actor", "update_weights", "step")


def run_once(arm: str, steps: int, seed: int, workdir: Path) -> list[dict]:
    out = workdir / f"{arm}-{seed}-{os.getpid()}.jsonl"
    out.unlink(missing_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", RAY_AUTH_MODE="disabled", HF_HUB_OFFLINE="1")
    cmd = [sys.executable, str(REPO / "integrations" / "verl_cpu" / "run.py"), "--steps", str(steps), "--seed",
           str(seed), "--metrics-out", str(out), "--log", str(out.with_suffix(".log")), "--timeout", "600", *ARMS[arm]]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=700)
    if proc.returncode != 0:
        raise RuntimeError(f"{arm}: run.py exited {proc.returncode}: {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.verl.trainer_e2e", description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--out", default="out/verl_e2e.json")
    a = p.parse_args(argv)
    times: dict[str, dict[str, list[float]]] = {arm: {s: [] for s in STAGES} for arm in a.arms}
    curves: dict[str, list] = {}
    with tempfile.TemporaryDirectory(prefix="verl_e2e_") as tmp:
        for rep in range(a.reps):
            for arm in a.arms:
                rows = run_once(arm, a.steps, a.seed, Path(tmp))
                curve = [(r["step"], r["reward_mean"], r["actor_loss"], r["grad_norm"]) for r in rows]
                curves.setdefault(arm, curve)
                if curve != curves[arm] or curve != curves[a.arms[0]]:
                    raise AssertionError(f"{arm} rep {rep}: rewards/losses differ from the first run: {curve} "
                                         f"vs {curves[a.arms[0]]}")
                for r in rows[1:]:
                    for s in STAGES:
                        times[arm][s].append(r["timing_s"].get(s, float("nan")))
                print(f"  rep {rep} {arm:13s} step times {[round(r['timing_s']['step'], 3) for r in rows]}",
                      flush=True)
    med = {arm: {s: statistics.median(v) for s, v in st.items()} for arm, st in times.items()}
    base = a.arms[0]
    rows = [[s, *[f"{med[arm][s] * 1e3:.0f}" + ("" if arm == base else f" ({med[arm][s] / med[base][s]:.2f}x)")
                  for arm in a.arms]] for s in STAGES]
    print(f"\nverl GRPO on CPU, ms per iteration (iterations 2..{a.steps}, median over {a.reps} runs per arm); "
          f"(Nx) = arm / {base}; rewards and losses equal in every run")
    print(fmt_table(rows, ["stage", *a.arms]))
    write_json(a.out, {"machine": machine(), "args": vars(a), "median_s": med, "samples_s": times,
                       "curve": curves[base]})
    return med


if __name__ == "__main__":
    main()
