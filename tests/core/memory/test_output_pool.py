"""The output pool's promise: a delivered batch stays valid for ``reuse_outputs`` more deliveries
to the learner, also when a data plane prepares batches ahead (they take entries of their own)."""

import time

import numpy as np
import pytest
import torch

from conduit_core import ExperienceDataPlane, Schedule
from conduit_core.memory.output_pool import OutputPool

from ..selection.test_prioritized_step import filled


def test_a_batch_survives_kept_deliveries_and_growth_keeps_that():
    pool = OutputPool(2, {"x": ((3,), np.dtype(np.float32))})
    seen = []
    for k in range(5):
        arrays, _ = pool.get((4,))
        arrays["x"][:] = k
        seen.append(arrays["x"])
        if k == 2:
            pool.reserve(3)   # grows while a batch is held: it must survive 2 more deliveries still
    assert pool.depth == 8    # kept * (prepared + 1): prepared batches discarded unseen take entries too
    assert seen[2][0, 0] == 2 and seen[3][0, 0] == 3 and seen[4][0, 0] == 4
    ptrs = {a.ctypes.data for a in seen[2:]}
    assert len(ptrs) == 3


@pytest.mark.parametrize("n_step, end", [(None, "shorten"), (1, "shorten"), ((2, 4), "redraw")])
@pytest.mark.parametrize("depth, g_del", [(2, 1), (3, 2)])
def test_prepared_batches_never_overwrite_the_one_the_learner_holds(n_step, end, depth, g_del):
    buf = filled(seed=0, capacity=64, reuse=2)
    b = buf.sample(32)
    buf.update_priorities(b.slots, np.random.default_rng(1).random(32) * 10, seqs=b.seqs)
    edp = ExperienceDataPlane(buffer=buf, schedule=Schedule.overlapped(depth=depth, delivery_granularity=g_del))
    try:
        held = edp.deliver(8, n_step=n_step, episode_end=end)
        obs, weights = held["obs"].clone(), held.weights.clone()
        time.sleep(0.5)   # the worker prepares up to depth (+ spares) ahead meanwhile
        assert torch.equal(held["obs"], obs) and torch.equal(held.weights, weights)
        nxt = edp.deliver(8, n_step=n_step, episode_end=end)
        assert torch.equal(held["obs"], obs)   # one more delivery: still valid (reuse_outputs=2)
        assert held["obs"].data_ptr() != nxt["obs"].data_ptr()
    finally:
        edp.close()


def _rows(n, rng):
    return {"obs": rng.standard_normal((n, 3)).astype(np.float32), "next_obs": np.zeros((n, 3), np.float32),
            "action": rng.integers(0, 2, n), "reward": np.ones(n, np.float32),
            "terminated": np.zeros(n, bool), "truncated": np.zeros(n, bool)}


def test_a_refused_sample_uses_up_no_pooled_weights():
    """The weights entry is handed out only with a delivered batch: a draw the rate limiter
    refuses must not shorten the validity of the batch the learner holds."""
    from conduit_core import ExperienceBuffer, ExperienceSpec, Prioritized
    from conduit_core.errors import RateLimitError
    from conduit_core.selection.rate_limiter import RateLimiter
    buf = ExperienceBuffer(spec=ExperienceSpec.transition(obs_shape=(3,)), capacity=64,
                           selector=Prioritized(alpha=0.6, beta=0.4), reuse_outputs=2, seed=0,
                           rate_limiter=RateLimiter(min_size=8, samples_per_insert=1.0, tolerance=4.0,
                                                    on_limit="raise"))
    rng = np.random.default_rng(0)
    buf.add(_rows(8, rng))
    buf.update_priorities(np.arange(8), np.arange(1, 9, dtype=np.float64), slots_only=True)
    held = buf.sample(8)
    kept = held.weights.clone()
    with pytest.raises(RateLimitError):
        buf.sample(8)
    buf.add(_rows(4, rng))
    nxt = buf.sample(8)   # the first of the 2 deliveries `held` must survive
    assert torch.equal(held.weights, kept)
    assert held.weights.data_ptr() != nxt.weights.data_ptr()
    buf.close()


def test_custom_weighted_selectors_get_their_own_weights_delivered():
    """A subclass whose ``select`` takes no ``weights_out`` is not passed one, and weights a
    selector returns in its own array are delivered as they are (fresh): same values as the base."""
    from conduit_core import ExperienceBuffer, ExperienceSpec, Prioritized

    class WithoutOut(Prioritized):
        def select(self, batch_size, size, rng, *, beta=None):
            return super().select(batch_size, size, rng, beta=beta)

    class OwnArray(Prioritized):
        def select(self, batch_size, size, rng, *, beta=None, **kw):
            slots, w = super().select(batch_size, size, rng, beta=beta)
            return slots, w.copy()

    assert Prioritized.fills_weights_out and not WithoutOut.fills_weights_out and not OwnArray.fills_weights_out
    got = []
    for cls in (Prioritized, WithoutOut, OwnArray):
        buf = ExperienceBuffer(spec=ExperienceSpec.transition(obs_shape=(3,)), capacity=64,
                               selector=cls(alpha=0.6, beta=0.4), reuse_outputs=2, seed=0)
        buf.add(_rows(40, np.random.default_rng(0)))
        buf.update_priorities(np.arange(40), np.arange(1, 41, dtype=np.float64), slots_only=True)
        b = buf.sample(16)
        got.append((b.slots.copy(), b.weights.clone()))
        buf.close()
    for slots, w in got[1:]:
        assert np.array_equal(slots, got[0][0]) and torch.equal(w, got[0][1])


def test_weights_are_fresh_where_the_columns_are():
    """Storage that does not fill the pool's arrays (two shards) returns fresh columns; the
    batch's weights are fresh then too (the pool's rule is one function, ``delivery.gathers_pooled``)."""
    from conduit_core import ExperienceBuffer, ExperienceSpec, Prioritized
    from conduit_core.buffer.delivery import gathers_pooled
    from conduit_core.memory.tiers import Tier
    from conduit_core.storage.shards import ShardSpec
    buf = ExperienceBuffer(spec=ExperienceSpec.transition(obs_shape=(3,)), capacity=64,
                           selector=Prioritized(alpha=0.6, beta=0.4), reuse_outputs=1, seed=0,
                           shards=[ShardSpec(Tier.PAGEABLE, 32), ShardSpec(Tier.PAGEABLE, 32)])
    buf.add(_rows(40, np.random.default_rng(0)))
    assert not gathers_pooled(buf)
    a, b = buf.sample(8), buf.sample(8)
    assert a["obs"].data_ptr() != b["obs"].data_ptr() and a.weights.data_ptr() != b.weights.data_ptr()
    buf.close()


def _episodes_buffer(reuse: int, seed: int, prioritized: bool = True):
    """Episodes of 3-12 steps (terminated or truncated), random rewards, a ring gone round."""
    from conduit_core import ExperienceBuffer, ExperienceSpec, Prioritized, Uniform
    buf = ExperienceBuffer(spec=ExperienceSpec.transition(obs_shape=(3,)), capacity=96, reuse_outputs=reuse, seed=seed,
                           selector=Prioritized(alpha=0.6, beta=0.4) if prioritized else Uniform())
    rng = np.random.default_rng(seed)
    for src in range(24):
        n = int(rng.integers(3, 13))
        rows = _rows(n, rng)
        rows["reward"] = rng.standard_normal(n).astype(np.float32)
        rows["terminated"][-1] = bool(rng.random() < 0.7)
        rows["truncated"][-1] = not rows["terminated"][-1]
        buf.add(rows, source=src)
    return buf


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("fields", [None, ("obs", "reward", "next_obs", "terminated")])
@pytest.mark.parametrize("prioritized", [True, False])
def test_pooled_window_batches_equal_fresh_ones(seed, fields, prioritized):
    """n-step windows drawn with the redraw rule go into the output pool (steps and weights
    written by the walk in place): the same slots, columns, returns, steps and weights as a
    buffer without a pool, draw after draw, with the priorities updated between draws."""
    pooled, fresh = _episodes_buffer(2, seed, prioritized), _episodes_buffer(0, seed, prioritized)
    rng = np.random.default_rng(seed + 10)
    for step in range(8):
        n_step = (2, 5) if step % 2 else 3
        a = pooled.sample(16, n_step=n_step, gamma=0.9, episode_end="redraw", fields=fields)
        b = fresh.sample(16, n_step=n_step, gamma=0.9, episode_end="redraw", fields=fields)
        assert list(a) == list(b) and np.array_equal(a.slots, b.slots) and np.array_equal(a.seqs, b.seqs)
        for k in b:
            assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
        assert (a.weights is None) == (b.weights is None) == (not prioritized)
        if prioritized:
            assert torch.equal(a.weights, b.weights)
            p = rng.random(16) * 5
            pooled.update_priorities(a.slots, p, seqs=a.seqs)
            fresh.update_priorities(b.slots, p, seqs=b.seqs)
    pooled.close()
    fresh.close()


def test_a_pooled_window_batch_survives_one_more_delivery_and_keeps_its_in_place_changes():
    buf = _episodes_buffer(2, 0)
    held = buf.sample(16, n_step=(2, 5), episode_end="redraw")
    kept = {k: v.clone() for k, v in held.items()}
    kept_w = held.weights.clone()
    nxt = buf.sample(16, n_step=(2, 5), episode_end="redraw")
    assert all(torch.equal(held[k], kept[k]) for k in kept) and torch.equal(held.weights, kept_w)
    assert held["obs"].data_ptr() != nxt["obs"].data_ptr() and held.weights.data_ptr() != nxt.weights.data_ptr()
    held["obs"].unsqueeze_(0)            # a learner changes its batch's wrappers in place
    held["n_step"].requires_grad_(False)
    held.weights.unsqueeze_(1)
    held["reward"].requires_grad_()
    obs = held["obs"]
    del held   # (a Batch alive is never reused: the learner keeps only a tensor)
    buf.sample(16, n_step=(2, 5), episode_end="redraw")   # (a window ring keeps one entry spare)
    fourth = buf.sample(16, n_step=(2, 5), episode_end="redraw")   # reuses held's memory
    assert fourth["obs"].shape == (16, 3) and fourth.weights.shape == (16,)
    assert not fourth["reward"].requires_grad and fourth["obs"] is not obs
    assert fourth["obs"].data_ptr() == obs.data_ptr()      # (the same pooled memory)
    buf.close()


def test_window_batches_for_a_device_or_without_the_pool_are_fresh():
    buf = _episodes_buffer(0, 0)
    a, b = (buf.sample(8, n_step=2, episode_end="redraw") for _ in range(2))
    assert a["obs"].data_ptr() != b["obs"].data_ptr() and a.weights.data_ptr() != b.weights.data_ptr()
    buf.close()
    buf = _episodes_buffer(1, 0)
    a, b = (buf.sample(8, n_step=2, episode_end="redraw", device="cpu") for _ in range(2))
    assert a["obs"].data_ptr() != b["obs"].data_ptr()
    buf.close()


def _short_episodes(reuse):
    from conduit_core import ExperienceBuffer, ExperienceSpec, Prioritized
    buf = ExperienceBuffer(spec=ExperienceSpec.transition(obs_shape=(3,)), capacity=64, reuse_outputs=reuse, seed=0,
                           selector=Prioritized(alpha=0.6, beta=0.4))
    rng = np.random.default_rng(0)
    for s in range(6):
        rows = _rows(8, rng)
        rows["terminated"][-1] = True
        buf.add(rows, source=s)
    return buf


def test_a_window_draw_that_fails_leaves_the_held_batch_alone():
    """Found in review: the pool's window entry was taken before the draw, and the walk wrote
    into the next one, so a refused draw (episodes too short for n) overwrote the batch the
    learner held one delivery early."""
    from conduit_core.errors import SemanticError
    buf = _short_episodes(2)
    held = buf.sample(8, n_step=2, episode_end="redraw")
    kept, kept_w = {k: v.clone() for k, v in held.items()}, held.weights.clone()
    with pytest.raises(SemanticError, match="too short"):
        buf.sample(8, n_step=12, episode_end="redraw")
    nxt = buf.sample(8, n_step=2, episode_end="redraw")   # the first delivery after held
    assert all(torch.equal(held[k], kept[k]) for k in kept) and torch.equal(held.weights, kept_w)
    assert held["obs"].data_ptr() != nxt["obs"].data_ptr()
    buf.close()


def prepared_ahead(edp, timeout=10.0):
    """Until the worker has prepared as deep as its schedule lets it (a fixed sleep is too short
    on a loaded machine)."""
    end = time.monotonic() + timeout
    while len(edp._prepared) < edp.schedule.depth and time.monotonic() < end:
        time.sleep(0.002)
    assert len(edp._prepared) == edp.schedule.depth, "the worker prepared nothing ahead"


@pytest.mark.parametrize("n_step, end", [(None, "shorten"), ((2, 4), "redraw")])
def test_batches_prepared_and_discarded_never_overwrite_the_one_the_learner_holds(n_step, end):
    """Found in review: with staleness 0 every priority update discards the prepared batches,
    and their entries were not counted: the worker's refill overwrote the held batch before its
    next delivery was over. The pool now keeps kept * (prepared + 1) entries."""
    buf = _short_episodes(2)
    edp = ExperienceDataPlane(buffer=buf, schedule=Schedule.overlapped(depth=2))
    rng = np.random.default_rng(1)
    try:
        held = edp.deliver(8, n_step=n_step, episode_end=end)
        kept = {k: v.clone() for k, v in held.items()}
        for _ in range(3):
            prepared_ahead(edp)   # the worker prepares ahead meanwhile
            edp.update_priorities(held, rng.random(8) * 5 + 0.1)   # stale: discarded at the next deliver
            nxt = edp.deliver(8, n_step=n_step, episode_end=end)
            prepared_ahead(edp)   # ... and refills
            assert all(torch.equal(held[k], kept[k]) for k in kept)   # held survives one more delivery
            held, kept = nxt, {k: v.clone() for k, v in nxt.items()}
        assert edp.metrics().prefetch_discards > 0
    finally:
        edp.close()


@pytest.mark.parametrize("name", ["weights", "n_step"])
def test_a_stored_field_named_like_the_walks_outputs_keeps_them_apart(name):
    """Found in review: a stored field named ``weights`` (or ``n_step``) took the place of the
    walk's own array in a pooled window entry: the batch's importance weights were the field."""
    from conduit_core import ExperienceBuffer, ExperienceSpec, Prioritized
    got = []
    for reuse in (0, 2):
        buf = ExperienceBuffer(spec=ExperienceSpec.transition(obs_shape=(3,), extras={name: ((), torch.float32)}),
                               capacity=64, reuse_outputs=reuse, seed=0, selector=Prioritized(alpha=0.6, beta=0.4))
        rng = np.random.default_rng(0)
        for s in range(6):
            rows = _rows(8, rng)
            rows[name] = np.full(8, 100.0 + s, np.float32)
            rows["terminated"][-1] = True
            buf.add(rows, source=s)
        b = buf.sample(6, n_step=2, episode_end="redraw")
        got.append(({k: v.clone() for k, v in b.items()}, b.weights.clone()))
        buf.close()
    (fresh, fresh_w), (pooled, pooled_w) = got
    assert list(fresh) == list(pooled) and all(torch.equal(fresh[k], pooled[k]) for k in fresh)
    assert torch.equal(fresh_w, pooled_w) and float(pooled_w.max()) <= 1.0
