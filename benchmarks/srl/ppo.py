"""Real SRL PPO on CartPole, SRL's buffer vs Conduit's: the same experiment, the same wall time.

Each run is ``integrations/srl_cartpole/run.py`` (SRL's own launcher, 1 actor x 16 envs, 1 policy
worker, 1 MAPPO trainer, ``priority_queue`` buffer, CPU): ``--buffer srl`` leaves SRL's
``make_buffer`` alone, ``--buffer conduit`` calls ``conduit_srl.enable()``; both go through the same
timing proxy. For each seed both arms run ``--seconds`` each, one run at a time (the order alternates
per seed). Reported, median over seeds, and the conduit/srl ratio (of the medians; min/median/max of
the per-seed ratios):

- trained frames/s: samples (T x B) the trainer's buffer handed out per second after warm-up;
- exposed wait for data per trainer step: the training thread's time between an ``empty()`` that
  returned True (SRL then sleeps 5 ms) and its next poll, divided by the gets;
- return reached in the same wall time: mean of the last 20 finished episodes when the run is stopped.

SRL must be importable by ``--python`` (default ``$CONDUIT_SRL_PYTHON``, else this interpreter):
``scripts/srl/setup-srl-venv.sh SRC VENV``.

    PYTHONPATH=.:adapters /work/srl-venv/bin/python -m benchmarks.srl.ppo --seeds 3 --seconds 90 \\
        --json out/bench_srl_ppo.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

from ..common import REPO, fmt_table, machine, median, ratio_stats, write_json

ARMS = ("srl", "conduit")
# (summary key, label, format, higher is better)
METRICS = [
    ("trained_frames_per_s", "trained frames/s", "{:.0f}", True),
    ("exposed_wait_ms_per_step", "exposed wait ms/step", "{:.1f}", False),
    ("exposed_wait_fraction", "exposed wait fraction", "{:.3f}", False),
    ("return_last20", "return (last 20 eps)", "{:.1f}", True),
    ("get_ms_per_step", "get ms/step", "{:.3f}", False),
    ("put_ms_per_sample", "put ms/sample", "{:.3f}", False),
    ("episodes", "episodes", "{:.0f}", True),
]


def run_arm(python: str, arm: str, seed: int, a, out: str) -> dict:
    """One run of ``integrations.srl_cartpole.run`` in its own session; its summary."""
    cmd = [python, "-m", "integrations.srl_cartpole.run", "--buffer", arm, "--stream", a.stream,
           "--seconds", str(a.seconds), "--seed", str(seed), "--out", out, "--warmup", str(a.warmup),
           "--batch-size", str(a.batch_size), "--reuses", str(a.reuses), "--max-size", str(a.max_size),
           "--actors", str(a.actors), "--quiet"]
    if arm == "conduit" and a.consumer == "conduit":   # Conduit's consumer too: the trainer's whole data path
        cmd += ["--consumer", "conduit", "--g-ing", str(a.g_ing)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "adapters")] +
                                        ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, start_new_session=True)
    try:
        rc = proc.wait(timeout=a.seconds + 120)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        proc.send_signal(signal.SIGTERM)   # run.py kills SRL's process group on SIGTERM
        proc.wait(timeout=30)
        raise
    path = os.path.join(out, "summary.json")
    if rc != 0 or not os.path.exists(path):
        raise RuntimeError(f"{arm} seed {seed}: run.py exited {rc}; see {out}/srl.log")
    with open(path) as fh:
        return json.load(fh)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.srl.ppo", description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=3, help="seeds FIRST..FIRST+N-1, both arms each")
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--seconds", type=float, default=90.0, help="wall time of each run")
    p.add_argument("--stream", choices=["shm", "zmq"], default="shm")
    p.add_argument("--warmup", type=float, default=10.0)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--reuses", type=int, default=1)
    p.add_argument("--max-size", type=int, default=32)
    p.add_argument("--actors", type=int, default=1)
    p.add_argument("--consumer", choices=["srl", "conduit"], default="srl",
                   help="the conduit arm's end of the sample stream: SRL's consumer or Conduit's (at --g-ing)")
    p.add_argument("--g-ing", type=int, default=16, help="Conduit's consumer: samples per buffer call")
    p.add_argument("--python", default=os.environ.get("CONDUIT_SRL_PYTHON") or sys.executable,
                   help="a python where rlsrl imports (SRL's venv)")
    p.add_argument("--out", default="out/bench_srl_ppo", help="one folder per run under it")
    p.add_argument("--json", default="out/bench_srl_ppo.json")
    a = p.parse_args(argv)

    runs: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    t0 = time.time()
    for seed in range(a.first_seed, a.first_seed + a.seeds):
        order = ARMS if seed % 2 == 0 else ARMS[::-1]
        for arm in order:
            out = os.path.abspath(os.path.join(a.out, f"{arm}-{a.stream}-s{seed}"))
            s = run_arm(a.python, arm, seed, a, out)
            runs[arm].append(s)
            print(f"seed {seed} {arm:7s}: {s.get('trained_frames_per_s', float('nan')):7.0f} frames/s  "
                  f"wait {s.get('exposed_wait_ms_per_step', float('nan')):7.1f} ms/step  "
                  f"return {s.get('return_last20') or float('nan'):6.1f}  ({s['episodes']} episodes)", flush=True)

    rows, table = [], {}
    for key, label, fmt, higher in METRICS:
        vals = {arm: [r.get(key) for r in runs[arm]] for arm in ARMS}
        if any(v is None for arm in ARMS for v in vals[arm]):
            rows.append([label, "-", "-", "-", "-"])
            table[key] = {"values": vals}
            continue
        med = {arm: median(vals[arm]) for arm in ARMS}
        ratio = med["conduit"] / med["srl"] if med["srl"] else float("nan")
        paired = ratio_stats(vals["conduit"], vals["srl"]) if all(vals["srl"]) else None
        table[key] = {"values": vals, "median": med, "ratio_of_medians": ratio, "paired_ratio": paired,
                      "higher_is_better": higher}
        rows.append([label, fmt.format(med["srl"]), fmt.format(med["conduit"]), f"{ratio:.3f}",
                     "-" if paired is None else f"{paired['min']:.2f}/{paired['median']:.2f}/{paired['max']:.2f}"])
    print(f"\nSRL PPO CartPole, {a.stream} streams, {a.seconds:.0f} s per run, medians over {a.seeds} seeds "
          f"(ratio conduit/srl; per-seed ratios min/median/max):")
    print(fmt_table(rows, ["metric", "srl", "conduit", "ratio", "per-seed"]))
    payload = {"machine": machine(), "args": vars(a), "wall_s": time.time() - t0, "metrics": table, "runs": runs}
    write_json(a.json, payload)
    print(f"\nwrote {a.json}")
    return payload


if __name__ == "__main__":
    main()
