"""``PooledWindowDraw`` (a sequential replay step's redraw-rule windows in one frame) against
the reference it stands in for, ``delivery.draw_reference`` (a twin whose ``routes.fast`` is
False): two twin buffers given the same rows and the same priority updates must hand out the
same batches (values, weights, slots, provenance), leave their RNGs in the same state and count
the same, draw after draw; the draw dispatcher sends it exactly the draws it carries out."""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conduit_core import (AffineCodec, ClosedError, ConfigError, ExperienceBuffer, ExperienceDataPlane, ExperienceSpec,
                          Fifo, Prioritized, RateLimiter, Schedule, SemanticError, ShardSpec, Uniform)

from conduit_core.buffer.delivery import reserve_prepared_outputs
from conduit_core.errors import RateLimitTimeout

from ..helpers import SPEC, rollout


def twins(selector, capacity=64, **kw):
    """(route's buffer, reference buffer): the same seed; the reference draws by the reference only."""
    route, ref = [ExperienceBuffer(spec=kw.pop("spec", SPEC), capacity=capacity, selector=selector(), seed=7,
                                   reuse_outputs=2, **kw) for _ in range(2)]
    ref.routes.fast = False
    return route, ref


def windows_drawn(buf) -> int:
    return buf.routes.draws["pooled_windows"]


def assert_same_batch(a, b):
    assert list(a) == list(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name
    np.testing.assert_array_equal(a.slots, b.slots)
    np.testing.assert_array_equal(a.seqs, b.seqs)
    np.testing.assert_array_equal(a.versions, b.versions)
    assert (a.weights is None) == (b.weights is None)
    if a.weights is not None:
        assert torch.equal(a.weights, b.weights)
    assert a.inserted_at_selection == b.inserted_at_selection


def assert_same_buffers(route, ref):
    assert route.rng.bit_generator.state == ref.rng.bit_generator.state
    assert route.counts.sampled == ref.counts.sampled


def insert(bufs, ops_rng, start):
    n = int(ops_rng.integers(3, 20))
    done = int(ops_rng.integers(0, n)) if ops_rng.random() < 0.7 else None
    r = rollout(n, start, done_at=done)
    r["reward"] = ops_rng.random(n).astype(np.float32)
    for buf in bufs:
        buf.add(r, source=int(start) % 3)
    return start + n


def schedule_step(route, ref, ops, start):
    """One step of a random schedule on both twins: 0-2 inserts, sometimes an eviction (ring holes)
    and pool growth (reserve). Returns the next insert's start."""
    for _ in range(int(ops.integers(0, 3))):
        start = insert([route, ref], ops, start)
    if ops.random() < 0.25 and len(ref) > 2:
        seqs = ops.integers(ref.inserted - len(ref), ref.inserted, 2)
        route.evict(seqs), ref.evict(seqs)
    if ops.random() < 0.15:
        k = int(ops.integers(1, 3))
        reserve_prepared_outputs(route, k), reserve_prepared_outputs(ref, k)
    return start


def after_draw(route, ref, a, b, held, ops, prioritized):
    """The batch before this draw still holds what it held (valid for reuse_outputs=2 more
    deliveries); both twins get the same new priorities. Returns what to check after the next."""
    if held is not None:
        assert_same_batch(*held)
    kept = (a, a.clone())
    if prioritized:
        p = ops.random(len(a.slots)) * 3 + 0.01
        route.update_priorities(a.slots, p, seqs=a.seqs)
        ref.update_priorities(b.slots, p, seqs=b.seqs)
    return kept


@pytest.mark.parametrize("selector", [Uniform, lambda: Prioritized(alpha=0.6)])
@pytest.mark.parametrize("n_step, beta, fields", [((2, 5), 0.4, None), (3, None, None), (1, 0.0, None),
                                                   ((1, 4), 0.5, ("obs", "reward", "next_obs"))])
def test_the_route_hands_out_the_reference_batches(selector, n_step, beta, fields):
    route, ref = twins(selector)
    ops = np.random.default_rng(1)
    start = 0
    for step in range(60):   # the ring wraps several times
        start = insert([route, ref], ops, start)
        a = route.sample(16, n_step=n_step, gamma=0.9, beta=beta, fields=fields, episode_end="redraw")
        b = ref.sample(16, n_step=n_step, gamma=0.9, beta=beta, fields=fields, episode_end="redraw")
        assert_same_batch(a, b)
        assert_same_buffers(route, ref)
        if route.selector.weighted:
            p = ops.random(16) + 0.05
            route.update_priorities(a.slots, p, seqs=a.seqs)
            ref.update_priorities(b.slots, p, seqs=b.seqs)
    assert windows_drawn(route) == 60 and windows_drawn(ref) == 0
    route.close(), ref.close()


FIELD_SETS = [None, ("obs",), ("reward",), ("next_obs", "obs", "reward"), ("terminated", "action"), ()]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), prioritized=st.booleans(), batch=st.integers(1, 40),
       n_lo=st.integers(1, 4), span=st.integers(0, 3), gamma=st.floats(0.0, 1.0), capacity=st.integers(24, 90),
       fields=st.sampled_from(FIELD_SETS))
def test_any_schedule_of_inserts_draws_and_updates_matches_the_reference(seed, prioritized, batch, n_lo, span, gamma,
                                                                        capacity, fields):
    """Inserts, evictions (ring holes), pool growth (reserve), priority updates and draws in any
    order; the route's buffer sometimes draws by the reference (both take entries from the
    same pool rings), and the batch before each draw must still hold what it held."""
    selector = (lambda: Prioritized(alpha=0.7)) if prioritized else Uniform
    route, ref = twins(selector, capacity=capacity)
    ops = np.random.default_rng(seed)
    n_step = n_lo if span == 0 else (n_lo, n_lo + span)
    held = None
    start = insert([route, ref], ops, 0)
    try:
        for _ in range(12):
            start = schedule_step(route, ref, ops, start)
            if len(ref) == 0:   # (an empty buffer's sample waits for rows: both routes)
                continue
            route.routes.fast = ops.random() >= 0.25   # sometimes the reference
            try:
                b = ref.sample(batch, n_step=n_step, gamma=gamma, beta=0.4, fields=fields, episode_end="redraw")
            except SemanticError as e:   # too few windows fit: the route refuses the same, counting nothing
                with pytest.raises(SemanticError, match="too short"):
                    route.sample(batch, n_step=n_step, gamma=gamma, beta=0.4, fields=fields, episode_end="redraw")
                assert "too short" in str(e)
                assert_same_buffers(route, ref)
                continue
            a = route.sample(batch, n_step=n_step, gamma=gamma, beta=0.4, fields=fields, episode_end="redraw")
            assert_same_batch(a, b)
            assert_same_buffers(route, ref)
            held = after_draw(route, ref, a, b, held, ops, prioritized)
    finally:
        route.close(), ref.close()


def test_a_closed_buffer_and_a_fifo_one_get_the_references_answers():
    route, ref = twins(Uniform)
    for buf in (route, ref):
        buf.add(rollout(30))
        buf.close()
    with pytest.raises(ClosedError):
        route.sample(8, n_step=3, gamma=0.9, episode_end="redraw")
    fifo = ExperienceBuffer(spec=SPEC, capacity=64, selector=Fifo(), seed=7, reuse_outputs=2)
    fifo.add(rollout(30))
    with pytest.raises(ConfigError, match="take"):
        fifo.sample(8, n_step=3, episode_end="redraw")
    fifo.close()


def test_draws_the_route_does_not_fit_go_to_the_reference():
    """A rate limit to wait on, rows below min_size, a codec, the shortening rule, a device, slot
    order, no output pool: the dispatcher sends the draw to the reference."""
    spi, _ = twins(Uniform, rate_limiter=RateLimiter(samples_per_insert=4.0))
    small, _ = twins(Uniform, rate_limiter=RateLimiter(min_size=1000))
    coded = ExperienceBuffer(spec=ExperienceSpec.transition(obs_shape=(4,), obs_codec=AffineCodec(scale=1.0)),
                             capacity=64, seed=7, reuse_outputs=2)
    plain = ExperienceBuffer(spec=SPEC, capacity=64)
    for buf in (spi, small, coded, plain):
        buf.add(rollout(30, done_at=29))
        if buf is small:
            with pytest.raises(RateLimitTimeout):
                buf.sample(8, n_step=3, gamma=0.9, episode_end="redraw", timeout=0.01)
        else:
            buf.sample(8, n_step=3, gamma=0.9, episode_end="redraw", timeout=0.5)
        assert windows_drawn(buf) == 0 and buf.routes.draws["reference"] == 1
        buf.close()
    route, _ = twins(Uniform)
    route.add(rollout(30, done_at=29))
    route.sample(8, n_step=3, episode_end="shorten"), route.sample(8, n_step=3, episode_end="redraw", device="cpu")
    with pytest.raises(ConfigError, match="in_slot_order"):
        route.sample(8, n_step=3, episode_end="redraw", in_slot_order=True)
    assert windows_drawn(route) == 0 and route.routes.draws["reference"] == 2
    route.close()


def test_the_data_planes_sequential_deliveries_take_the_route_across_a_migration():
    """Through ExperienceDataPlane.deliver (the route RLlib's adapter takes): the same batches as
    the reference on a twin, before and after a migration swaps the storage and trees (to one
    larger shard: the route's; then two: the general route's)."""
    planes = [ExperienceDataPlane(buffer=buf, schedule=Schedule.sequential())
              for buf in twins(lambda: Prioritized(alpha=0.6))]
    route_plane, ref_plane = planes
    taken = []
    ops = np.random.default_rng(3)
    start = 0
    try:
        for phase, shards in enumerate(([ShardSpec("pageable", 96)], [ShardSpec("pageable", 64)] * 2, None)):
            for _ in range(15):
                r = rollout(9, start, done_at=8)
                start += 9
                for p in planes:
                    p.ingest(r, source=0)
                before = windows_drawn(route_plane.buffer)
                a = route_plane.deliver(12, n_step=(2, 4), gamma=0.95, beta=0.4, episode_end="redraw")
                taken.append(windows_drawn(route_plane.buffer) > before)
                b = ref_plane.buffer.sample(12, n_step=(2, 4), gamma=0.95, beta=0.4, episode_end="redraw")
                assert_same_batch(a, b)
                pr = ops.random(12) + 0.1
                route_plane.update_priorities(a, pr)
                ref_plane.buffer.update_priorities(b.slots, pr, seqs=b.seqs)
            if shards is not None:
                for p in planes:
                    p.migrate(shards=shards, capacity=sum(s.capacity for s in shards), background=False)
        assert taken == [True] * 30 + [False] * 15
        assert_same_buffers(route_plane.buffer, ref_plane.buffer)
    finally:
        for p in planes:
            p.close()
