"""The ``conduit`` command line: benchmarks, conformance, machine info.

    conduit info                       what this machine offers (tiers, C helper, versions)
    conduit bench buffer [...]         the buffer benchmark (Conduit vs RLlib's buffers)
    conduit bench rllib-dqn [...]      unmodified RLlib vs RLlib with Conduit (adapter)
    conduit bench rllib-learners [...] the same for DQN with num_learners 0, 1 and 2, as ratios
    conduit conformance ADAPTER        the conformance suite's table for an adapter
    conduit new-adapter NAME           scaffold an adapter package that passes the suite
    conduit probe                      measure this machine's memory tiers and links
    conduit plan --transition-bytes B --capacity N [--topology a100x8]   the placement and its costs
    conduit tune dqn-synthetic|rllib-dqn   cost model: predicted vs measured for every configuration
    conduit simulate [--cluster a100|frontier] [--workload ...]   scaling to 1,024 GPUs on paper

``bench``/``tune`` workloads and the ``conformance``/``new-adapter`` commands come from the packages
that own them (entry points); the core imports none of them. A missing framework is named with the fix.
"""

from __future__ import annotations

import argparse
import sys


def _cmd_info(args: list[str]) -> int:
    argparse.ArgumentParser(prog="conduit info", description="What this machine offers Conduit: tiers, the C "
                            "helpers, versions.").parse_args(args)
    from importlib.metadata import PackageNotFoundError, version

    import numpy as np

    from . import __version__
    try:
        torch_version: str | None = version("torch")
    except PackageNotFoundError:
        torch_version = None
    try:
        from ._native import _sumtree  # noqa: F401 - the C helpers are built, or none is
        helpers = "C helper"
    except ImportError:
        helpers = "numpy fallback (no C compiler at install)"
    # the CUDA tiers need a device only a CUDA build of torch reaches: a CPU build ("+cpu") is answered
    # without importing torch, which is most of this command's time otherwise
    cuda = torch_version is not None and "+cpu" not in torch_version and _torch_sees_cuda()
    tiers = [t for t in TIER_NAMES if cuda or t not in CUDA_TIERS]
    shown = torch_version or "not installed (pip install torch==2.13.0, the CPU wheel, first)"
    print(f"conduit {__version__}  torch {shown}  numpy {np.__version__}")
    print(f"tiers available: {', '.join(tiers)}")
    print(f"prioritized index: {helpers}")
    return 0


# memory.tiers.Tier's names in its order, and those that need CUDA (that module imports torch, which
# `info` avoids; tests/core/test_cli.py holds these equal to Tier)
TIER_NAMES = ("pageable", "shared", "pinned", "device", "remote")
CUDA_TIERS = ("pinned", "device")


def _torch_sees_cuda() -> bool:
    from .memory.tiers import cuda_available
    return cuda_available()


# Workloads, tuning campaigns and extra commands are contributed by the packages that own them
# (benchmarks, conduit_rllib, the conformance suite...) through entry points, so the core imports
# none of them: pyproject.toml's [project.entry-points."conduit.bench" | "conduit.tune" | "conduit.commands"].
BENCH_GROUP, TUNE_GROUP, COMMAND_GROUP = "conduit.bench", "conduit.tune", "conduit.commands"


def _contributed(group: str) -> dict:
    from importlib.metadata import entry_points
    return {ep.name: ep for ep in entry_points(group=group)}


# where each missing module comes from (from a checkout: the folder pip installs; from the registry: its name)
INSTALL_HINTS = {
    "conduit_benchmarks": "the lab: pip install -e benchmarks (conduit-benchmarks)",
    "conduit_rllib": "the RLlib adapter: pip install -e adapters/conduit_rllib (conduit-rllib)",
    "ray": "the RLlib adapter, which brings ray[rllib]: pip install -e adapters/conduit_rllib",
    "conduit_verl": "the verl adapter: pip install -e adapters/conduit_verl (conduit-verl)",
    "verl": "the verl adapter, which brings verl: pip install -e adapters/conduit_verl",
    "conduit_srl": "the SRL adapter: pip install -e adapters/conduit_srl, in SRL's venv (scripts/srl)",
    "rlsrl": "SRL itself, from a copy of its source: bash scripts/srl/setup-srl-venv.sh SRC VENV .",
    "scipy": "the suite's statistics: pip install -e '.[test]'",
    "ale_py": "the Atari workload: pip install -e 'adapters/conduit_rllib[atari]'",
    "cv2": "the Atari workload: pip install -e 'adapters/conduit_rllib[atari]'",
}


def install_hint(module: str | None, fallback: str) -> str:
    top = (module or "").split(".")[0]
    return INSTALL_HINTS.get(top, INSTALL_HINTS.get(fallback, f"install the package that provides {top or fallback}"))


def _load(ep, what: str):
    try:
        return ep.load()
    except ImportError as exc:
        package = ep.value.split(":")[0].split(".")[0]
        print(f"{what}: cannot import {ep.value} ({exc}). Fix: install {install_hint(exc.name, package)}",
              file=sys.stderr)
        return None


def _dispatch(group: str, prog: str, args: list[str], blurb: str) -> int:
    found = _contributed(group)
    if not args or args[0] in ("-h", "--help"):
        print(f"usage: {prog} {{{','.join(sorted(found)) or '(none installed)'}}} [options]\n\n{blurb}")
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in found:
        print(f"{prog}: unknown workload {name!r}; expected one of {sorted(found) or '(none installed)'}. Fix: "
              f"workloads come from installed packages ({group!r} entry points); for the project's own, install "
              f"{INSTALL_HINTS['conduit_benchmarks']}", file=sys.stderr)
        return 2
    fn = _load(found[name], f"{prog} {name}")
    if fn is None:
        return 2
    rc = fn(rest)
    return rc if isinstance(rc, int) else 0


def _cmd_bench(args: list[str]) -> int:
    return _dispatch(BENCH_GROUP, "conduit bench", args, "Runs a workload side by side with its baseline and "
                     "prints ratios. `conduit bench WORKLOAD --help` lists the options.")


def _cmd_tune(args: list[str]) -> int:
    return _dispatch(TUNE_GROUP, "conduit tune", args, "Profiles briefly, predicts every configuration (placement "
                     "x overlap x granularity) with the cost model, measures them all and prints predicted vs "
                     "measured.")


def _cmd_probe(args: list[str]) -> int:
    p = argparse.ArgumentParser(prog="conduit probe", description="Measure this machine's tiers and links.")
    p.add_argument("--out", default=None, help="write the topology as JSON here")
    p.add_argument("--mib", type=int, default=256, help="copy size for the bandwidth measurements")
    p.add_argument("--remote-node", action="append", default=[], metavar="RESOURCE",
                   help="also measure the Ray node that advertises this custom resource, as a 'remote' tier "
                        "(repeatable; the name a ShardSpec(tier='remote', node=...) uses)")
    p.add_argument("--ray-address", default="auto", help="the Ray cluster to join for --remote-node")
    a = p.parse_args(args)
    from .planning.topology import probe, with_remote_nodes
    t = probe(nbytes=a.mib << 20)
    if a.remote_node:
        import ray
        try:
            ray.init(address=a.ray_address, include_dashboard=False, log_to_driver=False, configure_logging=False)
        except ConnectionError as exc:
            raise SystemExit(f"conduit probe --remote-node: no Ray cluster at --ray-address={a.ray_address} ({exc}). "
                             "Fix: start the cluster first (ray start --head; each node with --resources "
                             "'{\"NAME\": 1}') or pass its address") from None
        try:
            t = with_remote_nodes(t, a.remote_node)
        finally:
            ray.shutdown()
    for tier in t.tiers:
        print(f"tier {tier.name:8s} {tier.kind:9s} {tier.capacity_bytes / 1e9:8.1f} GB")
    for line in t.notes:
        print(f"  {line}")
    if a.out:
        t.save(a.out)
        print(f"topology written to {a.out}")
    return 0


def _cmd_plan(args: list[str]) -> int:
    p = argparse.ArgumentParser(prog="conduit plan",
                                description="Print the placement Conduit would choose, with predicted costs and "
                                            "the fixed placements of existing systems.")
    p.add_argument("--topology", default="probe", help="'probe' (this machine), a preset (a100x8, mi250x8) or a JSON file")
    p.add_argument("--transition-bytes", type=int, required=True)
    p.add_argument("--capacity", type=int, required=True)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--inserts-per-step", type=float, default=1.0)
    p.add_argument("--learner", default="host", help="the learner's tier, e.g. gpu0")
    p.add_argument("--actors", default="host")
    a = p.parse_args(args)
    from .errors import ConduitError
    from .planning.placement import BASELINES, Workload, fixed_plan, plan
    from .planning.topology import PRESETS, Topology, probe
    topo = probe(nbytes=32 << 20, reps=3) if a.topology == "probe" else (
        PRESETS[a.topology]() if a.topology in PRESETS else Topology.load(a.topology))
    w = Workload(transition_bytes=a.transition_bytes, capacity=a.capacity, batch_size=a.batch_size,
                 inserts_per_step=a.inserts_per_step, learner=a.learner, actors=a.actors)
    try:
        best = plan(w, topo)
    except ConduitError as exc:
        print(f"conduit plan: {exc}", file=sys.stderr)
        return 1
    print(f"topology {topo.name} ({topo.source})")
    print(best.render())
    print("baselines (fixed placements):")
    for b in BASELINES:
        try:
            q = fixed_plan(b, w, topo)
            print(f"  {b:10s} {q.total_s * 1e3:9.3f} ms per step  ({q.total_s / best.total_s:.2f}x conduit's)")
        except ConduitError as exc:
            print(f"  {b:10s} cannot hold it: {str(exc)[:90]}")
    return 0


def _cmd_simulate(args: list[str]) -> int:
    from .planning.simulate import CLUSTERS, WORKLOADS, assumptions, simulate
    p = argparse.ArgumentParser(prog="conduit simulate",
                                description="Strong and weak scaling of the experience path and of the iteration "
                                            "time, 8 to 1,024 GPUs, from the node presets and stated assumptions "
                                            "(on paper: nothing here is measured).")
    p.add_argument("--cluster", choices=sorted(CLUSTERS), action="append")
    p.add_argument("--workload", choices=sorted(WORKLOADS), action="append")
    p.add_argument("--scaling", choices=["weak", "strong"], action="append")
    p.add_argument("--mode", choices=["sequential", "overlapped"], default="sequential",
                   help="the schedule's mode (Schedule.mode)")
    p.add_argument("--json", default=None, help="write every point (both modes) here")
    p.add_argument("--plot", default=None, help="write a PNG of the iteration time (needs matplotlib)")
    a = p.parse_args(args)
    points = []
    for cluster in a.cluster or ["a100", "frontier"]:
        for workload in a.workload or ["dqn-atari", "grpo-llm"]:
            for line in assumptions(cluster, workload):
                print(f"# {line}")
            for scaling in a.scaling or ["weak", "strong"]:
                pts = simulate(cluster, workload, scaling=scaling)
                points += pts
                rows = {}
                for q in pts:
                    if q.mode == a.mode:
                        rows.setdefault(q.gpus, {})[q.layout] = q
                print(f"{cluster} {workload} {scaling} scaling ({a.mode}): ms per iteration "
                      f"[experience path], samples/s, sharded vs central")
                print(f"  {'GPUs':>5s} {'batch/GPU':>9s} {'central':>20s} {'sharded':>20s} {'speedup':>8s} "
                      f"{'sharded eff.':>12s}")
                first = None
                for g, r in sorted(rows.items()):
                    c, s = r["central"], r["sharded"]
                    first = first or s
                    ideal = first.samples_per_s * g / first.gpus
                    print(f"  {g:5d} {s.per_gpu_batch:9.1f} {c.iteration_s * 1e3:9.2f} [{c.experience_s * 1e3:8.2f}]"
                          f" {s.iteration_s * 1e3:9.2f} [{s.experience_s * 1e3:8.2f}] "
                          f"{c.iteration_s / s.iteration_s:7.2f}x {s.samples_per_s / ideal:11.0%}")
            print()
    if a.json:
        import json
        with open(a.json, "w") as fh:
            json.dump([q.to_dict() for q in points], fh, indent=1)
        print(f"wrote {a.json}")
    if a.plot:
        _plot_simulation(points, a.mode, a.plot)
    return 0


def _plot_simulation(points, mode: str, path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("conduit simulate --plot: matplotlib is not installed. Fix: pip install matplotlib", file=sys.stderr)
        return
    keys = sorted({(q.cluster, q.workload, q.scaling) for q in points})
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.4), squeeze=False)
    for ax, key in zip(axes[0], keys):
        for layout, style in (("central", "--o"), ("sharded", "-s")):
            pts = sorted((q for q in points if (q.cluster, q.workload, q.scaling) == key and q.layout == layout
                          and q.mode == mode), key=lambda q: q.gpus)
            ax.plot([q.gpus for q in pts], [q.iteration_s * 1e3 for q in pts], style, label=layout, ms=3)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{key[0].split()[0]} {key[1]} {key[2]}", fontsize=8)
        ax.set_xlabel("GPUs")
        ax.set_ylabel("ms / iteration")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


BUILTIN = {"info": _cmd_info, "bench": _cmd_bench, "probe": _cmd_probe, "plan": _cmd_plan, "tune": _cmd_tune,
           "simulate": _cmd_simulate}


def _commands() -> dict:
    """The core's commands plus those contributed through ``conduit.commands`` (conformance, new-adapter)."""
    cmds = dict(BUILTIN)
    for name, ep in _contributed(COMMAND_GROUP).items():
        cmds.setdefault(name, lambda args, ep=ep, name=name: (lambda fn: 2 if fn is None else fn(args))(
            _load(ep, f"conduit {name}")))
    return cmds


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="conduit", description="Conduit: the Experience Data Plane for distributed RL.",
        epilog="commands: info | bench WORKLOAD | conformance ADAPTER | new-adapter NAME | probe | plan | tune "
               "WORKLOAD | simulate  (each takes --help)")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    commands = _commands()
    parser.add_argument("command", nargs="?", choices=sorted(commands))
    parser.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    if ns.version:
        from . import __version__
        print(__version__)
        return 0
    if ns.command is None:
        parser.print_help()
        return 0
    return commands[ns.command](ns.args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
