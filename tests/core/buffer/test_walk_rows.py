"""n-step windows over a storage the native walk cannot read directly (here: two host shards) are
walked on rows fetched first in one gather (``conduit_core.buffer.walk_rows``): the same batches as one
host shard's native walk, and no row read on its own.

Found in session 32: the reference read each row's reward and done flags with one gather per
field and step, so on a remote shard a B=32 draw made ~250 Ray round trips (0.56 s per
sample in RLlib's DQN writing at the source); tests/distributed/test_remote_tier.py checks the
remote case."""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conduit_core import ExperienceBuffer, ExperienceSpec, Prioritized, ShardSpec, Uniform
from conduit_core.buffer.episodes import window_source
from conduit_core.buffer.walk_rows import window_candidates

SPEC = ExperienceSpec.transition(obs_shape=(2,))


def _fill(bufs, rng, episodes: int) -> None:
    for c in range(episodes):
        n = int(rng.integers(1, 12))
        cols = {"obs": rng.random((n, 2), dtype=np.float32), "next_obs": rng.random((n, 2), dtype=np.float32),
                "action": np.arange(n), "reward": rng.random(n).astype(np.float32),
                "terminated": rng.random(n) < 0.15, "truncated": rng.random(n) < 0.05}
        for buf in bufs:
            buf.add(cols, source=c % 3)


def _count_gathers(storage, together: list | None = None) -> list:
    """Wrap ``storage.gather`` and ``storage.gather_each`` (on the instance) to record each
    gather's row count and fields; ``together`` gets how many gathers each ``gather_each`` call
    started at once."""
    calls, inner, inner_each, inside = [], storage.gather, storage.gather_each, [0]

    def gather(slots, *args, fields=None, **kw):
        if not inside[0]:   # (gather_each's own gathers, on one host shard, are counted there)
            calls.append((int(np.asarray(slots).size), None if fields is None else tuple(fields)))
        return inner(slots, *args, fields=fields, **kw)

    def gather_each(requests, **kw):
        calls.extend((int(np.asarray(slots).size), tuple(fields)) for slots, fields in requests)
        if together is not None:
            together.append(len(requests))
        inside[0] += 1
        try:
            return inner_each(requests, **kw)
        finally:
            inside[0] -= 1
    storage.gather, storage.gather_each = gather, gather_each
    return calls


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), prioritized=st.booleans(), n_step=st.sampled_from([3, (2, 5), (1, 4)]),
       end=st.sampled_from(["shorten", "redraw"]), evict=st.integers(0, 5), python_walk=st.booleans())
def test_two_shards_deliver_what_one_host_shard_delivers_without_reading_a_row_alone(seed, prioritized, n_step,
                                                                                        end, evict, python_walk):
    """The two-shard buffer walks natively on ``ScratchWalkViews`` (rows not fetched read as NaN
    rewards and done flags: a walk that strayed would differ), or with ``python_walk`` by the
    Python reference on ``PrefetchedRows`` (the route for columns the C walk cannot read)."""
    rng = np.random.default_rng(seed)
    cap = int(rng.integers(20, 90))
    half = cap // 2
    make = lambda shards: ExperienceBuffer(spec=SPEC, capacity=cap, shards=shards, seed=seed,
                                           selector=Prioritized(alpha=0.7) if prioritized else Uniform())
    one, two = make(None), make([ShardSpec("pageable", half), ShardSpec("pageable", cap - half)])
    try:
        assert one.walk.native_views(one.storage) is not None   # the native walk
        assert two.walk.native_views(two.storage) is None       # walked on prefetched rows
        walks, walk = [0], two.walk
        native_walk, numpy_walk = walk.walk_prefetched, walk.n_step_returns_numpy

        def redraw_walk(*args):   # one per pool of uniforms
            walks[0] += 1
            return walk.sample_windows_reference(*args) if python_walk else native_walk(*args)

        def shorten_walk(*args):   # one per draw
            walks[0] += 1
            return numpy_walk(*args)
        walk.walk_prefetched, walk.n_step_returns_numpy = redraw_walk, shorten_walk
        _fill((one, two), rng, int(rng.integers(4, 30)))
        if evict:
            gone = rng.integers(one.inserted - len(one), one.inserted, evict)
            one.evict(gone)
            two.evict(gone)
        if prioritized:
            s = np.flatnonzero(one.selector.index.leaves() > 0)
            p = rng.random(s.size) + 0.1
            one.update_priorities(s, p, slots_only=True)
            two.update_priorities(s, p, slots_only=True)
        together = []
        calls = _count_gathers(two.storage, together)
        walk_fields = ("reward", *two.walk.done_fields)
        samples = 0
        for _ in range(3):
            try:
                a = one.sample(16, n_step=n_step, episode_end=end)
            except Exception as exc:   # (no window fits: both must say so, the same way)
                try:
                    two.sample(16, n_step=n_step, episode_end=end)
                except type(exc) as twin:
                    assert str(twin) == str(exc)
                    break
                raise AssertionError(f"one host shard raised {exc!r}, two shards did not")
            b = two.sample(16, n_step=n_step, episode_end=end)
            samples += 1
            assert set(a.keys()) == set(b.keys())
            for k in a.keys():
                assert torch.equal(a[k], b[k]), k
            assert np.array_equal(a.seqs, b.seqs) and np.array_equal(a.slots, b.slots)
            assert (a.weights is None) == (b.weights is None)
            if a.weights is not None:
                assert torch.equal(a.weights, b.weights)
        assert one.rng.bit_generator.state == two.rng.bit_generator.state
        # every walk read its rows in one gather, and nothing else was read but each batch's rows (two)
        assert sum(fields == walk_fields for _, fields in calls) == walks[0], (walks, calls)
        assert len(calls) == walks[0] + 2 * samples, (walks, samples, calls)
        assert together == [2] * samples   # the batch's first and last rows started together
    finally:
        one.close()
        two.close()


def test_the_candidates_are_each_tries_start_and_its_linked_successors():
    """Pure: the starts the uniforms pick, then n_hi - 2 links down each episode, stopping at a
    successor the ring no longer holds."""
    buf = ExperienceBuffer(spec=SPEC, capacity=10, seed=0)
    try:
        row = lambda n, done: {"obs": np.zeros((n, 2), np.float32), "next_obs": np.zeros((n, 2), np.float32),
                               "action": np.zeros(n, np.int64), "reward": np.ones(n, np.float32),
                               "terminated": np.r_[np.zeros(n - 1, bool), [done]], "truncated": np.zeros(n, bool)}
        buf.add(row(6, True))     # seqs 0-5: one episode
        buf.add(row(4, False))    # seqs 6-9: the next, still running
        source, _ = window_source(buf.ring, buf.selector, None, None)
        u = np.array([0.05, 0.55, 0.75, 0.95])   # one uniform per try (a fixed n): starts 0, 5, 7, 9
        got = window_candidates(source, buf.selector, u, 3, 4)   # n = 3: a start and two successors
        # 0 -> 1 -> 2 and 7 -> 8 -> 9; 5 ends its episode and 9 is the newest row: no successor
        assert got.tolist() == [0, 1, 2, 5, 7, 8, 9]
        buf.evict([8])   # a removed row ends the chain: 7 alone
        source, _ = window_source(buf.ring, buf.selector, None, None)
        assert window_candidates(source, buf.selector, np.array([0.75]), 3, 4).tolist() == [7]
        assert window_candidates(source, buf.selector, u[:0], 3, 4).size == 0
    finally:
        buf.close()


def test_scratch_views_hold_only_the_rows_of_the_walk_and_a_failed_walk_leaves_none():
    """Outside the rows filled in, a NaN reward and both done flags set; ``clear`` restores that,
    and a walk that fails leaves nothing behind (``EpisodeWalk.walk_prefetched``'s finally)."""
    from conduit_core.buffer.walk_rows import ScratchWalkViews
    buf = ExperienceBuffer(spec=SPEC, capacity=40, seed=0,
                           shards=[ShardSpec("pageable", 20), ShardSpec("pageable", 20)])
    try:
        _fill((buf,), np.random.default_rng(0), 12)
        assert ScratchWalkViews.reads(buf.spec, buf.walk.done_fields)
        scratch = ScratchWalkViews(40)
        rows = np.array([1, 5, 30])
        reward, term, trunc = scratch.fill(buf.storage, rows, buf.walk.done_fields)
        stored = buf.storage.gather(rows, fields=["reward", "terminated"])
        assert np.array_equal(reward[rows], stored["reward"].numpy())
        assert np.array_equal(term[rows], stored["terminated"].numpy())
        others = np.setdiff1d(np.arange(40), rows)
        assert np.isnan(reward[others]).all() and (term[others] == 1).all() and (trunc[others] == 1).all()
        scratch.clear(rows)
        assert np.isnan(reward).all() and (term == 1).all() and (trunc == 1).all()

        from conduit_core.buffer import episodes as episodes_mod
        native = episodes_mod._c_sample_windows

        def walk_fails(*args):   # the walk fails once its rows are written in
            raise RuntimeError("injected")
        episodes_mod._c_sample_windows = walk_fails
        try:
            with pytest.raises(RuntimeError, match="injected"):
                buf.sample(8, n_step=3, episode_end="redraw")
        finally:
            episodes_mod._c_sample_windows = native
        left = buf.walk._scratch   # (the walk's own scratch: nothing of the failed walk stays in it)
        assert np.isnan(left.reward).all() and (left.terminated == 1).all() and (left.truncated == 1).all()
        again = buf.sample(8, n_step=3, episode_end="redraw")   # the next draw is whole and finite
        assert torch.isfinite(again["reward"]).all()
    finally:
        buf.close()
