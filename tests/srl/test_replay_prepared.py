"""SRL's replay kinds with delivery prepared ahead, without SRL (a stand-in for the two SRL types the
adapter builds: ``NamedArray`` and ``ReplayEntry``; with real SRL installed, SRL's own are used).

What the training thread gets with ``delivery=Schedule.overlapped(...)`` is what it gets sequentially
on the same puts, gets and priority updates: the same chunks, ``reuses``, ``sampling_indices`` and
weights; pickling (SRL's save_buffer_on_exit) undoes what was prepared; a failure in the preparing
thread reaches ``get``; ``close`` joins it. The SRL-venv twin of these is
tests/srl_venv/test_prepared_replay_vs_srl.py (against SRL's own buffers)."""

import importlib.util
import pickle
import sys
import threading
import time
import types

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conduit_core.planning.costmodel import OperatorCost, Profile
from conduit_core.errors import ConfigError, WorkerError
from conduit_core.planning.schedule import Schedule

T, B = 4, 3


class _NamedArray:
    """The part of SRL's NamedArray the adapter uses: ordered fields, nesting, metadata."""

    def __init__(self, **kw):
        object.__setattr__(self, "_fields", list(kw))
        object.__setattr__(self, "metadata", {})
        for k, v in kw.items():
            object.__setattr__(self, k, v)

    def __setattr__(self, k, v):
        if k not in self._fields:
            self._fields.append(k)
        object.__setattr__(self, k, v)

    def keys(self):
        return list(self._fields)

    def register_metadata(self, **kw):
        self.metadata.update(kw)


def _flatten(x, prefix=""):
    for k in x.keys():
        v = getattr(x, k)
        if isinstance(v, _NamedArray):
            yield from _flatten(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


class _ReplayEntry:
    def __init__(self, **kw):
        self.__dict__.update(kw)


@pytest.fixture(autouse=True)
def srl_types(monkeypatch):
    """SRL's own types where SRL is installed, else the stand-ins above (for this test only)."""
    if importlib.util.find_spec("rlsrl") is not None:
        return
    root, base = types.ModuleType("rlsrl"), types.ModuleType("rlsrl.base")
    na, buf = types.ModuleType("rlsrl.base.namedarray"), types.ModuleType("rlsrl.base.buffer")
    na.NamedArray, na.flatten = _NamedArray, lambda x: list(_flatten(x))
    buf.ReplayEntry = _ReplayEntry
    root.base, base.namedarray, base.buffer = base, na, buf
    for name, mod in (("rlsrl", root), ("rlsrl.base", base), ("rlsrl.base.namedarray", na),
                      ("rlsrl.base.buffer", buf)):
        monkeypatch.setitem(sys.modules, name, mod)


def sample(i: int):
    from rlsrl.base.namedarray import NamedArray
    obs = NamedArray(obs=np.full((T, 2), i, np.float32))
    return NamedArray(obs=obs, reward=np.full((T, 1), float(i), np.float32), action=None)


def make(kind, delivery=None, **kw):
    from conduit_srl.replay_buffer import ConduitReplayBuffer
    extra = dict(alpha=0.7, beta=0.5) if kind == "prioritized_replay_buffer" else {}
    return ConduitReplayBuffer(kind, max_size=10, batch_size=B, warmup_transitions=0, sample_length=T, seed=3,
                               delivery=delivery, **extra, **kw)


def view(e):
    """What the trainer sees of an entry."""
    s = e.sample
    ids = s.reward[0, :, 0].tolist()
    assert s.obs.obs.shape == (T, B, 2) and s.obs.obs[0, :, 0].tolist() == ids and s.action is None
    w = s.metadata.get("sampling_weight")
    return (ids, e.reuses, None if w is None else np.round(w, 5).tolist(),
            getattr(e, "sampling_indices", np.zeros(0)).tolist())


def play(buf, ops, prioritized, wait):
    out, n = [], 0
    for _ in range(B + 1):
        buf.put(sample(n))
        n += 1
    for k, (op, m) in enumerate(ops):
        if op == "put":
            for _ in range(m):
                buf.put(sample(n))
                n += 1
        elif op == "wait":
            time.sleep(wait)
        else:
            e = buf.get()
            out.append(view(e))
            if prioritized:
                buf.update_priorities(e.sampling_indices, np.full(B, 1.0 + k % 3))
    return out


AHEAD = Schedule.overlapped(delivery_granularity=2, depth=4)


@pytest.mark.parametrize("kind", ["simple_replay_buffer", "prioritized_replay_buffer"])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(st.sampled_from(["put", "get", "get", "wait"]), st.integers(1, 3)), max_size=20))
def test_prepared_replay_delivers_what_sequential_delivers(kind, ops):
    prioritized = kind == "prioritized_replay_buffer"
    seq, ahead = make(kind), make(kind, AHEAD)
    try:
        assert play(ahead, ops, prioritized, 0.01) == play(seq, ops, prioritized, 0)
    finally:
        seq.close()
        ahead.close()


def test_prepared_batches_are_used_when_nothing_was_put_between_gets():
    b = make("simple_replay_buffer", AHEAD)
    for i in range(8):
        b.put(sample(i))
    for _ in range(20):
        b.get()
        time.sleep(0.005)
    st_ = b.stats()
    assert st_["prepared_hits"] >= 10, st_
    b.close()


def test_pickling_undoes_what_was_prepared():
    for kind in ("simple_replay_buffer", "prioritized_replay_buffer"):
        seq, ahead = make(kind), make(kind, AHEAD)
        for b in (seq, ahead):
            for i in range(8):
                b.put(sample(i))
            b.get()
        time.sleep(0.05)  # the worker prepares ahead
        back_seq, back_ahead = pickle.loads(pickle.dumps(seq)), pickle.loads(pickle.dumps(ahead))
        for _ in range(4):
            assert view(back_ahead.get()) == view(back_seq.get()) == view(seq.get()) == view(ahead.get())
        for b in (seq, ahead, back_seq, back_ahead):
            b.close()


def test_a_failure_in_the_preparing_thread_reaches_get_and_close_joins(monkeypatch):
    b = make("simple_replay_buffer", Schedule.overlapped(delivery_granularity=1, depth=1))
    for i in range(8):
        b.put(sample(i))
    real = b._prepare

    def failing(batch):
        if threading.current_thread().name == "conduit-prepared-replay":
            raise RuntimeError("injected rebuild failure")
        return real(batch)

    b._delivery._prepare = failing  # the preparing thread's rebuild fails (fault injection)
    b.get()
    end = time.monotonic() + 10   # until the failure is kept (a fixed sleep is too short on a loaded machine)
    while not b._delivery._errors and time.monotonic() < end:
        time.sleep(0.002)
    with pytest.raises(WorkerError, match="injected rebuild failure"):
        b.get()
    worker = b._delivery._thread
    assert worker is not None and worker.is_alive()
    b.close()
    assert not worker.is_alive()


def test_delivery_options_are_checked_where_they_are_given():
    from conduit_srl.buffers import check_delivery, make_buffer
    with pytest.raises(ConfigError, match="worker"):
        check_delivery(Schedule.overlapped(worker="process"), 0)
    with pytest.raises(ConfigError, match="delivery"):
        check_delivery("overlapped", 0)
    with pytest.raises(ConfigError, match="priority_lag"):
        check_delivery(None, -1)
    with pytest.raises(ConfigError, match="priority_lag"):
        make("simple_replay_buffer", priority_lag=1)  # prioritized replay only
    b = make_buffer("simple_replay_buffer", delivery=AHEAD, max_size=10, batch_size=B, warmup_transitions=0,
                    sample_length=T)
    for i in range(8):
        b.put(sample(i))
    b.get()
    time.sleep(0.05)
    b.get()
    assert b.stats()["prepared_hits"] >= 1
    b.close()


def _profile(deliver_s: float, staleness: int = 0) -> Profile:
    return Profile(base_s=0.02, priorities_s=0.0, ingest=OperatorCost(), deliver=OperatorCost(fixed_s=deliver_s),
                   rows_per_step=1.0, rollouts_per_step=1.0, batch_size=B, transition_bytes=64,
                   thread_handoff_s=20e-6, thread_interference=0.2, staleness=staleness)


def test_plan_delivery_takes_the_cost_models_choice():
    from conduit_srl.delivery_plan import plan_delivery
    ahead = plan_delivery(_profile(0.005), cores=4)   # a costly delivery and spare cores: prepare ahead
    assert ahead.is_overlapped and ahead.worker == "thread" and ahead.staleness == 0
    assert ahead.delivery_granularity == 1  # staleness 0: a second batch per call would go stale (wasted)
    inline = plan_delivery(_profile(0.005), cores=1)   # no spare core: the worker's time is the trainer's
    assert not inline.is_overlapped
    cheap = plan_delivery(_profile(1e-6), cores=4)     # nothing to hide: the hand-off costs more
    assert not cheap.is_overlapped
    with pytest.raises(ConfigError):
        plan_delivery("fast", cores=2)
    # prioritized replay at SRL's algorithm: update k comes right before get k + 1, nothing to hide
    assert not plan_delivery(_profile(0.005), cores=4, prioritized=True).is_overlapped
    assert plan_delivery(_profile(0.005), cores=4, prioritized=True, priority_lag=1).is_overlapped


def test_the_trainer_workers_exit_joins_the_preparing_thread():
    from conduit_srl.trainer_worker import close_buffer
    b = make("simple_replay_buffer", AHEAD)
    b.put(sample(0))  # the core buffer (and its preparing thread) is built on the first put
    worker = types.SimpleNamespace()
    setattr(worker, "_TrainerWorker__buffer", b)  # where SRL's TrainerWorker keeps its buffer
    thread = b._delivery._thread
    assert thread.is_alive()
    close_buffer(worker)
    assert not thread.is_alive()
    close_buffer(types.SimpleNamespace())  # no buffer (or one without close): nothing to do


def test_a_refused_first_sample_leaves_the_buffer_unbuilt_and_its_length_unlearned():
    """Found in review (session 16): the sample length inferred from a first sample was kept even
    when that sample was refused, so every later sample of another length was refused too."""
    from rlsrl.base.namedarray import NamedArray

    from conduit_core.errors import SpecError
    from conduit_srl.replay_buffer import ConduitReplayBuffer
    buf = ConduitReplayBuffer("simple_replay_buffer", max_size=8, batch_size=1, warmup_transitions=0)
    bad = NamedArray(obs=np.zeros((8, 3), np.float32), extra=np.array([["a"]] * 8))
    with pytest.raises(SpecError, match="extra"):
        buf.put(bad)
    buf.put(NamedArray(obs=np.zeros((4, 3), np.float32), extra=np.zeros((4, 1), np.float32)))
    assert buf.qsize() == 4   # one sample of 4 steps stored (SRL counts steps)
    buf.close()


def _with_info(i: int, info: bool):
    from rlsrl.base.namedarray import NamedArray
    x = sample(i)
    x.info = NamedArray(ep_ret=np.full((T, 1), 7.0, np.float32)) if info else None
    return x


@pytest.mark.parametrize("kind", ["simple_replay_buffer", "prioritized_replay_buffer", "priority_queue"])
def test_a_sub_structure_none_in_a_later_sample_is_stored_as_zeros(kind):
    """Found by a review (session 24): SRL's actor sends ``info=None`` for a sample without episode
    info; a sample whose info was None after one that had it was refused (SpecError on the trainer's
    main thread: the trainer died), where SRL's batching fills it with zeros."""
    if kind == "priority_queue":
        from conduit_srl.queue_buffer import ConduitQueueBuffer
        buf = ConduitQueueBuffer(kind, batch_size=B)
    else:
        buf = make(kind)
    try:
        for i in range(2 * B):
            buf.put(_with_info(i, info=i % 2 == 0))
        s = buf.get().sample
        ids = s.reward[0, :, 0].astype(int)
        assert s.info.ep_ret.shape == (T, B, 1)
        assert s.info.ep_ret[0, :, 0].tolist() == [7.0 if i % 2 == 0 else 0.0 for i in ids]
    finally:
        close = getattr(buf, "close", None)
        if close is not None:
            close()
