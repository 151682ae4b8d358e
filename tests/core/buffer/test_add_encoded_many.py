"""``add_encoded_many``: several rollouts as one insert is the same as adding them one by one
(rows, seqs, metadata and episode links, priorities), and all or nothing; where one by one
could wait or evict (FIFO, a rate ratio, frame pools) it is one by one."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit_core import ExperienceBuffer, ExperienceSpec, Fifo, Prioritized, RateLimiter, Uniform
from conduit_core.errors import RateLimitTimeout


def make(selector, capacity=50, **kw) -> ExperienceBuffer:
    return ExperienceBuffer(spec=ExperienceSpec.transition(obs_shape=(2,)), capacity=capacity, selector=selector,
                            seed=0, **kw)


def rollout(rng, n, end):
    done = np.zeros(n, bool)
    if end and n:
        done[-1] = True
    return {"obs": rng.standard_normal((n, 2)).astype(np.float32), "next_obs": rng.standard_normal((n, 2)).astype(np.float32),
            "action": rng.integers(0, 3, n), "reward": rng.standard_normal(n).astype(np.float32),
            "terminated": done, "truncated": np.zeros(n, bool)}


def encoded(buf, data):
    return buf.spec.validate_and_encode(data)


def state(buf):
    out = {"inserted": buf.ring.inserted, "open": dict(buf.ring.open_tail),
           "meta": {k: v.copy() for k, v in buf.meta.items()},
           # the stored rows (a slot never written holds whatever the allocator gave)
           "cols": {name: buf.storage.host_view(name)[np.arange(buf.ring.lo(), buf.ring.inserted) % buf.capacity]
                    for name in buf.spec.names}}
    if hasattr(buf.selector, "index"):
        out["tree"] = buf.selector.index.trees()[0].copy()
    return out


def same(a, b):
    assert a["inserted"] == b["inserted"] and a["open"] == b["open"]
    for k in a["meta"]:
        assert np.array_equal(a["meta"][k], b["meta"][k]), k
    for k in a["cols"]:
        assert np.array_equal(a["cols"][k], b["cols"][k]), k
    if "tree" in a:
        assert np.array_equal(a["tree"], b["tree"])


groups = st.lists(st.lists(st.tuples(st.integers(0, 12), st.integers(0, 3), st.booleans()), min_size=1, max_size=6),
                  min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(groups=groups, prioritized=st.booleans(), seed=st.integers(0, 1000))
def test_one_insert_equals_one_by_one(groups, prioritized, seed):
    sel = (lambda: Prioritized(alpha=0.6)) if prioritized else Uniform
    together, apart = make(sel()), make(sel())
    rng = np.random.default_rng(seed)
    for group in groups:   # 1-6 rollouts per call, several sources, episodes ending or not; the ring wraps
        parts = []
        for n, source, end in group:
            n_, cols = encoded(together, rollout(rng, n, end))
            parts.append((cols, n_, source, 0))
        if sum(p[1] for p in parts) > together.capacity:
            continue
        firsts = together.add_encoded_many(parts)
        one_by_one = [apart.add_encoded(c, n, source=s, policy_version=v) for c, n, s, v in parts]
        assert firsts == one_by_one
        same(state(together), state(apart))
    if together.size >= 8:   # and both deliver the same
        a, b = together.sample(8), apart.sample(8)
        assert np.array_equal(a.seqs, b.seqs)
        for k in a:
            assert np.array_equal(a[k].numpy(), b[k].numpy())


def test_a_rollout_failing_part_way_leaves_what_one_by_one_leaves():
    """On a full ring: the rollouts copied before the failure are stored (and named), the ring's
    older rows they replaced are gone; none is left in place holding another rollout's data."""
    together, apart = make(Uniform(), capacity=10), make(Uniform(), capacity=10)
    rng = np.random.default_rng(0)
    n, full = encoded(together, rollout(rng, 10, False))
    n5, good = encoded(together, rollout(rng, 5, False))
    bad = dict(good)
    bad["obs"] = np.zeros((5, 7), np.float32)   # not what encode makes: the copy refuses it
    for buf in (together, apart):
        buf.add_encoded(full, n, source=0)
    with pytest.raises(Exception) as err:
        together.add_encoded_many([(good, n5, 1, 0), (bad, n5, 2, 0)])
    assert err.value.stored_parts == 1
    apart.add_encoded(good, n5, source=1)
    with pytest.raises(Exception):
        apart.add_encoded(bad, n5, source=2)
    same(state(together), state(apart))
    for buf in (together, apart):   # every stored row holds its own data
        got = buf.read(np.arange(buf.ring.lo(), buf.ring.inserted))["obs"].numpy()
        assert np.array_equal(got, np.concatenate([full["obs"][5:], good["obs"]]))


def test_a_migration_starting_before_the_lock_gets_the_rows():
    """The route is judged under the lock: a dual writer attached while the insert waited for
    the lock gets the group (one by one), so the migrated layout holds every row."""
    import threading
    import time

    from conduit_core.buffer.migration import begin_migration
    from conduit_core.storage.shards import ShardSpec
    from conduit_core.memory.tiers import Tier
    buf = make(Uniform(), capacity=20)
    rng = np.random.default_rng(0)
    parts = []
    for s in (1, 2):
        n, c = encoded(buf, rollout(rng, 3, False))
        parts.append((c, n, s, 0))
    with buf.lock:
        t = threading.Thread(target=buf.add_encoded_many, args=(parts,))
        t.start()
        time.sleep(0.2)   # the insert is past any check made before the lock
        mig = begin_migration(buf, shards=[ShardSpec(Tier.PAGEABLE, 40)], capacity=40)
    t.join(10)
    mig.finish()
    assert buf.size == 6
    assert np.array_equal(buf.read(np.arange(6))["obs"].numpy(), np.concatenate([parts[0][0]["obs"], parts[1][0]["obs"]]))


@pytest.mark.parametrize("kind", ["fifo", "rate"])
def test_where_one_by_one_could_wait_it_is_one_by_one(kind):
    """FIFO space and a rate ratio are checked per rollout: the second one times out, the first stays."""
    if kind == "fifo":
        buf = make(Fifo(), capacity=8)
    else:
        buf = make(Uniform(), capacity=50, rate_limiter=RateLimiter(samples_per_insert=1.0, min_size=1, tolerance=6))
    rng = np.random.default_rng(0)
    n, cols = encoded(buf, rollout(rng, 6, False))
    with pytest.raises(RateLimitTimeout) as err:
        buf.add_encoded_many([(cols, n, 0, 0), (cols, n, 1, 0)], timeout=0.05)
    assert err.value.stored_parts == 1 and buf.ring.inserted == 6
