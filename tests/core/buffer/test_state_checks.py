"""A state is checked before anything of it loads: a damaged frame pool, a part of the wrong kind, a prefetch in flight.
Each test failed before its fix."""

import numpy as np

import pytest

from conduit_core import (ExperienceBuffer, ExperienceDataPlane, ExperienceSpec, Prioritized,
                          Schedule, StateError)


from ..helpers import SPEC, assert_same_state, rollout

from ..schema.test_framestack import fill, make


def test_a_damaged_frame_pool_state_changes_nothing():
    rng = np.random.default_rng(0)
    a, b = make(100), make(100)
    fill(a, rng, [30, 20])
    fill(b, rng, [10])
    st = a.state_dict()
    st["pools"]["frames"] = dict(st["pools"]["frames"])
    st["pools"]["frames"]["frames"] = st["pools"]["frames"]["frames"][:, :5]
    before = (b.inserted, len(b))
    with pytest.raises(StateError, match="pools"):
        b.load_state_dict(st)
    assert (b.inserted, len(b)) == before


def test_state_round_trip_with_a_prefetch_in_flight_and_load_into_a_prefetching_plane():
    """state_dict waits for an in-flight prefetch (its draw is undone before the RNG is saved), and
    loading into a plane with prepared batches keeps the loaded RNG (the undo happens first)."""
    import torch
    from conduit_core import ExperienceBuffer
    spec = ExperienceSpec.transition(obs_shape=(3,))

    def plane(seed):
        return ExperienceDataPlane(buffer=ExperienceBuffer(spec=spec, capacity=100, selector=Prioritized(), seed=seed),
                                   schedule=Schedule.overlapped())

    def rollout(n, base):
        return {"obs": np.arange(base, base + n, dtype=np.float32)[:, None].repeat(3, 1),
                "next_obs": np.zeros((n, 3), np.float32), "action": np.zeros(n, np.int64),
                "reward": np.zeros(n, np.float32), "terminated": np.zeros(n, bool), "truncated": np.zeros(n, bool)}
    for _ in range(20):
        a, b = plane(3), plane(9)
        for i in range(5):
            a.ingest(rollout(6, 6 * i), source=i)
            b.ingest(rollout(6, 6 * i), source=i)
        a.deliver(4)
        b.deliver(4)  # b now has a prefetch prepared (or in flight) when the state is loaded
        b.load_state_dict(a.state_dict())
        for _ in range(3):
            x, y = a.deliver(8), b.deliver(8)
            assert all(torch.equal(x[k], y[k]) for k in x)
        a.close()
        b.close()


@pytest.mark.parametrize("part, value, names", [("counters", 5, "counters"), ("pools", [1], "pools"),
                                                 ("buffer", None, "state")])
def test_a_state_with_a_part_of_the_wrong_kind_is_named_and_changes_nothing(part, value, names):
    """Found in review (session 16): these raised AttributeError, TypeError or KeyError."""
    from conduit_core import StateError
    buf = ExperienceBuffer(spec=SPEC, capacity=8)
    buf.add(rollout(3))
    edp = ExperienceDataPlane(buffer=buf)
    state = edp.state_dict()
    before = edp.state_dict()
    if part == "buffer":
        state.pop("buffer")
    else:
        state["buffer"] = {**state["buffer"], part: value}
    with pytest.raises(StateError, match=f"^{names}: expected .*nothing was loaded"):
        edp.load_state_dict(state)
    after = edp.state_dict()
    assert after["ticket"] == before["ticket"] and after["buffer"]["counters"] == before["buffer"]["counters"]
    edp.close()


@pytest.mark.parametrize("change", [dict(inserted=1_000_000), dict(holes=3), dict(floor=120)],
                         ids=["inserted far past the rows", "holes that are not there", "a floor above stored rows"])
def test_counters_that_disagree_with_the_rows_are_refused(change):
    """A state whose counters place its rows outside the live window would serve old rows and write
    the next seq far from them: refused before anything loads."""
    donor = ExperienceBuffer(spec=SPEC, capacity=100)
    for _ in range(7):
        donor.add(rollout(20))                   # seqs 40..139 stored
    state = donor.state_dict()
    state["counters"] = {**state["counters"], **change}
    target = ExperienceBuffer(spec=SPEC, capacity=100)
    before = target.state_dict()
    with pytest.raises(StateError, match="counters"):
        target.load_state_dict(state)
    assert_same_state(before, target.state_dict())
    target.load_state_dict(donor.state_dict())   # the untouched state loads
    donor.close()
    target.close()
