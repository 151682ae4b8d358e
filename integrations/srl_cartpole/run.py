"""Run real SRL training CartPole with PPO through SRL's own launcher, with SRL's buffer or Conduit's.

    cd /work/main && PYTHONPATH=.:adapters /work/srl-venv/bin/python -m integrations.srl_cartpole.run \\
        --buffer srl|conduit --stream shm|zmq --consumer srl|conduit --g-ing 1 --seconds 90 --seed 0 \\
        --out out/srl_cartpole/conduit-s0

``--consumer conduit`` makes the trainer's end of the stream Conduit's ``SampleConsumer``
(``conduit_srl.sample_consumer``, at ``--g-ing`` samples per buffer call, over whichever ``--stream``);
the launching process then registers Conduit's trainer worker (``conduit_srl.enable`` or, with SRL's
buffer, ``conduit_srl.enable_consumer``), which binds the consumer after the fork.

The launching process (a child in its own session) applies the CPU shims (``cpu.py``), for
``--buffer conduit`` calls ``conduit_srl.enable()`` (SRL's ``make_buffer`` builds Conduit's buffers),
then wraps ``make_buffer`` in the timing proxy (``timing.py``, the same for both arms), registers
the environment and the experiment in SRL's registries and calls ``rlsrl.apps.main.main()`` with
``srl-local run -e NAME -f TRIAL --wandb_mode disabled``. SRL forks its workers from there. After
``--seconds`` the whole process group is killed (SRL's ``run_local`` would leave its workers
running), SRL's shared-memory blocks of the trial and its parameter DB are removed, and the run is
summarized from what the workers left in ``--out``:

- ``buffer_stats_<pid>.json`` (trainer worker): trained frames/s after warm-up, the trainer's
  exposed wait for data (fraction of wall time, ms per trainer step), get ms per step, put ms per sample;
- ``returns/returns_<pid>.jsonl`` (actor workers): every finished episode with its wall time;
- ``consumer_stats_<pid>.json`` (trainer worker, ``--consumer conduit``): the consumer's counters
  (received == put + staged + rejected), written every 2 s and at close.

The summary is printed and written to ``<out>/summary.json``; SRL's log is ``<out>/srl.log``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXPERIMENT = "conduit-cartpole-ppo"
STATE_VAR = "CONDUIT_SRL_STATE_DIR"


@dataclass
class Args:
    buffer: str = "conduit"        # srl | conduit
    stream: str = "shm"            # shm | zmq
    seconds: float = 90.0
    seed: int = 0
    out: str = "out/srl_cartpole/run"
    actors: int = 1
    envs_per_actor: int = 16
    batch_size: int = 16
    reuses: int = 1
    max_size: int = 32
    warmup: float = 10.0           # seconds after the trainer's first get excluded from the rates
    threads: int = 1               # OMP/torch threads per worker (2 cores, ~5 processes)
    quiet: bool = False
    zero_copy: bool = False        # SRL's buffer_zero_copy: the shm stream batches, the buffer is a simple_queue
    kill_actor_after: float = 0.0  # > 0: SIGKILL the actor worker(s) this many seconds into the run (fault test)
    consumer: str = "srl"          # srl | conduit: the trainer's end of the sample stream
    g_ing: int = 1                 # Conduit's consumer: samples per buffer call (1 = SRL's behaviour)
    shm_order: str = "fresh"       # Conduit's consumer on shared memory: fresh (SRL's reader) | old


# ---------------------------------------------------------------------------- child: SRL's launcher
def _child(args: Args, trial: str, port: int, state_dir: str) -> None:
    out = os.path.abspath(args.out)
    os.environ["WANDB_MODE"] = "disabled"
    os.environ["CONDUIT_SRL_RETURNS_DIR"] = os.path.join(out, "returns")
    import torch
    torch.set_num_threads(args.threads)

    import rlsrl.apps.main as srl_main   # imports SRL's legacy algorithms, environments, experiments
    import rlsrl.system.api.parameter_db as parameter_db

    from . import cpu, experiment, timing
    cpu.apply()
    import conduit_srl
    if args.buffer == "conduit":
        conduit_srl.enable()            # Conduit's buffers (and Conduit's trainer worker)
    elif args.consumer == "conduit":
        conduit_srl.enable_consumer()   # Conduit's trainer worker only: it binds the consumer
    timing.install(out, label=args.buffer)   # wraps whichever make_buffer is now in place
    # SRL's filesystem parameter DB lives under $HOME/marl_checkpoints: keep this run's in state_dir
    parameter_db.PytorchFilesystemParameterDB.ROOT = os.path.join(state_dir, "marl_checkpoints/")

    experiment.register(EXPERIMENT, seed=args.seed, stream=args.stream, actors=args.actors,
                        envs_per_actor=args.envs_per_actor, port=port, buffer_zero_copy=args.zero_copy,
                        consumer=args.consumer, g_ing=args.g_ing, shm_order=args.shm_order,
                        consumer_stats_path=os.path.join(out, "consumer_stats_{pid}.json"),
                        buffer_name="priority_queue",
                        buffer_args=dict(batch_size=args.batch_size, reuses=args.reuses, max_size=args.max_size))
    sys.argv = ["srl-local", "run", "-e", EXPERIMENT, "-f", trial, "--wandb_mode", "disabled",
                "--timeout", str(int(args.seconds) + 600)]
    srl_main.main()


# ---------------------------------------------------------------------------- parent: launch, stop, summarize
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _kill_group(pgid: int) -> None:
    for sig, grace in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.time() + grace
        while time.time() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def launch(args: Args) -> dict:
    """Run one arm for ``args.seconds`` and return its summary."""
    if args.buffer not in ("srl", "conduit"):
        raise SystemExit(f"--buffer must be srl or conduit, got {args.buffer!r}")
    if args.stream not in ("shm", "zmq"):
        raise SystemExit(f"--stream must be shm or zmq, got {args.stream!r}")
    args = replace(args, out=os.path.abspath(args.out))   # the child runs in the repository root
    out = args.out
    if args.stream == "shm" and args.actors > 1:
        print("warning: SRL's shared-memory streams race with more than one actor (FileExistsError, then "
              "'cannot mmap an empty file', rlsrl/base/shared_memory.py:41-47); use --stream zmq", file=sys.stderr)
    if os.path.exists(out):
        for stale in glob.glob(os.path.join(out, "buffer_stats_*.json")) + \
                glob.glob(os.path.join(out, "consumer_stats_*.json")) + \
                glob.glob(os.path.join(out, "returns", "*.jsonl")):
            os.remove(stale)
    os.makedirs(os.path.join(out, "returns"), exist_ok=True)
    trial = f"{args.buffer}{args.stream}s{args.seed}p{os.getpid()}t{int(time.time()) % 100000}"
    state_dir = tempfile.mkdtemp(prefix="conduit-srl-")
    port = _free_port()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([REPO, os.path.join(REPO, "adapters")] +
                                        ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(args.threads)
    env["WANDB_MODE"] = "disabled"
    env[STATE_VAR] = state_dir
    cmd = [sys.executable, "-m", "integrations.srl_cartpole.run", "--_child", trial, str(port)] + _argv(args)
    log_path = os.path.join(out, "srl.log")
    t_launch = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        killed: list[dict] = []
        try:
            while time.time() - t_launch < args.seconds and proc.poll() is None:
                time.sleep(0.5)
                if args.kill_actor_after > 0 and not killed and time.time() - t_launch >= args.kill_actor_after:
                    killed = _kill_actors(out)
        finally:   # also on SIGTERM / Ctrl-C: nothing of the run is left behind
            t_stop = time.time()
            _kill_group(proc.pid)
            proc.wait()
            leftover = _group_alive(proc.pid)
            for path in glob.glob(f"/dev/shm/*{trial}*"):   # SRL's shared-memory blocks of this trial
                try:
                    os.remove(path)
                except OSError:
                    pass
            shutil.rmtree(state_dir, ignore_errors=True)
    summary = summarize(out, t_launch=t_launch, t_stop=t_stop, warmup=args.warmup)
    summary.update(args=asdict(args), trial=trial, child_rc=proc.returncode, actors_killed=killed,
                   child_exited_early=t_stop - t_launch < args.seconds - 1, leftover_processes=leftover)
    with open(os.path.join(out, "summary.json"), "w") as fh:
        json.dump(summary, fh, indent=2)
    return summary


def _kill_actors(out: str) -> list[dict]:
    """SIGKILL every actor worker, found by the returns file its environments write
    (``returns_<pid>.jsonl``: only actor processes host environments)."""
    killed = []
    for path in glob.glob(os.path.join(out, "returns", "returns_*.jsonl")):
        pid = int(os.path.basename(path)[len("returns_"):-len(".jsonl")])
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append({"pid": pid, "t": time.time()})
        except ProcessLookupError:
            pass
    return killed


def _argv(args: Args) -> list[str]:
    argv = []
    for k, v in asdict(args).items():
        if isinstance(v, bool):
            argv += [f"--{k.replace('_', '-')}"] if v else []
        else:
            argv += [f"--{k.replace('_', '-')}", str(v)]
    return argv


def _returns(out: str) -> list[dict]:
    eps = []
    for path in glob.glob(os.path.join(out, "returns", "*.jsonl")):
        with open(path) as fh:
            for line in fh:
                try:
                    eps.append(json.loads(line))
                except json.JSONDecodeError:  # a line cut by the kill
                    pass
    eps.sort(key=lambda e: e["t"])
    return eps


def summarize(out: str, *, t_launch: float, t_stop: float, warmup: float = 10.0, window: int = 20) -> dict:
    s: dict = {"wall_s": t_stop - t_launch}
    stats = sorted(glob.glob(os.path.join(out, "buffer_stats_*.json")))
    if stats:
        with open(stats[-1]) as fh:
            st = json.load(fh)
        h = [x for x in st["history"] if x["t"] <= t_stop]
        s["buffer"] = st["buffer"]
        first_get = st.get("first_get")
        if first_get is not None and len(h) >= 2:
            start = next((x for x in h if x["t"] >= first_get + warmup), None)
            end = h[-1]
            if start is None or end["t"] - start["t"] < 1.0:
                start = next(x for x in h if x["gets"] > 0) if any(x["gets"] > 0 for x in h) else h[0]
            d = {k: end[k] - start[k] for k in end if k != "t"}
            dt = end["t"] - start["t"]
            s["first_get_s"] = first_get - t_launch
            s["window_s"] = dt
            if dt > 0 and d["gets"] > 0:
                s["trained_frames_per_s"] = d["trained"] / dt
                s["trainer_steps_per_s"] = d["gets"] / dt
                s["exposed_wait_fraction"] = d["wait_s"] / dt
                s["exposed_wait_ms_per_step"] = 1e3 * d["wait_s"] / d["gets"]
                # empty() answers True: with Conduit's empty_wait_s each True follows a wait of its own, so
                # this counts polls, not time, and does not compare across the arms (exposed wait does)
                s["empty_polls_per_step"] = d["empty_true"] / d["gets"]
                s["get_ms_per_step"] = 1e3 * d["get_s"] / d["gets"]
            if d["puts"] > 0:
                s["put_ms_per_sample"] = 1e3 * d["put_s"] / d["puts"]
                s["put_us_per_step"] = 1e6 * d["put_s"] / max(d["put_steps"], 1)
                s["samples_put_per_s"] = d["puts"] / dt if dt > 0 else None
        s["totals"] = {k: v for k, v in h[-1].items() if k != "t"} if h else {}
        s["buffer_accounting"] = st.get("buffer_accounting")  # Conduit's: every sample put, accounted for
    consumer = sorted(glob.glob(os.path.join(out, "consumer_stats_*.json")))
    if consumer:   # Conduit's consumer: every sample received, accounted for (written every 2 s and at close)
        with open(consumer[-1]) as fh:
            s["consumer"] = json.load(fh)
    eps = [e for e in _returns(out) if e["t"] <= t_stop]
    rets = [e["ret"] for e in eps]
    s["episodes"] = len(eps)
    s["env_steps"] = int(sum(e["len"] for e in eps))
    s["return_first20"] = sum(rets[:window]) / len(rets[:window]) if rets else None
    s["return_last20"] = sum(rets[-window:]) / len(rets[-window:]) if rets else None
    for target in (100, 150):
        s[f"t_to_ma{window}_{target}_s"] = None
        for i in range(window, len(rets) + 1):
            if sum(rets[i - window:i]) / window >= target:
                s[f"t_to_ma{window}_{target}_s"] = eps[i - 1]["t"] - t_launch
                break
    return s


def _fmt(s: dict) -> str:
    def f(k, fmt="{:.1f}"):
        v = s.get(k)
        return "-" if v is None else fmt.format(v)
    return (f"trained frames/s {f('trained_frames_per_s')}  exposed wait {f('exposed_wait_fraction', '{:.1%}')} "
            f"({f('exposed_wait_ms_per_step', '{:.2f}')} ms/step)  get {f('get_ms_per_step', '{:.3f}')} ms/step  "
            f"put {f('put_ms_per_sample', '{:.3f}')} ms/sample\n"
            f"episodes {s.get('episodes')}  return first20 {f('return_first20')} last20 {f('return_last20')}  "
            f"MA20>=100 at {f('t_to_ma20_100_s')} s  >=150 at {f('t_to_ma20_150_s')} s")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    d = Args()
    p.add_argument("--buffer", choices=["srl", "conduit"], default=d.buffer)
    p.add_argument("--stream", choices=["shm", "zmq"], default=d.stream)
    p.add_argument("--seconds", type=float, default=d.seconds)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--out", default=d.out)
    p.add_argument("--actors", type=int, default=d.actors)
    p.add_argument("--envs-per-actor", type=int, default=d.envs_per_actor)
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    p.add_argument("--reuses", type=int, default=d.reuses)
    p.add_argument("--max-size", type=int, default=d.max_size)
    p.add_argument("--warmup", type=float, default=d.warmup)
    p.add_argument("--threads", type=int, default=d.threads)
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--kill-actor-after", type=float, default=d.kill_actor_after,
                   help="SIGKILL the actor worker(s) this many seconds in (fault test: the trainer must keep and "
                        "count everything it received)")
    p.add_argument("--zero-copy", action="store_true",
                   help="SRL's buffer_zero_copy (shm stream only): batching and reuses move into the stream")
    p.add_argument("--consumer", choices=["srl", "conduit"], default=d.consumer,
                   help="the trainer's end of the sample stream: SRL's consumer or conduit_srl.sample_consumer")
    p.add_argument("--g-ing", type=int, default=d.g_ing, help="Conduit's consumer: samples per buffer call")
    p.add_argument("--shm-order", choices=["fresh", "old"], default=d.shm_order,
                   help="Conduit's consumer on shared memory: freshest first (SRL's reader) or oldest first")
    p.add_argument("--_child", nargs=2, metavar=("TRIAL", "PORT"), help=argparse.SUPPRESS)
    return p


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)   # unwinds through launch()'s finally: the group is killed


def main(argv=None) -> None:
    ns = vars(parser().parse_args(argv))
    child = ns.pop("_child")
    args = Args(**ns)
    if child:
        _child(args, child[0], int(child[1]), os.environ.get(STATE_VAR) or tempfile.mkdtemp())
        return
    # a SIGTERM (e.g. from benchmarks/srl/ppo.py on its timeout) still stops SRL's process group
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    summary = launch(args)
    if not args.quiet:
        print(f"[{args.buffer}/{args.stream}/consumer {args.consumer} g_ing {args.g_ing} seed {args.seed}] "
              + _fmt(summary))
        print(json.dumps({k: v for k, v in summary.items() if k not in ("args", "totals")}, indent=None, default=str))


if __name__ == "__main__":
    main()
