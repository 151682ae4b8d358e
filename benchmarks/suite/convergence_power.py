"""How often the convergence check fails a correct adapter, and how often it catches a known change in
learning speed: the check's own decision (``conduit_conformance.checks_convergence.judge``) replayed
on a pool of native runs of a workload.

A correct adapter learns like native, so two disjoint sets of k native seeds stand for the two arms of
a correct adapter: the share of random pairs the check fails is its false-alarm rate on that workload.
Multiplying one arm's steps to the threshold by ``--shift`` (1.5: learning 1.5x slower; its inverse,
1.5x faster) is exactly a known change in learning speed: the share of pairs it fails then is what the
check detects (with ``--budget WORKLOAD=N``, the workload's env-step budget, a run scaled past it counts
as not reached, as it would have been).
Both are measured for the calibrated bound (the spread measured on the pool, as an author declares it
with ``--calibrate-convergence``, or the one a harness declares: ``--spread WORKLOAD=S``) and for the
suite's fixed bound (no spread declared).

    python -m benchmarks.suite.convergence_power                       # the example adapter's bandit, 400 runs
    python -m benchmarks.suite.convergence_power --from-calibration out/calibrate_rllib.json   # stored runs
        [--seeds 2 5] [--trials 20000] [--shift 1.5] [--json out/convergence_power.json]

``--from-calibration`` reads what ``CONDUIT_CONVERGENCE_SEEDS=0,...,19 conduit conformance NAME
--calibrate-convergence`` printed (each workload's steps and whether each run reached the threshold).
Pairs are drawn without replacement within a trial and independently across trials, so with a pool of
n runs the trials are not independent of each other: the rates are those of the pool's empirical
distribution, read with the pool's size in mind.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

from ..common import fmt_table, machine, write_json


def native_pool(harness_name: str, pool: int) -> dict[str, dict]:
    """{workload: {"steps": [...], "reached": [...]}} of ``pool`` native runs (seeds 0..pool-1)."""
    from conduit_conformance.checks_convergence import run_all
    from conduit_conformance.runner import load_harness
    harness = load_harness(harness_name)
    out = {}
    for name, run in sorted(harness.convergence_workloads().items()):
        results = run_all(run, [("native", s) for s in range(pool)])
        out[name] = {"steps": [int(r.env_steps) for r in results], "reached": [bool(r.reached) for r in results]}
    return out


def power(steps, reached, *, k: int, trials: int, shift: float, seed: int = 0, declared: float | None = None,
          budget: int | None = None) -> dict:
    """Rates over ``trials`` random pairs of disjoint k-run arms from the pool: failed when equal
    (false alarms), failed when one arm's steps are ``shift`` times (slower) or 1/``shift`` times
    (faster), for the calibrated bound (the pool's spread, or ``declared``: what a harness declares)
    and the fixed one. ``budget``: the workload's env-step budget, past which a scaled run counts as not
    reached (None: every scaled run keeps its own, as with a budget large enough for it)."""
    from conduit_conformance.checks_convergence import detectable_ratio, judge, native_spread, ratio_bound
    steps, reached = np.asarray(steps, dtype=np.float64), np.asarray(reached, dtype=bool)
    if len(steps) < 2 * k:
        raise SystemExit(f"--seeds {k}: the pool holds {len(steps)} runs, fewer than the {2 * k} two arms need. "
                         "Fix: a larger pool (--pool, or more seeds in the calibration)")
    measured = native_spread(steps.tolist(), reached.tolist())
    spread = measured if declared is None else float(declared)
    rng = np.random.default_rng(seed)
    failed = {(bound, case): 0 for bound in ("calibrated", "fixed") for case in ("equal", "slower", "faster")}
    for _ in range(trials):
        pick = rng.choice(len(steps), 2 * k, replace=False)
        a, b = pick[:k], pick[k:]
        for case, factor in (("equal", 1.0), ("slower", shift), ("faster", 1 / shift)):
            other = np.rint(steps[b] * factor)
            other_reached = reached[b] if budget is None else reached[b] & (other <= budget)
            if budget is not None:
                other = np.minimum(other, budget)
            for bound, arg in (("calibrated", spread), ("fixed", None)):
                v = judge(steps[a].tolist(), reached[a].tolist(), other.tolist(), other_reached.tolist(), arg)
                failed[(bound, case)] += not v.ok
    rate = lambda bound, case: failed[(bound, case)] / trials   # noqa: E731
    return {"k": k, "trials": trials, "shift": shift, "spread": spread, "measured_spread": measured, "budget": budget,
            "declared": declared is not None, "pool": int(len(steps)),
            "reached": float(reached.mean()),
            "calibrated": {"bound": ratio_bound(k, spread), "detectable_80": detectable_ratio(k, spread),
                           "false_alarms": rate("calibrated", "equal"), "caught_slower": rate("calibrated", "slower"),
                           "caught_faster": rate("calibrated", "faster")},
            "fixed": {"bound": ratio_bound(k), "false_alarms": rate("fixed", "equal"),
                      "caught_slower": rate("fixed", "slower"), "caught_faster": rate("fixed", "faster")}}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.suite.convergence_power",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--harness", default="conduit_conformance.examples.conduit_minirl.conformance:harness",
                   help="the harness whose native runs make the pool (default: the example adapter)")
    p.add_argument("--pool", type=int, default=400, help="native runs in the pool (seeds 0..pool-1)")
    p.add_argument("--from-calibration", default=None, metavar="FILE",
                   help="a --calibrate-convergence output to read the pool from instead of running it")
    p.add_argument("--seeds", type=int, nargs="+", default=[2, 5], help="seeds per arm (CI runs 2)")
    p.add_argument("--trials", type=int, default=20_000)
    p.add_argument("--shift", type=float, default=1.5, help="the known change in learning speed")
    p.add_argument("--spread", action="append", default=[], metavar="WORKLOAD=S",
                   help="the spread a harness declares for a workload, in place of the pool's own (repeatable)")
    p.add_argument("--budget", action="append", default=[], metavar="WORKLOAD=N",
                   help="the workload's env-step budget: a run scaled past it counts as not reached (repeatable)")
    p.add_argument("--json", default="out/convergence_power.json")
    a = p.parse_args(argv)
    def pairs(flag: str, items: list[str], kind) -> dict:
        out = {}
        for item in items:
            name, _, value = item.partition("=")
            try:
                out[name] = kind(value)
            except ValueError:
                p.error(f"{flag}: expected WORKLOAD=NUMBER (e.g. dqn_cartpole=0.38), got {item!r}")
        return out
    declared, budgets = pairs("--spread", a.spread, float), pairs("--budget", a.budget, int)
    if a.from_calibration:
        with open(a.from_calibration) as f:
            pools = {name: {"steps": w["steps"], "reached": w["reached"]} for name, w in json.load(f).items()}
        source = {"calibration": os.path.abspath(a.from_calibration)}
    else:
        pools = native_pool(a.harness, a.pool)
        source = {"harness": a.harness, "pool": a.pool}
    report = {"machine": machine(), "source": source, "workloads": {}}
    rows = []
    for name, pool in pools.items():
        report["workloads"][name] = [power(pool["steps"], pool["reached"], k=k, trials=a.trials, shift=a.shift,
                                           declared=declared.get(name), budget=budgets.get(name))
                                     for k in a.seeds]
        for r in report["workloads"][name]:
            c, x = r["calibrated"], r["fixed"]
            rows.append([name, r["pool"], f"{r['spread']:.3f}" + (" (declared)" if r["declared"] else ""), r["k"],
                         f"{c['bound']:.2f}", f"{c['false_alarms']:.2%}", f"{c['caught_slower']:.1%} / {c['caught_faster']:.1%}",
                         f"{c['detectable_80']:.2f}x",
                         f"{x['bound']:.2f}", f"{x['false_alarms']:.2%}", f"{x['caught_slower']:.1%} / {x['caught_faster']:.1%}"])
    print(fmt_table(rows, ["workload", "pool", "spread", "seeds/arm", "calibrated R", "false alarms",
                           f"caught {a.shift}x slower / faster", "detects (80%)", "fixed R", "false alarms",
                           f"caught {a.shift}x slower / faster"]))
    write_json(a.json, report)
    return report


if __name__ == "__main__":
    main()
