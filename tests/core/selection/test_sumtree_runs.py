"""An insert's run of slots at one priority goes to the sum tree in one native call
(``PriorityIndex.set_range``): the trees it leaves must be the ones the slot-by-slot update
leaves, bit for bit (the draws and weights read them), wrapping runs included."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from conduit_core.selection.sumtree import HAVE_C, PriorityIndex, _c

pytestmark = pytest.mark.skipif(not HAVE_C, reason="C helper not built")

runs = st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 200),
                          st.sampled_from([0.0, 1.0, 0.5, 3.25, 1e-300, 7.0e12])), min_size=1, max_size=12)


@settings(max_examples=150, deadline=None)
@given(capacity=st.integers(1, 300), runs=runs)
def test_a_run_leaves_the_trees_the_slot_by_slot_update_leaves(capacity, runs):
    whole, by_slot, numpy_route = (PriorityIndex(capacity, use_c=True), PriorityIndex(capacity, use_c=True),
                                   PriorityIndex(capacity, use_c=False))
    for start, n, value in runs:
        start, n = start % capacity, min(n, capacity)
        whole.set_range(start, n, value)
        numpy_route.set_range(start, n, value)
        by_slot.set((start + np.arange(n)) % capacity, np.full(n, value))
    for a, b in ((whole, by_slot), (whole, numpy_route)):
        np.testing.assert_array_equal(a.trees()[0], b.trees()[0])
        np.testing.assert_array_equal(a.trees()[1], b.trees()[1])


@pytest.mark.parametrize("start, n", [(-1, 1), (10, 1), (0, 11), (3, -1)])
def test_a_run_out_of_range_is_refused_and_changes_nothing(start, n):
    idx = PriorityIndex(10, use_c=True)
    idx.set_range(0, 10, 2.0)
    before = [t.copy() for t in idx.trees()[:2]]
    with pytest.raises(IndexError, match="out of range"):
        _c.update_run(*idx.trees()[:2], idx.size, start, n, 10, 1.0)
    for t, b in zip(idx.trees()[:2], before):
        np.testing.assert_array_equal(t, b)
