"""The ``conduit`` command line: benchmarks, conformance, machine info.

    conduit info                       what this machine offers (tiers, C helper, versions)
    conduit bench buffer [...]         the buffer benchmark (Conduit vs RLlib's buffers)
    conduit bench rllib-dqn [...]      unmodified RLlib vs RLlib with Conduit (adapter)
    conduit conformance ADAPTER        the conformance suite's table for an adapter
    conduit new-adapter NAME           scaffold an adapter package that passes the suite

Subcommands that need a framework import it lazily and say how to install it.
"""

from __future__ import annotations

import argparse
import sys


def _cmd_info(_args: list[str]) -> int:
    import numpy as np
    import torch

    from . import __version__
    from .sumtree import HAVE_C
    from .tiers import Tier, cuda_available
    tiers = [t.value for t in Tier if not t.needs_cuda or cuda_available()]
    print(f"conduit {__version__}  torch {torch.__version__}  numpy {np.__version__}")
    print(f"tiers available: {', '.join(tiers)}")
    print(f"prioritized index: {'C helper' if HAVE_C else 'numpy fallback (no C compiler at install)'}")
    return 0


BENCHES = {
    "buffer": ("benchmarks.bench_buffer", "main", "conduit-edp"),
    "rllib-dqn": ("conduit_rllib.bench", "main_dqn", "conduit-edp[rllib]"),
    "rllib-ppo": ("conduit_rllib.bench", "main_ppo", "conduit-edp[rllib]"),
    "rllib-dqn-atari": ("conduit_rllib.bench", "main_dqn_atari", "conduit-edp[rllib]"),
}


def _cmd_bench(args: list[str]) -> int:
    if not args or args[0] in ("-h", "--help"):
        print("usage: conduit bench {" + ",".join(BENCHES) + "} [options]\n\n"
              "Runs a workload side by side with its baseline and prints ratios. "
              "`conduit bench WORKLOAD --help` lists the options.")
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in BENCHES:
        print(f"conduit bench: unknown workload {name!r}; expected one of {sorted(BENCHES)}", file=sys.stderr)
        return 2
    module, func, extra = BENCHES[name]
    import importlib
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        print(f"conduit bench {name}: cannot import {module} ({exc}). Fix: pip install '{extra}'", file=sys.stderr)
        return 2
    getattr(mod, func)(rest)
    return 0


def _cmd_conformance(args: list[str]) -> int:
    try:
        from conformance.cli import main as conformance_main
    except ImportError as exc:
        print(f"conduit conformance: the conformance suite is not installed ({exc})", file=sys.stderr)
        return 2
    return conformance_main(args)


def _cmd_new_adapter(args: list[str]) -> int:
    from conformance.scaffold import main as scaffold_main
    return scaffold_main(args)


COMMANDS = {"info": _cmd_info, "bench": _cmd_bench, "conformance": _cmd_conformance,
            "new-adapter": _cmd_new_adapter}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="conduit", description="Conduit: the Experience Data Plane for distributed RL.",
        epilog="commands: info | bench WORKLOAD | conformance ADAPTER | new-adapter NAME  (each takes --help)")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    parser.add_argument("command", nargs="?", choices=sorted(COMMANDS))
    parser.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    if ns.version:
        from . import __version__
        print(__version__)
        return 0
    if ns.command is None:
        parser.print_help()
        return 0
    return COMMANDS[ns.command](ns.args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
