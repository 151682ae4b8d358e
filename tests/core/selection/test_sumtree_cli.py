import json
import subprocess
import sys

import numpy as np
import pytest

from conduit_core.selection.sumtree import HAVE_C, PriorityIndex


@pytest.mark.parametrize("use_c", [pytest.param(True, marks=pytest.mark.skipif(not HAVE_C, reason="C helper not built")),
                                   False])
def test_priority_index_matches_a_plain_cumsum_search(use_c):
    rng = np.random.default_rng(0)
    idx = PriorityIndex(1000, use_c=use_c)
    p = rng.random(1000) * (rng.random(1000) > 0.3)  # ~30% zero priorities
    idx.set(np.arange(1000), p)
    assert idx.total == pytest.approx(p.sum())
    assert idx.min == pytest.approx(p[p > 0].min())
    v = rng.random(5000) * idx.total
    want = np.searchsorted(np.cumsum(p), v, side="right")
    got = idx.find_prefixsum(v)
    np.testing.assert_array_equal(got, want)
    assert (p[got] > 0).all()
    fresh = PriorityIndex(1000, use_c=use_c)
    fresh.rebuild(idx.leaves().copy())
    np.testing.assert_array_equal(fresh.find_prefixsum(v), got)


def test_c_and_numpy_paths_agree_after_updates():
    if not HAVE_C:
        pytest.skip("C helper not built")
    rng = np.random.default_rng(1)
    a, b = PriorityIndex(777, use_c=True), PriorityIndex(777, use_c=False)
    for _ in range(20):
        i = rng.integers(0, 777, 50)
        v = rng.random(50)
        a.set(i, v)
        b.set(i, v)
    np.testing.assert_allclose(a._sum, b._sum)
    q = rng.random(1000) * a.total
    np.testing.assert_array_equal(a.find_prefixsum(q), b.find_prefixsum(q))


def test_cli_help_info_and_unknown_workload():
    run = lambda *a: subprocess.run([sys.executable, "-m", "conduit_core.cli", *a], capture_output=True, text=True)
    assert run("--help").returncode == 0
    assert "tiers available" in run("info").stdout
    r = run("bench", "nope")
    assert r.returncode == 2 and "unknown workload" in r.stderr


def test_buffer_benchmark_smoke(tmp_path):
    """The benchmark runs end to end (tiny sizes) and writes its report; no timing asserted."""
    from conduit_benchmarks import bench_buffer
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
    import numpy as np
    from conduit_benchmarks.plain_ring import PlainRing
    ring = PlainRing(100, {"x": np.zeros((1, 3)), "action": np.zeros(1)}, outputs=4)
    ring.add({"x": np.arange(300.0).reshape(100, 3), "action": np.arange(100.0)})
    first = ring.sample(8)
    kept = first["x"].copy()
    for _ in range(3):
        assert ring.sample(8)["x"] is not first["x"]
    np.testing.assert_array_equal(first["x"], kept)
    assert ring.sample(8)["x"] is first["x"]   # the 5th sample reuses the first one's set


def test_row_gather_benchmark_smoke(tmp_path):
    """The prefetch-distance benchmark runs end to end (tiny sizes), leaves the distance as it
    found it and writes its report; no timing asserted."""
    from conduit_benchmarks import bench_row_gather
    from conduit_core._native import _rows
    before = _rows.set_rows_ahead(8)
    _rows.set_rows_ahead(before)
    out = tmp_path / "g.json"
    bench_row_gather.main(["--capacity", "2000", "--batch", "8", "--reps", "1", "--calls", "10", "--json", str(out)])
    arms = json.loads(out.read_text())["batches"]["8"]
    assert arms["gather_batch, whole batch first"]["us"] > 0 and len(arms) == 5
    assert _rows.set_rows_ahead(before) == before
