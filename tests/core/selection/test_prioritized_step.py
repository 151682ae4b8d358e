"""The prioritized step's shortcuts (issue 18) against the routes they skip.

- ``update_priorities`` with a delivered batch's own numpy arrays is one native call; any other
  input (torch priorities, int32 slots, 2-D arrays, wrong lengths, bad values) takes the checked
  route, with the same trees after and the same errors.
- ``Ring.gather_meta`` (one C pass) returns what fancy indexing returns.
- importance weights come in reused tensors, valid as long as the batch's other outputs.
- large priority trees and ring metadata are lazily mapped zeros (huge pages asked for).
"""

import mmap

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import conduit_core.buffer.ring as ring_mod
from conduit_core import ExperienceBuffer, ExperienceSpec, Prioritized
from conduit_core.errors import SpecError
from conduit_core.memory.tiers import LAZY_THRESHOLD, host_zeros


def filled(seed: int = 0, capacity: int = 64, reuse: int = 2) -> ExperienceBuffer:
    buf = ExperienceBuffer(spec=ExperienceSpec.transition(obs_shape=(3,)), capacity=capacity,
                           selector=Prioritized(alpha=0.6, beta=0.4), reuse_outputs=reuse, seed=seed)
    rng = np.random.default_rng(seed)
    for _ in range(3):   # 90 rows into 64 slots: some delivered rows get overwritten below
        n = 30
        buf.add({"obs": rng.standard_normal((n, 3)).astype(np.float32), "next_obs": np.zeros((n, 3), np.float32),
                 "action": rng.integers(0, 2, n), "reward": np.ones(n, np.float32),
                 "terminated": np.zeros(n, bool), "truncated": np.zeros(n, bool)})
    return buf


def trees(buf):
    s, m, _ = buf.selector.index.trees()
    return s.copy(), m.copy(), buf.selector.max_priority


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), form=st.sampled_from(["numpy", "torch", "int32", "column", "float32", "list"]),
       overwrite=st.booleans())
def test_update_shortcut_matches_the_checked_route(seed, form, overwrite):
    """Two identical buffers: one updated with the batch's float64 numpy arrays (the shortcut),
    one with the same values in another form (the checked route): same trees, same count."""
    a, b = filled(seed), filled(seed)
    ba, bb = a.sample(16), b.sample(16)
    assert np.array_equal(ba.slots, bb.slots)
    pr = np.random.default_rng(seed).random(16) + 0.01
    if form == "float32":   # values a float32 array holds exactly, given as float32 to the checked route
        pr = pr.astype(np.float32).astype(np.float64)
    if overwrite:   # some delivered rows are overwritten before the update: skipped by both
        for buf in (a, b):
            buf.add({"obs": np.zeros((20, 3), np.float32), "next_obs": np.zeros((20, 3), np.float32),
                     "action": np.zeros(20, np.int64), "reward": np.ones(20, np.float32),
                     "terminated": np.zeros(20, bool), "truncated": np.zeros(20, bool)})
    got_a = a.update_priorities(ba.slots, pr, seqs=ba.seqs)
    other = {"numpy": (bb.slots, pr), "torch": (bb.slots, torch.from_numpy(pr)),
             "int32": (bb.slots.astype(np.int32), pr), "column": (bb.slots.reshape(-1, 1), pr.reshape(-1, 1)),
             "float32": (bb.slots, pr.astype(np.float32)), "list": (list(bb.slots), list(pr))}[form]
    b.selector.index.use_c = False   # the reference: the checked route with numpy's tree walks
    got_b = b.update_priorities(*other, seqs=bb.seqs)
    assert got_a == got_b
    for x, y in zip(trees(a), trees(b)):
        assert np.array_equal(x, y)


@pytest.mark.parametrize("bad, field", [(np.array([np.nan] * 8), "priorities"), (-np.ones(8), "priorities"),
                                         (np.ones(7), "priorities")])
def test_update_shortcut_refusals_name_the_field_and_change_nothing(bad, field):
    buf = filled()
    batch = buf.sample(8)
    before = trees(buf)
    with pytest.raises(SpecError, match=field):
        buf.update_priorities(batch.slots, bad, seqs=batch.seqs)
    for x, y in zip(before, trees(buf)):
        assert np.array_equal(x, y)


def test_update_shortcut_refuses_a_slot_out_of_range():
    buf = filled()
    batch = buf.sample(4)
    slots = batch.slots.copy()
    slots[0] = 10_000
    with pytest.raises(SpecError, match="slots"):
        buf.update_priorities(slots, np.ones(4), seqs=batch.seqs)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**16), n=st.integers(0, 40))
def test_gather_meta_matches_fancy_indexing(seed, n):
    buf = filled(seed)
    slots = np.random.default_rng(seed).integers(0, buf.capacity, n)
    seqs, versions, sources = buf.ring.gather_meta(slots)
    assert np.array_equal(seqs, buf.meta["seq"][slots]) and np.array_equal(versions, buf.meta["version"][slots])
    assert np.array_equal(sources, buf.meta["source"][slots])
    assert seqs.dtype == versions.dtype == sources.dtype == np.int64
    assert seqs.flags.owndata and versions.flags.owndata and sources.flags.owndata
    saved = ring_mod._c_take_rows
    ring_mod._c_take_rows = None   # the Python route, as without a compiler
    try:
        s2, v2, o2 = buf.ring.gather_meta(slots)
    finally:
        ring_mod._c_take_rows = saved
    assert np.array_equal(seqs, s2) and np.array_equal(versions, v2) and np.array_equal(sources, o2)


@pytest.mark.skipif(ring_mod._c_take_rows is None, reason="the native rows module was not built")
def test_take_rows_declines_what_it_cannot_read():
    col = np.arange(10, dtype=np.int64)
    rows = np.arange(20, dtype=np.float32).reshape(10, 2)
    a, b = ring_mod._c_take_rows(np.array([3, 0, 9]), (col, rows))
    assert a.tolist() == [3, 0, 9] and b.tolist() == [[6, 7], [0, 1], [18, 19]] and b.dtype == np.float32
    assert ring_mod._c_take_rows(np.array([3, 10]), (col, rows)) is None          # a slot past a column's end
    assert ring_mod._c_take_rows(np.array([-1]), (col,)) is None                  # a negative slot
    assert ring_mod._c_take_rows(np.array([1], dtype=np.int32), (col,)) is None   # not int64
    assert ring_mod._c_take_rows(np.array([1]), (col[::2],)) is None             # a strided column
    assert ring_mod._c_take_rows(np.array([0]), (np.array(["a", 1], dtype=object),)) is None   # references


def test_weights_stay_valid_for_the_pool_depth_and_in_place_changes_stay_in_their_batch():
    buf = filled(reuse=2)
    first = buf.sample(8)
    kept = first.weights.clone()
    second = buf.sample(8)
    assert torch.equal(first.weights, kept)             # one more delivery: still valid (depth 2)
    assert first.weights.data_ptr() != second.weights.data_ptr()
    first.weights.unsqueeze_(1)                          # a learner reshapes its batch's weights in place
    buf.sample(8)
    third = buf.sample(8)                                # reuses first's memory, with a fresh wrapper
    assert third.weights.shape == (8,)
    p = first.weights.squeeze(1) / first.weights.max()
    assert torch.all(p <= 1.0)


def test_weights_without_a_pool_are_fresh():
    buf = filled(reuse=0)
    a, b = buf.sample(8), buf.sample(8)
    assert a.weights.data_ptr() != b.weights.data_ptr()


def test_host_zeros_small_and_large():
    small = host_zeros(16, np.float64)
    assert not isinstance(small.base, mmap.mmap)   # np.zeros below the threshold
    assert small.dtype == np.float64 and not small.any()
    n = LAZY_THRESHOLD // 8 + 1
    big = host_zeros(n, np.int64)
    assert isinstance(big.base.obj, mmap.mmap)     # the lazy mapping, kept alive by the array
    assert big.shape == (n,) and big.dtype == np.int64 and big.flags.writeable and big.flags.c_contiguous
    assert not big[:: 4096].any() and big[-1] == 0
    big[-1] = 7
    assert big[-1] == 7


@pytest.mark.parametrize("kw", [{"n_step": 1}, {"n_step": (2, 3)}, {"fields": ("obs", "action")}])
def test_weights_are_fresh_where_the_columns_are(kw):
    """n-step windows and field subsets gather fresh columns: their weights must not be reused
    (a learner, or an overlapped worker preparing batches ahead, keeps them as long as the columns)."""
    buf = filled(reuse=2)
    b = buf.sample(32)
    buf.update_priorities(b.slots, np.random.default_rng(1).random(32) * 10, seqs=b.seqs)
    first = buf.sample(8, **kw)
    kept = first.weights.clone()
    for _ in range(3):
        buf.sample(8, **kw)
    assert torch.equal(first.weights, kept)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), n=st.integers(0, 40),
       fields=st.sampled_from([None, ["obs"], ["next_obs", "terminated"], ["action", "reward", "truncated"]]))
def test_fresh_gathers_equal_numpy_takes(seed, n, fields):
    """Fresh outputs (n-step windows and field subsets take them) from the one native pass equal
    a take per field, as without a compiler."""
    import conduit_core.storage.columnar as storage_mod
    buf = filled(seed, reuse=0)
    slots = np.random.default_rng(seed).integers(0, buf.capacity, n)
    with buf.lock:
        got = buf.gather(slots, fields=fields)
        saved = storage_mod._c_take_rows
        storage_mod._c_take_rows = None
        try:
            want = buf.gather(slots, fields=fields)
        finally:
            storage_mod._c_take_rows = saved
    assert list(got) == list(want)
    for name in want:
        assert got[name].dtype == want[name].dtype and torch.equal(got[name], want[name])


def test_initial_priorities_whose_power_overflows_are_refused_before_anything_is_stored():
    """(p + eps) ** alpha past the largest float (alpha > 1) would put inf in the sum tree: the
    insert is refused, naming the value, and leaves the buffer as it was."""
    buf = ExperienceBuffer(spec=ExperienceSpec.transition(obs_shape=(3,)), capacity=8,
                           selector=Prioritized(alpha=2.0, beta=0.4))
    batch = {"obs": np.zeros((2, 3), np.float32), "next_obs": np.zeros((2, 3), np.float32),
             "action": np.zeros(2, np.int64), "reward": np.zeros(2, np.float32), "terminated": np.zeros(2, bool),
             "truncated": np.zeros(2, bool)}
    with pytest.raises(SpecError, match="priorities"):
        buf.add(batch, priorities=[1.0, 1e200])
    assert buf.size == 0
    buf.add(batch, priorities=[1.0, 2.0])
    assert buf.size == 2
