"""Priorities given as TD errors (``abs_floor``): each row gets ``max(|p|, abs_floor)``, in the
native update and in the Python route alike, float32 or float64, bit for bit the trees that the
floored priorities given directly leave; NaN is still refused and nothing changes."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from conduit_core import ConfigError, ExperienceBuffer, Prioritized, SpecError

from ..helpers import SPEC, rollout

FLOOR = 1e-12


def filled(seed: int) -> tuple[ExperienceBuffer, object]:
    buf = ExperienceBuffer(spec=SPEC, capacity=64, selector=Prioritized(alpha=0.6, eps=0.0), seed=seed)
    buf.add(rollout(50))
    batch = buf.sample(24)
    buf.add(rollout(30, 50))   # wrapped: some delivered slots now hold newer rows (skipped)
    return buf, batch


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**16), dtype=st.sampled_from([np.float64, np.float32]),
       route=st.sampled_from(["native", "list", "tensor", "strided"]))
def test_floored_td_errors_leave_the_trees_the_floored_priorities_leave(seed, dtype, route):
    rng = np.random.default_rng(seed)
    td = (rng.standard_normal(24) * rng.choice([1e-14, 1.0, 30.0], 24)).astype(dtype)
    td[rng.integers(0, 24, 3)] = 0.0
    want, batch_w = filled(seed)
    got, batch_g = filled(seed)
    n_want = want.update_priorities(batch_w.slots, np.maximum(np.abs(td.astype(np.float64)), FLOOR), seqs=batch_w.seqs)
    given_td = {"native": td, "list": td.tolist(), "tensor": torch.from_numpy(td.copy()),
                "strided": np.repeat(td, 2)[::2]}[route]
    n_got = got.update_priorities(batch_g.slots, given_td, seqs=batch_g.seqs, abs_floor=FLOOR)
    assert n_got == n_want
    for a, b in zip(got.selector.index.trees()[:2], want.selector.index.trees()[:2]):
        np.testing.assert_array_equal(a, b)
    assert got.selector.max_priority == want.selector.max_priority
    got.close(), want.close()


def test_nan_is_refused_with_a_floor_too_and_changes_nothing():
    buf, batch = filled(0)
    before = [t.copy() for t in buf.selector.index.trees()[:2]]
    td = np.ones(24)
    td[5] = np.nan
    with pytest.raises(SpecError, match="priorities"):
        buf.update_priorities(batch.slots, td, seqs=batch.seqs, abs_floor=FLOOR)
    for t, b in zip(buf.selector.index.trees()[:2], before):
        np.testing.assert_array_equal(t, b)
    buf.close()


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), True, "1e-12"])
def test_a_bad_floor_is_named(bad):
    buf, batch = filled(1)
    with pytest.raises(ConfigError, match="abs_floor"):
        buf.update_priorities(batch.slots, np.ones(24), seqs=batch.seqs, abs_floor=bad)
    buf.close()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_the_native_update_takes_td_errors_itself(dtype):
    """Negative, zero and tiny TD errors, float32 or float64, are floored in the one native
    call (it does not decline them to the Python route)."""
    buf, batch = filled(2)
    td = np.linspace(-3, 3, 24).astype(dtype)
    td[:3] = [0.0, 1e-20, -1e-20]
    want, batch_w = filled(2)
    n_want = want.update_priorities(batch_w.slots, np.maximum(np.abs(td.astype(np.float64)), FLOOR), seqs=batch_w.seqs)
    with buf.lock.mutex:
        n = buf.selector.update_delivered(batch.slots, batch.seqs, td, buf.meta["seq"], abs_floor=FLOOR)
        with pytest.raises(SpecError, match="priorities"):   # no floor: negative TD errors refused, nothing set
            buf.selector.update_delivered(batch.slots, batch.seqs, td, buf.meta["seq"])
    assert n == n_want > 0
    for a, b in zip(buf.selector.index.trees()[:2], want.selector.index.trees()[:2]):
        np.testing.assert_array_equal(a, b)
    buf.close(), want.close()


def test_a_selector_written_before_abs_floor_still_takes_td_errors():
    """A selector whose update_delivered has the older signature: the Python route floors."""
    class OlderSelector(Prioritized):
        def update_delivered(self, slots, seqs, priorities, stored_seqs):
            return super().update_delivered(slots, seqs, priorities, stored_seqs)
    td = np.linspace(-2, 2, 24)
    bufs = []
    for sel in (OlderSelector(alpha=0.6, eps=0.0), Prioritized(alpha=0.6, eps=0.0)):
        buf = ExperienceBuffer(spec=SPEC, capacity=64, selector=sel, seed=4)
        buf.add(rollout(50))
        batch = buf.sample(24)
        assert buf.update_priorities(batch.slots, td, seqs=batch.seqs, abs_floor=np.int64(0) if not bufs else 0.0) == 24
        bufs.append(buf)
    for a, b in zip(bufs[0].selector.index.trees()[:2], bufs[1].selector.index.trees()[:2]):
        np.testing.assert_array_equal(a, b)
    for b in bufs:
        b.close()


def test_a_selector_whose_update_declines_with_none_is_warned_and_updated_by_the_reference():
    """The contract before 0.2 let ``update_delivered`` answer None to decline; such a selector
    still gets its update (the reference's), with a DeprecationWarning naming the fix."""
    class Declining(Prioritized):
        def update_delivered(self, slots, seqs, priorities, stored_seqs, *, abs_floor=None):
            return None
    bufs = []
    for sel in (Declining(alpha=0.6), Prioritized(alpha=0.6)):
        buf = ExperienceBuffer(spec=SPEC, capacity=64, selector=sel, seed=4)
        buf.add(rollout(50))
        batch = buf.sample(24)
        if not bufs:
            with pytest.warns(DeprecationWarning, match="must now return how many rows"):
                assert buf.update_priorities(batch.slots, np.linspace(0.1, 2, 24), seqs=batch.seqs) == 24
        else:
            assert buf.update_priorities(batch.slots, np.linspace(0.1, 2, 24), seqs=batch.seqs) == 24
        bufs.append(buf)
    for a, b in zip(bufs[0].selector.index.trees()[:2], bufs[1].selector.index.trees()[:2]):
        np.testing.assert_array_equal(a, b)
    for b in bufs:
        b.close()
