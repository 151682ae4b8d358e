"""Run verl's own GRPO trainer end to end on CPU: one command.

    .venv/bin/python integrations/verl_cpu/run.py --steps 2 --seed 0 --metrics-out out/verl_cpu.jsonl \
        [hydra overrides, e.g. trainer.use_v1=False  transfer_queue.backend.storage_backend=<name>]

1. builds the tiny model, tokenizer and parquet dataset in a temporary run folder (assets.py);
2. launches `python -m verl.trainer.main_ppo` (verl unmodified) with the environment and overrides of
   overrides.py, then the extra overrides from this command line (later ones win in Hydra);
3. reads verl's own per-step metrics (its "file" logger) and writes one JSON line per iteration
   (reward mean, actor loss, grad norm, timing per stage) to --metrics-out.
Exit status is verl's. The run folder is deleted unless --keep or --workdir is given.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from integrations.verl_cpu import assets as assets_mod  # noqa: E402
from integrations.verl_cpu import metrics, overrides  # noqa: E402


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2, help="training iterations (default 2)")
    parser.add_argument("--seed", type=int, default=0, help="model init, data order and rollout sampling seed")
    parser.add_argument("--metrics-out", default=None, help="JSON lines, one per iteration")
    parser.add_argument("--workdir", default=None, help="run folder to use and keep (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary run folder")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds before the run is killed")
    parser.add_argument("--log", default=None, help="file for verl's stdout/stderr (default: inherit)")
    parser.add_argument("--trainer", default="main_ppo", choices=sorted(overrides.TRAINER_MODULES),
                        help="verl's synchronous trainer (main_ppo) or one of its disaggregated ones")
    parser.add_argument("--staleness", type=int, default=0, help="fully_async: async_training.staleness_threshold")
    parser.add_argument("--trigger", type=int, default=1, help="fully_async: trigger_parameter_sync_step")
    parser.add_argument("--queue", default="verl", choices=("verl", "conduit"),
                        help="fully_async: verl's MessageQueue or Conduit's (conduit_verl.async_queue)")
    parser.add_argument("--advantage-stage", default="verl", choices=("verl", "conduit"),
                        help="one_step_off: verl's trainer or Conduit's (separated.ConduitOneStepOffTrainer)")
    parser.add_argument("--trained-trace", default=None,
                        help="fully_async: JSON lines, what each training step took (trained_trace.py)")
    parser.add_argument("--generation-trace", default=None,
                        help="JSON lines, every response the rollout generated (hf_rollout.py), any trainer")
    return parser.parse_known_args(argv)


def _command(run_assets: assets_mod.Assets, args: argparse.Namespace, run_dir: str, extra: list[str]) -> list[str]:
    base = overrides.hydra_overrides(run_assets, run_dir=run_dir, seed=args.seed, steps=args.steps)
    base += overrides.async_overrides(args.trainer, steps=args.steps, staleness=args.staleness, trigger=args.trigger)
    return [sys.executable, "-m", overrides.TRAINER_MODULES[args.trainer], *base, *extra]


def _environment(run_dir: str, args: argparse.Namespace | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)  # always a fresh local cluster, never a shared one
    env.update(overrides.environment())
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, env.get("PYTHONPATH", "")) if p)
    env["VERL_FILE_LOGGER_PATH"] = os.path.join(run_dir, "verl_metrics.jsonl")
    if args is not None:
        env["CONDUIT_VERL_MESSAGE_QUEUE"] = args.queue
        env["CONDUIT_VERL_ONE_STEP_OFF"] = args.advantage_stage
        if args.trained_trace:
            env["VERL_CPU_TRAINED_TRACE"] = os.path.abspath(args.trained_trace)
        if args.generation_trace:
            env["VERL_CPU_GENERATION_TRACE"] = os.path.abspath(args.generation_trace)
    return env


def run(argv: list[str] | None = None) -> int:
    args, extra = parse_args(argv)
    run_dir = os.path.abspath(args.workdir) if args.workdir else tempfile.mkdtemp(prefix="verl_cpu_")
    os.makedirs(run_dir, exist_ok=True)
    try:
        run_assets = assets_mod.build(os.path.join(run_dir, "assets"), seed=args.seed)
        cmd = _command(run_assets, args, run_dir, extra)
        env = _environment(run_dir, args)
        log = open(args.log, "w") if args.log else None
        start = time.monotonic()
        # Own process group: on timeout everything verl started (Ray included) is stopped with it.
        proc = subprocess.Popen(cmd, cwd=run_dir, env=env, stdout=log, stderr=subprocess.STDOUT if log else None,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
            rc = 124
        wall = time.monotonic() - start
        if log:
            log.close()
        rows = []
        if os.path.exists(env["VERL_FILE_LOGGER_PATH"]):
            rows = metrics.summarize(metrics.read_steps(env["VERL_FILE_LOGGER_PATH"]))
        for row in rows:
            row["seed"] = args.seed
        if args.metrics_out:
            os.makedirs(os.path.dirname(os.path.abspath(args.metrics_out)), exist_ok=True)
            metrics.write_jsonl(rows, args.metrics_out)
        for row in rows:
            print(f"[verl_cpu] step {row['step']}: reward_mean={row['reward_mean']} "
                  f"actor_loss={row['actor_loss']} grad_norm={row['grad_norm']}")
        print(f"[verl_cpu] exit={rc} steps_logged={len(rows)} wall_s={wall:.1f} run_dir={run_dir}")
        # the fully-async trainer logs a step's metrics when it syncs the weights after it; with
        # test_freq=-1 it skips the sync after the last step (fully_async_trainer.py, fit: `% test_freq`)
        expected = args.steps - 1 if args.trainer == "fully_async" else args.steps
        return rc if rc != 0 or len(rows) == expected else 1
    finally:
        if not (args.keep or args.workdir):
            shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(run())
