"""EntryQueue: reuse / overflow / staleness rules against a plain reference model, the
accounting invariant (every sample put is served, queued, pending or counted dropped), and
the leases that keep served views intact while puts go on."""

import math
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit_core.queues.entry_queue import EntryQueue
from conduit_core.errors import CapacityError, ConfigError, SpecError
from conduit_core.schema.nested import flatten, unflatten
from conduit_core.queues.reuse_order import ReuseOrder

T = 3


def sample(i):
    return {"obs.pixels": np.full((T, 2), i, np.float32), "reward": np.full((T, 1), i, np.int64), "info": None}


class Reference:
    """The rules written the obvious way: a list of [reuses_left, order, ids] scanned each time."""

    def __init__(self, max_entries, batch, reuses, serve, overflow):
        self.q, self.pending, self.order = [], [], 0
        self.max, self.batch, self.reuses, self.serve, self.overflow = max_entries, batch, reuses, serve, overflow

    def put(self, i):
        self.pending.append(i)
        if len(self.pending) < self.batch:
            return False
        if self.overflow == "reject" and len(self.q) >= self.max:
            self.pending.pop()
            raise CapacityError("full")
        self.q.append([self.reuses, self.order, self.pending])
        self.order, self.pending = self.order + 1, []
        while len(self.q) > self.max:
            if self.overflow == "drop_oldest":
                victim = min(self.q, key=lambda e: e[1])
            else:
                victim = min(self.q, key=lambda e: (e[0], e[1]))
            self.q.remove(victim)
        return True

    def get(self):
        if not self.q:
            return None
        sign = 1 if self.serve == "freshest" else -1
        e = max(self.q, key=lambda e: (e[0], sign * e[1]))
        e[0] -= 1
        if e[0] == 0:
            self.q.remove(e)
        return e[2], e[0]


@settings(max_examples=150, deadline=None)
@given(max_entries=st.integers(1, 5), batch=st.integers(1, 3), reuses=st.integers(1, 4),
       serve=st.sampled_from(["freshest", "oldest"]), overflow=st.sampled_from(["drop_lowest", "drop_oldest", "reject"]),
       ops=st.lists(st.booleans(), max_size=60), lease=st.integers(0, 3))
def test_rules_match_the_reference_and_every_sample_is_accounted_for(max_entries, batch, reuses, serve, overflow,
                                                                     ops, lease):
    q = EntryQueue(max_entries=max_entries, batch_size=batch, reuses=reuses, serve=serve, overflow=overflow,
                   lease_depth=lease)
    ref = Reference(max_entries, batch, reuses, serve, overflow)
    held, put_id, rejected = [], 0, 0
    for is_put in ops:
        if is_put:
            try:
                expect = ref.put(put_id)
            except CapacityError:
                with pytest.raises(CapacityError):
                    q.put(sample(put_id))
                rejected += 1
                continue
            assert q.put(sample(put_id)) == expect
            put_id += 1
        else:
            expect, e = ref.get(), q.get()
            if expect is None:
                assert e is None
                continue
            ids, left = expect
            got = [int(v) for v in e.columns["reward"][0, :, 0]]
            assert got == ids and e.reuses_left == left
            assert e.columns["info"] is None and e.columns["obs.pixels"].shape == (T, batch, 2)
            held.append((ids, e.columns))
            held = held[-lease:] if lease else []
        assert q.qsize() == len(ref.q)
        # the leased views still hold what they held when served
        for ids, cols in held:
            assert [int(v) for v in cols["reward"][0, :, 0]] == ids
    s = q.stats()
    assert s["samples_put"] == put_id and s["rejected"] == rejected
    assert s["entries_formed"] * batch + s["pending_samples"] == put_id
    assert s["entries_formed"] == s["retired"] + s["queued"] + s["dropped_overflow"] + s["dropped_stale"]
    assert s["served"] <= s["entries_formed"] * reuses


def test_version_window_drops_stale_entries_unserved_and_counts_them():
    q = EntryQueue(max_entries=10, batch_size=1, reuses=2, max_version_lag=1)
    for v in range(4):
        q.put(sample(v), policy_version=v)
    e = q.get(current_version=3)
    assert e.policy_version == 3
    seen = [q.get(current_version=3).policy_version for _ in range(2)]
    assert seen == [2, 3] and q.get(current_version=3).policy_version == 2  # most reuses left first
    assert q.get(current_version=3) is None
    s = q.stats()
    assert s["dropped_stale"] == 2 and s["dropped_stale_samples"] == 2 and s["served"] == 4


def test_reject_refuses_the_put_and_keeps_everything_already_accepted():
    q = EntryQueue(max_entries=1, batch_size=2, overflow="reject")
    q.put(sample(0)); q.put(sample(1)); q.put(sample(2))
    with pytest.raises(CapacityError, match="max_entries=1"):
        q.put(sample(3))
    assert q.stats()["pending_samples"] == 1 and q.qsize() == 1
    assert [int(v) for v in q.get().columns["reward"][0, :, 0]] == [0, 1]
    assert q.put(sample(3)) is True


def test_bad_samples_name_the_field_and_change_nothing():
    q = EntryQueue(max_entries=4, batch_size=2)
    q.put(sample(0))
    bad = sample(1)
    bad["obs.pixels"] = np.zeros((T + 1, 2), np.float32)
    with pytest.raises(SpecError, match=r"obs\.pixels\.shape"):
        q.put(bad)
    extra = dict(sample(1), more=np.zeros(T))
    with pytest.raises(SpecError, match="extra"):
        q.put(extra)
    assert q.stats()["samples_put"] == 1 and q.stats()["pending_samples"] == 1
    for kw, field in ((dict(max_entries=0), "max_entries"), (dict(max_entries=2, reuses=0), "reuses"),
                      (dict(max_entries=2, serve="lifo"), "serve"), (dict(max_entries=2, overflow="x"), "overflow"),
                      (dict(max_entries=2, batch_size=0), "batch_size")):
        with pytest.raises(ConfigError, match=field):
            EntryQueue(**kw)


def test_unbounded_queue_grows_lazily_and_batch_major_layout():
    q = EntryQueue(max_entries=math.inf, batch_size=2, serve="oldest", time_major=False)
    for i in range(100):
        q.put(sample(i))
    assert q.qsize() == 50
    e = q.get()
    assert e.columns["obs.pixels"].shape == (2, T, 2) and int(e.columns["reward"][1, 0, 0]) == 1


def test_pickle_keeps_queued_and_partial_entries():
    q = EntryQueue(max_entries=3, batch_size=2, reuses=2)
    for i in range(5):
        q.put(sample(i), policy_version=i)
    q.get()
    back = pickle.loads(pickle.dumps(q))
    assert back.stats() == q.stats()
    assert back.put(sample(5)) is True
    assert q.put(sample(5)) is True
    while (a := q.get()) is not None:
        b = back.get()
        assert a.order == b.order and a.reuses_left == b.reuses_left and a.policy_version == b.policy_version
        assert np.array_equal(a.columns["obs.pixels"], b.columns["obs.pixels"])
    assert back.get() is None


def test_reuse_order_victims():
    o = ReuseOrder("freshest", "drop_lowest")
    for order, r in ((0, 2), (1, 1), (2, 2), (3, 1)):
        o.add(order, r)
    assert o.peek() == (2, 2) and o.victim() == 1
    o2 = ReuseOrder("oldest", "drop_lowest")
    for order, r in ((0, 2), (1, 1), (2, 2), (3, 1)):
        o2.add(order, r)
    assert o2.peek() == (0, 2) and o2.victim() == 1


@settings(deadline=None)   # (a loaded CI machine can pause any example past Hypothesis' 200 ms)
@given(st.recursive(st.integers(), lambda kids: st.dictionaries(
    st.text("abcxyz", min_size=1, max_size=3), kids, min_size=1, max_size=3), max_leaves=10))
def test_nested_names_round_trip(tree):
    if not isinstance(tree, dict):
        tree = {"x": tree}
    assert unflatten(flatten(tree)) == tree
    assert flatten(unflatten(flatten(tree))) == flatten(tree)


def test_adopt_keeps_the_put_arrays_without_copying_and_accounts_for_them():
    q = EntryQueue(max_entries=2, batch_size=None, overflow="drop_oldest", serve="oldest", adopt=True)
    samples = [sample(i) for i in range(3)]
    for s in samples:
        q.put(s)
    assert q.stats()["dropped_overflow"] == 1 and q.qsize() == 2
    e = q.get()
    assert e.columns["obs.pixels"] is samples[1]["obs.pixels"] and e.columns["info"] is None
    back = pickle.loads(pickle.dumps(q))
    assert np.array_equal(back.get().columns["reward"], samples[2]["reward"])
    with pytest.raises(ConfigError, match="adopt"):
        EntryQueue(max_entries=2, batch_size=2, adopt=True)


def group_sample(i, form):
    """A sample with an object field; ``form`` 1: an array to convert (int32), 2: a missing array (zeros)."""
    s = dict(sample(i), tag=f"s{i}")
    if form == 1:
        s["reward"] = s["reward"].astype(np.int32)
    elif form == 2:
        s["reward"] = None
    return s


def served(e):
    """What a get delivered, comparable across queues (receive_time aside)."""
    if e is None:
        return None
    return (e.order, e.reuses_left, e.reuses, e.policy_version, e.columns["obs.pixels"].tobytes(),
            None if e.columns["reward"] is None else e.columns["reward"].tobytes(),
            list(e.columns["tag"]) if e.columns["tag"] is not None else None)


@settings(max_examples=150, deadline=None)
@given(max_entries=st.integers(1, 4), batch=st.sampled_from([None, 1, 2, 3, 5]), reuses=st.integers(1, 3),
       serve=st.sampled_from(["freshest", "oldest"]), overflow=st.sampled_from(["drop_lowest", "drop_oldest", "reject"]),
       time_major=st.booleans(), lag=st.sampled_from([None, 1]),
       ops=st.lists(st.one_of(st.lists(st.integers(0, 2), min_size=0, max_size=7), st.none()), max_size=25))
def test_put_many_equals_the_same_puts_one_at_a_time(max_entries, batch, reuses, serve, overflow, time_major, lag, ops):
    kw = dict(max_entries=max_entries, batch_size=batch, reuses=reuses, serve=serve, overflow=overflow,
              time_major=time_major, max_version_lag=lag, lease_depth=2)
    one, many = EntryQueue(**kw), EntryQueue(**kw)
    put_id, version, held, refused = 0, 0, [], 0
    for op in ops:
        if op is None:                       # a get on both, at the same current version
            a, b = one.get(current_version=version), many.get(current_version=version)
            assert served(a) == served(b)
            if b is not None:
                held = (held + [(served(b), b)])[-1:]   # lease_depth=2: the last batch stays intact
            continue
        forms = [0] + op[1:] if put_id == 0 else op   # the first sample fixes the layout: a plain one
        group = [group_sample(put_id + k, f) for k, f in enumerate(forms)]
        versions = [version + k // 2 for k in range(len(group))]
        before = many.stats()
        try:
            formed = many.put_many(group, policy_versions=versions)
        except CapacityError:
            assert overflow == "reject"
            assert many.stats() == dict(before, rejected=before["rejected"] + len(group))
            trial = pickle.loads(pickle.dumps(one))   # single puts would have refused one of them
            with pytest.raises(CapacityError):
                for s, v in zip(group, versions):
                    trial.put(s, policy_version=v)
            refused += len(group)   # the group's samples, counted as refused puts
            continue
        assert formed == sum(one.put(s, policy_version=v) for s, v in zip(group, versions))
        put_id, version = put_id + len(group), version + 1
        assert dict(one.stats(), rejected=refused) == many.stats() and one.qsize() == many.qsize()
        for was, e in held:
            assert served(e) == was
    while True:
        a, b = one.get(), many.get()
        assert served(a) == served(b)
        if b is None:
            break
    assert dict(one.stats(), rejected=refused) == many.stats()


def test_put_many_is_all_or_nothing_and_names_the_sample_and_field():
    q = EntryQueue(max_entries=4, batch_size=3)
    q.put(sample(0))
    bad = sample(2)
    bad["obs.pixels"] = np.zeros((T + 1, 2), np.float32)
    with pytest.raises(SpecError, match=r"samples\[1\]\.obs\.pixels\.shape") as err:
        q.put_many([sample(1), bad, sample(3)])
    assert err.value.expected == (T, 2) and err.value.actual == (T + 1, 2) and err.value.fix
    with pytest.raises(SpecError, match=r"samples\[0\]"):
        q.put_many([np.zeros(3)])
    with pytest.raises(SpecError, match="policy_versions"):
        q.put_many([sample(1)], policy_versions=[0, 1])
    with pytest.raises(SpecError, match="policy_versions"):
        q.put_many([sample(1)], policy_versions=["x"])
    with pytest.raises(SpecError, match="samples"):
        q.put_many(sample(1))
    assert q.stats()["samples_put"] == 1 and q.stats()["pending_samples"] == 1 and q.put_many([]) == 0
    assert q.put_many([sample(i) for i in range(1, 6)]) == 2     # spans two entries
    assert [int(v) for v in q.get().columns["reward"][0, :, 0]] == [3, 4, 5]
    q.close()
    with pytest.raises(Exception, match="closed"):
        q.put_many([sample(0)])


def test_prepare_runs_once_per_entry_as_it_forms_and_every_serve_hands_it_over():
    made = []

    def prepare(entry):
        made.append((entry.order, entry.reuses_left, entry.reuses, float(entry.columns["reward"][0, 0, 0])))
        return object()
    q = EntryQueue(max_entries=2, batch_size=2, reuses=3, prepare=prepare)
    for i in range(6):
        q.put(sample(i))          # three entries formed; the overflow drops one
    assert [m[:3] for m in made] == [(0, 3, 0), (1, 3, 0), (2, 3, 0)] and made[2][3] == 4.0
    served = [q.get() for _ in range(6)]
    assert len({id(e.prepared) for e in served}) == 2 and len(made) == 3   # built at form only, never at get
    by_order = {}
    assert all(by_order.setdefault(e.order, e.prepared) is e.prepared for e in served) and q.get() is None
    q2 = EntryQueue(max_entries=2, batch_size=1, reuses=3, prepare=prepare)
    q2.put(sample(9))
    back = pickle.loads(pickle.dumps(q2))
    assert back.get().prepared is None and len(made) == 4   # prepare is not pickled
    back.set_prepare(prepare)                               # queued entries get theirs now
    assert made[-1] == (0, 2, 1, 9.0) and back.get().prepared is back.get().prepared is not None
    with pytest.raises(ConfigError, match="prepare"):
        EntryQueue(max_entries=2, prepare="not callable")


def test_a_get_never_waits_behind_a_put_in_progress():
    """The put lock, not the state lock, is held while a put copies and prepares: a get of an entry
    already formed completes while another thread's put is stuck inside ``prepare``."""
    import threading
    inside, release = threading.Event(), threading.Event()

    def prepare(entry):
        if entry.order == 1:
            inside.set()
            assert release.wait(10)
        return entry.order
    q = EntryQueue(max_entries=4, batch_size=2, reuses=2, prepare=prepare)
    q.put(sample(0))
    q.put(sample(1))
    putter = threading.Thread(target=lambda: [q.put(sample(i)) for i in (2, 3)])
    putter.start()
    try:
        assert inside.wait(10)
        got = []
        getter = threading.Thread(target=lambda: got.append(q.get()))
        getter.start()
        getter.join(5)
        assert not getter.is_alive() and got[0].prepared == 0 and q.stats()["samples_put"] == 4
    finally:
        release.set()
        putter.join()
    assert q.get().prepared == 1 and q.stats()["entries_formed"] == 2


def test_wait_nonempty_wakes_when_an_entry_forms_and_times_out_otherwise():
    import threading
    import time
    q = EntryQueue(max_entries=4, batch_size=2)
    t0 = time.perf_counter()
    assert q.wait_nonempty(0.05) is False                       # nothing forms: waits the timeout, answers False
    assert time.perf_counter() - t0 >= 0.045
    q.put(sample(0))                                           # half a batch: still nothing to serve
    assert q.wait_nonempty(0.0) is False

    def put_later():
        time.sleep(0.05)
        q.put(sample(1))                                       # forms the entry
    th = threading.Thread(target=put_later)
    th.start()
    t0 = time.perf_counter()
    assert q.wait_nonempty(5.0) is True                        # woken by the put, not by the timeout
    assert time.perf_counter() - t0 < 2.0
    th.join()
    assert q.get() is not None and q.wait_nonempty(0.0) is False
    closer = threading.Timer(0.05, q.close)
    closer.start()
    t0 = time.perf_counter()
    assert q.wait_nonempty(5.0) is False                       # closing wakes a waiter
    assert time.perf_counter() - t0 < 2.0
    closer.join()


# ---------------------------------------------------------------- None values, batched as SRL batches them
def srl_aggregate(samples, time_major):
    """SRL's ``recursive_aggregate`` over flat samples, stacked as SRL's queues stack (axis 1, time-major):
    a field every sample leaves None is None, one some leave None has zeros there."""
    out = {}
    for name in samples[0]:
        values = [s[name] for s in samples]
        given_ = [v for v in values if v is not None]
        if not given_:
            out[name] = None
            continue
        values = [np.zeros_like(given_[0]) if v is None else v for v in values]
        out[name] = np.stack(values, axis=1 if time_major else 0)
    return out


def gappy(i, pattern):
    """Sample ``i`` whose fields ``pattern`` leaves None (bit 0: reward, bit 1: value, bit 2: obs.pixels)."""
    s = {"obs.pixels": np.full((T, 2), i, np.float32), "reward": np.full((T, 1), i, np.int64),
         "value": np.full((T, 1), i + 0.5, np.float32)}
    for bit, name in enumerate(("reward", "value", "obs.pixels")):
        if pattern >> bit & 1:
            s[name] = None
    return s


@settings(max_examples=120, deadline=None)
@given(batch=st.sampled_from([None, 1, 2, 3]), time_major=st.booleans(), grouped=st.booleans(),
       patterns=st.lists(st.integers(0, 7), min_size=1, max_size=14))
def test_none_values_batch_as_srls_aggregation(batch, time_major, grouped, patterns):
    """Entries equal SRL's rule on the same samples, whatever fields are None in which samples, the
    first sample's included (a field None so far takes its layout from the first sample that gives it);
    put_many and pickling keep it."""
    adopt = batch is None and grouped
    q = EntryQueue(max_entries=100, batch_size=batch, reuses=1, serve="oldest", overflow="drop_oldest",
                   time_major=time_major, adopt=adopt)
    samples = [gappy(i, p) for i, p in enumerate(patterns)]
    if grouped:
        q.put_many(samples[:len(samples) // 2])
        q = pickle.loads(pickle.dumps(q))          # the partial entry keeps which fields it has
        q.put_many(samples[len(samples) // 2:])
    else:
        for s in samples:
            q.put(s)
    per = batch or 1
    for k in range(len(samples) // per):
        e = q.get()
        group = samples[k * per:(k + 1) * per]
        want = dict(group[0]) if batch is None else srl_aggregate(group, time_major)
        assert list(e.columns) == ["obs.pixels", "reward", "value"]
        for name, w in want.items():
            got = e.columns[name]
            assert (got is None) == (w is None), (name, k)
            if w is not None:
                assert got.dtype == w.dtype and np.array_equal(got, w), (name, k)
    assert q.get() is None


def test_a_field_none_at_first_is_learned_from_the_first_sample_that_gives_it():
    q = EntryQueue(max_entries=8, batch_size=2, serve="oldest", overflow="drop_oldest")
    q.put(gappy(0, 0b010))
    q.put(gappy(1, 0b010))
    q.put(gappy(2, 0b010))                      # value None in every sample so far
    q.put(gappy(3, 0))                          # given: learned as float32 [T, 1]
    first, second = q.get(), q.get()
    assert first.columns["value"] is None       # formed before: never had it
    assert np.array_equal(second.columns["value"][:, 0], np.zeros((T, 1), np.float32))
    assert np.array_equal(second.columns["value"][:, 1], np.full((T, 1), 3.5, np.float32))
    with pytest.raises(SpecError, match="value.shape"):
        q.put(dict(gappy(4, 0), value=np.zeros((T, 5), np.float32)))   # the learned layout holds from then on


def test_new_fields_come_with_the_put_that_brings_them_and_a_refused_put_adds_none():
    q = EntryQueue(max_entries=8, batch_size=2, serve="oldest", overflow="drop_oldest")
    q.put({"a": np.ones((T, 1), np.float32), "info": None})
    grown = {"a": np.ones((T, 1), np.float32), "info": None, "info.x": np.ones((T, 2), np.int32)}
    with pytest.raises(SpecError, match="extra"):
        q.put(grown)
    with pytest.raises(SpecError, match="a.shape"):     # refused: the new name is not added either
        q.put(dict(grown, a=np.ones((T, 3), np.float32)), new_fields=["info.x"])
    with pytest.raises(SpecError, match="extra"):
        q.put({"a": np.ones((T, 1), np.float32), "info": None, "info.x": None})
    q.put(grown, new_fields=["info.x", "a"])          # "a" is known: left as it is
    q.put_many([{"a": np.ones((T, 1), np.float32), "info": None, "info.x": None}] * 2)
    e1, e2 = q.get(), q.get()
    assert np.array_equal(e1.columns["info.x"], np.stack([np.zeros((T, 2), np.int32), np.ones((T, 2), np.int32)], 1))
    assert e2.columns["info.x"] is None and e2.columns["info"] is None
    with pytest.raises(SpecError, match="names"):
        q.put(grown, new_fields="info.y")
