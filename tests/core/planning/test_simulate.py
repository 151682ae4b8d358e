"""`conduit simulate`: the arithmetic behaves as its assumptions say (pure functions, no timing)."""

import subprocess
import sys

import pytest

from conduit_core.errors import ConfigError
from conduit_core.planning.simulate import CLUSTERS, WORKLOADS, allreduce_s, experience_s, simulate


def by(points, layout, mode="sequential"):
    return {p.gpus: p for p in points if p.layout == layout and p.mode == mode}


@pytest.mark.parametrize("cluster", sorted(CLUSTERS))
@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_one_node_is_the_same_for_both_layouts_and_the_central_node_is_the_bottleneck(cluster, workload):
    pts = simulate(cluster, workload, scaling="weak")
    central, sharded = by(pts, "central"), by(pts, "sharded")
    assert central[8].iteration_s == pytest.approx(sharded[8].iteration_s)
    # weak scaling: what crosses the central node grows with the GPUs; a shard serves its node only
    assert central[1024].experience_s > 50 * central[16].experience_s / 2
    assert sharded[1024].experience_s < 2 * sharded[16].experience_s
    for g in central:
        assert sharded[g].iteration_s <= central[g].iteration_s + 1e-12


def test_strong_scaling_splits_the_global_batch_and_drops_counts_below_one_row():
    pts = by(simulate("a100", "grpo-llm", scaling="strong", global_batch=64), "sharded")
    assert sorted(pts) == [8, 16, 32, 64]
    assert pts[16].compute_s == pytest.approx(pts[8].compute_s / 2)


def test_overlap_hides_only_what_compute_covers():
    pts = simulate("a100", "dqn-atari", scaling="weak")
    seq, ovl = by(pts, "sharded"), by(pts, "sharded", "overlapped")
    for g in seq:
        assert ovl[g].exposed_s == pytest.approx(max(0.0, seq[g].experience_s - seq[g].compute_s))


def test_allreduce_grows_with_nodes_and_experience_layouts_are_checked():
    c = CLUSTERS["a100"]()
    assert allreduce_s(c, 8, 1e9) < allreduce_s(c, 64, 1e9) < allreduce_s(c, 1024, 1e9)
    with pytest.raises(ConfigError, match="layout"):
        experience_s(c, WORKLOADS["dqn-atari"], 16, "p2p", 32)
    with pytest.raises(ConfigError, match="gpus"):
        simulate("a100", "dqn-atari", gpus=(12,))
    with pytest.raises(ConfigError, match="cluster"):
        simulate("tpu", "dqn-atari")


def test_cli_prints_the_assumptions_beside_the_table():
    r = subprocess.run([sys.executable, "-m", "conduit_core.cli", "simulate", "--cluster", "a100", "--workload",
                        "dqn-atari", "--scaling", "weak"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "# network:" in r.stdout and "# workload dqn-atari" in r.stdout and "1024" in r.stdout
