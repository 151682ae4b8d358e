"""Fault injection: whatever fails in the background, accepted = stored + reported, and
every failure reaches the caller (all of them, not the first)."""

import time

import numpy as np
import pytest

from conduit_core import ExperienceBuffer, ExperienceDataPlane, Schedule, Uniform, WorkerError

from ..helpers import SPEC, rollout


def make(schedule, **kw):
    buf = ExperienceBuffer(spec=SPEC, capacity=1000, selector=Uniform(), seed=1)
    return ExperienceDataPlane(buffer=buf, schedule=schedule, **kw)


def stored_ids(edp):
    return sorted(int(x) for x in edp.buffer.state_dict()["data"]["obs"][:, 0])


def _fail_on_tens(rollouts):  # module level: picklable for the process worker
    for r in rollouts:
        if int(r.data["obs"][0, 0]) % 20 == 10:
            raise ValueError(f"bad rollout {int(r.data['obs'][0, 0])}")
    return rollouts


@pytest.mark.parametrize("worker", ["thread", "process"])
def test_two_background_failures_both_reach_the_caller(worker):
    """Each failure is reported once, on the next call (an ingest or a flush, whichever comes
    first: under load the worker may fail rollout 10 before rollout 30 is even handed over)."""
    errors, rejected = [], []

    def reported(call):
        try:
            call()
            return False
        except WorkerError as err:
            errors.extend(getattr(err, "errors", [err]))  # one failure comes as itself
            rejected.extend(err.rejected_tickets)
            return True
    with make(Schedule.overlapped(worker=worker), ingest_hooks=[_fail_on_tens]) as edp:
        for start in (0, 10, 20, 30, 40):          # 10 and 30 fail
            while reported(lambda: edp.ingest(rollout(5, start))):
                pass                               # a failure reported at ingest: this rollout was not taken
        deadline = time.monotonic() + 30
        while edp.metrics().ingest.items_in < 25 and time.monotonic() < deadline:  # both fail before we look
            time.sleep(0.02)
        while reported(edp.flush):
            pass
        text = " ".join(str(e) for e in errors)
        assert "bad rollout 10" in text and "bad rollout 30" in text
        assert sorted(rejected) == [1, 3]
        assert len(errors) == 2                    # reported once, each
        edp.flush()
        assert stored_ids(edp) == list(range(5)) + list(range(20, 25)) + list(range(40, 45))


def _slow_on_ten(rollouts):
    for r in rollouts:
        if int(r.data["obs"][0, 0]) == 10:
            time.sleep(25.0)
    return rollouts


def test_a_process_worker_answer_that_comes_too_late_is_never_taken_for_the_next_one():
    """Request 2 runs past Schedule.timeout: it is reported as failed, and its late answer
    must not be stored as request 3's (rows one rollout late) nor break later requests."""
    # (the other requests get 10 s, room for a fresh child's first answer on a busy machine; the slow one 25)
    with make(Schedule.overlapped(worker="process", timeout=10.0), ingest_hooks=[_slow_on_ten]) as edp:
        edp.ingest(rollout(5, 0))
        edp.ingest(rollout(5, 10))                 # slower than the timeout
        edp.ingest(rollout(5, 20))
        edp.ingest(rollout(5, 30))
        with pytest.raises(WorkerError, match="did not answer request") as info:
            edp.flush(timeout=30)
        assert info.value.rejected_tickets == [1]
        edp.flush(timeout=30)
        ids = edp.buffer.state_dict()["data"]["obs"][:, 0]
        assert stored_ids(edp) == list(range(5)) + list(range(20, 25)) + list(range(30, 35))
        # each stored row holds its own data (obs id and next_obs id agree row by row)
        nxt = edp.buffer.state_dict()["data"]["next_obs"][:, 0]
        assert np.array_equal(nxt, ids + 1)
        edp.ingest(rollout(5, 40))
        edp.flush(timeout=30)
        assert stored_ids(edp)[-5:] == list(range(40, 45))


def test_a_killed_process_worker_is_replaced_and_nothing_else_is_lost():
    import os
    import signal
    with make(Schedule.overlapped(worker="process")) as edp:
        edp.ingest(rollout(5, 0))
        edp.flush(timeout=30)
        child = edp.worker_process_id
        os.kill(child, signal.SIGKILL)
        time.sleep(0.5)
        edp.ingest(rollout(5, 10))               # starts a new child; nothing was in flight
        edp.ingest(rollout(5, 20))
        edp.flush(timeout=60)
        assert stored_ids(edp) == list(range(5)) + list(range(10, 15)) + list(range(20, 25))


_ORPHAN_SCRIPT = """
import sys, time
sys.path.insert(0, {root!r})
from conduit_core import ExperienceBuffer, ExperienceDataPlane, Schedule, Uniform
from tests.core.helpers import SPEC
if __name__ == "__main__":
    edp = ExperienceDataPlane(buffer=ExperienceBuffer(spec=SPEC, capacity=100, selector=Uniform(), tier="shared"),
                              schedule=Schedule.overlapped(worker="process"))
    import glob
    print(edp.worker_process_id, " ".join(sorted(glob.glob("/dev/shm/conduit_*"))), flush=True)
    time.sleep(120)
"""


def test_the_process_worker_and_shared_memory_die_with_their_parent_even_after_sigkill(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    script = tmp_path / "parent.py"
    script.write_text(_ORPHAN_SCRIPT.format(root=root))
    import glob
    before = set(glob.glob("/dev/shm/conduit_*"))
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        line = parent.stdout.readline().split()
        child, segments = int(line[0]), set(line[1:]) - before
        assert segments                                       # the shared tier's segments exist
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                break
            with open(f"/proc/{child}/stat") as fh:     # a zombie has exited (reaped by init later)
                if fh.read().split()[2] == "Z":
                    break
            time.sleep(0.2)
        else:
            os.kill(child, signal.SIGKILL)
            raise AssertionError("the ingestion child outlived its SIGKILLed parent by 15 s")
        # with the child gone, Python's resource tracker unlinks the parent's shared segments
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(os.path.exists(p) for p in segments):
            time.sleep(0.2)
        assert not [p for p in segments if os.path.exists(p)], "shared segments outlived the SIGKILLed parent"
    finally:
        if parent.poll() is None:
            parent.kill()


# --------------------------------------------------------------------- state: all or nothing

def _filled(selector=None, n=50, capacity=40):
    from conduit_core import Prioritized
    buf = ExperienceBuffer(spec=SPEC, capacity=capacity, selector=selector or Prioritized(), seed=3)
    for i in range(0, n, 5):
        buf.add(rollout(5, i), source=i % 3)
    k = min(10, n, capacity)
    buf.update_priorities(np.arange(k), np.linspace(0.1, 2, k), slots_only=True)
    return buf


def _damage(state, part):
    import copy
    s = copy.deepcopy(state)
    if part == "rng":
        s["rng"] = {"bit_generator": "PCG64", "state": {"state": "x"}}
    elif part == "meta":
        s["meta"]["seq"] = s["meta"]["seq"][:-3]
    elif part == "meta_slots":
        s["meta"]["seq"] = s["meta"]["seq"][::-1].copy()
    elif part == "leaves":
        s["selector_state"]["leaves"] = s["selector_state"]["leaves"][:-1]
    elif part == "leaves_nan":
        s["selector_state"]["leaves"][3] = np.nan
    elif part == "counters":
        s["counters"]["head"] = s["counters"]["inserted"] + 1
    elif part == "counter_type":
        s["counters"]["inserted"] = 2.5
    elif part == "data_last":  # the last column damaged: the first ones must not have been written
        s["data"]["truncated"] = s["data"]["truncated"][:-1]
    elif part == "open_tail":
        s["open_tail"] = [["a"]]
    return s


@pytest.mark.parametrize("part", ["rng", "meta", "meta_slots", "leaves", "leaves_nan", "counters", "counter_type",
                                  "data_last", "open_tail"])
def test_a_damaged_state_changes_nothing(part):
    from conduit_core import StateError
    donor = _filled(n=80)
    target = _filled(n=50)
    before = target.state_dict()
    with pytest.raises(StateError):
        target.load_state_dict(_damage(donor.state_dict(), part))
    after = target.state_dict()
    for k in ("counters", "open_tail", "rng"):
        assert after[k] == before[k], k
    for k in before["data"]:
        assert np.array_equal(after["data"][k], before["data"][k]), k
    for k in before["meta"]:
        assert np.array_equal(after["meta"][k], before["meta"][k]), k
    assert np.array_equal(after["selector_state"]["leaves"], before["selector_state"]["leaves"])
    target.sample(8)


@pytest.mark.parametrize("damage", ["truncate_arrays", "truncate_header", "flip_array_bit", "flip_header_bit",
                                    "garbage_header"])
def test_a_damaged_state_file_raises_state_error_naming_the_section(tmp_path, damage):
    from conduit_core import StateError, state_io
    path = tmp_path / "s.conduit"
    state_io.save(_filled().state_dict(), path)
    raw = bytearray(path.read_bytes())
    hlen = int.from_bytes(raw[8:16], "little")
    if damage == "truncate_arrays":
        raw = raw[:-7]
    elif damage == "truncate_header":
        raw = raw[:20 + hlen // 2]
    elif damage == "flip_array_bit":
        raw[20 + hlen + 5] ^= 0x10
    elif damage == "flip_header_bit":
        raw[20 + hlen // 3] ^= 0x01
    else:
        raw[20:20 + hlen] = b"\xff" * hlen
    path.write_bytes(bytes(raw))
    with pytest.raises(StateError, match="header|array") as info:
        state_io.load(path)
    assert "Fix" in str(info.value)


def test_state_files_round_trip_exactly(tmp_path):
    from conduit_core import state_io
    a = _filled()
    state_io.save(a.state_dict(), tmp_path / "s")
    b = _filled(n=5)
    b.load_state_dict(state_io.load(tmp_path / "s"))
    assert np.array_equal(a.sample(16).seqs, b.sample(16).seqs)


def test_a_state_file_is_on_disk_before_it_replaces_the_old_one(tmp_path, monkeypatch):
    """Found in review (session 16): save renamed the new file over the old one without flushing
    it, so a crash could leave an empty or torn file where a good one was."""
    import os

    from conduit_core import state_io
    order = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (order.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (order.append("replace"), real_replace(a, b))[1])
    path = tmp_path / "s"
    path.write_bytes(b"the old state")
    state_io.save(_filled().state_dict(), path)
    assert order == ["fsync", "replace", "fsync"]   # the file, the rename, then its directory
    assert not (tmp_path / "s.tmp").exists() and state_io.load(path)["schema_version"]


# --------------------------------------------------------------------- bad input, named

@pytest.mark.parametrize("capacity", [2.5, "10", True, 0, -3])
def test_capacity_must_be_a_positive_int(capacity):
    from conduit_core import ConfigError
    with pytest.raises(ConfigError, match="capacity"):
        ExperienceBuffer(spec=SPEC, capacity=capacity)


@pytest.mark.parametrize("tier", ["pageable", "shared"])
def test_a_capacity_larger_than_the_free_memory_is_refused_before_allocating(tier):
    from conduit_core import CapacityError
    with pytest.raises(CapacityError, match=r"free there.*Fix") as info:
        ExperienceBuffer(spec=SPEC, capacity=10**12, tier=tier)
    assert "GiB" in str(info.value)


@pytest.mark.parametrize("kwargs", [{"n_step": (5, 2)}, {"n_step": 2.7}, {"n_step": "3"}, {"n_step": (1,)},
                                    {"n_step": 0}, {"n_step": True}, {"gamma": float("nan")}, {"gamma": 5},
                                    {"beta": -1.0}, {"beta": float("inf")}])
def test_sampling_arguments_are_checked_with_a_named_error(kwargs):
    from conduit_core import ConfigError
    buf = _filled()
    with pytest.raises(ConfigError, match=next(iter(kwargs))):
        buf.sample(8, **({"n_step": 1} | kwargs))


@pytest.mark.parametrize("kwargs", [{"eps": -1}, {"alpha": float("nan")}, {"beta": float("inf")}, {"alpha": "1"}])
def test_prioritized_numbers_are_checked(kwargs):
    from conduit_core import ConfigError, Prioritized
    with pytest.raises(ConfigError, match=next(iter(kwargs))):
        Prioritized(**kwargs)


def test_zero_priorities_without_eps_are_refused():
    from conduit_core import Prioritized, SpecError
    buf = _filled(Prioritized(eps=0.0))
    with pytest.raises(SpecError, match="eps=0"):
        buf.update_priorities(np.arange(3), np.array([1.0, 0.0, 2.0]), slots_only=True)


@pytest.mark.parametrize("slots", [[45], [39], [-1], [1 << 20]])
def test_priorities_go_only_to_slots_that_hold_data(slots):
    """A never-written slot would be sampled and return uninitialised memory; a slot past
    the capacity would break every later sample(). Both are refused, nothing changes."""
    from conduit_core import SpecError
    buf = ExperienceBuffer(spec=SPEC, capacity=64, selector=__import__("conduit_core").Prioritized(), seed=1)
    buf.add(rollout(30, 0))
    before = buf.state_dict()["selector_state"]["leaves"].copy()
    with pytest.raises(SpecError, match="slot"):
        buf.update_priorities(np.array(slots), np.ones(len(slots)), slots_only=True)
    assert np.array_equal(buf.state_dict()["selector_state"]["leaves"], before)
    buf.sample(16)


def test_sequence_length_is_bounded_by_capacity():
    from conduit_core import ConfigError
    with pytest.raises(ConfigError, match="length"):
        _filled().sample_sequences(1, 10**6)


def test_a_batch_larger_than_memory_is_refused():
    from conduit_core import CapacityError
    with pytest.raises(CapacityError, match="batch_size"):
        _filled().sample(10**12)


@pytest.mark.parametrize("granularity", [1, 3])
def test_a_failed_delivery_hook_does_not_count_as_sampled(granularity):
    """The hook fails on its 2nd call: with g=1 the 2nd delivery fails, with g=3 the first
    (its 3 batches are prepared in one call). What failed is not counted as sampled."""
    calls = {"n": 0}

    def hook(batch):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("hook failed")
        return batch
    with make(Schedule.sequential(delivery_granularity=granularity), delivery_hooks=[hook]) as edp:
        edp.ingest(rollout(50, 0))
        with pytest.raises(RuntimeError, match="hook failed"):
            edp.deliver(8)
            edp.deliver(8)
        assert edp.buffer.sampled == (8 if granularity == 1 else 0)


def test_ctrl_c_in_the_terminal_does_not_kill_the_process_worker():
    import os
    import signal
    with make(Schedule.overlapped(worker="process")) as edp:
        pid = edp.worker_process_id
        os.kill(pid, signal.SIGINT)          # what a terminal's Ctrl-C sends to the whole process group
        time.sleep(1.0)
        edp.ingest(rollout(5, 0))
        edp.flush(timeout=30)
        assert edp.worker_process_id == pid and stored_ids(edp) == list(range(5))


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("as_torch", [False, True])
def test_non_finite_data_is_refused_by_default_and_names_the_row(value, as_torch):
    import torch
    from conduit_core import SpecError
    buf = ExperienceBuffer(spec=SPEC, capacity=100)
    r = rollout(5)
    r["obs"][3, 2] = value
    if as_torch:
        r = {k: torch.from_numpy(v) for k, v in r.items()}
    with pytest.raises(SpecError, match=r"obs: expected finite values.*row 3.*allow_nonfinite"):
        buf.add(r)
    assert len(buf) == 0


def test_non_finite_values_are_stored_when_the_field_allows_them():
    import torch
    from conduit_core import ExperienceSpec, FieldSpec
    spec = ExperienceSpec([FieldSpec("x", (2,), torch.float32, allow_nonfinite=True)])
    buf = ExperienceBuffer(spec=spec, capacity=10)
    buf.add({"x": np.array([[np.inf, 1.0]], np.float32)})
    assert np.isinf(buf.sample(1)["x"].numpy()[0, 0])
    assert ExperienceSpec.from_config(spec.to_config()) == spec


def test_large_finite_values_whose_sum_overflows_are_accepted():
    buf = ExperienceBuffer(spec=SPEC, capacity=100)
    r = rollout(5)
    r["obs"][:, 2] = 3e38
    buf.add(r)
    assert len(buf) == 5



def _fail_marked(rollouts):
    for r in rollouts:
        if float(r.data["obs"][0, 1]) == 1.0:       # tag 1: this rollout's transform fails
            raise ValueError(f"injected failure in rollout starting at {int(r.data['obs'][0, 0])}")
    return rollouts


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(1, 12), st.booleans(), st.booleans()), min_size=1, max_size=30),
       st.sampled_from([1, 3]))
def test_accepted_is_stored_plus_reported_under_any_failure_schedule(schedule, granularity):
    """Property (overlapped, thread worker): rollouts of random sizes, some failing in the
    background, flushes at random points. Every accepted rollout is either stored exactly
    once or named in a raised error's rejected_tickets; nothing else, nothing twice."""
    edp = make(Schedule.overlapped(ingest_granularity=granularity), ingest_hooks=[_fail_marked])
    reported: set[int] = set()
    tickets: dict[int, tuple[int, int]] = {}     # ticket -> (first id, rows)
    nxt = 0
    starts = []                                   # (first id, fails) of every rollout offered
    try:
        for n, fails, flush in schedule:
            starts.append((nxt, fails))
            r = rollout(n, nxt, source_tag=1.0 if fails else 0.0)
            ticket = len(tickets)
            try:
                edp.ingest(r)          # raises an earlier rollout's failure before accepting this one
            except WorkerError as exc:
                reported |= set(exc.rejected_tickets)
                nxt += n
                continue
            tickets[ticket] = (nxt, n)
            nxt += n
            if flush:
                try:
                    edp.flush(timeout=30)
                except WorkerError as exc:
                    reported |= set(exc.rejected_tickets)
        while True:
            try:
                edp.flush(timeout=30)
                break
            except WorkerError as exc:
                reported |= set(exc.rejected_tickets)
        ids = stored_ids(edp)
    finally:
        try:
            edp.close()
        except WorkerError as exc:
            reported |= set(exc.rejected_tickets)
    want_stored = sorted(i for t, (first, n) in tickets.items() if t not in reported for i in range(first, first + n))
    assert ids == want_stored                                    # stored exactly once, unless reported
    failing = {t for t, (first, n) in tickets.items() if any(first == f for f, fl in starts if fl)}
    # a failing rollout may take its group's neighbours with it (a group is transformed at once);
    # every failing one is reported, and no rollout is both stored and reported
    assert failing <= reported


def test_a_group_with_a_rollout_larger_than_the_buffer_stores_nothing_and_counts_nothing():
    from conduit_core import CapacityError, Rollout
    buf = ExperienceBuffer(spec=SPEC, capacity=30, selector=Uniform())
    edp = ExperienceDataPlane(buffer=buf, schedule=Schedule.sequential())
    with pytest.raises(CapacityError, match="capacity=30"):
        edp.ingest_many([Rollout(rollout(5, 0)), Rollout(rollout(40, 5))])
    assert len(buf) == 0 and edp.metrics().ingest.items_in == 0
    edp.ingest_many([Rollout(rollout(5, 0))])
    assert len(buf) == 5
    edp.close()


def test_a_hook_that_never_returns_leaves_its_rollout_reported_not_lost():
    """A thread worker's hook that hangs: close() cannot stop it and says so, naming the rollouts
    accepted and not stored (the one in the hook, those queued behind it); once the hook returns, a
    second close() stores them."""
    import threading
    release = threading.Event()

    def hook(rollouts):
        if any(r.data["obs"][0, 0] == 100 for r in rollouts):
            release.wait(30)
        return rollouts
    buf = ExperienceBuffer(spec=SPEC, capacity=100)
    edp = ExperienceDataPlane(buffer=buf, schedule=Schedule.overlapped(timeout=0.3), ingest_hooks=[hook])
    t0 = edp.ingest(rollout(3, 0))
    edp.flush()
    stuck = edp.ingest(rollout(3, 100))
    behind = edp.ingest(rollout(3, 200))
    with pytest.raises(WorkerError, match="Accepted and not stored") as info:
        edp.close()
    assert info.value.unstored_tickets == [stuck, behind] and t0 < stuck
    release.set()
    edp.close()
    assert sorted(buf_ids := [int(x) for x in edp.buffer.ring.live_seqs()]) == buf_ids and len(buf_ids) == 9
