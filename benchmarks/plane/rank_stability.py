"""Does a `conduit tune` measurement reproduce its own top-8 order? Re-reads the rounds
stored in tune reports (``rounds_s_per_step``) and sets the predicted order's agreement
beside the measurement's agreement with itself.

    python -m benchmarks.plane.rank_stability docs/results/tune-rllib-dqn/*.json docs/results/history/tune_rllib_*.json

Per size: the predicted top-8's pairs in the confirmed order (strict); the bootstrap chance
that the confirmed top-8 order comes out the same again, and its mean pairs; two halves of
the confirmation rounds (top-8 of one, ordered by the other); and the survey's top-8 ordered
by the confirmation rounds (two separate measurements of the same configurations).
See ``conduit_core.planning.ranking`` for why this is the ceiling for an "identical top-8" criterion.
"""

from __future__ import annotations

import argparse
import json
import statistics

from conduit_core.planning.ranking import concordant_pairs, order_stability, split_half

from ..common import fmt_table


def analyse(report: dict, resamples: int = 2000) -> list[dict]:
    rows = []
    for dims, entry in report["dims"].items():
        rounds = entry.get("rounds_s_per_step")
        if not rounds:
            continue
        survey, confirm = rounds["survey"], rounds["confirm"]
        med_c = {k: statistics.median(v) for k, v in confirm.items()}
        med_s = {k: statistics.median(v) for k, v in survey.items()}
        pred = entry["predicted_s"]
        top_p = sorted(pred, key=pred.get)[:8]
        top_c = sorted(med_c, key=med_c.get)[:8]
        top_s = sorted(med_s, key=med_s.get)[:8]   # all in the confirmation rounds by construction
        stab = order_stability(confirm, top_c, resamples=resamples)
        rows.append({"dims": int(dims), "predicted_pairs": concordant_pairs(top_p, med_c),
                     "predicted_identical": top_p == sorted(top_p, key=med_c.get),
                     "p_identical": stab["p_identical"], "bootstrap_pairs": stab["mean_pairs"],
                     "split_half_pairs": split_half(confirm)["pairs_agree"],
                     "survey_pairs": concordant_pairs(top_s, med_c),
                     "survey_identical": top_s == sorted(top_s, key=med_c.get)})
    return rows


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("reports", nargs="+", help="JSON reports written by `conduit tune rllib-dqn --json`")
    p.add_argument("--resamples", type=int, default=2000)
    a = p.parse_args(argv)
    out = []
    for path in a.reports:
        with open(path) as f:
            rows = analyse(json.load(f), a.resamples)
        if not rows:
            print(f"{path}: no per-round measurements stored; skipped")
            continue
        print(f"\n{path}")
        print(fmt_table([[r["dims"], f"{r['predicted_pairs']}/28", f"{r['p_identical']:.1%}",
                          f"{r['bootstrap_pairs']:.1f}/28", f"{r['split_half_pairs']}/28",
                          f"{r['survey_pairs']}/28" + (" (identical)" if r["survey_identical"] else "")]
                         for r in rows],
                        ["D", "predicted top-8 pairs", "measured order again (bootstrap)", "bootstrap pairs",
                         "split halves", "survey top-8 in confirmed order"]))
        out.append({"report": path, "rows": rows})
    if len(out) > 1:
        print("\nper campaign, over its sizes: mean (min-max) of concordant pairs out of 28")
        span = lambda v: f"{sum(v) / len(v):.1f} ({min(v):.0f}-{max(v):.0f})"
        table = [[o["report"].rsplit("/", 1)[-1], len(o["rows"]),
                  span([r["predicted_pairs"] for r in o["rows"]]), span([r["survey_pairs"] for r in o["rows"]]),
                  span([r["split_half_pairs"] for r in o["rows"]]),
                  f"{max(r['p_identical'] for r in o['rows']):.1%}"] for o in out]
        every = [r for o in out for r in o["rows"]]
        table.append(["all", len(every), span([r["predicted_pairs"] for r in every]),
                      span([r["survey_pairs"] for r in every]), span([r["split_half_pairs"] for r in every]),
                      f"{max(r['p_identical'] for r in every):.1%}"])
        print(fmt_table(table, ["report", "sizes", "predicted top-8", "survey top-8 (a 2nd measurement)",
                                "split halves", "bootstrap: same order again, at most"]))
    return out


if __name__ == "__main__":
    main()
