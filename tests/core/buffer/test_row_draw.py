"""``PooledRowDraw`` (a 1-step replay draw into the output pool in a few frames) against the
reference it stands in for, ``delivery.draw_reference`` (taken on a twin whose
``routes.fast`` is False): the two must hand out the same batches (values, weights, slots,
provenance), leave their RNGs in the same state and count the same, draw after draw; the draw
dispatcher sends it exactly the draws it carries out."""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conduit_core.errors import RateLimitTimeout
from conduit_core import (AffineCodec, ClosedError, ConfigError, ExperienceBuffer, ExperienceDataPlane, ExperienceSpec, Fifo,
                          Prioritized, RateLimiter, Schedule, ShardSpec, Uniform)

from ..helpers import SPEC, rollout
from .test_window_draw import after_draw, assert_same_batch, assert_same_buffers, insert, schedule_step


def twins(selector, capacity=64, **kw):
    """(route's buffer, reference buffer): the same seed, rows and priorities; the reference
    samples by the reference only."""
    spec = kw.pop("spec", SPEC)
    route, ref = [ExperienceBuffer(spec=spec, capacity=capacity, selector=selector(), seed=7, reuse_outputs=2, **kw)
                  for _ in range(2)]
    ref.routes.fast = False
    return route, ref


def rows_drawn(buf) -> int:
    return buf.routes.draws["pooled_rows"]


def assert_same_sources(a, b):
    np.testing.assert_array_equal(a.sources, b.sources)
    assert a.redraws == b.redraws == 0


@pytest.mark.parametrize("selector", [Uniform, lambda: Prioritized(alpha=0.6), lambda: Prioritized(alpha=0.6, beta=0.0)])
@pytest.mark.parametrize("beta", [None, 0.4, 0.0])
def test_the_route_hands_out_the_reference_batches(selector, beta):
    route, ref = twins(selector)
    ops = np.random.default_rng(1)
    start = 0
    for _ in range(60):   # the ring wraps several times
        start = insert([route, ref], ops, start)
        a = route.sample(16, beta=beta)
        b = ref.sample(16, beta=beta)
        assert_same_batch(a, b)
        assert_same_sources(a, b)
        assert_same_buffers(route, ref)
        if route.selector.weighted:
            p = ops.random(16) + 0.05
            route.update_priorities(a.slots, p, seqs=a.seqs)
            ref.update_priorities(b.slots, p, seqs=b.seqs)
    assert rows_drawn(route) == 60 and rows_drawn(ref) == 0
    route.close(), ref.close()


def test_sample_takes_the_route_for_a_plain_draw_only():
    """``sample(B)`` (any gamma, beta or episode_end) goes through the route; n-step, fields, a
    device and in-slot order go to the reference."""
    route, _ = twins(lambda: Prioritized(alpha=0.6))
    route.add(rollout(40))
    route.sample(8), route.sample(8, beta=0.5, gamma=0.9), route.sample(8, episode_end="redraw")
    assert rows_drawn(route) == 3
    route.sample(8, n_step=2), route.sample(8, fields=("obs",)), route.sample(8, device="cpu")
    route.sample(8, in_slot_order=True)
    assert rows_drawn(route) == 3 and route.routes.draws["reference"] == 4
    route.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), prioritized=st.booleans(), batch=st.integers(1, 40),
       capacity=st.integers(24, 90), beta=st.sampled_from([None, 0.0, 0.4, 1.0]))
def test_any_schedule_of_inserts_evictions_draws_and_updates_matches_the_reference(seed, prioritized, batch, capacity,
                                                                                   beta):
    """Inserts, evictions (ring holes), pool growth (reserve), priority updates and draws in any
    order; the route's buffer sometimes draws by the general route (both take entries from the
    same pool rings), and the batch before each draw must still hold what it held."""
    selector = (lambda: Prioritized(alpha=0.7)) if prioritized else Uniform
    route, ref = twins(selector, capacity=capacity)
    ops = np.random.default_rng(seed)
    held = None
    start = insert([route, ref], ops, 0)
    try:
        for _ in range(12):
            start = schedule_step(route, ref, ops, start)
            if len(ref) == 0:   # (an empty buffer's sample waits for rows: both routes)
                continue
            b = ref.sample(batch, beta=beta)
            route.routes.fast = ops.random() >= 0.25   # sometimes the reference
            a = route.sample(batch, beta=beta)
            assert_same_batch(a, b)
            assert_same_sources(a, b)
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
        route.sample(8)
    fifo = ExperienceBuffer(spec=SPEC, capacity=64, selector=Fifo(), seed=7, reuse_outputs=2)
    fifo.add(rollout(30))
    with pytest.raises(ConfigError, match="take"):
        fifo.sample(8)
    fifo.close()


def test_bad_arguments_get_the_references_errors():
    route, _ = twins(Uniform)
    route.add(rollout(30))
    with pytest.raises(ConfigError, match="batch_size"):
        route.sample(0)
    with pytest.raises(ConfigError, match="beta"):
        route.sample(8, beta=-1.0)
    with pytest.raises(ConfigError, match="episode_end"):
        route.sample(8, episode_end="sometimes")
    route.close()


def test_draws_the_route_does_not_fit_go_to_the_reference():
    """A rate limit to wait on, rows below min_size, a codec, two shards, no output pool: the
    dispatcher sends the draw to the reference (which waits, decodes or gathers by shard)."""
    spi, _ = twins(Uniform, rate_limiter=RateLimiter(samples_per_insert=4.0))
    small, _ = twins(Uniform, rate_limiter=RateLimiter(min_size=1000))
    coded = ExperienceBuffer(spec=ExperienceSpec.transition(obs_shape=(4,), obs_codec=AffineCodec(scale=1.0)),
                             capacity=64, seed=7, reuse_outputs=2)
    sharded = ExperienceBuffer(spec=SPEC, capacity=64, seed=7, reuse_outputs=2,
                               shards=[ShardSpec("pageable", 32)] * 2)
    for buf in (spi, small, coded, sharded):
        buf.add(rollout(30))
        if buf is small:
            with pytest.raises(RateLimitTimeout):
                buf.sample(8, timeout=0.01)
        else:
            buf.sample(8, timeout=0.5)
        assert rows_drawn(buf) == 0 and buf.routes.draws["reference"] == 1
        buf.close()
    plain = ExperienceBuffer(spec=SPEC, capacity=8)   # no output pool: no pooled route
    plain.add(rollout(8))
    plain.sample(4)
    assert rows_drawn(plain) == 0 and plain.routes.rows is None
    plain.close()


def test_the_route_follows_a_migration_of_the_storage():
    """A data plane's migration swaps the storage: to one larger shard (the route's), then two
    (the general route's): the same batches as the reference throughout."""
    planes = [ExperienceDataPlane(buffer=buf, schedule=Schedule.sequential())
              for buf in twins(lambda: Prioritized(alpha=0.6))]
    route, ref = (p.buffer for p in planes)
    ops = np.random.default_rng(3)
    start = 0
    taken = []
    try:
        for shards in ([ShardSpec("pageable", 96)], [ShardSpec("pageable", 64)] * 2, None):
            for _ in range(10):
                r = rollout(9, start, done_at=8)
                start += 9
                for p in planes:
                    p.ingest(r, source=0)
                before = rows_drawn(route)
                a, b = route.sample(12, beta=0.4), ref.sample(12, beta=0.4)
                taken.append(rows_drawn(route) > before)
                assert_same_batch(a, b)
                pr = ops.random(12) + 0.1
                route.update_priorities(a.slots, pr, seqs=a.seqs)
                ref.update_priorities(b.slots, pr, seqs=b.seqs)
            if shards is not None:
                for p in planes:
                    p.migrate(shards=shards, capacity=sum(s.capacity for s in shards), background=False)
        assert taken == [True] * 20 + [False] * 10
        assert_same_buffers(route, ref)
    finally:
        for p in planes:
            p.close()
