"""The output pool's promise: a delivered batch stays valid for ``reuse_outputs`` more deliveries
to the learner, also when a data plane prepares batches ahead (they take entries of their own)."""

import time

import numpy as np
import pytest
import torch

from conduit_core import ExperienceDataPlane, Schedule
from conduit_core.output_pool import OutputPool

from .test_prioritized_step import filled


def test_a_batch_survives_kept_deliveries_and_growth_keeps_that():
    pool = OutputPool(2, {"x": ((3,), np.dtype(np.float32))})
    seen = []
    for k in range(5):
        arrays, _ = pool.get((4,))
        arrays["x"][:] = k
        seen.append(arrays["x"])
        if k == 2:
            pool.reserve(3)   # grows while a batch is held: it must survive 2 more deliveries still
    assert pool.depth == 5
    assert seen[2][0, 0] == 2 and seen[3][0, 0] == 3 and seen[4][0, 0] == 4
    ptrs = {a.ctypes.data for a in seen[2:]}
    assert len(ptrs) == 3


@pytest.mark.parametrize("n_step", [None, 1])
@pytest.mark.parametrize("depth, g_del", [(2, 1), (3, 2)])
def test_prepared_batches_never_overwrite_the_one_the_learner_holds(n_step, depth, g_del):
    buf = filled(seed=0, capacity=64, reuse=2)
    b = buf.sample(32)
    buf.update_priorities(b.slots, np.random.default_rng(1).random(32) * 10, seqs=b.seqs)
    edp = ExperienceDataPlane(buffer=buf, schedule=Schedule.overlapped(depth=depth, delivery_granularity=g_del))
    try:
        held = edp.deliver(8, n_step=n_step)
        obs, weights = held["obs"].clone(), held.weights.clone()
        time.sleep(0.5)   # the worker prepares up to depth (+ spares) ahead meanwhile
        assert torch.equal(held["obs"], obs) and torch.equal(held.weights, weights)
        nxt = edp.deliver(8, n_step=n_step)
        assert torch.equal(held["obs"], obs)   # one more delivery: still valid (reuse_outputs=2)
        assert held["obs"].data_ptr() != nxt["obs"].data_ptr()
    finally:
        edp.close()
