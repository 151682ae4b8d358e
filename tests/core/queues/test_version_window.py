"""VersionWindowQueue: staleness bounded by admission, delivery in admission order, nothing dropped,
every sample accounted for; errors that name the field; waits that end."""

import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit_core import ClosedError, ConfigError, ExperienceTimeout, SemanticError
from conduit_core.queues import Admission, VersionWindowQueue, admissible


def test_the_rule_is_the_window_and_the_capacity():
    kw = dict(staleness=1, per_version=4, capacity=100)
    assert admissible(7, version=0, outstanding=7, **kw) and not admissible(8, version=0, outstanding=8, **kw)
    assert admissible(8, version=1, outstanding=4, **kw)
    assert not admissible(0, version=0, staleness=1, per_version=4, outstanding=3, capacity=3)


def test_staleness_zero_is_the_synchronous_schedule():
    q = VersionWindowQueue(per_version=3, staleness=0)
    for version in range(4):
        tickets = [q.admit(timeout=1) for _ in range(3)]
        assert q.try_admit() is None                      # the next group waits for the next version
        assert [t.seq for t in tickets] == [3 * version + i for i in range(3)]
        assert {t.version for t in tickets} == {version}
        for t in reversed(tickets):                       # finishing out of order changes nothing
            q.put(t, f"s{t.seq}")
        got = q.take(3, timeout=1)
        assert [d.item for d in got] == [f"s{t.seq}" for t in tickets] and {d.staleness for d in got} == {0}
        q.publish_version(version + 1)
    assert q.stats()["staleness"] == {0: 12}


def test_delivery_waits_for_the_oldest_rather_than_pass_it_over():
    q = VersionWindowQueue(per_version=2, staleness=2)
    a, b, c = q.admit(), q.admit(), q.admit()
    q.put(b, "b")
    q.put(c, "c")
    assert q.try_take(2) is None                          # a (started first) is still generating
    q.put(a, "a")
    assert [d.item for d in q.take(2, timeout=1)] == ["a", "b"]
    assert q.pending_items() == ["c"]


def test_a_reported_sample_is_counted_and_passed_over():
    q = VersionWindowQueue(per_version=2, staleness=1)
    t = [q.admit() for _ in range(3)]
    q.report(t[0], "generation failed")
    q.put(t[1], 1)
    q.put(t[2], 2)
    assert [d.item for d in q.take(2, timeout=1)] == [1, 2]
    s = q.stats()
    assert (s["admitted"], s["delivered"], s["reported"], s["pending"]) == (3, 2, 1, 0)
    with pytest.raises(SemanticError, match="not awaiting its put"):
        q.report(t[1], "late")


def test_partial_rollouts_carry_each_segment_and_age_from_the_oldest():
    q = VersionWindowQueue(per_version=1, staleness=1)
    t0, t1 = q.admit(), q.admit()
    q.put(t0, "x")
    q.take(1)
    q.publish_version(1)
    q.put(t1, "cut by the sync", versions=[0, 1])
    (d,) = q.take(1)
    assert d.versions == (0, 1) and d.staleness == 1


@pytest.mark.parametrize("versions, why", [([], "non-empty"), ([1, 0], "non-decreasing"), ([2], "published")])
def test_bad_versions_are_refused_naming_the_field_and_nothing_changes(versions, why):
    q = VersionWindowQueue(per_version=2, staleness=1)
    t = q.admit()
    with pytest.raises(ConfigError, match=r"versions: expected .*Fix"):
        q.put(t, "x", versions=versions)
    q.put(t, "x")                                          # the admission is still open
    assert q.stats()["put"] == 1


def test_a_sample_put_twice_or_never_admitted_is_refused():
    q = VersionWindowQueue(per_version=2, staleness=0)
    t = q.admit()
    q.put(t, 1)
    with pytest.raises(SemanticError, match="already put"):
        q.put(t, 2)

    with pytest.raises(SemanticError, match="never admitted"):
        q.put(Admission(seq=9, version=0), 3)


@pytest.mark.parametrize("kw, field", [(dict(per_version=0, staleness=0), "per_version"),
                                       (dict(per_version=2, staleness=-1), "staleness"),
                                       (dict(per_version=4, staleness=0, capacity=3), "capacity"),
                                       (dict(per_version=2.0, staleness=0), "per_version")])
def test_bad_arguments_name_the_argument(kw, field):
    with pytest.raises(ConfigError, match=rf"^{field}: expected"):
        VersionWindowQueue(**kw)


def test_versions_are_published_in_order():
    q = VersionWindowQueue(per_version=1, staleness=0)
    q.publish_version(2)
    with pytest.raises(ConfigError, match="version: expected an int >= the published 2"):
        q.publish_version(1)


def test_a_trainer_that_outruns_its_versions_is_told_and_gets_nothing():
    q = VersionWindowQueue(per_version=1, staleness=0)
    t = q.admit()
    q.put(t, "x")
    q.publish_version(3)                                   # three versions, no sample taken
    with pytest.raises(SemanticError, match="over the bound 0; nothing was delivered"):
        q.take(1)
    assert q.pending_items() == ["x"]


def test_waits_end_with_a_timeout_that_says_what_blocks():
    q = VersionWindowQueue(per_version=1, staleness=0)
    t = q.admit()
    with pytest.raises(ExperienceTimeout, match="version window stayed full"):
        q.admit(timeout=0.05)
    with pytest.raises(ExperienceTimeout, match="sample 0 was not put"):
        q.take(1, timeout=0.05)
    q.put(t, 1)
    assert q.stats()["admission_waits"] == 0              # a wait that timed out admitted nothing


def test_close_wakes_every_waiter_and_keeps_what_is_pending():
    q = VersionWindowQueue(per_version=2, staleness=0)
    q.put(q.admit(), "kept")
    q.admit()                                             # admitted, never put: a take of 2 waits for it
    errors = []

    def wait(call):
        try:
            call()
        except ClosedError as exc:
            errors.append(exc)
    threads = [threading.Thread(target=wait, args=(q.admit,)), threading.Thread(target=wait, args=(lambda: q.take(2),))]
    for th in threads:
        th.start()
    time.sleep(0.05)
    q.close()
    for th in threads:
        th.join(timeout=5)
        assert not th.is_alive()
    assert len(errors) == 2 and q.pending_items() == ["kept"]
    with pytest.raises(ClosedError, match="put: the queue is closed"):
        q.put(Admission(1, 0), "late")


def test_finish_producing_lets_the_last_batch_be_short():
    q = VersionWindowQueue(per_version=4, staleness=0)
    for i in range(3):
        q.put(q.admit(), i)
    q.finish_producing()
    assert [d.item for d in q.take(4, timeout=1)] == [0, 1, 2]
    assert q.take(4, timeout=1) == []
    with pytest.raises(ClosedError, match="finish_producing"):
        q.admit()


def test_threads_producing_and_training_keep_the_bound_and_lose_nothing():
    per_version, staleness, steps = 4, 1, 30
    q = VersionWindowQueue(per_version=per_version, staleness=staleness)
    rng = np.random.default_rng(0)
    delays = iter(rng.exponential(0.002, size=10_000).tolist())
    lock = threading.Lock()
    put = []

    def producer():
        while True:
            try:
                t = q.admit(timeout=10)
            except ClosedError:
                return
            with lock:
                d = next(delays)
            time.sleep(d)
            try:
                q.put(t, t.seq, versions=range(t.version, q.version + 1))
            except ClosedError:
                return
            with lock:
                put.append(t.seq)

    workers = [threading.Thread(target=producer) for _ in range(6)]
    for w in workers:
        w.start()
    got = []
    for v in range(steps):
        batch = q.take(per_version, timeout=10)
        assert max(d.staleness for d in batch) <= staleness
        got += [d.item for d in batch]
        q.publish_version(v + 1)
    q.close()
    for w in workers:
        w.join(timeout=10)
        assert not w.is_alive()
    assert got == list(range(len(got)))                   # admission order
    assert sorted(got + q.pending_items()) == sorted(put)   # nothing lost, nothing twice


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 4), st.integers(0, 3), st.lists(st.tuples(st.sampled_from("apPrt"), st.integers(0, 50)),
                                                       max_size=120))
def test_any_interleaving_keeps_the_accounts_the_order_and_the_bound(per_version, staleness, ops):
    q = VersionWindowQueue(per_version=per_version, staleness=staleness)
    open_, taken, reported, taken_count = [], [], set(), 0
    for op, k in ops:
        if op == "a":
            t = q.try_admit()
            if t is not None:
                open_.append(t)
        elif op in "pP" and open_:
            t = open_.pop(k % len(open_))
            q.put(t, t.seq, versions=range(t.version, q.version + 1) if op == "P" else None)
        elif op == "r" and open_:
            t = open_.pop(k % len(open_))
            q.report(t, "gave up")
            reported.add(t.seq)
        elif op == "t":
            batch = q.try_take(per_version)
            if batch is not None:
                assert all(d.staleness <= staleness for d in batch)
                taken += [d.item for d in batch]
                taken_count += 1
                q.publish_version(taken_count)   # one version per batch, as the contract asks
        s = q.stats()
        assert s["admitted"] == s["delivered"] + s["pending"] + s["reported"]
        assert s["admitted"] - s["delivered"] - s["reported"] <= q.capacity
    admitted = [s for s in range(q.stats()["admitted"]) if s not in reported]
    assert taken == admitted[:len(taken)]                  # oldest first, none passed over
    assert sorted(taken + q.pending_items()) == sorted(set(admitted) - {t.seq for t in open_})


def test_a_producer_that_lags_admits_at_its_own_version_never_a_newer_one():
    q = VersionWindowQueue(per_version=1, staleness=1)
    q.publish_version(1)
    t = q.admit(version=0)
    assert t.version == 0
    q.put(t, "old weights", versions=[0])
    assert q.take(1)[0].staleness == 1
    with pytest.raises(ConfigError, match="version: expected an int <= the published 1"):
        q.admit(version=2)


def test_a_lagging_version_past_its_window_is_refused_at_once_not_waited_for():
    q = VersionWindowQueue(per_version=1, staleness=0)
    q.put(q.admit(), "a")
    q.take(1)
    q.publish_version(1)
    with pytest.raises(SemanticError, match="generated by version 0 would be trained at version 1, over"):
        q.admit(version=0, timeout=5)                  # at once: its window never moves
    assert q.stats()["admitted"] == 1
    assert q.admit(version=1).seq == 1


def test_a_resumed_queue_counts_its_window_from_its_start_version():
    q = VersionWindowQueue(per_version=2, staleness=0, start_version=5)
    assert [q.admit().version for _ in range(2)] == [5, 5] and q.try_admit() is None
    with pytest.raises(ConfigError, match="n: expected an int in \\[1, 2\\]"):
        q.try_take(3)
