"""SRL's replay kinds with delivery prepared ahead (``delivery=Schedule.overlapped(...)``) against
SRL's own buffers and against Conduit's sequential delivery, with real SRL types.

Puts interleaved with gets (SRL's trainer puts on its main thread between training steps): the
prepared mode's chunk distribution matches SRL's on the same schedule of puts and gets, and with
priority updates after every get it delivers exactly what sequential delivery delivers (the same
chunks, weights and sampling_indices), so update k always applies before draw k + 1."""

import time

import numpy as np
import pytest

from conduit_core.planning.schedule import Schedule
from conduit_srl.buffers import make_buffer
from rlsrl.base import buffer as srl_buffer

from test_buffers_vs_srl import T, chi2_same, ident, sample

AHEAD = Schedule.overlapped(delivery_granularity=2, depth=4)


@pytest.fixture(autouse=True)
def cpu_pin_memory(monkeypatch):
    import torch
    if not torch.cuda.is_available():
        monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a, **k: self)


def test_prepared_uniform_replay_matches_srl_with_puts_between_gets():
    n, B = 12, 4
    args = dict(max_size=n, batch_size=B, warmup_transitions=B * T, seed=1, sample_length=T, batch_length=T)
    ours = make_buffer("simple_replay_buffer", delivery=AHEAD, **args)
    theirs = srl_buffer.make_buffer("simple_replay_buffer", **args)
    for i in range(n):
        ours.put(sample(i)); theirs.put(sample(i))
    ca, cb = np.zeros(n + 400), np.zeros(n + 400)
    put = n
    for k in range(2400):
        if k % 6 == 5:  # a put every few gets: what was prepared before it is stale, redrawn or discarded
            ours.put(sample(put)); theirs.put(sample(put))
            put += 1
        a, b = ours.get().sample, theirs.get().sample
        ia = ident(a)
        for col, i in enumerate(ia):  # every delivered chunk is the stored sample
            assert np.array_equal(a.obs.obs[:, col], sample(i).obs.obs)
        assert min(ia) >= put - n  # never a chunk overwritten before the get
        ca[ia] += 1
        cb[ident(b)] += 1
        if k % 3 == 0:
            time.sleep(0.001)  # the trainer's step: the worker prepares meanwhile
    st = ours.stats()
    assert st["prepared_hits"] > 100, st
    assert chi2_same(ca, cb) > 1e-3
    ours.close()


def test_prepared_prioritized_replay_equals_sequential_with_an_update_after_every_get():
    args = dict(max_size=8, sample_length=T, batch_size=3, warmup_transitions=T, seed=4, alpha=0.7, beta=0.5,
                priority_interpolation_eta=0.9)
    seq, ahead = make_buffer("prioritized_replay_buffer", **args), make_buffer(
        "prioritized_replay_buffer", delivery=AHEAD, **args)
    assert isinstance(ahead, srl_buffer.PrioritizedReplayBuffer)
    rng = np.random.default_rng(0)
    for i in range(10):
        seq.put(sample(i)); ahead.put(sample(i))
    for k in range(300):
        a, b = ahead.get(), seq.get()
        assert ident(a.sample) == ident(b.sample)
        assert np.array_equal(a.sampling_indices, b.sampling_indices) and a.reuses == b.reuses
        assert np.allclose(a.sample.metadata["sampling_weight"], b.sample.metadata["sampling_weight"])
        pr = rng.uniform(0.1, 5.0, 3)
        assert ahead.update_priorities(a.sampling_indices, pr) == seq.update_priorities(b.sampling_indices, pr)
        if k % 50 == 49:
            seq.put(sample(10 + k)); ahead.put(sample(10 + k))
        time.sleep(0.0005)
    ahead.close()
    seq.close()


def test_opt_in_priority_lag_hands_out_batches_drawn_before_the_update():
    """priority_lag=1 changes SRL's algorithm (a batch may miss the last update): opt-in only."""
    args = dict(max_size=8, sample_length=T, batch_size=3, warmup_transitions=T, seed=4, alpha=0.7,
                priority_interpolation_eta=0.9)
    lagged = make_buffer("prioritized_replay_buffer", delivery=Schedule.overlapped(depth=1), priority_lag=1, **args)
    for i in range(8):
        lagged.put(sample(i))
    for _ in range(40):
        e = lagged.get()
        time.sleep(0.003)
        lagged.update_priorities(e.sampling_indices, np.full(3, 2.0))
    assert lagged.stats()["prepared_hits"] >= 30
    lagged.close()
    with pytest.raises(Exception, match="priority_lag"):
        make_buffer("prioritized_replay_buffer", priority_lag=-1, **args)
