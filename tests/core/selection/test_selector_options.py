"""Selector options SRL's replay kinds need, as general core features: sampling without
replacement, stratified proportional draws, initial priorities at insert; and chunk items
(fields of shape (T, ...), dotted names, a per-step done field)."""

import numpy as np
import pytest
import torch
from scipy import stats

from conduit_core import ExperienceBuffer, ExperienceSpec, FieldSpec, Prioritized, Uniform
from conduit_core.errors import ConfigError, SpecError

T = 4
SPEC = ExperienceSpec([FieldSpec("obs.obs", (T, 2)), FieldSpec("done", (T, 1), torch.bool)])


def chunk(i, done_last=False):
    d = np.zeros((1, T, 1), bool)
    d[0, -1, 0] = done_last
    return {"obs.obs": np.full((1, T, 2), i, np.float32), "done": d}


def test_uniform_without_replacement_never_repeats_within_a_batch():
    b = ExperienceBuffer(spec=SPEC, capacity=10, selector=Uniform(replace=False), done_fields=("done",))
    for i in range(10):
        b.add(chunk(i))
    counts = np.zeros(10)
    for _ in range(500):
        s = b.sample(6)
        assert len(set(s.slots.tolist())) == 6
        np.add.at(counts, s.slots, 1)
    assert stats.chisquare(counts).pvalue > 1e-3
    with pytest.raises(ConfigError, match="batch_size"):
        b.sample(11)


def test_stratified_prioritized_matches_priorities_and_initial_priorities_apply():
    b = ExperienceBuffer(spec=SPEC, capacity=8, selector=Prioritized(alpha=0.5, beta=0.4, eps=0.0, stratified=True),
                         done_fields=("done",))
    pr = np.arange(1.0, 9.0)
    for i in range(8):
        b.add(chunk(i), priorities=[pr[i]])
    counts = np.zeros(8)
    for _ in range(1500):
        s = b.sample(4)
        np.add.at(counts, s.slots, 1)
        p = pr[s.slots] ** 0.5
        assert np.allclose(s.weights.numpy(), (p / (pr.min() ** 0.5)) ** -0.4, rtol=1e-5)
    expect = pr ** 0.5 / (pr ** 0.5).sum()
    assert stats.chisquare(counts, counts.sum() * expect).pvalue > 1e-3
    with pytest.raises(ConfigError, match="episode_end"):
        b.sample(2, n_step=2, episode_end="redraw")


def test_initial_priorities_are_checked_before_anything_is_written():
    b = ExperienceBuffer(spec=SPEC, capacity=4, selector=Prioritized(eps=0.0), done_fields=("done",))
    for bad in ([-1.0], [float("nan")], [1.0, 2.0]):
        with pytest.raises(SpecError, match="priorities"):
            b.add(chunk(0), priorities=bad)
    assert len(b) == 0
    u = ExperienceBuffer(spec=SPEC, capacity=4, done_fields=("done",))
    with pytest.raises(ConfigError, match="priorities"):
        u.add(chunk(0), priorities=[1.0])
    assert len(u) == 0


def test_dotted_names_and_per_step_done_of_chunk_items():
    with pytest.raises(SpecError, match="field name"):
        FieldSpec("obs._private", (1,))
    b = ExperienceBuffer(spec=SPEC, capacity=8, done_fields=("done",))
    b.add({k: np.concatenate([chunk(0)[k], chunk(1, done_last=True)[k], chunk(2)[k]]) for k in chunk(0)})
    assert len(b) == 3 and b.sample(2)["obs.obs"].shape == (2, T, 2)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 1000, 2**33 + 5])
def test_uniform_draws_are_uniform_on_the_range(n):
    """The C draws (Lemire's method on the bit generator) stay in [0, n) and are uniform:
    a chi-square test over 20 equal bins (p > 1e-4), for small and large ranges."""
    from scipy import stats

    from conduit_core.selection import selectors
    assert selectors._c_uniform_ints is not None
    x = selectors.uniform_ints(np.random.default_rng(n), n, 200_000)
    assert x.dtype == np.int64 and x.min() >= 0 and x.max() < n
    if n == 1:
        assert not x.any()
        return
    bins = min(n, 20)
    if n <= 1000:  # bins of unequal size: each bin's exact share of [0, n)
        counts = np.bincount((x * bins) // n, minlength=bins)
        share = np.bincount((np.arange(n) * bins) // n, minlength=bins) / n
        assert stats.chisquare(counts, share * x.size).pvalue > 1e-4
    else:          # near-equal bins of width n // bins + 1 (the last one 3 values short)
        counts = np.bincount(x // (n // bins + 1), minlength=bins)
        assert stats.chisquare(counts).pvalue > 1e-4


@pytest.mark.parametrize("stratified", [False, True])
def test_prioritized_draws_in_c_equal_the_numpy_route(stratified):
    """The prioritized draw takes its uniforms from the generator's bit generator inside C; it must
    give the slots and weights that Generator.random + select_weighted give for the same seed."""
    from conduit_core._native._sumtree import select_weighted

    sel = Prioritized(alpha=0.6, beta=0.4, stratified=stratified)
    sel.bind(1000)
    rng = np.random.default_rng(7)
    sel.index.set(np.arange(1000), rng.random(1000) ** 2 + 1e-3)
    a, b = np.random.default_rng(11), np.random.default_rng(11)
    for _ in range(5):
        slots, weights = sel.select(64, 1000, a)
        want_slots, want_w = np.empty(64, np.int64), np.empty(64, np.float32)
        select_weighted(*sel.index.trees(), sel._masses(64, sel.index.total, b), 0.4, want_slots, want_w)
        assert np.array_equal(slots, want_slots) and np.array_equal(weights, want_w)


def test_draws_without_replacement_never_repeat_a_row_after_evictions():
    """Removed rows are not positions: a draw without replacement maps over the live rows
    (a redraw of a removed one, with replacement, could repeat a row)."""
    import torch
    from conduit_core import ConfigError, ExperienceBuffer, ExperienceSpec, FieldSpec, Uniform
    spec = ExperienceSpec([FieldSpec("obs", (1,), torch.float32)])
    buf = ExperienceBuffer(spec=spec, capacity=10, selector=Uniform(replace=False), seed=3)
    buf.add({"obs": np.arange(10, dtype=np.float32).reshape(10, 1)})
    buf.evict([0, 2, 4, 6, 8])
    for _ in range(200):
        ids = buf.sample(5)["obs"][:, 0].tolist()
        assert sorted(ids) == [1.0, 3.0, 5.0, 7.0, 9.0]
    with pytest.raises(ConfigError, match="at most the 5 stored items"):
        buf.sample(8)
