"""Found in review (session 22): one data plane used from several threads. A close() or a
reschedule() while others ingest lost accepted rollouts silently; a spare batch drawn before
another thread's rows were stored was handed out; flush() under a steady stream waited for an
empty queue; a queued ingest_many that failed part way did not say what it took; metrics read
after flush() lagged. Each test fails on the code before the fix."""

import threading
import time

import numpy as np
import pytest

from conduit_core import (ClosedError, ConfigError, ExperienceBuffer, ExperienceDataPlane, ExperienceTimeout,
                          Schedule, Uniform, WorkerError)

from ..helpers import SPEC, rollout


def _producers(edp, count, stop, refused=(ClosedError,)):
    """Threads ingesting 2-row rollouts until ``stop`` is set or a refusal; each counts the rows of
    the calls that returned a ticket (accepted) and keeps the errors it got."""
    accepted, errors = [0] * count, [[] for _ in range(count)]

    def run(k):
        while not stop.is_set():
            try:
                edp.ingest(rollout(2, source_tag=float(k)), source=k, timeout=10.0)
            except refused as exc:
                errors[k].append(exc)
                if isinstance(exc, ClosedError):
                    return
                continue
            accepted[k] += 2
    threads = [threading.Thread(target=run, args=(k,)) for k in range(count)]
    for t in threads:
        t.start()
    return threads, accepted, errors


@pytest.mark.parametrize("trial", range(4))
def test_close_while_others_ingest_stores_every_accepted_rollout_and_refuses_the_rest(trial):
    buf = ExperienceBuffer(spec=SPEC, capacity=1_000_000, selector=Uniform(), seed=trial)
    edp = ExperienceDataPlane(buffer=buf, schedule=Schedule.overlapped(queue_size=64, timeout=10.0))
    stop = threading.Event()
    threads, accepted, errors = _producers(edp, 3, stop)
    time.sleep(0.05 + 0.02 * trial)
    t0 = time.monotonic()
    edp.close()
    stop.set()
    for t in threads:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in threads) and time.monotonic() - t0 < 5
    assert buf.inserted == sum(accepted) > 0   # every accepted row stored, none beyond
    assert all(isinstance(e[-1], ClosedError) for e in errors if e)


@pytest.mark.parametrize("trial", range(4))
def test_reschedule_while_others_ingest_loses_no_accepted_rollout(trial):
    buf = ExperienceBuffer(spec=SPEC, capacity=1_000_000, selector=Uniform(), seed=trial)
    edp = ExperienceDataPlane(buffer=buf, schedule=Schedule.overlapped(queue_size=64, timeout=10.0))
    stop = threading.Event()
    threads, accepted, errors = _producers(edp, 3, stop)
    time.sleep(0.03)
    edp.reschedule(Schedule.sequential())
    time.sleep(0.02)
    stop.set()
    for t in threads:
        t.join(timeout=10)
    edp.flush()
    assert buf.inserted == sum(accepted) > 0   # (rollouts that came during the switch waited for it)
    assert edp.ingestion.accepted_rows == edp.ingestion.committed_rows == buf.inserted
    assert not any(errors)
    edp.close()


def test_a_worker_that_fails_to_start_in_reschedule_refuses_rollouts_until_a_schedule_works():
    """The schedule used to be switched with no worker: ingest accepted, nothing stored, and
    close() dropped the rollouts without a word."""
    buf = ExperienceBuffer(spec=SPEC, capacity=1000, selector=Uniform())
    edp = ExperienceDataPlane(buffer=buf, schedule=Schedule.sequential(), ingest_hooks=[lambda rs: rs])
    with pytest.raises(ConfigError):   # (a lambda hook cannot go to a process worker)
        edp.reschedule(Schedule.overlapped(worker="process", timeout=0.5))
    with pytest.raises(WorkerError, match="did not start"):
        edp.ingest(rollout(3))
    edp.reschedule(Schedule.sequential())
    edp.ingest(rollout(3))
    assert buf.inserted == 3 and edp.ingestion.accepted_rows == edp.ingestion.committed_rows == 3
    edp.close()


class _HoldTag7:
    """An ingest hook that holds a rollout tagged 7 (``obs[:, 1]``) until ``gate`` is set, and
    says when it holds one (``entered``): a store caught half way, on a thread of the test's choosing."""

    def __init__(self):
        self.gate, self.entered = threading.Event(), threading.Event()

    def __call__(self, rollouts):
        if any(r.data["obs"][0, 1] == 7 for r in rollouts):
            self.entered.set()
            self.gate.wait(10)
        return rollouts


def _held_sequential_plane():
    """A sequential plane drawing two batches per call (staleness 0) with 8 rows stored, and a
    thread whose 4-row rollout is held in its hook: counted as accepted, not stored."""
    hold = _HoldTag7()
    buf = ExperienceBuffer(spec=SPEC, capacity=1000, selector=Uniform(), seed=0)
    edp = ExperienceDataPlane(buffer=buf, schedule=Schedule.sequential(delivery_granularity=2, staleness=0),
                              ingest_hooks=[hold])
    edp.ingest(rollout(8))
    held = threading.Thread(target=lambda: edp.ingest(rollout(4, 100, source_tag=7.0), source=1))
    return buf, edp, hold, held


def test_a_load_while_another_threads_ingest_is_being_stored_keeps_its_rows_counted_as_in_flight():
    """The load set accepted = committed; the in-flight caller then added its rows to committed
    only, so the staleness guard was off by them for good and handed out a stale spare batch."""
    buf, edp, hold, a = _held_sequential_plane()
    state = edp.state_dict()
    a.start()
    assert hold.entered.wait(5)
    edp.load_state_dict(state)
    hold.gate.set()
    a.join()
    assert edp.ingestion.accepted_rows == edp.ingestion.committed_rows == buf.inserted == 12
    edp.deliver(4)   # draws two: one kept
    edp.ingest(rollout(4, 200), source=2)
    assert edp.deliver(4).inserted_at_selection == buf.inserted == 16
    edp.close()


def test_a_spare_batch_drawn_before_another_threads_rows_were_stored_is_not_handed_out():
    """Sequential, two batches per draw, staleness 0: thread A's rollout is held in its hook
    (counted, not stored) while B's completes; B's count used to mark A's rows committed, so the
    spare drawn then passed as fresh once A's ingest had returned."""
    buf, edp, hold, a = _held_sequential_plane()
    a.start()
    assert hold.entered.wait(5)
    edp.ingest(rollout(4, 200), source=2)
    edp.deliver(4)   # draws two batches: one handed out, one kept
    hold.gate.set()
    a.join()
    b = edp.deliver(4)
    assert b.inserted_at_selection == buf.inserted == 16
    edp.close()


@pytest.mark.parametrize("hook_ms", [0.0, 1.0])
def test_flush_returns_once_what_came_before_it_is_stored_under_a_steady_stream(hook_ms):
    def slow(rollouts):
        time.sleep(hook_ms / 1e3)
        return rollouts
    buf = ExperienceBuffer(spec=SPEC, capacity=1_000_000, selector=Uniform(), seed=0)
    edp = ExperienceDataPlane(buffer=buf, schedule=Schedule.overlapped(queue_size=8, timeout=60.0),
                              ingest_hooks=[slow] if hook_ms else None)
    stop = threading.Event()
    threads, accepted, _ = _producers(edp, 2, stop)
    time.sleep(0.05)
    for _ in range(3):
        before = edp.ingestion.enqueued
        t0 = time.monotonic()
        edp.flush(timeout=60.0)   # (waiting for the stream to stop would last until the timeout, and raise)
        assert time.monotonic() - t0 < 30 and edp.ingestion.finished >= before
    stop.set()
    for t in threads:
        t.join(timeout=10)
    edp.flush()
    assert buf.inserted == sum(accepted)
    edp.close()


def test_a_queued_ingest_many_that_fails_part_way_names_the_rollouts_it_accepted():
    gate = threading.Event()

    def held(rollouts):
        gate.wait(10)
        return rollouts
    buf = ExperienceBuffer(spec=SPEC, capacity=1000, selector=Uniform())
    edp = ExperienceDataPlane(buffer=buf, schedule=Schedule.overlapped(queue_size=2), ingest_hooks=[held])
    with pytest.raises(ExperienceTimeout) as info:
        edp.ingest_many([rollout(1, source_tag=float(t)) for t in (10, 11, 12, 13)], timeout=0.3)
    gate.set()
    edp.flush()
    tags = sorted(edp.read(np.arange(buf.inserted))["obs"][:, 1].numpy().astype(int).tolist())
    assert len(info.value.accepted_tickets) == len(tags) and tags == [10, 11, 12][:len(tags)]
    edp.close()


def test_metrics_read_after_flush_count_every_stored_row(monkeypatch):
    """The worker marked a group stored before recording its metrics; a recorder made slow here
    (2 ms) widens that window so that a flush() returning in it is seen."""
    from conduit_core.plane.metrics import MetricsRecorder
    record = MetricsRecorder.add_busy

    def slow_record(self, *args, **kwargs):
        time.sleep(0.002)
        return record(self, *args, **kwargs)
    monkeypatch.setattr(MetricsRecorder, "add_busy", slow_record)
    buf = ExperienceBuffer(spec=SPEC, capacity=10_000, selector=Uniform())
    edp = ExperienceDataPlane(buffer=buf, schedule=Schedule.overlapped())
    for i in range(30):
        edp.ingest(rollout(3, 3 * i))
        edp.flush()
        m = edp.metrics()
        assert m.ingest.items_in == m.ingest.items_out == buf.inserted == 3 * (i + 1)
    edp.close()


def test_a_state_taken_while_another_thread_ingests_counts_no_row_it_does_not_hold():
    """``rows`` used to be the rows accepted, a rollout queued after the state's flush included
    (above the rows the state holds); now the rows stored. The rollout is queued in that gap
    here, its store held in a hook."""
    hold = _HoldTag7()
    buf = ExperienceBuffer(spec=SPEC, capacity=1000, selector=Uniform())
    edp = ExperienceDataPlane(buffer=buf, schedule=Schedule.overlapped(), ingest_hooks=[hold])
    edp.ingest(rollout(8))
    flush = edp.flush

    def flush_then_another_thread_ingests(*args, **kwargs):
        flush(*args, **kwargs)
        edp.ingest(rollout(4, 100, source_tag=7.0), source=1)   # queued once the flush returned
    edp.flush = flush_then_another_thread_ingests
    state = edp.state_dict()
    del edp.flush
    assert state["rows"] == state["buffer"]["counters"]["inserted"] == 8
    hold.gate.set()
    edp.flush()
    assert buf.inserted == 12
    edp.close()
