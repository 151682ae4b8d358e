"""Placement predictions for the topology presets: Conduit's plan vs greedy, conservative and the
fixed placements of existing systems, at several capacities (model output, no measurement).

    python -m benchmarks.plane.placement [--transition-bytes 7000] [--batch-size 256] [--inserts-per-step 4]
"""

from __future__ import annotations

import argparse

from conduit_core.errors import CapacityError
from conduit_core.planning.placement import (
    BASELINES,
    Workload,
    conservative_plan,
    fixed_plan,
    greedy_plan,
    plan,
)
from conduit_core.planning.topology import PRESETS


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(prog="python -m benchmarks.plane.placement", description=__doc__.split("\n\n")[0])
    p.add_argument("--transition-bytes", type=int, default=7000)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--inserts-per-step", type=float, default=4)
    p.add_argument("--capacities", type=int, nargs="+", default=[1_000_000, 10_000_000, 50_000_000, 100_000_000])
    a = p.parse_args(argv)

    def ms(make) -> str:
        try:
            return f"{make().total_s * 1e3:.3f}"
        except CapacityError:
            return "does not fit"

    lines = ["| topology | capacity | Conduit plan | Conduit | greedy | conservative | " + " | ".join(BASELINES) + " |",
             "|---|---|---|---|---|---|" + "---|" * len(BASELINES)]
    for preset in PRESETS.values():
        t = preset()
        for cap in a.capacities:
            w = Workload(transition_bytes=a.transition_bytes, capacity=cap, batch_size=a.batch_size,
                         inserts_per_step=a.inserts_per_step, learner="gpu0")
            best = plan(w, t)
            shares = sorted(best.fractions().items(), key=lambda kv: -kv[1])
            text = ", ".join(f"{k} {v:.0%}" for k, v in shares[:3]) + (f", +{len(shares) - 3} more" if len(shares) > 3 else "")
            cols = [ms(lambda: greedy_plan(w, t)), ms(lambda: conservative_plan(w, t))]
            cols += [ms(lambda b=b: fixed_plan(b, w, t)) for b in BASELINES]
            lines.append(f"| {t.name} | {cap:,} ({cap * a.transition_bytes / 1e9:.0f} GB) | {text} | "
                         f"**{best.total_s * 1e3:.3f}** | " + " | ".join(cols) + " |")
    out = "\n".join(lines)
    print(out)
    return out


if __name__ == "__main__":
    main()
