"""Module-level runs for tests/conformance/test_convergence_runs.py: a spawned worker imports them by name."""

import os

from conduit_conformance.harness import ConvergenceResult


def where(path: str, seed: int) -> ConvergenceResult:
    """Reports the process it ran in (as env_steps) and its arguments (as returns)."""
    return ConvergenceResult(True, os.getpid(), [float(seed), 1.0 if path == "conduit" else 0.0])


def fails(path: str, seed: int) -> ConvergenceResult:
    if seed == 1:
        raise ValueError(f"run {path} {seed} failed")
    return where(path, seed)


def dies(path: str, seed: int) -> ConvergenceResult:
    os._exit(3)
