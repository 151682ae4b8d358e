"""Per-call cost of the buffer's hot paths, and the same on another checkout, in turns.

A refactor must not make the experience path slower. This times the calls a learner makes
every step on a CartPole-sized buffer (200k rows, full): a uniform sample of 32, a uniform
n-step sample, a prioritized sample plus its priority update, and an add of a 200-row rollout.
With ``--against DIR`` (another checkout of the project, e.g. ``git worktree add /tmp/before
<commit>`` with its C helpers built), the two trees run alternately in fresh processes and the
report gives each call's median per tree and the median of the paired ratios (this tree over
the other): on a noisy machine only paired, interleaved runs say anything.

    python -m benchmarks.buffer.calls                        # this tree
    python -m benchmarks.buffer.calls --against /tmp/before --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

CALLS = ("uniform B=32", "uniform n-step 3 B=32", "prioritized sample+update B=32", "add 200 rows")


def measure() -> dict[str, float]:
    """Microseconds per call, median of 7 repetitions, in this process's conduit_core."""
    import numpy as np

    from conduit_core import ExperienceBuffer, ExperienceSpec, Prioritized
    spec = ExperienceSpec.transition(obs_shape=(4,))
    rng = np.random.default_rng(0)

    def rollout(n: int = 200) -> dict:
        return {"obs": rng.random((n, 4), np.float32), "action": np.zeros(n, np.int64),
                "reward": np.ones(n, np.float32), "next_obs": rng.random((n, 4), np.float32),
                "terminated": np.zeros(n, bool), "truncated": np.zeros(n, bool)}

    def full(selector):
        buf = ExperienceBuffer(spec=spec, capacity=200_000, selector=selector, reuse_outputs=4, seed=0)
        for _ in range(1000):
            buf.add(rollout())
        return buf
    uniform, prioritized = full(None), full(Prioritized())
    one = rollout()
    errors = rng.random(32)

    def sample_and_update():
        b = prioritized.sample(32)
        prioritized.update_priorities(b.slots, errors, seqs=b.seqs)

    def per_call(f, calls: int = 2000, reps: int = 7) -> float:
        out = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(calls):
                f()
            out.append((time.perf_counter() - t0) / calls * 1e6)
        return float(statistics.median(out))
    return {CALLS[0]: per_call(lambda: uniform.sample(32)),
            CALLS[1]: per_call(lambda: uniform.sample(32, n_step=3, gamma=0.99)),
            CALLS[2]: per_call(sample_and_update),
            CALLS[3]: per_call(lambda: uniform.add(one), calls=500)}


def run_in(tree: pathlib.Path) -> dict[str, float]:
    """``measure()`` in a fresh process importing conduit_core from ``tree`` (this file runs as
    a script there, so the other tree needs no copy of it)."""
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, str(pathlib.Path(__file__).resolve()), "--measure"], cwd=tree, env=env,
                         capture_output=True, text=True, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    if not got.pop("core").startswith(str(tree)):
        raise RuntimeError(f"{tree}: conduit_core was imported from elsewhere; build its C helpers there first "
                           "(python setup.py build_ext --inplace)")
    return got


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.buffer.calls", description=__doc__.split("\n")[0])
    p.add_argument("--against", default=None, help="another checkout to compare with, in turns")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", default=None)
    p.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)   # one tree's run, as JSON
    a = p.parse_args(argv)
    if a.measure:
        import conduit_core
        print(json.dumps({**measure(), "core": str(pathlib.Path(conduit_core.__file__).resolve())}))
        return {}
    here = pathlib.Path(__file__).resolve().parents[2]   # (this file runs as a script: no package imports)
    trees = {"this": here} if a.against is None else {"this": here, "other": pathlib.Path(a.against).resolve()}
    runs: dict[str, list[dict]] = {k: [] for k in trees}
    for _ in range(a.rounds):
        for name, tree in trees.items():
            runs[name].append(run_in(tree))
    report = {"rounds": a.rounds, "trees": {k: str(v) for k, v in trees.items()}, "runs": runs, "calls": {}}
    for call in CALLS:
        row = {name: statistics.median(r[call] for r in rs) for name, rs in runs.items()}
        if "other" in runs:
            row["paired_ratio"] = statistics.median(t[call] / o[call] for t, o in zip(runs["this"], runs["other"]))
        report["calls"][call] = row
        extra = f"  other {row['other']:8.2f} us  this/other {row['paired_ratio']:.3f}" if "other" in row else ""
        print(f"{call:32s} this {row['this']:8.2f} us{extra}")
    if a.json:
        pathlib.Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(a.json).write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
