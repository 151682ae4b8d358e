"""``sample(in_slot_order=True)``: the same draw, its items sorted by ring slot (SRL hands its
batches out so), weights and rows with them; batches prepared several per call sorted each on
its own."""

import numpy as np
import pytest

from conduit_core import ConfigError, ExperienceBuffer, Prioritized, Uniform
from conduit_core.plane.delivery_operator import DeliveryOperator
from conduit_core.plane.prepared_deliveries import DeliveryRequest

from ..helpers import SPEC, rollout


def filled(selector, *, seed=5, capacity=64, rows=100):
    buf = ExperienceBuffer(spec=SPEC, capacity=capacity, selector=selector, seed=seed)
    for start in range(0, rows, 20):   # the ring goes round: slot order is not insertion order
        buf.add(rollout(20, start))
    if selector.weighted:
        slots = np.arange(capacity, dtype=np.int64)
        buf.update_priorities(slots, np.linspace(0.1, 5.0, capacity), seqs=buf.meta["seq"][slots])
    return buf


@pytest.mark.parametrize("selector", [Uniform, lambda: Prioritized(alpha=0.7)], ids=["uniform", "prioritized"])
def test_a_batch_in_slot_order_is_the_same_draw_sorted_by_slot(selector):
    drawn, ordered = filled(selector()), filled(selector())
    for _ in range(20):
        a = drawn.sample(16, beta=0.5 if drawn.selector.weighted else None)
        b = ordered.sample(16, beta=0.5 if drawn.selector.weighted else None, in_slot_order=True)
        order = np.argsort(a.slots, kind="stable")
        assert np.all(np.diff(b.slots) >= 0)
        assert np.array_equal(b.slots, a.slots[order]) and np.array_equal(b.seqs, a.seqs[order])
        for name in a:   # each row its slot's, weights with them
            assert np.array_equal(b[name].numpy(), a[name].numpy()[order]), name
        if a.weights is not None:
            assert np.array_equal(b.weights.numpy(), a.weights.numpy()[order])
    assert drawn.rng.bit_generator.state == ordered.rng.bit_generator.state   # the same draws, no more


def test_batches_drawn_several_per_call_are_each_sorted_on_their_own():
    """Uniform items are independent, so several batches usually come from one draw, split; a
    sorted draw split would give the lowest slots to the first batch. Each is its own draw."""
    request = DeliveryRequest("sample", 8, in_slot_order=True)
    per_call = DeliveryOperator(filled(Uniform()), [])
    one_by_one = filled(Uniform())
    got = per_call.run(request, 0, granularity=4, speculative=False, rows_committed=0, priority_version=0)
    for p in got:
        want = one_by_one.sample(8, in_slot_order=True)
        assert np.array_equal(p.batch.slots, want.slots)


def test_n_step_windows_in_slot_order_are_refused_with_the_fix():
    buf = filled(Uniform())
    with pytest.raises(ConfigError, match="in_slot_order"):
        buf.sample(8, n_step=3, in_slot_order=True)
