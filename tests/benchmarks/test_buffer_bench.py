"""The buffer bench (``conduit bench buffer``) and its numpy floor, at tiny sizes: the report's
shape and the floor's guarantee, never a timing."""

import json

import numpy as np
import pytest

pytest.importorskip("conduit_benchmarks", reason="the lab is its own distribution: pip install -e benchmarks")


def test_buffer_benchmark_smoke(tmp_path):
    """The benchmark runs end to end (tiny sizes) and writes its report; no timing asserted."""
    from conduit_benchmarks.buffer import bench as bench_buffer
    out = tmp_path / "b.json"
    report = bench_buffer.main(["--quick", "--json", str(out)])
    data = json.loads(out.read_text())
    assert set(data["workloads"]) == {"cartpole", "atari"}
    assert report["workloads"]["cartpole"]["uniform"]["B32"]["conduit_s"] > 0
    ring = data["workloads"]["cartpole"]["uniform"]["plain_ring"]   # compared at equal guarantees: k + 1 sets
    assert (ring["B32"]["outputs"], ring["B32_reuse4"]["outputs"]) == (2, 5)


def test_plain_ring_keeps_a_batch_for_its_outputs():
    """The plain ring's batch stays valid through one sample fewer than it has output sets: the
    guarantee of the Conduit ring it is timed against (reuse_outputs=k against k + 1 sets)."""
    from conduit_benchmarks.buffer.peers import PlainRing
    ring = PlainRing(100, {"x": np.zeros((1, 3)), "action": np.zeros(1)}, outputs=4)
    ring.add({"x": np.arange(300.0).reshape(100, 3), "action": np.arange(100.0)})
    first = ring.sample(8)
    kept = first["x"].copy()
    for _ in range(3):
        assert ring.sample(8)["x"] is not first["x"]
    np.testing.assert_array_equal(first["x"], kept)
    assert ring.sample(8)["x"] is first["x"]   # the 5th sample reuses the first one's set
