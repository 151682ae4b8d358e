"""Convergence checks: the framework's reference workload reaches the same return
threshold within the same step budget with Conduit as natively, over fixed seeds.

Each workload a harness offers becomes the check ``convergence/<workload>``."""

from __future__ import annotations

from .registry import check, ensure

SEEDS = (0,)


@check("convergence/*", needs=("convergence",), level="convergence")
def convergence(ctx, workload: str, run) -> None:
    """Conduit reaches the reference return within the native budget (fixed seeds)."""
    for seed in SEEDS:
        native = run("native", seed)
        conduit = run("conduit", seed)
        ensure(conduit.reached or not native.reached,
               f"seed {seed}: native reached the threshold in {native.env_steps} env steps, Conduit did not "
               f"within the same budget (returns {conduit.returns[-3:]})")
