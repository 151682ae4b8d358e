"""Conduit's SRL buffers against SRL's own, on the same puts (real SRL, its venv).

Queue kinds are deterministic: the same schedule of puts and gets must give the same served
samples, in the same order, with the same ``reuses_left``/``reuses``, the same ``qsize`` and
``empty`` after every step. Replay kinds are random: their distributions are compared with
chi-square tests, and every delivered chunk is checked against what was put."""

import math
import queue

import numpy as np
import pytest
from scipy import stats

import conduit_srl
from conduit_srl.buffers import ConduitQueueBuffer, ConduitReplayBuffer, make_buffer
from conduit_core.planning.schedule import Schedule
from rlsrl.api.trainer import SampleBatch
from rlsrl.base import buffer as srl_buffer
from rlsrl.base import namedarray
from rlsrl.base.namedarray import NamedArray

T = 5


@pytest.fixture(autouse=True)
def cpu_pin_memory(monkeypatch):
    """SRL's replay buffers pin their storage (rlsrl/base/buffer.py: .pin_memory()), which raises
    without CUDA; on this CPU machine pinning is the identity (what the CPU shim for runs does)."""
    import torch
    if not torch.cuda.is_available():
        monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a, **k: self)


class Obs(NamedArray):
    def __init__(self, obs, mask=None):
        super().__init__(obs=obs, mask=mask)


class Analyzed(NamedArray):
    def __init__(self, ret, value):
        super().__init__(ret=ret, value=value)


def sample(i: int, *, version: int = 0, ret=True) -> SampleBatch:
    """A sample whose every field encodes its id ``i`` (nested obs, a None leaf, bool and int fields)."""
    return SampleBatch(
        obs=Obs(obs=np.full((T, 3), i, np.float32) + np.arange(T, dtype=np.float32)[:, None]),
        on_reset=np.zeros((T, 1), np.uint8), done=(np.arange(T) == i % T).reshape(T, 1),
        truncated=np.zeros((T, 1), np.uint8), action=None, reward=np.full((T, 1), float(i), np.float32),
        analyzed_result=Analyzed(ret=np.full((T, 1), i + 1.0, np.float32) if ret else None,
                                 value=np.full((T, 1), 0.5, np.float32)),
        policy_version_steps=np.full((T, 1), version, np.int64))


def ident(s) -> list[int]:
    """The sample ids of an entry's batch columns."""
    r = np.asarray(s.reward)
    return [int(v) for v in (r[0, :, 0] if r.ndim == 3 else r[0:1, 0])]


def same_structure(a, b, path=""):
    assert type(a) is type(b) or (isinstance(a, NamedArray) and isinstance(b, NamedArray)), path
    if isinstance(a, NamedArray):
        assert a._fields == b._fields, (path, a._fields, b._fields)
        for k in a._fields:
            same_structure(a[k], b[k], f"{path}.{k}")
    elif a is None:
        assert b is None, path
    else:
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), (path, a.dtype, b.dtype, a.shape,
                                                                                 b.shape)


@pytest.mark.parametrize("kind,args", [
    ("priority_queue", dict(max_size=4, reuses=3, batch_size=2)),
    ("priority_queue", dict(max_size=2, reuses=1, batch_size=1)),
    ("priority_queue", dict(max_size=3, reuses=2, batch_size=None)),
    ("priority_queue", dict()),
    ("simple_queue", dict(max_size=3, batch_size=2)),
    ("simple_queue", dict(max_size=5)),
])
def test_queue_kinds_serve_what_srl_serves(kind, args):
    """200 random schedules of puts and gets: identical service, counters and sizes."""
    rng = np.random.default_rng(0)
    for schedule in range(200):
        ours = ConduitQueueBuffer(kind, **args)
        theirs = srl_buffer.make_buffer(kind, **args)
        put_id = 0
        for op in rng.random(40):
            if op < 0.55:
                s = sample(put_id)
                put_id += 1
                assert ours.put(s) == theirs.put(sample(put_id - 1)) or kind == "simple_queue"
            elif not theirs.empty():
                a, b = ours.get(), theirs.get()
                assert ident(a.sample) == ident(b.sample), (schedule, put_id)
                assert (a.reuses_left, a.reuses) == (b.reuses_left, b.reuses)
                same_structure(a.sample, b.sample)
            else:
                with pytest.raises((AssertionError, queue.Empty)):
                    ours.get()
            assert ours.qsize() == theirs.qsize() and ours.empty() == theirs.empty()
        st = ours.stats()
        assert st["samples_put"] == put_id
        per = args.get("batch_size") or 1
        assert st["samples_put"] == (st["entries_formed"] * per + st["pending_samples"])


def test_a_reused_entry_is_the_same_object_with_its_counters_updated_in_place():
    ours, theirs = (ConduitQueueBuffer("priority_queue", batch_size=1, reuses=2),
                    srl_buffer.make_buffer("priority_queue", batch_size=1, reuses=2))
    for b in (ours, theirs):
        b.put(sample(0))
        first = b.get()
        second = b.get()
        assert first is second and first.reuses_left == 0 and first.reuses == 2


def test_the_replay_entry_is_built_when_the_batch_forms_and_get_only_hands_it_over(monkeypatch):
    """The priority queue's ReplayEntry is built on the putting thread as its batch forms; gets
    (the training thread) rebuild nothing, also after unpickling; what SRL serves, in the same order."""
    from conduit_srl import samples as conduit_samples
    built = []
    real = conduit_samples.replay_entry
    monkeypatch.setattr(conduit_samples, "replay_entry", lambda **kw: built.append(kw) or real(**kw))
    ours = ConduitQueueBuffer("priority_queue", batch_size=2, reuses=3, max_size=2)
    theirs = srl_buffer.make_buffer("priority_queue", batch_size=2, reuses=3, max_size=2)
    for i in range(6):
        ours.put(sample(i))
        theirs.put(sample(i))
    assert len(built) == 3 and all(kw["reuses"] == 0 and kw["reuses_left"] == 3 for kw in built)
    served = []
    for _ in range(3):
        a, b = ours.get(), theirs.get()
        assert ident(a.sample) == ident(b.sample) and (a.reuses_left, a.reuses) == (b.reuses_left, b.reuses)
        served.append(a)
    assert len(built) == 3
    import pickle
    back = pickle.loads(pickle.dumps(ours))
    assert len(built) == 3 + back.qsize()
    while not ours.empty():
        a, b, c = ours.get(), back.get(), theirs.get()
        assert ident(a.sample) == ident(b.sample) == ident(c.sample) and a.reuses_left == b.reuses_left == c.reuses_left
    assert len(built) == 5 and theirs.empty() and back.empty()


def test_queue_entry_rebuilt_exactly_as_srl_builds_it():
    ours, theirs = ConduitQueueBuffer("priority_queue", batch_size=3), srl_buffer.make_buffer(
        "priority_queue", batch_size=3)
    for i in range(3):
        ours.put(sample(i))
        theirs.put(sample(i))
    a, b = ours.get(), theirs.get()
    same_structure(a.sample, b.sample)
    assert a.sample.obs.obs.shape == (T, 3, 3)  # time-major [T, B, ...]


def test_served_views_stay_valid_for_the_lease_while_puts_go_on():
    """A trainer with a one-step prefetcher still reads entry n while entry n+1 is served:
    puts that overflow the queue must not overwrite either."""
    ours = ConduitQueueBuffer("priority_queue", max_size=1, reuses=1, batch_size=2, lease_depth=2)
    ours.put(sample(0)); ours.put(sample(1))
    first = ours.get().sample
    ours.put(sample(2)); ours.put(sample(3))
    second = ours.get().sample
    for i in range(4, 40):  # many overflowing puts
        ours.put(sample(i))
    assert ident(first) == [0, 1] and ident(second) == [2, 3]
    assert float(first.obs.obs[0, 1, 0]) == 1.0 and float(second.obs.obs[0, 0, 0]) == 2.0


def chi2_same(a_counts, b_counts):
    keep = (a_counts + b_counts) > 0
    table = np.stack([a_counts[keep], b_counts[keep]])
    return stats.chi2_contingency(table)[1]


# the replay kinds' deliveries: sequential (SRL's order of work) and prepared ahead by a thread
DELIVERIES = [None, Schedule.overlapped(delivery_granularity=2, depth=4)]
DELIVERY_IDS = ["sequential", "prepared"]


@pytest.mark.parametrize("delivery", DELIVERIES, ids=DELIVERY_IDS)
def test_uniform_replay_matches_srl_distribution_and_contents(delivery):
    n, B = 12, 4
    args = dict(max_size=n, batch_size=B, warmup_transitions=B * T, seed=1, sample_length=T, batch_length=T)
    ours, theirs = ConduitReplayBuffer("simple_replay_buffer", delivery=delivery, **args), srl_buffer.make_buffer(
        "simple_replay_buffer", **args)
    for i in range(n + 5):  # wraps: ids 5..16 stored
        ours.put(sample(i)); theirs.put(sample(i))
    assert ours.qsize() == theirs.qsize() and ours.empty() == theirs.empty()
    ca, cb = np.zeros(n + 5), np.zeros(n + 5)
    for _ in range(3000):
        a, b = ours.get().sample, theirs.get().sample
        ia, ib = ident(a), ident(b)
        assert len(set(ia)) == B and len(set(ib)) == B  # without replacement, both
        ca[ia] += 1
        cb[ib] += 1
        # every delivered chunk is the stored sample, field for field
        for col, i in enumerate(ia):
            ref = sample(i)
            assert np.array_equal(a.obs.obs[:, col], ref.obs.obs)
            assert np.array_equal(a.done[:, col], ref.done)
    assert ca[:5].sum() == 0 and cb[:5].sum() == 0
    assert chi2_same(ca, cb) > 1e-3
    ours.close()


@pytest.mark.parametrize("delivery", DELIVERIES, ids=DELIVERY_IDS)
def test_prioritized_replay_matches_priorities_exactly_and_srl_except_its_last_slot(delivery):
    """Conduit draws chunk i with probability p_i^alpha / sum p^alpha (goodness of fit), as SRL
    does for every chunk but the one in its last filled slot, which SRL never draws (its sum
    over [0, total-1) excludes it): shown here, and Conduit matches SRL on the others."""
    n, B, alpha = 8, 4, 0.7
    args = dict(max_size=n, sample_length=T, batch_size=B, warmup_transitions=T, seed=3, alpha=alpha, beta=0.5,
                priority_interpolation_eta=0.9)
    ours, theirs = make_buffer("prioritized_replay_buffer", delivery=delivery, **args), srl_buffer.make_buffer(
        "prioritized_replay_buffer", **args)
    assert isinstance(ours, srl_buffer.PrioritizedReplayBuffer)  # SRL's trainer sends it priorities
    for i in range(n):
        ours.put(sample(i)); theirs.put(sample(i))
    # the initial priority is SRL's TD rule: |ret - value| = i + 0.5
    p = (np.arange(n) + 0.5) ** alpha
    ca, cb = np.zeros(n), np.zeros(n)
    draws = 4000
    for _ in range(draws):
        a, b = ours.get(), theirs.get()
        np.add.at(ca, ident(a.sample), 1)   # a chunk may be drawn twice in a batch
        np.add.at(cb, ident(b.sample), 1)
        w = a.sample.metadata["sampling_weight"]
        ids = ident(a.sample)
        expect = (p[ids] / p.min()) ** -0.5
        assert np.allclose(w, expect, rtol=1e-5)
    assert cb[n - 1] == 0 and ca[n - 1] > 0           # SRL's excluded slot; Conduit draws it
    assert stats.chisquare(ca, ca.sum() * p / p.sum()).pvalue > 1e-3
    q = p[: n - 1] / p[: n - 1].sum()
    assert stats.chisquare(cb[: n - 1], cb.sum() * q).pvalue > 1e-3
    ours.close()


@pytest.mark.parametrize("delivery", DELIVERIES, ids=DELIVERY_IDS)
def test_prioritized_update_moves_the_distribution_as_in_srl(delivery):
    n, B = 6, 2
    args = dict(max_size=n, sample_length=T, batch_size=B, warmup_transitions=T, seed=0, alpha=1.0, beta=0.4)
    ours = make_buffer("prioritized_replay_buffer", delivery=delivery, **args)
    for i in range(n):
        ours.put(sample(i, ret=False))
    e = ours.get()
    ids = ident(e.sample)
    assert ours.update_priorities(e.sampling_indices, np.array([50.0] * B)) == B
    counts = np.zeros(n)
    for _ in range(2000):
        np.add.at(counts, ident(ours.get().sample), 1)
    hot = counts[ids].sum() / counts.sum()
    # with stratified draws a pair at p=50 among 1s: each draw picks a hot one w.p. 100/(100+n-2)
    assert hot > 0.9
    with pytest.raises(Exception, match="sampling_indices of delivered chunks"):
        ours.update_priorities(np.array([99, 98]), np.array([1.0, 1.0]))
    ours.close()


def test_a_priority_for_an_overwritten_chunk_never_reaches_its_successor():
    """sampling_indices are seqs: SRL's slot indices would send a late update to whatever chunk
    took the slot since; here it is skipped and counted out."""
    n = 4
    ours = make_buffer("prioritized_replay_buffer", max_size=n, sample_length=T, batch_size=2, warmup_transitions=T,
                       alpha=1.0)
    for i in range(n):
        ours.put(sample(i, ret=False))
    e = ours.get()
    for i in range(n, 2 * n):  # overwrite every chunk
        ours.put(sample(i, ret=False))
    assert ours.update_priorities(e.sampling_indices, np.array([1e6, 1e6])) == 0
    counts = np.zeros(2 * n)
    for _ in range(400):
        np.add.at(counts, ident(ours.get().sample), 1)
    assert counts[:n].sum() == 0 and stats.chisquare(counts[n:]).pvalue > 1e-3


def test_replay_buffer_pickles_and_delivers_the_same_afterwards():
    import pickle
    for kind, extra in (("simple_replay_buffer", {}), ("prioritized_replay_buffer", dict(alpha=0.6))):
        ours = make_buffer(kind, max_size=6, sample_length=T, batch_size=3, warmup_transitions=T, seed=2, **extra)
        for i in range(8):
            ours.put(sample(i, ret=False))
        ours.get()
        back = pickle.loads(pickle.dumps(ours))
        for _ in range(5):
            assert ident(ours.get().sample) == ident(back.get().sample)


def test_batch_length_shorter_than_sample_length_is_refused_with_the_reason():
    ours = ConduitReplayBuffer("simple_replay_buffer", max_size=4, batch_size=2, warmup_transitions=0,
                               batch_length=2)
    with pytest.raises(Exception, match="mixes steps of different samples"):
        ours.put(sample(0))


def test_srl_slicing_mixes_chunks_when_batch_length_is_shorter():
    """The reason for the refusal above, shown on SRL's own buffer: a column mixes samples."""
    theirs = srl_buffer.SimpleReplayBuffer(max_size=4, batch_size=4, warmup_transitions=0, seed=0,
                                           sample_length=T, batch_length=2)
    for i in range(4):
        theirs.put(sample(i))
    mixed = 0
    for _ in range(50):
        r = np.asarray(theirs.get().sample.reward)[:, :, 0]
        mixed += int((r[0] != r[1]).any())
    assert mixed > 0


def test_enable_routes_srl_make_buffer_and_disable_restores_it():
    original = srl_buffer.make_buffer
    conduit_srl.enable()
    try:
        assert conduit_srl.enabled()
        assert isinstance(srl_buffer.make_buffer("priority_queue", batch_size=2), ConduitQueueBuffer)
    finally:
        conduit_srl.disable()
    assert srl_buffer.make_buffer is original and not conduit_srl.enabled()


def test_buffer_pickles_with_its_queued_entries():
    import pickle
    ours = ConduitQueueBuffer("priority_queue", batch_size=2, reuses=2, max_size=4)
    for i in range(5):
        ours.put(sample(i))
    back = pickle.loads(pickle.dumps(ours))
    assert back.qsize() == ours.qsize()
    while not ours.empty():
        a, b = ours.get(), back.get()
        assert ident(a.sample) == ident(b.sample) and a.reuses_left == b.reuses_left


def test_unpickled_replay_buffer_with_an_inferred_sample_length_is_not_empty_forever():
    import pickle
    ours = ConduitReplayBuffer("simple_replay_buffer", max_size=6, batch_size=2, warmup_transitions=2 * T)
    for i in range(4):
        ours.put(sample(i, ret=False))
    back = pickle.loads(pickle.dumps(ours))
    assert back.qsize() == ours.qsize() == 4 * T and not back.empty()
    back.put(sample(9, ret=False))
    assert back.qsize() == 5 * T


def test_a_zero_td_error_is_stored_as_srl_stores_it():
    args = dict(max_size=4, sample_length=T, batch_size=2, warmup_transitions=T, priority_interpolation_eta=0.9)
    ours = make_buffer("prioritized_replay_buffer", **args)
    zero = sample(0)
    zero.analyzed_result.ret[:] = zero.analyzed_result.value  # |ret - value| = 0
    ours.put(zero)  # SRL stores 0**alpha; a put must not kill the trainer worker
    ours.put(sample(1))
    assert ours.qsize() == 2 * T
    assert all(0 not in ident(ours.get().sample) for _ in range(50))


def test_unknown_buffer_arguments_are_errors_as_in_srl():
    with pytest.raises(TypeError):
        ConduitQueueBuffer("priority_queue", resuses=2)


def test_empty_hands_over_a_batch_as_it_forms():
    """``empty_wait_s``: the training thread's ``empty()`` on an empty queue is answered False when a
    put forms a batch meanwhile (long before the wait ends), True after the wait when none forms."""
    import threading
    import time
    buf = ConduitQueueBuffer("priority_queue", batch_size=2, reuses=1, empty_wait_s=1.0)   # (the longest allowed)
    buf.put(sample(0))
    timer = threading.Timer(0.05, buf.put, args=(sample(1),))   # the second sample forms the batch
    timer.start()
    t0 = time.perf_counter()
    assert buf.empty() is False
    assert time.perf_counter() - t0 < 0.9   # (as the batch forms, not when the 1 s wait ends)
    timer.join()
    assert buf.get().reuses == 1
    t0 = time.perf_counter()
    assert buf.empty() is True
    assert time.perf_counter() - t0 >= 0.95   # (the wait's end; a condition's wait never ends early)


def test_a_sub_structure_none_in_a_later_sample_is_zero_filled_as_srl_batches_it():
    """SRL's actor sends ``info=None`` for a sample without episode info (namedarray.from_dict of
    {}); SRL's priority queue batches such samples with others whose info is set, zero-filled
    (recursive_aggregate). Conduit's served the same batch (it refused the sample before session 24)."""
    def with_info(i, info):
        s = sample(i)
        s.info = NamedArray(ep_ret=np.full((T, 1), 7.0, np.float32)) if info else None
        return s
    ours, theirs = ConduitQueueBuffer("priority_queue", batch_size=2), srl_buffer.make_buffer("priority_queue",
                                                                                              batch_size=2)
    for i in range(4):
        ours.put(with_info(i, i % 2 == 0))
        theirs.put(with_info(i, i % 2 == 0))
    for _ in range(2):
        a, b = ours.get(), theirs.get()
        assert ident(a.sample) == ident(b.sample)
        same_structure(a.sample, b.sample)


def test_a_put_batch_mixing_samples_with_and_without_a_return_prioritizes_each_as_srl_puts_them():
    """SRL's prioritized put gives a sample with ``analyzed_result.ret`` its TD rule's priority and
    one without the running max priority. A consumer's ``put_batch`` mixing the two raised (the
    first sample's kind decided for all; a review, session 24): each now gets what SRL's put gives."""
    args = dict(max_size=4, sample_length=T, batch_size=2, warmup_transitions=T, seed=1, alpha=1.0, beta=1.0,
                priority_interpolation_eta=0.9)
    ours, theirs = make_buffer("prioritized_replay_buffer", **args), srl_buffer.make_buffer(
        "prioritized_replay_buffer", **args)
    batch = [sample(0), sample(1, ret=False), sample(2), sample(3, ret=False)]
    ours.put_batch(batch)
    for s in batch:
        theirs.put(s)
    p = np.array([0.5, 1.0, 2.5, 1.0])   # |ret - value| = i + 0.5 where ret is set, else max priority 1.0
    for buf, drawn in ((ours, range(4)), (theirs, range(3))):   # (SRL never draws its last filled slot)
        seen = set()
        for _ in range(300):
            e = buf.get()
            ids = ident(e.sample)
            seen.update(ids)
            assert np.allclose(e.sample.metadata["sampling_weight"], p.min() / p[ids], rtol=1e-5)
        assert seen == set(drawn)
    ours.close()


def obs_ident(s) -> list[int]:
    """The sample ids of a batch (or one sample) by ``obs.obs``, which no gappy sample leaves out."""
    o = np.asarray(s.obs.obs)
    return [int(v) for v in (o[0, :, 0] if o.ndim == 3 else o[0:1, 0])]


def gappy_sample(i: int, rng) -> SampleBatch:
    """A sample with ``None`` at random leaves and sub-structures (the first sample's included): SRL's
    actor leaves ``info`` None for steps without episode info, algorithms leave out fields."""
    maybe = lambda value, p=0.4: None if rng.random() < p else value
    s = sample(i)
    s.obs = Obs(obs=s.obs.obs, mask=maybe(np.full((T, 1), i % 2, np.uint8)))
    s.reward = maybe(s.reward, 0.2)
    s.analyzed_result = maybe(Analyzed(ret=maybe(np.full((T, 1), i + 1.0, np.float32)),
                                       value=np.full((T, 1), 0.5, np.float32)), 0.3)
    s.info = maybe(NamedArray(ep_ret=np.full((T, 1), 7.0 + i, np.float32),
                              sub=maybe(NamedArray(x=np.full((T, 2), i, np.int32)))), 0.6)
    return s


@pytest.mark.parametrize("kind,args", [
    ("priority_queue", dict(max_size=4, reuses=2, batch_size=3)),
    ("priority_queue", dict(max_size=3, reuses=1, batch_size=2)),
    ("priority_queue", dict(max_size=3, reuses=2, batch_size=None)),
    ("simple_queue", dict(max_size=3, batch_size=2)),
    ("simple_queue", dict(max_size=5)),
])
def test_none_anywhere_in_any_sample_is_served_as_srl_serves_it(kind, args):
    """150 random schedules of samples with None at random leaves and sub-structures, from the first
    sample on (a position None so far may be filled later: the nesting grows), put one at a time or in
    groups: every served batch has SRL's structure and values (None where every sample left a field or
    sub-structure out, zeros where only some did)."""
    rng = np.random.default_rng(1)
    for schedule in range(150):
        ours = ConduitQueueBuffer(kind, **args)
        theirs = srl_buffer.make_buffer(kind, **args)
        put_id = 0
        for op in rng.random(30):
            if op < 0.6:
                n = int(rng.integers(1, 4)) if op < 0.2 else 1
                xs = [gappy_sample(put_id + k, rng) for k in range(n)]
                if n == 1:
                    ours.put(xs[0])
                else:
                    ours.put_batch(xs)
                for x in xs:
                    theirs.put(x)
                put_id += n
            elif not theirs.empty():
                a, b = ours.get(), theirs.get()
                assert obs_ident(a.sample) == obs_ident(b.sample), (schedule, put_id)
                same_structure(a.sample, b.sample)
            assert ours.qsize() == theirs.qsize()


@pytest.mark.parametrize("max_size", [3, 7])
def test_replay_stores_none_anywhere_as_srls_replay_buffer_stores_it(max_size):
    """The uniform replay kind against SRL's on samples with None at random leaves and sub-structures:
    after every put (one at a time or in groups, wrapping the ring), all stored chunks, drawn at once,
    equal SRL's storage slot for slot. SRL's assignment skips a None field, so the slot keeps its
    previous sample's values (zeros when never written); a field None in the first sample has no
    storage and stays None (its later values dropped, with a warning here)."""
    import warnings
    rng = np.random.default_rng(2)
    warned = 0
    for schedule in range(60):
        args = dict(max_size=max_size, batch_size=1, warmup_transitions=0, sample_length=T, batch_length=T)
        ours = ConduitReplayBuffer("simple_replay_buffer", **args)
        theirs = srl_buffer.make_buffer("simple_replay_buffer", **args)
        put_id = 0
        while put_id < 2 * max_size + 2:
            n = int(rng.integers(1, max_size + 2)) if rng.random() < 0.3 else 1
            xs = [gappy_sample(put_id + k, rng) for k in range(n)]
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                ours.put_batch(xs) if n > 1 else ours.put(xs[0])
            warned += len(caught)
            for x in xs:
                theirs.put(x)
            put_id += n
            stored = min(put_id, max_size)
            got = ours.get(batch_size=stored).sample   # every stored chunk, in slot order
            want = namedarray.recursive_apply(theirs._buffer, lambda a: a[:, :stored])
            same_structure(got, want)
    assert warned > 0   # some schedule's first sample left a field out that a later one gave


def test_a_refused_put_changes_nothing_the_queue_learned():
    """Found by review: a sample refused after the codec had learned a grown nesting from it left the
    codec half-grown and its names added to the queue, and every later sample was refused. Now a
    refused put (one at a time or a group) undoes what it taught; SRL accepts the later samples."""
    def good(i, info=False):
        return NamedArray(obs=NamedArray(x=np.full((T, 1), i, np.float32)), reward=np.full((T, 1), i, np.float32),
                          info=NamedArray(a=np.full((T, 1), i, np.float32)) if info else None)
    bad = NamedArray(obs=NamedArray(x=np.zeros((T, 1), np.float32), y=np.zeros((T, 1), np.float32)),
                     reward=np.zeros((T, 1), np.float32), info=NamedArray(a=np.zeros((T, 1), np.float32)))
    for grouped in (False, True):
        ours = ConduitQueueBuffer("priority_queue", batch_size=2)
        theirs = srl_buffer.make_buffer("priority_queue", batch_size=2)
        ours.put(good(0))
        theirs.put(good(0))
        with pytest.raises(Exception):
            ours.put_batch([good(5, True), bad]) if grouped else ours.put(bad)
        for x in (good(1), good(2, True), good(3)):
            ours.put(x)
            theirs.put(x)
        for _ in range(2):
            a, b = ours.get(), theirs.get()
            assert obs_ident_x(a.sample) == obs_ident_x(b.sample)
            same_structure(a.sample, b.sample)
    first = ConduitQueueBuffer("priority_queue", batch_size=2)   # a refused first sample teaches nothing
    with pytest.raises(Exception):
        first.put_batch([bad, good(0)])    # the codec came from `bad`: kept, it refused every good sample
    first.put(good(1, True))
    first.put(good(2, True))
    assert first.get().sample.info.a.shape == (T, 2, 1)


def obs_ident_x(s) -> list[int]:
    return [int(v) for v in np.asarray(s.obs.x)[0, :, 0]]


def test_a_replay_group_larger_than_the_ring_is_stored_whole_or_not_at_all():
    """Found by review: a put_batch larger than max_size went in pieces, and a bad row in a later piece
    raised after the earlier pieces were stored. Every piece is now encoded first. A refused group also
    warns of nothing (its unstored values were never stored)."""
    import warnings
    def s(i, dtype=np.float32, info=False):
        out = NamedArray(obs=np.full((T, 1), i, np.float32), reward=np.full((T, 1), i + 0.5, dtype), info=None)
        out.info = NamedArray(a=np.ones((T, 1), np.float32)) if info else None
        return out
    ours = ConduitReplayBuffer("simple_replay_buffer", max_size=2, batch_size=1, warmup_transitions=0,
                               sample_length=T, batch_length=T)
    ours.put(s(0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(Exception, match="reward"):
            ours.put_batch([s(1, info=True), s(2), s(3, np.complex64)])
    assert ours.stats()["chunks_put"] == 1 and ours.stats()["unstored_values"] == 0 and not caught
    ours.put_batch([s(1), s(2), s(3)])
    assert ours.stats()["chunks_put"] == 4
    assert sorted(int(v) for v in np.asarray(ours.get(batch_size=2).sample.obs)[0, :, 0]) == [2, 3]
