"""The RLlib benches' iteration floor: per block, Conduit's iteration less its whole exposed path
(ms per step x steps per iteration), over RLlib's iteration in the same block."""

import pytest

pytest.importorskip("ray.rllib")

from conduit_benchmarks.rllib.bench import iteration_floor  # noqa: E402


def test_the_floor_takes_each_blocks_exposed_time_out_of_that_blocks_iteration():
    rec = {"conduit": {"iter_s": [4.0, 5.0, 4.2], "exposed_ms": [0.5, 1.0, 0.4], "steps": [200, 400, 100]},
           "rllib": {"iter_s": [6.0, 7.0, 8.0]}}
    # two iterations per block: steps count both, the times are per iteration
    got = iteration_floor(rec, block_iters=2)
    floors = sorted([(4.0 - 0.05) / 6.0, (5.0 - 0.2) / 7.0, (4.2 - 0.02) / 8.0])
    assert got == pytest.approx({"min": floors[0], "median": floors[1], "max": floors[2]})
    assert iteration_floor({"conduit": {"iter_s": [], "exposed_ms": [], "steps": []}, "rllib": {"iter_s": []}}, 1) == {}
