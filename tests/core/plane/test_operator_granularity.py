"""A delivery call of g_del batches gives each batch the distribution of its own draw: for
selectors whose batch items are not independent (stratified prioritized, uniform without
replacement) each batch is its own draw, so the batches equal g_del sequential samples exactly."""

import numpy as np
import pytest

from conduit_core import ExperienceBuffer, ExperienceSpec, Prioritized, Uniform
from conduit_core.plane.delivery_operator import DeliveryOperator
from conduit_core.plane.prepared_deliveries import DeliveryRequest


def filled(selector, seed=3) -> ExperienceBuffer:
    buf = ExperienceBuffer(spec=ExperienceSpec.transition(obs_shape=(2,)), capacity=256, selector=selector, seed=seed)
    rng = np.random.default_rng(0)
    n = 200
    buf.add({"obs": rng.standard_normal((n, 2)).astype(np.float32), "next_obs": np.zeros((n, 2), np.float32),
             "action": rng.integers(0, 2, n), "reward": np.ones(n, np.float32),
             "terminated": np.zeros(n, bool), "truncated": np.zeros(n, bool)})
    if selector.weighted:   # skewed priorities: a stratum of the mass is a region of the slots
        b = buf.sample(64)
        buf.update_priorities(b.slots, np.linspace(0.1, 10, 64), seqs=b.seqs)
    return buf


@pytest.mark.parametrize("make", [lambda: Prioritized(stratified=True), lambda: Uniform(replace=False)],
                         ids=["prioritized-stratified", "uniform-without-replacement"])
@pytest.mark.parametrize("speculative", [False, True])
def test_each_batch_is_its_own_draw(make, speculative):
    a, b = filled(make()), filled(make())
    before = a.sampled
    op = DeliveryOperator(a, [])
    got = op.run(DeliveryRequest("sample", 16), None, granularity=3, speculative=speculative, rows_committed=0,
                 priority_version=0)
    want = [b.sample(16) for _ in range(3)]
    assert [p.batch.slots.tolist() for p in got] == [w.slots.tolist() for w in want]
    assert a.sampled - before == b.sampled - before == 48


def test_independent_items_still_draw_once():
    assert Uniform().independent_items and Prioritized().independent_items
    assert not Uniform(replace=False).independent_items and not Prioritized(stratified=True).independent_items


def test_a_hook_failing_undoes_every_draw():
    a, b = filled(Prioritized(stratified=True)), filled(Prioritized(stratified=True))
    calls = [0]

    def hook(batch):
        calls[0] += 1
        if calls[0] == 2:
            raise RuntimeError("second batch's hook")
        return batch
    op = DeliveryOperator(a, [hook])
    before = a.sampled
    with pytest.raises(RuntimeError):
        op.run(DeliveryRequest("sample", 16), None, granularity=3, speculative=True, rows_committed=0,
               priority_version=0)
    assert a.sampled == before
    assert a.sample(16).slots.tolist() == b.sample(16).slots.tolist()   # the RNG as if nothing was drawn
