"""Where Conduit's share of an RLlib DQN training step goes, with the real algorithm running.

``conduit bench rllib-dqn`` compares the two systems; this takes the Conduit arm apart:

- ``--iters N``: N ``algo.train()`` iterations after the warm-up, with the same wrappers as the
  bench (``timing.PathTimer``): ms per training step of each buffer call, in the run, where
  the caches are cold after the env step and the learner update.
- ``--sections``: also the time inside a few of the core's steps per training step (validate,
  encode, frame interning, frame pool write, storage write, frame-stack decode).
- ``--tight N``: then N sample + priority-update calls back to back with the last sample's
  arguments (the same code with warm caches), us per call.
- ``--replay-adds``: the ``add()`` calls of the measured iterations, recorded, replayed into a
  fresh buffer of the same configuration in a tight loop, us per call (CartPole).
- ``--route-ab``: the recorded ``add()`` calls replayed, each followed (once 100 are in) by a
  ``sample()`` by the window route (``conduit_core.buffer.window_draw``) and one by the general route, in
  turns, cold (``--cold-replay MB``, default 64), us per call and their ratio per replay (CartPole).
- ``--split``: both systems, built as the bench builds them, iterations in turns: seconds per
  iteration spent in the env runner's ``sample`` and in ``learner_group.update``.
- ``--against DIR --rounds N``: this tree and another checkout of the project (e.g. ``git
  worktree add /tmp/before <commit>``, its C helpers built there), each run in fresh processes in
  turns, N rounds: each call's median ms per step per tree and the median of the paired ratios
  (this tree over the other). The machine's speed drifts by 10-20% over minutes: only paired,
  interleaved runs tell a change of a few microseconds per call.
- ``--cold-replay MB``: the recorded ``add()`` calls replayed into a fresh buffer, each followed
  (once 100 are in) by a sample with the last sample's arguments and a priority update; ``add()``
  and ``sample()`` timed alone, with and without a write over MB megabytes before each (the cache
  state the run leaves them in, made repeatable), us per call (CartPole; implies the recording).

    python -m benchmarks.rllib.conduit_path --workload dqn --iters 6 --tight 2000 --replay-adds
    python -m benchmarks.rllib.conduit_path --workload dqn-atari --iters 3 --sections
    python -m benchmarks.rllib.conduit_path --workload dqn-atari --split --iters 3
    python -m benchmarks.rllib.conduit_path --workload dqn --iters 3 --cold-replay 64
    python -m benchmarks.rllib.conduit_path --workload dqn --iters 2 --route-ab
    python -m benchmarks.rllib.conduit_path --workload dqn --iters 1 --frames
    python -m benchmarks.rllib.conduit_path --workload dqn --iters 3 --against /tmp/before --rounds 4
"""

from __future__ import annotations

import argparse
import collections
import copy
import functools
import json
import pathlib
import statistics
import time
from types import SimpleNamespace

import numpy as np

from ..common import REPO
from . import bench as rllib_bench


def _args(workload: str, seed: int) -> SimpleNamespace:
    return SimpleNamespace(seed=seed, mode="sequential", worker="thread", staleness=0, game="ale_py:ALE/Qbert-v5",
                           atari_learning_starts=500, atari_iteration_steps=100)


def _timed_methods(targets: list[tuple[type, str]], totals: dict, counts: dict) -> None:
    """Wrap class methods so that each call adds its time to ``totals[Class.name]``."""
    for cls, name in targets:
        fn = getattr(cls, name)
        key = f"{cls.__name__}.{name}"

        def wrapper(*a, _fn=fn, _key=key, **k):
            t0 = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                totals[_key] += time.perf_counter() - t0
                counts[_key] += 1
        setattr(cls, name, wrapper)


def count_frames(buf, names=("add", "sample", "update_priorities")) -> dict:
    """Wrap the buffer's calls so that each counts the Python frames and C calls it runs
    (``sys.setprofile`` inside the call only): returns {call: [calls, frames, C calls]}."""
    import sys
    counts: dict = {n: [0, 0, 0] for n in names}
    for name in names:
        fn = getattr(buf, name)

        def counted(*a, _fn=fn, _c=counts[name], **k):
            def prof(frame, event, arg):
                if event == "call":
                    _c[1] += 1
                elif event == "c_call":
                    _c[2] += 1
            _c[0] += 1
            sys.setprofile(prof)
            try:
                return _fn(*a, **k)
            finally:
                sys.setprofile(None)
        setattr(buf, name, functools.update_wrapper(counted, fn))   # (__wrapped__: the timed call below it)
    return counts


def section_targets() -> list[tuple[type, str]]:
    from conduit_core.schema import framestack, spec
    from conduit_core.storage import columnar as storage
    return [(spec.ExperienceSpec, "validate"), (spec.ExperienceSpec, "encode"),
            (storage.ColumnarStorage, "plan_frames"), (storage.ColumnarStorage, "write"),
            (framestack.FramePool, "write"), (framestack.PooledDecoder, "decode")]


def conduit_arm(a) -> dict:
    totals: dict = collections.defaultdict(float)
    counts: dict = collections.Counter()
    if a.sections:
        _timed_methods(section_targets(), totals, counts)
    algo = rllib_bench._build(a.workload, "conduit", _args(a.workload, a.seed))
    for _ in range(a.warmup):
        algo.train()
    buf, timer = algo.local_replay_buffer, algo._conduit_bench_timer
    last: dict = {}
    adds: list = []
    timed_sample, timed_add = buf.sample, buf.add

    def sample(*args, **kw):
        last["args"], last["kw"] = args, kw
        return timed_sample(*args, **kw)

    def add(episodes, *args, **kw):
        if a.replay_adds or a.cold_replay or a.route_ab:
            adds.append(copy.deepcopy(episodes))   # before the buffer takes them (outside the timer)
        return timed_add(episodes, *args, **kw)
    buf.sample, buf.add = sample, add
    frames = count_frames(buf) if a.frames else None
    timer.reset()
    totals.clear()
    counts.clear()
    t0 = time.perf_counter()
    for _ in range(a.iters):
        algo.train()
    out: dict = {"iteration_s": (time.perf_counter() - t0) / a.iters}
    if frames is not None:   # (times in this run include the profiler's: take them from a run without it)
        out["per_call"] = {n: {"python_frames": f / max(c, 1), "c_calls": cc / max(c, 1)}
                           for n, (c, f, cc) in frames.items()}
    steps = timer.calls["sample"]
    out["steps"] = steps
    out["ms_per_step"] = {k: v / steps * 1e3 for k, v in timer.seconds.items()}
    if a.sections:
        out["sections_ms_per_step"] = {k: v / steps * 1e3 for k, v in totals.items()}
        out["section_calls_per_step"] = {k: c / steps for k, c in counts.items()}
    raw_sample = timed_sample.__wrapped__
    raw_update = buf.update_priorities.__wrapped__
    if a.tight:
        def loop(n: int) -> float:
            t = time.perf_counter()
            for _ in range(n):
                raw_sample(*last["args"], **last["kw"])
                raw_update(np.random.random(last["kw"].get("num_items", 32)))
            return (time.perf_counter() - t) / n * 1e6
        loop(min(200, a.tight))
        out["tight_sample_update_us"] = sorted(loop(a.tight) for _ in range(5))
    if (a.replay_adds or a.cold_replay or a.route_ab) and adds:
        from conduit_rllib.replay_buffer import ConduitEpisodeReplayBuffer
        rb = algo.config.replay_buffer_config

        def replay() -> float:
            fresh = ConduitEpisodeReplayBuffer(capacity=rb["capacity"], prioritized=True, alpha=rb["alpha"],
                                               beta=rb["beta"], conduit=rb.get("conduit"))
            episodes = copy.deepcopy(adds)
            t = time.perf_counter()
            for eps in episodes:
                fresh.add(eps)
            dt = (time.perf_counter() - t) / len(episodes) * 1e6
            fresh.close()
            return dt
        if a.replay_adds:
            replay()
            out["replayed_add_us"] = sorted(replay() for _ in range(5))
            out["replayed_adds"] = len(adds)
        if a.cold_replay:
            out["cold_replay"] = {f"{mb} MB" if mb else "warm": cold_replay(rb, adds, last, mb)
                                  for mb in (0, a.cold_replay)}
        if a.route_ab:
            out["route_ab"] = route_ab(rb, adds, last, a.cold_replay or 64)
    algo.stop()
    return out


def cold_replay(rb: dict, adds: list, last: dict, flush_mb: int, reps: int = 5) -> dict:
    """``add()`` and ``sample()`` us per call (medians of ``reps`` replays, each into a fresh
    buffer), with a write over ``flush_mb`` MB before each timed call (0: none)."""
    from conduit_rllib.replay_buffer import ConduitEpisodeReplayBuffer
    junk = np.ones(max(flush_mb, 1) << 20, dtype=np.uint8)
    rng = np.random.default_rng(0)
    n = last["kw"].get("num_items", 32)
    runs = []
    for _ in range(reps + 1):   # the first: warm-up
        buf = ConduitEpisodeReplayBuffer(capacity=rb["capacity"], prioritized=True, alpha=rb["alpha"],
                                         beta=rb["beta"], conduit=rb.get("conduit"))
        t_add = t_sample = 0.0
        samples = 0
        for i, eps in enumerate(copy.deepcopy(adds)):
            if flush_mb:
                junk[::64] += 1
            t = time.perf_counter()
            buf.add(eps)
            t_add += time.perf_counter() - t
            if i >= 100:
                if flush_mb:
                    junk[::64] += 1
                t = time.perf_counter()
                buf.sample(*last["args"], **last["kw"])
                t_sample += time.perf_counter() - t
                samples += 1
                buf.update_priorities(rng.random(n))
        buf.close()
        runs.append((t_add / len(adds) * 1e6, t_sample / max(samples, 1) * 1e6))
    runs = runs[1:]
    return {"add_us": statistics.median(r[0] for r in runs), "sample_us": statistics.median(r[1] for r in runs),
            "adds": len(adds)}


def route_ab(rb: dict, adds: list, last: dict, flush_mb: int, reps: int = 5) -> dict:
    """``sample()`` us per call by the data plane's window route (``PooledWindowDraw``) and by
    the general route (``ExperienceBuffer.sample``) in turns, call by call on the same buffers
    (the recorded adds replayed, a write over ``flush_mb`` MB before each timed call; which
    route goes first alternates): per replay, and the route/general ratio per replay."""
    from conduit_rllib.replay_buffer import ConduitEpisodeReplayBuffer
    junk = np.ones(max(flush_mb, 1) << 20, dtype=np.uint8)
    rng = np.random.default_rng(0)
    n = last["kw"].get("num_items", 32)
    out: dict = {"route_us": [], "general_us": []}
    for _ in range(reps):
        buf = ConduitEpisodeReplayBuffer(capacity=rb["capacity"], prioritized=True, alpha=rb["alpha"],
                                         beta=rb["beta"], conduit=rb.get("conduit"))
        spent, calls = {"route": 0.0, "general": 0.0}, 0
        for i, eps in enumerate(copy.deepcopy(adds)):
            buf.add(eps)
            if i < 100:
                continue
            core = buf.edp.buffer
            for kind in (("route", "general") if i % 2 else ("general", "route")):
                core.routes.fast = kind == "route"   # False: every draw by the reference
                if flush_mb:
                    junk[::64] += 1
                t = time.perf_counter()
                buf.sample(*last["args"], **last["kw"])
                spent[kind] += time.perf_counter() - t
                buf.update_priorities(rng.random(n))
            core.routes.fast = True
            calls += 1
        buf.close()
        out["route_us"].append(spent["route"] / max(calls, 1) * 1e6)
        out["general_us"].append(spent["general"] / max(calls, 1) * 1e6)
    out["ratio"] = [r / g for r, g in zip(out["route_us"], out["general_us"])]
    out["median_ratio"] = statistics.median(out["ratio"])
    return out


def split(a) -> dict:
    """Both systems in turns: per iteration, env sampling and learner update seconds."""
    algos = {s: rllib_bench._build(a.workload, s, _args(a.workload, a.seed)) for s in rllib_bench.SYSTEMS}
    totals = {s: collections.defaultdict(float) for s in algos}
    for s, algo in algos.items():
        for obj, name, key in ((algo.env_runner, "sample", "env_sample_s"),
                               (algo.learner_group, "update", "learner_update_s")):
            fn = getattr(obj, name)

            def wrapper(*args, _fn=fn, _t=totals[s], _key=key, **kw):
                t0 = time.perf_counter()
                try:
                    return _fn(*args, **kw)
                finally:
                    _t[_key] += time.perf_counter() - t0
            setattr(obj, name, wrapper)
    for _ in range(a.warmup):
        for algo in algos.values():
            algo.train()
    rows: dict = {s: [] for s in algos}
    for _ in range(a.iters):
        for s, algo in algos.items():
            totals[s].clear()
            t0 = time.perf_counter()
            algo.train()
            rows[s].append(dict(totals[s], iteration_s=time.perf_counter() - t0))
    for algo in algos.values():
        algo.stop()
    return {s: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for s, rs in rows.items()}


def run_in(tree: pathlib.Path, argv: list[str]) -> dict:
    """This tool's run in a fresh process importing the project (core and adapters) from ``tree``."""
    import os
    import subprocess
    import sys
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "run.json"
        env = dict(os.environ, PYTHONPATH=f"{tree}{os.pathsep}{tree / 'adapters'}")
        probe = ("import conduit_core, conduit_rllib\n"
                 "try:\n    import conduit_core.selection.sumtree as t\n"
                 "except ImportError:   # a tree from before the core's subpackages (0.1)\n"
                 "    import conduit_core.sumtree as t\n"
                 "print(conduit_core.__file__, conduit_rllib.__file__, t.HAVE_C)")
        *where, native = subprocess.run([sys.executable, "-c", probe], cwd=tree, env=env, capture_output=True,
                                        text=True, check=True).stdout.split()
        if not all(pathlib.Path(w).resolve().is_relative_to(tree) for w in where):
            raise RuntimeError(f"{tree}: the project was imported from elsewhere ({where})")
        if native != "True":   # (a tree without its C helpers runs numpy's routes: not the code compared)
            raise RuntimeError(f"{tree}: its C helpers are not built; run python setup.py build_ext --inplace there")
        # (the tool's module in that tree: a tree from before the lab's beds has it at the lab's top)
        module = "benchmarks.rllib.conduit_path" if (tree / "benchmarks" / "rllib").is_dir() else \
            "benchmarks.rllib_conduit_path"
        run = subprocess.run([sys.executable, "-m", module, *argv, "--json", str(out)],
                             cwd=tree, env=env, capture_output=True, text=True)
        if run.returncode != 0:
            raise RuntimeError(f"{tree}: the run failed ({run.returncode}):\n{run.stderr[-4000:]}")
        return json.loads(out.read_text())


def runs_arguments(argv: list[str]) -> list[str]:
    """The command line without ``--against``, ``--rounds`` and ``--json`` (either form): what each
    run in turns is given."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--against", "--rounds", "--json"):
            skip = True
        elif not arg.startswith(("--against=", "--rounds=", "--json=")):
            out.append(arg)
    return out


def against(a, argv: list[str]) -> dict:
    """``--against``: both trees in turns, each call's median per tree and paired ratio."""
    trees = {"this": REPO, "other": pathlib.Path(a.against).resolve()}
    runs: dict = {k: [] for k in trees}
    for r in range(a.rounds):
        for name in (("this", "other") if r % 2 == 0 else ("other", "this")):   # (who goes first alternates)
            runs[name].append(run_in(trees[name], argv)["ms_per_step"])
    report: dict = {"rounds": a.rounds, "argv": argv, "trees": {k: str(v) for k, v in trees.items()}, "runs": runs,
                    "calls": {}}
    common = sorted(set(runs["this"][0]) & set(runs["other"][0]))   # (the calls both trees time)
    report["left_out"] = sorted(set(runs["this"][0]) ^ set(runs["other"][0]))
    for call in common:
        row = {name: statistics.median(r[call] for r in rs) for name, rs in runs.items()}
        row["paired_ratio"] = statistics.median(t[call] / o[call] for t, o in zip(runs["this"], runs["other"]))
        report["calls"][call] = row
    total = lambda r: sum(r[c] for c in common)
    report["calls"]["total"] = {"this": statistics.median(map(total, runs["this"])),
                                "other": statistics.median(map(total, runs["other"])),
                                "paired_ratio": statistics.median(total(t) / total(o)
                                                                  for t, o in zip(runs["this"], runs["other"]))}
    return report


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.rllib.conduit_path", description=__doc__.split("\n\n")[0],
                                allow_abbrev=False)   # (--against strips its own flags by their full names)
    p.add_argument("--workload", default="dqn", choices=["dqn", "dqn-atari"])
    p.add_argument("--iters", type=int, default=6)
    p.add_argument("--warmup", type=int, default=None, help="default: 2 (dqn), 6 (dqn-atari)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sections", action="store_true")
    p.add_argument("--tight", type=int, default=0)
    p.add_argument("--replay-adds", action="store_true")
    p.add_argument("--split", action="store_true", help="both systems: env sampling vs learner update per iteration")
    p.add_argument("--cold-replay", type=int, default=0, metavar="MB",
                   help="replay the adds (+ samples) with a write over MB megabytes before each call")
    p.add_argument("--route-ab", action="store_true",
                   help="sample() by the window route and by the general route in turns (cold: --cold-replay MB, "
                        "default 64)")
    p.add_argument("--frames", action="store_true",
                   help="Python frames and C calls per add/sample/update_priorities call (their times are then "
                        "the profiler's)")
    p.add_argument("--against", default=None, metavar="DIR", help="another checkout, run in turns with this one")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    if a.against:
        if a.split:
            p.error("--against compares the Conduit arm's calls; --split reports no calls")
        if a.rounds < 1:
            p.error(f"--rounds: expected >= 1, got {a.rounds}")
        import sys
        out = against(a, runs_arguments(list(sys.argv[1:] if argv is None else argv)))
        for call, row in out["calls"].items():
            print(f"{call:20s} this {row['this']:.4f}  other {row['other']:.4f} ms/step  this/other "
                  f"{row['paired_ratio']:.3f}")
        if a.json:
            pathlib.Path(a.json).write_text(json.dumps(out, indent=1))
        return out
    if a.warmup is None:
        a.warmup = 2 if a.workload == "dqn" else 6
    rllib_bench._init_ray()
    out = split(a) if a.split else conduit_arm(a)
    print(json.dumps(out, indent=1))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return out


if __name__ == "__main__":
    main()
