"""``conduit conformance <adapter> [--level semantic|convergence] [--xfails FILE] [--report out.json] [-k PATTERN]
[--require CAP]``"""

from __future__ import annotations

import argparse
import sys

from .runner import check_adapter, load_harness, load_xfails


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="conduit conformance",
                                description="Run the Conduit conformance suite on an adapter and print the table.")
    p.add_argument("adapter", help="a name (rllib, verl, srl, example, or one an installed adapter registers) or 'module:factory'")
    p.add_argument("--level", default="semantic", choices=["semantic", "convergence"])
    p.add_argument("--xfails", default=None, help="file of 'check/id: reason' lines (expected failures)")
    p.add_argument("--report", default=None, help="write the report as JSON here")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-k", dest="select", action="append", default=None,
                   help="only checks whose id matches (a substring or a glob; repeatable); one that matches none "
                        "is an error")
    p.add_argument("--require", action="append", default=[], metavar="CAP",
                   help="a capability that must be certified: a check skipped because the harness does not "
                        "declare it fails (repeatable)")
    p.add_argument("--calibrate-convergence", action="store_true",
                   help="measure the native arm's spread on each convergence workload (sd of log env steps to the "
                        "threshold over the seeds of $CONDUIT_CONVERGENCE_SEEDS, e.g. 0,1,...,9) and print what "
                        "Harness.convergence_spread should declare")
    a = p.parse_args(argv)
    try:
        harness = load_harness(a.adapter)
    except (ImportError, ValueError, TypeError) as exc:
        print(f"conduit conformance: cannot load adapter {a.adapter!r}: {exc}", file=sys.stderr)
        return 2
    if a.calibrate_convergence:
        import json

        from .checks_convergence import calibrate, seeds
        print(json.dumps(calibrate(harness, list(seeds())), indent=1))
        return 0
    try:
        report = check_adapter(harness, level=a.level, seed=a.seed, xfails=load_xfails(a.xfails), select=a.select,
                               require=a.require)
    except ValueError as exc:
        print(f"conduit conformance: {exc}", file=sys.stderr)
        return 2
    print(report.table())
    if a.report:
        with open(a.report, "w") as fh:
            fh.write(report.to_json())
    return 0 if report.ok else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
