"""n-step windows: the native window pass against its Python reference, the uniforms it draws, n_step given as a list.
Each test failed before its fix."""

import numpy as np

import pytest

from conduit_core import (ExperienceBuffer, ExperienceSpec, Prioritized,
                          Uniform)

from conduit_core.buffer import episodes as episodes_mod

from ..helpers import SPEC, rollout


@pytest.mark.parametrize("n_step", [[2, 4], [3, 3]])
def test_n_step_as_a_list_works(n_step):
    buf = ExperienceBuffer(spec=SPEC, capacity=100, selector=Prioritized(), seed=1)
    buf.add(rollout(50, 0, done_at=49))
    for end in ("shorten", "redraw"):
        assert buf.sample(8, n_step=n_step, episode_end=end)["n_step"].numel() == 8


@pytest.mark.parametrize("capacity, episodes, batch, n_step", [((20, 80), (3, 12), 16, (1, 4)),
                                                               ((2000, 5000), (150, 400), 150, (1, 4)),
                                                               ((2000, 5000), (150, 400), 100, (3, 4))])
def test_the_native_window_pass_equals_its_python_reference(capacity, episodes, batch, n_step):
    """The C sample_windows and the Python reference consume the same uniforms the same way:
    same slots, weights, returns, last slots, steps, and RNG state after, over random buffers
    (uniform and prioritized, with removed rows, episodes ending terminated or truncated; large
    trees and batches too, where the native pass searches the tree ahead in chunks)."""
    spec = ExperienceSpec.transition(obs_shape=(2,))
    rng0 = np.random.default_rng(5)
    for trial in range(40 if batch <= 16 else 8):
        sel = Uniform() if trial % 2 else Prioritized(alpha=0.7)
        buf = ExperienceBuffer(spec=spec, capacity=int(rng0.integers(*capacity)), selector=sel, seed=trial)
        for c in range(int(rng0.integers(*episodes))):
            n = int(rng0.integers(1, 15))
            buf.add({"obs": np.zeros((n, 2), np.float32), "next_obs": np.zeros((n, 2), np.float32),
                     "action": np.arange(n), "reward": rng0.random(n).astype(np.float32),
                     "terminated": rng0.random(n) < 0.15, "truncated": rng0.random(n) < 0.05}, source=c % 3)
        lo = buf.inserted - len(buf)
        buf.evict(rng0.integers(lo, buf.inserted, 3))
        if isinstance(sel, Prioritized):
            s = np.flatnonzero(buf.selector.index.leaves() > 0)
            buf.update_priorities(s, rng0.random(s.size) + 0.1, slots_only=True)
        if len(buf) == 0:
            continue
        outs = []
        for native in (True, False):
            state = buf.rng.bit_generator.state
            saved = episodes_mod._c_sample_windows
            if not native:
                episodes_mod._c_sample_windows = None
            try:
                r = buf.walk.sample_windows(buf.ring, buf.storage, buf.selector, buf.rng, batch, n_step, 0.9, None,
                                            redraw=True)
            finally:
                episodes_mod._c_sample_windows = saved
            outs.append((r, buf.rng.bit_generator.state))
            buf.rng.bit_generator.state = state
        (a, sa), (b, sb) = outs
        assert sa == sb, trial
        for x, y in zip(a, b):
            assert (x is None and y is None) or np.array_equal(x, y), trial


@pytest.mark.parametrize("batch", [8, 600])   # 600: more uniforms than the C pass keeps on its stack
def test_uniforms_the_native_pass_draws_itself_are_generator_randoms(batch):
    """Given ``(bit_generator.capsule, m)`` in place of ``u``, the C sample_windows draws the m
    uniforms ``rng.random(m)`` would: the same windows and the generator left in the same state."""
    if episodes_mod._c_sample_windows is None:
        pytest.skip("C helpers not built")
    spec = ExperienceSpec.transition(obs_shape=(2,))
    buf = ExperienceBuffer(spec=spec, capacity=2000, selector=Prioritized(alpha=0.7), seed=3)
    rng0 = np.random.default_rng(11)
    for c in range(150):
        n = int(rng0.integers(1, 15))
        buf.add({"obs": np.zeros((n, 2), np.float32), "next_obs": np.zeros((n, 2), np.float32),
                 "action": np.arange(n), "reward": rng0.random(n).astype(np.float32),
                 "terminated": rng0.random(n) < 0.15, "truncated": np.zeros(n, bool)}, source=c % 3)
    views = buf.walk.native_views(buf.storage)
    source, beta = episodes_mod.window_source(buf.ring, buf.selector, 0.4, None)
    m = 4 * batch + 16
    outs = []
    for from_bits in (True, False):
        rng = np.random.default_rng(7)
        out = (np.empty(batch, np.int64), np.empty(batch, np.float32), np.empty(batch, np.float64),
               np.empty(batch, np.int64), np.empty(batch, np.int64))
        u = (rng.bit_generator.capsule, m) if from_bits else rng.random(m)
        got = episodes_mod._c_sample_windows(*source, *views, u, 2, 5, 0.9, beta, True, *out, 0)
        outs.append((got, out, rng.bit_generator.state))
    (g1, o1, s1), (g2, o2, s2) = outs
    assert g1 == g2 and g1[1] > 0 and s1 == s2
    for x, y in zip(o1, o2):
        assert np.array_equal(x, y)
