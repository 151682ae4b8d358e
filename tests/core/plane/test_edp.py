import threading
import time

import numpy as np
import pytest
import torch

from conduit_core import (ClosedError, ConfigError, ExperienceBuffer, ExperienceDataPlane, ExperienceTimeout, Fifo,
                          Prioritized, RateLimiter, Schedule, SpecError, Uniform, WorkerError)

from ..helpers import SPEC, assert_same_state, rollout


def make(schedule, selector=None, capacity=1000, **kw):
    buf = ExperienceBuffer(spec=SPEC, capacity=capacity, selector=selector or Uniform(), seed=1)
    return ExperienceDataPlane(buffer=buf, schedule=schedule, **kw)


def dqn_like_run(schedule, selector, steps=40):
    seqs = []
    with make(schedule, selector) as edp:
        for i in range(steps):
            edp.ingest(rollout(5, 5 * i), source=i % 3)
            b = edp.deliver(8, n_step=(1, 3))
            seqs.append(b.seqs.copy())
            if isinstance(selector, Prioritized):
                edp.update_priorities(b, np.random.default_rng(i).random(8))
        return np.concatenate(seqs), edp.metrics()


@pytest.mark.parametrize("selector", [Uniform, Prioritized])
@pytest.mark.parametrize("worker", ["thread", "process"])
def test_overlapped_with_staleness_zero_delivers_exactly_what_sequential_delivers(selector, worker):
    ref, _ = dqn_like_run(Schedule.sequential(), selector())
    got, m = dqn_like_run(Schedule.overlapped(worker=worker), selector())
    np.testing.assert_array_equal(ref, got)
    assert m.ingest.items_in == 200


def test_overlapped_prefetch_is_used_when_staleness_allows():
    with make(Schedule.overlapped(staleness=10, depth=3)) as edp:
        edp.ingest(rollout(50))
        edp.flush()
        edp.deliver(8)
        deadline = time.time() + 5
        while edp.metrics().prefetch_hits == 0 and time.time() < deadline:
            time.sleep(0.01)
            edp.deliver(8)
        m = edp.metrics()
        assert m.prefetch_hits >= 1 and m.prefetch_discards == 0   # nothing changed: nothing prepared was stale


def test_delivery_granularity_amortises_and_keeps_semantics():
    with make(Schedule.sequential(delivery_granularity=4)) as edp:
        edp.ingest(rollout(100))
        batches = [edp.deliver(16) for _ in range(4)]
        assert edp.metrics().deliver.items_out == 64  # one operator call prepared all four
        assert edp.metrics().prefetch_hits == 3
        edp.deliver(16)                 # prepares four more, hands out one, keeps three
        edp.ingest(rollout(1, 100))
        edp.deliver(16)                 # the insert made the three kept batches stale: prepared anew
        assert edp.metrics().prefetch_discards == 3
        assert all(b.size == 16 for b in batches)


def test_hook_error_reaches_caller_on_next_call_and_other_rollouts_are_kept():
    def hook(rollouts):
        for r in rollouts:
            if r.data["obs"][0, 0] == 10:
                raise ValueError("bad rollout")
        return rollouts

    with pytest.raises(WorkerError):
        with make(Schedule.overlapped(), ingest_hooks=[hook]) as edp:
            edp.ingest(rollout(5, 0))
            edp.ingest(rollout(5, 10))
            edp.ingest(rollout(5, 20))
            with pytest.raises(WorkerError, match=r"rollouts \[1\].*bad rollout") as info:
                edp.flush()
            assert isinstance(info.value.__cause__, ValueError)
            edp.flush()  # reported once; the rest was stored
            ids = sorted(edp.buffer.state_dict()["data"]["obs"][:, 0].tolist())
            assert ids == list(range(0, 5)) + list(range(20, 25))
            edp.ingest(rollout(5, 10))
            raise WorkerError("leave the context with an error: close must still join")


def test_sequential_hook_error_raises_at_once_and_stores_nothing():
    def hook(rollouts):
        raise RuntimeError("boom")
    with make(Schedule.sequential(), ingest_hooks=[hook]) as edp:
        with pytest.raises(RuntimeError, match="boom"):
            edp.ingest(rollout(3))
        assert len(edp.buffer) == 0


def test_bad_input_without_hooks_is_rejected_in_the_callers_frame_even_when_overlapped():
    with make(Schedule.overlapped()) as edp:
        bad = rollout(3)
        bad["reward"] = bad["reward"].astype(np.float64)
        with pytest.raises(SpecError, match="reward"):
            edp.ingest(bad)
        edp.ingest(rollout(3))
        edp.flush()
        assert len(edp.buffer) == 3


def test_close_joins_worker_thread_and_process():
    before = set(threading.enumerate())
    edp = make(Schedule.overlapped(worker="process"))
    proc = edp._transformer._proc
    edp.ingest(rollout(10))
    edp.close()
    assert not proc.is_alive()
    assert set(threading.enumerate()) <= before
    with pytest.raises(ClosedError):
        edp.ingest(rollout(1))
    edp.close()  # idempotent


def test_full_ingest_queue_times_out_with_fix():
    rl = RateLimiter(samples_per_insert=1.0, tolerance=2.0, on_limit="block", timeout=5)
    buf = ExperienceBuffer(spec=SPEC, capacity=100, rate_limiter=rl)
    # staleness > 0: the learner may sample while the worker waits for the ratio to allow inserts
    edp = ExperienceDataPlane(buffer=buf, schedule=Schedule.overlapped(queue_size=1, timeout=0.3, staleness=10))
    edp.ingest(rollout(2))
    with pytest.raises(ExperienceTimeout, match="queue_size"):
        for _ in range(5):
            edp.ingest(rollout(2), timeout=0.2)
    for _ in range(4):  # ratio 1 with tolerance 2: 6 inserted allow 8 sampled
        edp.deliver(2)  # the learner samples: the worker gets unblocked
    edp.close()
    assert buf.closed


def test_on_policy_fifo_through_the_data_plane():
    with make(Schedule.overlapped(), selector=Fifo()) as edp:
        for v in range(3):
            for s in range(2):
                edp.ingest(rollout(4, 100 * v + 10 * s), source=s, policy_version=v)
            b = edp.deliver(None, policy_version=v)
            assert b.size == 8 and set(b.versions.tolist()) == {v}
        assert edp.metrics().dropped_stale == 0


def test_replay_needs_batch_size():
    with make(Schedule.sequential()) as edp:
        with pytest.raises(ConfigError, match="batch_size"):
            edp.deliver()


def test_metrics_snapshot_and_reset():
    with make(Schedule.sequential()) as edp:
        edp.ingest(rollout(10))
        edp.deliver(4)
        m = edp.metrics()
        assert m.ingest.calls == 1 and m.ingest.items_in == 10 and m.deliver.items_out == 4
        assert m.exposed_s > 0 and m.buffer_size == 10
        edp.reset_metrics()
        assert edp.metrics().ingest.calls == 0


def test_metrics_scalars_are_the_snapshot_flat_for_a_tracker():
    with make(Schedule.sequential()) as edp:
        edp.ingest(rollout(10))
        edp.deliver(4)
        m = edp.metrics()
        flat = m.scalars()
        assert all(isinstance(v, (int, float)) for v in flat.values())
        assert flat["buffer_size"] == 10 and flat["ingest_calls"] == 1 and flat["deliver_calls"] == 1
        assert flat["exposed_ms"] == pytest.approx(m.exposed_s * 1e3)
        assert flat["deliver_blocked_ms"] == pytest.approx(m.deliver.blocked_s * 1e3)
        assert {"priorities_calls", "prefetch_hits", "prefetch_discards", "dropped_stale", "inserted"} <= set(flat)


def test_edp_state_round_trip_continues_identically(tmp_path):
    from conduit_core import state_io
    a = make(Schedule.overlapped(), Prioritized())
    for i in range(5):
        a.ingest(rollout(6, 6 * i), source=i)
    a.deliver(4)
    state_io.save(a.state_dict(), tmp_path / "s")
    b = make(Schedule.sequential(), Prioritized())
    b.load_state_dict(state_io.load(tmp_path / "s"))
    for _ in range(3):
        x, y = a.deliver(8), b.deliver(8)
        assert all(torch.equal(x[k], y[k]) for k in x)
    a.close()
    b.close()


def test_device_delivery_when_cuda_present():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA: host-to-device delivery")
    with make(Schedule.overlapped(), device="cuda") as edp:
        edp.ingest(rollout(10))
        assert edp.deliver(4)["obs"].device.type == "cuda"


def _failing_hook(rollouts):  # module level: picklable for the process worker
    for r in rollouts:
        if r.data["obs"][0, 0] == 10:
            raise ValueError("bad rollout in the child")
    return rollouts


def test_process_worker_error_reaches_the_caller_and_the_rest_is_stored():
    edp = make(Schedule.overlapped(worker="process"), ingest_hooks=[_failing_hook])
    try:
        edp.ingest(rollout(5, 0))
        edp.ingest(rollout(5, 10))
        edp.ingest(rollout(5, 20))
        with pytest.raises(WorkerError, match="bad rollout in the child") as info:
            edp.flush()
        assert isinstance(info.value.__cause__, ValueError)
        edp.flush()
        assert sorted(edp.buffer.state_dict()["data"]["obs"][:, 0].tolist()) == list(range(5)) + list(range(20, 25))
    finally:
        edp.close()


def test_unpicklable_hooks_are_refused_for_the_process_worker():
    with pytest.raises(ConfigError, match="picklable"):
        make(Schedule.overlapped(worker="process"), ingest_hooks=[lambda rs: rs])


def _refuse_to_load():
    raise ValueError("this hook cannot be rebuilt in the child")


class _HookThatFailsToUnpickle:
    def __call__(self, rollouts):
        return rollouts

    def __reduce__(self):  # pickles in the parent, raises when the child unpickles it
        return (_refuse_to_load, ())


def test_a_process_worker_that_cannot_start_fails_at_schedule_time_and_leaves_nothing_running():
    before = {p.pid for p in __import__("multiprocessing").active_children()}
    with pytest.raises(RuntimeError, match="cannot be rebuilt in the child") as err:
        make(Schedule.overlapped(worker="process"), ingest_hooks=[_HookThatFailsToUnpickle()])
    assert "Traceback" in err.value.remote_traceback
    assert {p.pid for p in __import__("multiprocessing").active_children()} <= before


def test_reschedule_keeps_the_child_process_across_granularity_changes():
    edp = make(Schedule.overlapped(worker="process"))
    proc = edp._transformer._proc
    edp.ingest(rollout(4))
    edp.reschedule(Schedule.overlapped(worker="process", ingest_granularity=4, delivery_granularity=2))
    assert edp._transformer._proc is proc and proc.is_alive()
    edp.ingest(rollout(4))
    edp.reschedule(Schedule.overlapped(worker="thread"))
    assert not proc.is_alive()  # another worker kind: the child is joined
    edp.ingest(rollout(4))
    edp.flush()
    assert len(edp.buffer) == 12
    edp.close()


def test_a_delivery_hook_that_breaks_the_contract_is_named():
    with make(Schedule.sequential(), delivery_hooks=[lambda b: dict(b)]) as edp:
        edp.ingest(rollout(4))
        with pytest.raises(SpecError, match="delivery hook.*Batch"):
            edp.deliver(2)


def test_an_ingest_hook_that_drops_rollouts_is_named():
    with make(Schedule.sequential(), ingest_hooks=[lambda rs: rs[:0]]) as edp:
        with pytest.raises(SpecError, match="ingest hook.*1 rollouts"):
            edp.ingest(rollout(4))
        assert len(edp.buffer) == 0


def test_reschedule_keeps_everything_and_switches_workers():
    edp = make(Schedule.sequential())
    for i in range(3):
        edp.ingest(rollout(4, 4 * i))
    edp.reschedule(Schedule.overlapped(worker="thread"))
    edp.ingest(rollout(4, 12))
    edp.reschedule(Schedule.sequential())
    assert edp._thread is None and len(edp.buffer) == 16
    edp.close()


@pytest.mark.parametrize("selector", [Uniform, Prioritized])
def test_a_lone_rollout_without_hooks_is_stored_as_the_hooked_route_stores_it(selector):
    """``ingest_many([r])`` without hooks goes from the encode straight to the insert; the
    same tickets, rows, metrics and buffer state as the general route (here forced by a hook
    that changes nothing), refusals included: bad input and an oversized rollout leave both
    unchanged, and the lone route's failure names no stored ticket."""
    from conduit_core import CapacityError, Rollout
    lone, hooked = make(Schedule.sequential(), selector(), capacity=64), \
        make(Schedule.sequential(), selector(), capacity=64, ingest_hooks=[lambda rs: rs])
    try:
        for i in range(30):
            r = Rollout(rollout(5, 5 * i), source=i % 4, policy_version=i // 10)
            assert lone.ingest_many([r]) == hooked.ingest_many([r]) == [i]
        for bad, err in ((rollout(65, 0), CapacityError), ({**rollout(3, 0), "reward": np.ones(2, np.float32)},
                                                           SpecError)):
            for edp in (lone, hooked):
                with pytest.raises(err) as raised:
                    edp.ingest_many([bad])
                if edp is lone and err is CapacityError:
                    assert getattr(raised.value, "stored_tickets", []) == []
        assert_same_state(lone.state_dict(), hooked.state_dict())
        ml, mh = lone.metrics(), hooked.metrics()
        assert (ml.ingest.items_in, ml.ingest.items_out, ml.ingest.calls) == \
            (mh.ingest.items_in, mh.ingest.items_out, mh.ingest.calls) == (150, 150, 32)
    finally:
        lone.close()
        hooked.close()


def test_a_buffer_and_a_data_plane_say_they_are_there(caplog):
    """One INFO line under the 'conduit' logger when each is built: what it is, its capacity,
    selector and schedule, so a framework's run log shows that Conduit is in the path."""
    import logging
    with caplog.at_level(logging.INFO, logger="conduit"):
        buf = ExperienceBuffer(spec=SPEC, capacity=64, selector=Fifo())
        ExperienceDataPlane(buffer=buf, schedule=Schedule.sequential()).close()
    lines = [r.getMessage() for r in caplog.records if r.name == "conduit"]
    assert any("experience buffer built: capacity 64, selector fifo" in m for m in lines), lines
    assert any("data plane built over a fifo buffer of 64: schedule sequential" in m for m in lines), lines
