"""The sum tree behind prioritized selection: its C and numpy paths against a plain cumulative-sum search."""

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
