"""Replay deliveries prepared ahead for a buffer written inline (conduit_core.plane.prepared_replay).

The invariant: with ``staleness=0`` and ``priority_lag=0``, what the learner gets is exactly what a
sequential run gets on the same stores, gets and priority updates (same seqs, same weights, in the
same order), whatever the worker prepared and discarded meanwhile; discarded batches leave the RNG
and the sample count as if never drawn. Failures in the worker reach the next ``deliver``; ``close``
joins the worker."""

import threading
import time

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conduit_core.buffer.experience_buffer import ExperienceBuffer
from conduit_core.errors import ConfigError, WorkerError
from conduit_core.plane.prepared_deliveries import DeliveryRequest
from conduit_core.plane.prepared_replay import PreparedReplay
from conduit_core.planning.schedule import Schedule
from conduit_core.selection.selectors import Prioritized, Uniform
from conduit_core.schema.spec import ExperienceSpec, FieldSpec

B = 3


class Owner:
    """A buffer's owner as an adapter is: stores on its own thread under its lock, delivers through
    PreparedReplay, updates priorities under the lock."""

    def __init__(self, schedule, *, prioritized=False, seed=5, capacity=12, priority_lag=0, prepare=None):
        sel = Prioritized(alpha=0.7, beta=0.5, eps=0.0, stratified=True) if prioritized else Uniform(replace=False)
        self.buffer = ExperienceBuffer(spec=ExperienceSpec([FieldSpec("x", (), torch.int64)]), capacity=capacity,
                                       selector=sel, seed=seed, done_fields=())
        self.lock = threading.Lock()
        self.prioritized = prioritized
        self.replay = PreparedReplay(buffer=self.buffer, schedule=schedule, lock=self.lock, priority_lag=priority_lag,
                                     prepare=prepare or (lambda b: b["x"].clone()))
        self.next = 0

    def put(self, n):
        with self.lock:
            self.buffer.add({"x": np.arange(self.next, self.next + n)})
        self.next += n

    def get(self):
        req = DeliveryRequest("sample", B, beta=0.5 if self.prioritized else None)
        p, _ = self.replay.deliver(req)
        assert p.prepared.tolist() == p.batch["x"].tolist()
        w = None if p.batch.weights is None else np.round(p.batch.weights.numpy(), 6).tolist()
        return p.batch.seqs.tolist(), w

    def update(self, seqs, k):
        with self.lock:
            self.buffer.update_priorities(np.asarray(seqs) % self.buffer.capacity, np.full(len(seqs), 1.0 + k),
                                          seqs=np.asarray(seqs))
            self.replay.priorities_updated_locked()

    def settle(self, timeout=0.3):
        """Let the worker prepare what it wants to (so gets meet prepared batches); returns as soon
        as it has. A test that counts hits waits longer (``settle(10)``): a loaded machine's
        worker can take more than 0.3 s, and there the worker always fills its depth."""
        if not self.replay.schedule.is_overlapped:
            return
        end = time.monotonic() + timeout
        while time.monotonic() < end and len(self.replay) < self.replay.schedule.depth:
            time.sleep(0.001)


def wait_reported(replay, timeout=10.0):
    """Until the preparing thread's failure is kept for a caller (a fixed sleep is too short on a
    loaded machine); the worker reports it after letting go of the delivery lock."""
    end = time.monotonic() + timeout
    while not replay._errors and time.monotonic() < end:
        time.sleep(0.002)
    assert replay._errors, "the preparing thread reported no failure"


def run(owner, ops):
    out = []
    owner.put(B + 1)
    for k, (op, n) in enumerate(ops):
        if op == "put":
            owner.put(n)
        elif op == "settle":
            owner.settle()
        else:
            seqs, w = owner.get()
            out.append((seqs, w))
            if owner.prioritized and op == "get_update":
                owner.update(seqs, k)
    return out


OPS = st.lists(st.tuples(st.sampled_from(["put", "get", "get", "get_update", "settle"]), st.integers(1, 4)),
               max_size=25)
SCHEDULES = [Schedule.sequential(delivery_granularity=3),
             Schedule.overlapped(delivery_granularity=1, depth=2),
             Schedule.overlapped(delivery_granularity=2, depth=4)]


@pytest.mark.parametrize("prioritized", [False, True])
@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: f"{s.mode}-g{s.delivery_granularity}-d{s.depth}")
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_prepared_deliveries_equal_the_sequential_ones(prioritized, schedule, ops):
    seq, ahead = Owner(Schedule.sequential(), prioritized=prioritized), Owner(schedule, prioritized=prioritized)
    try:
        assert run(ahead, ops) == run(seq, ops)
        with ahead.replay.paused():  # every prepared draw undone: RNG and counts as if never drawn
            assert ahead.buffer.sampled == seq.buffer.sampled
            assert ahead.buffer.rng.bit_generator.state == seq.buffer.rng.bit_generator.state
    finally:
        seq.replay.close()
        ahead.replay.close()


def test_prepared_batches_are_handed_out_when_nothing_changed_and_discarded_after_a_put():
    o = Owner(Schedule.overlapped(delivery_granularity=2, depth=2))
    o.put(8)
    o.get()
    o.settle(10)
    o.get()
    m = o.replay.metrics()
    assert m.prefetch_hits == 1 and m.prefetch_discards == 0
    o.settle(10)
    o.put(1)  # the prepared batches no longer see every stored row: stale at staleness 0
    o.get()
    assert o.replay.metrics().prefetch_discards >= 1
    with o.replay.paused():  # the discarded ones' counts were undone: only what was handed out counts
        assert o.buffer.sampled == 3 * B
    o.replay.close()


def test_staleness_lets_a_prepared_batch_miss_that_many_rows():
    o = Owner(Schedule.overlapped(delivery_granularity=1, depth=1, staleness=2))
    o.put(8)
    o.get()
    o.settle(10)
    o.put(2)
    o.get()
    assert o.replay.metrics().prefetch_hits == 1
    o.settle(10)
    o.put(3)
    hits = o.replay.metrics().prefetch_hits
    o.get()
    m = o.replay.metrics()
    assert m.prefetch_hits == hits and m.prefetch_discards >= 1
    o.replay.close()


def test_priority_lag_is_opt_in_and_lets_a_batch_drawn_before_an_update_be_handed_out():
    o = Owner(Schedule.overlapped(delivery_granularity=1, depth=1), prioritized=True, priority_lag=1)
    o.put(8)
    seqs, _ = o.get()
    o.settle()
    o.update(seqs, 1)  # within the lag: the batch drawn before it stays valid (SRL's algorithm changes)
    o.get()
    m = o.replay.metrics()
    assert m.prefetch_hits == 1 and m.prefetch_discards == 0
    o.replay.close()
    assert Owner(Schedule.sequential(), prioritized=True).replay.priority_lag == 0  # the default


def _worker_threads():
    return [t for t in threading.enumerate() if t.name == "conduit-prepared-replay"]


def test_a_failure_in_the_preparing_thread_reaches_the_next_deliver_and_its_draw_is_undone():
    tried = []

    def prepare(batch):
        if threading.current_thread().name == "conduit-prepared-replay" and not tried:
            tried.append(1)
            raise RuntimeError("injected prepare failure")
        return batch["x"].clone()

    o = Owner(Schedule.overlapped(delivery_granularity=2, depth=2), prepare=prepare)
    twin = Owner(Schedule.sequential())
    o.put(8)
    twin.put(8)
    assert o.get() == twin.get()
    end = time.monotonic() + 2
    while not tried and time.monotonic() < end:
        time.sleep(0.002)
    wait_reported(o.replay)  # the worker reports after it lets go of the delivery lock
    with pytest.raises(WorkerError, match="injected prepare failure") as info:
        o.get()
    assert isinstance(info.value.__cause__, RuntimeError)
    for _ in range(6):  # the failed draws were undone: what follows is what the sequential twin delivers
        o.settle()
        assert o.get() == twin.get()
    o.replay.close()
    twin.replay.close()


def test_close_joins_the_worker_and_raises_a_failure_not_yet_raised(monkeypatch):
    before = set(_worker_threads())
    o = Owner(Schedule.overlapped(delivery_granularity=1, depth=1))
    mine = [t for t in _worker_threads() if t not in before]
    assert len(mine) == 1
    o.put(8)
    real = o.buffer.sample

    def failing(*a, **k):
        if threading.current_thread().name == "conduit-prepared-replay":
            raise RuntimeError("injected draw failure")
        return real(*a, **k)

    monkeypatch.setattr(o.buffer, "sample", failing)
    o.get()
    wait_reported(o.replay)
    with pytest.raises(WorkerError, match="injected draw failure"):
        o.replay.close()
    assert not mine[0].is_alive()


def test_deliver_never_waits_for_data():
    o = Owner(Schedule.overlapped(delivery_granularity=1, depth=1, timeout=60.0))
    o.put(2)  # fewer than B rows: a draw without replacement cannot be made
    t0 = time.perf_counter()
    with pytest.raises(Exception):
        o.get()
    assert time.perf_counter() - t0 < 20   # (a wait for data would last the schedule's 60 s)
    o.replay.close()


def test_process_worker_and_bad_priority_lag_are_refused():
    buf = ExperienceBuffer(spec=ExperienceSpec([FieldSpec("x", (), torch.int64)]), capacity=4)
    with pytest.raises(ConfigError, match="worker"):
        PreparedReplay(buffer=buf, schedule=Schedule.overlapped(worker="process"), lock=threading.Lock())
    with pytest.raises(ConfigError, match="priority_lag"):
        PreparedReplay(buffer=buf, schedule=Schedule.sequential(), lock=threading.Lock(), priority_lag=-1)
    with pytest.raises(ConfigError, match="schedule"):
        PreparedReplay(buffer=buf, schedule="overlapped", lock=threading.Lock())


def test_mostly_discarded_prepared_batches_are_said_once(caplog):
    """Preparing ahead that the learner's loop always invalidates costs draws and saves nothing:
    one warning, with the hit rate and the fix, once enough batches were judged; none while most
    are handed out."""
    import logging
    from conduit_core.plane.prepared_deliveries import HitRate
    with caplog.at_level(logging.WARNING, logger="conduit"):
        good = HitRate()
        for _ in range(50):
            good.note(handed=1, discarded=0)
        good.note(handed=0, discarded=3)
        bad = HitRate()
        for _ in range(HitRate.WARN_AFTER - 1):
            bad.note(handed=0, discarded=1)
        assert not caplog.records                       # too few judged to say anything yet
        for _ in range(30):
            bad.note(handed=0, discarded=1)
    warnings = [r.getMessage() for r in caplog.records if r.name == "conduit"]
    assert len(warnings) == 1 and "hit rate 0%" in warnings[0] and "Schedule.sequential()" in warnings[0]
