"""``InlineInsert`` (an ingest call's rollouts of plain host columns stored in a few frames)
against the routes it stands in for, ``ExperienceBuffer.add`` (one rollout) and
``add_encoded_many`` (several): twin buffers given the same rollouts, evictions and priority
updates must hold the same state after every call (rows in every slot, metadata and episode
links, open episodes, holes, priorities and their trees); where the route does not apply it
changes nothing, and the data plane's general route answers."""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conduit_core import (AffineCodec, ConfigError, ExperienceBuffer, ExperienceDataPlane, ExperienceSpec, Fifo,
                          Prioritized, RateLimiter, Schedule, ShardSpec, SpecError, Uniform)
from conduit_core.buffer.routes import DECLINED
from conduit_core.plane.hooks import Rollout

from ..helpers import SPEC, assert_same_state, rollout


def twins(selector, capacity=48, **kw):
    return [ExperienceBuffer(spec=kw.pop("spec", SPEC), capacity=capacity, selector=selector(), seed=3, **kw)
            for _ in range(2)]


def general_add(buf, rollout, source, version):
    """``ExperienceBuffer.add``'s general route (encode, then add_encoded): the reference, as
    ``add`` itself takes ``insert_one``'s route where it applies."""
    n, cols = buf.encode(rollout)
    return buf.add_encoded(cols, n, source=source, policy_version=version)


def assert_same_buffers(route, ref):
    assert_same_state(route.state_dict(), ref.state_dict())
    written = min(ref.inserted, ref.capacity)   # (slots never written hold whatever the memory held)
    for (name, a), (_, b) in zip(route.storage.row_copy_targets(), ref.storage.row_copy_targets()):
        assert np.array_equal(a[:written], b[:written]), name   # removed and overwritten rows too
    for name in ("seq", "next_seq", "version", "source"):
        assert np.array_equal(route.meta[name], ref.meta[name]), name
    assert route.ring.open_tail == ref.ring.open_tail
    assert (route.ring.inserted, route.ring.holes) == (ref.ring.inserted, ref.ring.holes)
    if route.selector.weighted:
        assert route.selector.index.total == ref.selector.index.total
        assert route.selector.index.min == ref.selector.index.min
        assert np.array_equal(route.selector.trees[0], ref.selector.trees[0])


def assert_same_live_state(route, ref):
    """State minus its data (which after a migration also holds slots no row was copied to),
    plus every live row's columns."""
    a, b = route.state_dict(), ref.state_dict()
    a.pop("data"), b.pop("data")
    assert_same_state(a, b)
    lo, hi = ref.live_range()
    seqs = np.arange(lo, hi, dtype=np.int64)
    seqs = seqs[ref.ring.stored(seqs)]
    assert_same_state(route.stored_columns(seqs), ref.stored_columns(seqs))


def one_rollout(ops, start, capacity):
    n = int(ops.integers(1, capacity + 1)) if ops.random() < 0.1 else int(ops.integers(1, min(9, capacity + 1)))
    done = int(ops.integers(0, n)) if ops.random() < 0.5 else None
    r = rollout(n, start, done_at=done)
    r["reward"] = ops.random(n).astype(np.float32)
    if ops.random() < 0.2:
        r["truncated"][-1] = True
    return r, int(ops.integers(0, 3)), int(ops.integers(0, 5))


def insert(route, ref, ops, start, capacity):
    """One call of one to three rollouts (a group fits the ring, as the route requires)."""
    parts = []
    for _ in range(int(ops.integers(1, 4)) if ops.random() < 0.4 else 1):
        r, src, version = one_rollout(ops, start, capacity)
        if sum(len(p[0]["reward"]) for p in parts) + len(r["reward"]) > capacity:
            break
        parts.append((r, src, version))
        start += len(r["reward"])
    if len(parts) == 1:
        r, src, version = parts[0]
        want = [(general_add(ref, r, src, version), len(r["reward"]))]
    else:
        enc = [ref.encode(r) for r, _, _ in parts]
        firsts = ref.add_encoded_many([(cols, n, src, v) for (n, cols), (_, src, v) in zip(enc, parts)])
        want = [(f, n) for f, (n, _) in zip(firsts, enc)]
    assert route.routes.inline_insert.insert(parts) == want
    return start


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), prioritized=st.booleans(), capacity=st.integers(4, 70))
def test_any_schedule_of_inserts_evictions_and_updates_leaves_the_references_state(seed, prioritized, capacity):
    selector = (lambda: Prioritized(alpha=0.7)) if prioritized else Uniform
    route, ref = twins(selector, capacity=capacity)
    ops = np.random.default_rng(seed)
    start = 0
    try:
        for _ in range(25):
            start = insert(route, ref, ops, start, capacity)
            assert_same_buffers(route, ref)
            if ops.random() < 0.3 and len(ref) > 1:   # removed rows: holes the ring later overwrites
                seqs = np.unique(ops.integers(ref.inserted - len(ref), ref.inserted, 3))
                route.evict(seqs), ref.evict(seqs)
            if prioritized and len(ref) and ops.random() < 0.5:
                a, b = route.sample(4), ref.sample(4)
                p = ops.random(4) * 5 + 0.01
                route.update_priorities(a.slots, p, seqs=a.seqs), ref.update_priorities(b.slots, p, seqs=b.seqs)
            assert_same_buffers(route, ref)
    finally:
        route.close(), ref.close()


def declined(buf, data, source=0, version=0):
    """The route declines ``data``, with the buffer's state as it was."""
    before = buf.state_dict()
    assert buf.routes.inline_insert.insert([(data, source, version)]) is DECLINED
    assert_same_state(buf.state_dict(), before)


def test_input_the_native_check_does_not_take_as_it_is_is_declined_untouched():
    buf = ExperienceBuffer(spec=SPEC, capacity=32, selector=Prioritized(), seed=0)
    buf.add(rollout(5))
    good = rollout(3)
    nan = rollout(3)
    nan["reward"][1] = np.nan
    cases = [{**good, "obs": torch.from_numpy(good["obs"])},   # a tensor: the general route takes it
             {**good, "obs": good["obs"][:, ::-1]},             # a strided view
             {**good, "action": good["action"].astype(np.int32)},
             nan, {k: v for k, v in good.items() if k != "reward"}, {**good, "extra": good["reward"]},
             {**good, "reward": good["reward"][:2]},
             rollout(0), rollout(40)]   # no rows; more rows than the ring holds
    for data in cases:
        declined(buf, data)
    from collections import OrderedDict
    declined(buf, OrderedDict(good))   # (the native check reads exact dicts)
    buf.close()


def test_buffers_the_route_does_not_apply_to_decline_untouched():
    coded = ExperienceBuffer(spec=ExperienceSpec.transition(obs_shape=(4,), obs_codec=AffineCodec(scale=1.0)),
                             capacity=32, seed=0)
    limited = ExperienceBuffer(spec=SPEC, capacity=32, seed=0, rate_limiter=RateLimiter(samples_per_insert=2.0))
    fifo = ExperienceBuffer(spec=SPEC, capacity=32, selector=Fifo(), seed=0)
    for buf in (coded, limited, fifo):
        buf.add(rollout(4))
        declined(buf, rollout(3))
        buf.close()
    closed = ExperienceBuffer(spec=SPEC, capacity=32, seed=0)
    closed.close()
    assert closed.routes.inline_insert.insert([(rollout(3), 0, 0)]) is DECLINED


def test_the_route_follows_a_migration_to_the_new_storage():
    planes = [ExperienceDataPlane(buffer=buf, schedule=Schedule.sequential()) for buf in twins(Prioritized, 32)]
    route, ref = planes
    start = 0
    try:
        for shards in ([ShardSpec("pageable", 40)], [ShardSpec("pageable", 24)] * 2, None):
            for _ in range(12):
                r = rollout(5, start, done_at=4 if start % 2 else None)
                start += 5
                got = route.buffer.routes.inline_insert.insert([(r, 1, 2)])
                first = general_add(ref.buffer, r, 1, 2)
                if shards is None:   # two shards: not the route's layout (it declines, untouched)
                    assert got is DECLINED
                    route.buffer.add(r, source=1, policy_version=2)
                else:
                    assert got == [(first, 5)]
                assert_same_live_state(route.buffer, ref.buffer)
            if shards is not None:
                for p in planes:
                    p.migrate(shards=shards, capacity=sum(s.capacity for s in shards), background=False)
    finally:
        for p in planes:
            p.close()


def general_route(plane):
    """The data plane's reference insert only: the native route never taken (nothing of it runs)."""
    plane.buffer.routes.fast = False


class Spy:
    """Counts the route's answers (stored / declined) on a data plane's buffer."""

    def __init__(self, buf):
        self.answers, self._insert = [], buf.routes.inline_insert.insert
        buf.routes.inline_insert.insert = self

    def __call__(self, *a):
        got = self._insert(*a)
        self.answers.append(got is not DECLINED)
        return got


def test_the_data_planes_ingest_many_takes_the_route_and_counts_as_the_general_route():
    """Tickets, accepted / committed rows, metrics and the stored state: the route's plane and a
    twin whose route always declines (the general route) agree call after call; a hook, a group,
    and bad input go the general route (the error it names, nothing stored)."""
    route, ref = (ExperienceDataPlane(buffer=b, schedule=Schedule.sequential()) for b in twins(Prioritized))
    spy = Spy(route.buffer)
    general_route(ref)
    try:
        start = 0
        for i in range(20):
            r = rollout(3, start, done_at=2 if i % 3 == 0 else None)
            start += 3
            items = [Rollout(r, source=i % 2, policy_version=i)] if i % 4 else [r]
            assert route.ingest_many(items) == ref.ingest_many(items)
            if i % 5 == 4:   # a group of two: add_encoded_many's route
                pair = [Rollout(rollout(2, start), source=1), Rollout(rollout(2, start + 2), source=0)]
                start += 4
                assert route.ingest_many(pair) == ref.ingest_many(pair)
        bad = rollout(3)
        bad["action"] = bad["action"].astype(np.float32)
        for p in (route, ref):
            with pytest.raises(SpecError, match="action"):
                p.ingest_many([bad])
            with pytest.raises(SpecError, match="action"):   # a group: refused before any of it is stored
                p.ingest_many([rollout(2, start), Rollout(bad, source=1)])
        assert spy.answers.count(True) == 24 and spy.answers[-2:] == [False, False]   # (the pairs too)
        for a, b in ((route.ingestion, ref.ingestion),):
            assert (a.ticket, a.accepted_rows, a.committed_rows) == (b.ticket, b.accepted_rows, b.committed_rows)
        ma, mb = route.metrics().ingest, ref.metrics().ingest
        assert (ma.calls, ma.items_in, ma.items_out) == (mb.calls, mb.items_in, mb.items_out) == (26, 76, 76)
        assert ma.blocked_s > 0 and ma.busy_s > 0
        assert_same_state(route.buffer.state_dict(), ref.buffer.state_dict())
        seen = []
        hooked = ExperienceDataPlane(buffer=ExperienceBuffer(spec=SPEC, capacity=16), schedule=Schedule.sequential(),
                                     ingest_hooks=[lambda rs: seen.extend(rs) or rs])
        hooked_spy = Spy(hooked.buffer)
        hooked.ingest_many([rollout(2)])
        assert len(seen) == 1 and hooked_spy.answers == [] and len(hooked.buffer) == 2
        hooked.close()
        route.close()
        with pytest.raises(Exception, match="closed"):
            route.ingest_many([rollout(2)])
    finally:
        route.close(), ref.close()


def test_a_uniform_buffer_wrapping_its_ring_with_holes_keeps_the_references_windows():
    """The rows the route stored are drawn into n-step windows as the reference's are: the same
    episode links across wraps and removed rows."""
    route, ref = twins(Uniform, capacity=20)
    ops = np.random.default_rng(5)
    start = 0
    for i in range(30):
        start = insert(route, ref, ops, start, 20)
        if i % 7 == 6:
            seqs = np.arange(ref.inserted - len(ref), ref.inserted - len(ref) + 2)
            route.evict(seqs), ref.evict(seqs)
    a = route.sample(16, n_step=3, gamma=0.9)
    b = ref.sample(16, n_step=3, gamma=0.9)
    for name in a:
        assert torch.equal(a[name], b[name]), name
    route.close(), ref.close()


def test_initial_priorities_and_a_misuse_still_take_the_buffers_checks():
    buf = ExperienceBuffer(spec=SPEC, capacity=16, selector=Uniform())
    with pytest.raises(ConfigError):
        buf.add(rollout(2), priorities=[1.0, 2.0])   # (add's own argument: the route never takes priorities)
    assert buf.routes.inline_insert.insert([(rollout(2), 0, 0)]) == [(0, 2)]
    buf.close()


def test_a_copy_that_fails_midway_leaves_what_the_general_route_leaves():
    """A rollout's copy fails after the first of a group was copied (forced: the storage's write
    raises on its second call): the first stays stored and is named in the error's
    ``stored_tickets``, on both routes alike, and both count the same."""
    route, ref = (ExperienceDataPlane(buffer=b, schedule=Schedule.sequential()) for b in twins(Prioritized))
    general_route(ref)
    spy = Spy(route.buffer)
    try:
        for p in (route, ref):
            p.ingest_many([rollout(4)])
            storage, calls = p.buffer.storage, []
            write = storage.write

            def failing(*a, _write=write, _calls=calls):
                _calls.append(1)
                if len(_calls) == 2:
                    raise MemoryError("injected")
                return _write(*a)
            storage.write = failing
        pair = [Rollout(rollout(3, 4), source=1), Rollout(rollout(2, 7), source=2)]
        errors = []
        for p in (route, ref):
            with pytest.raises(MemoryError) as e:
                p.ingest_many(pair)
            errors.append(e.value)
        assert errors[0].stored_tickets == errors[1].stored_tickets == [1]
        assert spy.answers == [True]   # (the failed call raised: no answer)
        for a, b in ((route.ingestion, ref.ingestion),):
            assert (a.ticket, a.accepted_rows, a.committed_rows) == (b.ticket, b.accepted_rows, b.committed_rows) \
                == (3, 7, 7)
        assert_same_live_state(route.buffer, ref.buffer)
        assert len(route.buffer) == 7
    finally:
        route.close(), ref.close()


def test_sources_and_versions_that_are_not_plain_ints_go_the_general_route():
    """A numpy int goes the general route with the same answer; anything else that is not an int
    >= 0 (a bool, a string, None, a negative one), even on a rollout of zero rows, is refused by
    both routes alike, naming the argument, before a ticket is taken or a row stored."""
    route, ref = (ExperienceDataPlane(buffer=b, schedule=Schedule.sequential()) for b in twins(Prioritized))
    general_route(ref)
    bad = rollout(2)
    bad["action"] = bad["action"].astype(np.float32)
    try:
        for items in ([Rollout(rollout(2), source=np.int64(3), policy_version=np.int32(2))],
                      [Rollout(rollout(2), source=1), Rollout(rollout(0), policy_version=4)]):
            assert route.ingest_many(items) == ref.ingest_many(items)
        for items, error in (([Rollout(rollout(2), source=np.int64(3), policy_version=True)], ConfigError),
                             ([Rollout(rollout(0), source="actor-7")], ConfigError),
                             ([Rollout(rollout(2), source=1), Rollout(rollout(0), policy_version=None)], ConfigError),
                             ([Rollout(rollout(2), source=-1)], ConfigError),
                             ([Rollout(rollout(2), source=None)], ConfigError),
                             ([Rollout(bad, source=2)], SpecError)):
            for p in (route, ref):
                tickets, rows = p.ingestion.ticket, len(p.buffer)
                with pytest.raises(error):
                    p.ingest_many(items)
                assert len(p.buffer) == rows and (error is SpecError or p.ingestion.ticket == tickets)
        assert route.ingestion.ticket == ref.ingestion.ticket
        assert_same_state(route.buffer.state_dict(), ref.buffer.state_dict())
    finally:
        route.close(), ref.close()


def test_a_plan_is_never_paired_with_another_storage():
    """A call that runs while another makes the plan for the storage a migration brought (a
    second thread, simulated here by a call made from inside the first one's planning) must
    not take the replaced storage's copy targets for the new storage (found by review: its
    rows went into the closed storage and were counted as stored)."""
    buf = ExperienceBuffer(spec=SPEC, capacity=16, seed=0)
    route = buf.routes.inline_insert
    assert route.insert([(rollout(4), 0, 0)]) == [(0, 4)]   # (the plan for the first storage)
    plane = ExperienceDataPlane(buffer=buf, schedule=Schedule.sequential())
    plane.migrate(shards=[ShardSpec("pageable", 24)], capacity=24, background=False)
    new = buf.storage
    targets, nested = new.row_copy_targets, []

    def planning():   # the first call is making its plan: the other thread's call comes now
        if not nested:
            nested.append(None)
            nested[0] = route.insert([(rollout(3, 4), 0, 0)])
        return targets()
    new.row_copy_targets = planning
    assert route.insert([(rollout(2, 7), 0, 0)]) == [(7, 2)]
    assert nested == [[(4, 3)]]
    np.testing.assert_array_equal(buf.stored_columns(np.arange(9))["obs"][:, 0].numpy(), np.arange(9))
    plane.close()
