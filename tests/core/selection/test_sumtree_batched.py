"""The C sum tree's batched walks (many walks a level at a time) against one walk at a time.

The batched walks exist for speed only (the memory system serves a level's loads together); they
must leave the same trees bit for bit and find the same leaves, duplicates and chunk edges
(64 walks per chunk) included. The reference here is the one-walk rule written in Python."""

import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit_core.selection.selectors import Selector

c = pytest.importorskip("conduit_core._native._sumtree", reason="the C helpers were not built (python setup.py build_ext --inplace)")


def min_positive(a: float, b: float) -> float:
    if a == 0.0:
        return b
    if b == 0.0:
        return a
    return min(a, b)


def set_leaf(s, m, size, i, v):
    node = i + size
    s[node] = v
    m[node] = v if v > 0 else 0.0
    node >>= 1
    while node >= 1:
        s[node] = s[2 * node] + s[2 * node + 1]
        m[node] = min_positive(m[2 * node], m[2 * node + 1])
        node >>= 1


def descend(s, size, v):
    node = 1
    while node < size:
        left, right = s[2 * node], s[2 * node + 1]
        if (v < left and left > 0.0) or right <= 0.0:
            node = 2 * node
        else:
            v -= left
            node = 2 * node + 1
    return node


@settings(max_examples=60, deadline=None)
@given(log_size=st.integers(1, 9), seed=st.integers(0, 2**31), batches=st.lists(st.integers(1, 150), min_size=1, max_size=4),
       alpha=st.sampled_from([1.0, 0.6]))
def test_batched_priority_updates_leave_the_trees_one_by_one_walks_leave(log_size, seed, batches, alpha):
    size = 1 << log_size
    rng = np.random.default_rng(seed)
    s, m = np.zeros(2 * size), np.zeros(2 * size)
    rs, rm = s.copy(), m.copy()
    eps = 1e-6
    for b in batches:
        idx = rng.integers(0, size, b).astype(np.int64)      # duplicates: the later one wins
        pr = rng.random(b) * rng.choice([1e-3, 1.0, 1e3])
        mx = c.set_priorities(s, m, size, idx, pr, alpha, eps)
        for i, p in zip(idx, pr):
            set_leaf(rs, rm, size, int(i), (p + eps) if alpha == 1.0 else (p + eps) ** alpha)
        assert mx == pytest.approx(float((pr + eps).max()), rel=0, abs=0)
        np.testing.assert_array_equal(s, rs)
        np.testing.assert_array_equal(m, rm)


@settings(max_examples=60, deadline=None)
@given(log_size=st.integers(1, 9), seed=st.integers(0, 2**31), n=st.integers(1, 200), zeros=st.floats(0, 0.8))
def test_batched_descents_find_the_leaves_one_walk_finds(log_size, seed, n, zeros):
    size = 1 << log_size
    rng = np.random.default_rng(seed)
    s, m = np.zeros(2 * size), np.zeros(2 * size)
    vals = np.where(rng.random(size) < zeros, 0.0, rng.random(size))
    vals[rng.integers(size)] = 0.5                            # at least one leaf can be drawn
    c.update(s, m, size, np.arange(size, dtype=np.int64), vals)
    targets = rng.random(n) * s[1]
    targets[: n // 4] = np.nextafter(s[1], 0.0)                # the top edge, where rounding bites
    want = np.array([descend(s, size, float(v)) - size for v in targets])
    got = np.empty(n, np.int64)
    c.find(s, size, targets.copy(), got)
    np.testing.assert_array_equal(got, want)
    assert (vals[got] > 0).all()                                # never a zero leaf
    w = np.empty(n, np.float32)
    got2 = np.empty(n, np.int64)
    c.select_weighted(s, m, size, targets.copy(), 0.4, got2, w)
    np.testing.assert_array_equal(got2, want)
    np.testing.assert_array_equal(w, np.array([np.float32((s[i + size] / m[1]) ** -0.4) for i in want]))


def test_draws_come_from_the_generator_in_order_and_match_the_walks():
    size = 256
    rng = np.random.default_rng(3)
    s, m = np.zeros(2 * size), np.zeros(2 * size)
    c.update(s, m, size, np.arange(size, dtype=np.int64), rng.random(size) + 0.01)
    g, ref = np.random.default_rng(11), np.random.default_rng(11)
    idx, w = np.empty(150, np.int64), np.empty(150, np.float32)   # more than one chunk of walks
    with g.bit_generator.lock:
        c.draw_weighted(s, m, size, g.bit_generator.capsule, s[1], False, 0.0, idx, w)
    u = ref.random(150) * s[1]
    np.testing.assert_array_equal(idx, [descend(s, size, float(v)) - size for v in u])
    assert g.random() == ref.random()                              # the stream advanced by exactly 150 draws


# ------------------------------------------------------- a delivered batch's update in one call
def _filled(capacity: int, rows: int, seed: int):
    from conduit_core import ExperienceBuffer, ExperienceSpec, Prioritized
    buf = ExperienceBuffer(spec=ExperienceSpec.transition(obs_shape=(2,)), capacity=capacity,
                           selector=Prioritized(alpha=0.6, eps=1e-6), seed=seed)
    rng = np.random.default_rng(seed)
    done = 0
    while done < rows:
        n = int(min(rng.integers(1, 20), rows - done, capacity))
        buf.add({"obs": rng.random((n, 2), np.float32), "action": np.zeros(n, np.int64),
                 "reward": np.ones(n, np.float32), "next_obs": rng.random((n, 2), np.float32),
                 "terminated": rng.random(n) < 0.1, "truncated": np.zeros(n, bool)})
        done += n
    return buf


@settings(max_examples=40, deadline=None)
@given(capacity=st.integers(8, 100), seed=st.integers(0, 2**31), b=st.integers(1, 150),
       overwrite=st.integers(0, 60), kind=st.sampled_from(["ok", "nan", "negative", "zero", "bad-slot", "short"]))
def test_the_one_call_update_equals_the_checked_route(capacity, seed, b, overwrite, kind):
    """Same trees, max priority, count and errors as the route that checks in numpy, including
    rows overwritten between delivery and update (skipped), duplicates and refused input."""
    from conduit_core.errors import SpecError
    bufs = [_filled(capacity, capacity + 5, seed) for _ in range(2)]
    batches = [buf.sample(b) for buf in bufs]
    assert np.array_equal(batches[0].slots, batches[1].slots)
    rng = np.random.default_rng(seed)
    overwrite = min(overwrite, capacity)
    for buf in bufs:   # overwrite some delivered rows before their update comes back
        if overwrite:
            buf.add({"obs": np.zeros((overwrite, 2), np.float32), "action": np.zeros(overwrite, np.int64),
                     "reward": np.zeros(overwrite, np.float32), "next_obs": np.zeros((overwrite, 2), np.float32),
                     "terminated": np.zeros(overwrite, bool), "truncated": np.zeros(overwrite, bool)})
    pr = rng.random(b) * 5
    slots = batches[0].slots.copy()
    if kind == "nan":
        pr[rng.integers(b)] = np.nan
    elif kind == "negative":
        pr[rng.integers(b)] = -1.0
    elif kind == "zero":
        pr[rng.integers(b)] = 0.0
    elif kind == "bad-slot":
        slots[rng.integers(b)] = capacity + 3
    elif kind == "short":
        pr = pr[:-1]
    outcomes = []
    for i, buf in enumerate(bufs):
        if i == 1:   # the reference update (the specification of the native one) in place of the selector's
            buf.selector.update_delivered = functools.partial(Selector.update_delivered, buf.selector)
        try:
            outcomes.append(("ok", buf.update_priorities(slots, pr, seqs=batches[i].seqs)))
        except SpecError as exc:
            outcomes.append(("error", str(exc)))
    assert outcomes[0] == outcomes[1]
    a, b_ = (buf.selector.index.trees() for buf in bufs)
    np.testing.assert_array_equal(a[0], b_[0])
    np.testing.assert_array_equal(a[1], b_[1])
    assert bufs[0].selector.max_priority == bufs[1].selector.max_priority
    for buf in bufs:
        buf.close()
