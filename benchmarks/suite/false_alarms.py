"""How often the suite's semantic level fails an exact adapter: the level run once per suite seed
(``conduit conformance NAME --seed S``), every failure counted by check.

The semantic checks that compare distributions test at a fixed significance, and each suite seed draws
other synthetic rollouts and other samples, so a check that holds on one seed can fail on another if
its threshold is too tight. An adapter that delivers exactly what its framework delivers must pass
every seed: a failure here is a false alarm of the check (or a real departure, then kept by the
adapter's ``known_departures`` with why).

    python -m benchmarks.suite.false_alarms                                  # the example adapter, seeds 0-19
    python -m benchmarks.suite.false_alarms --harness rllib --seeds 20 [--json out/false_alarms.json]
"""

from __future__ import annotations

import argparse
import collections
import time

from ..common import fmt_table, machine, write_json


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.suite.false_alarms", description=__doc__.split("\n\n")[0])
    p.add_argument("--harness", default="conduit_conformance.examples.conduit_minirl.conformance:harness",
                   help="an installed adapter's name (rllib, verl) or module:function")
    p.add_argument("--seeds", type=int, default=20, help="suite seeds 0..N-1")
    p.add_argument("--json", default="out/false_alarms.json")
    a = p.parse_args(argv)
    from conduit_conformance.runner import check_adapter, load_harness
    harness = load_harness(a.harness)
    failed: collections.Counter = collections.Counter()
    ran: collections.Counter = collections.Counter()
    details, t0 = {}, time.perf_counter()
    for seed in range(a.seeds):
        report = check_adapter(harness, level="semantic", seed=seed)
        for r in report.results:
            if r.status != "skip":
                ran[r.id] += 1
            if not r.ok:
                failed[r.id] += 1
                details.setdefault(r.id, []).append({"seed": seed, "detail": r.detail[:400]})
        print(f"seed {seed}: {'OK' if report.ok else 'FAILED ' + ', '.join(x.id for x in report.failures())}",
              flush=True)
    report = {"machine": machine(), "harness": a.harness, "adapter": harness.name, "seeds": a.seeds,
              "checks": len(ran), "check_runs": sum(ran.values()), "failed_runs": sum(failed.values()),
              "failed": dict(failed), "details": details, "seconds": time.perf_counter() - t0}
    rows = [[cid, ran[cid], failed[cid]] for cid in sorted(failed)] or [["(none)", sum(ran.values()), 0]]
    print(fmt_table(rows, ["check", "runs", "failed"]))
    print(f"{harness.name}: {len(ran)} checks x {a.seeds} seeds, {sum(failed.values())} failed")
    write_json(a.json, report)
    return report


if __name__ == "__main__":
    main()
