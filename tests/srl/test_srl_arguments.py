"""SRL's buffer arguments, kind by kind (found by a review, session 24): an argument SRL's class of
that kind does not take is a TypeError as in SRL (``alpha`` on the uniform buffer was taken and
ignored: uniform draws for a user who believed they had priorities; ``reuses`` on the simple queue
likewise); a uniform buffer that could never draw is refused (it reported empty() forever); numpy
integers are taken as SRL takes them; enable()'s own options are checked."""

import numpy as np
import pytest

from conduit_core.errors import ConfigError
from conduit_srl.buffers import check_options, make_buffer


@pytest.mark.parametrize("name, arg", [("simple_queue", {"reuses": 4}),
                                       ("simple_replay_buffer", {"alpha": 0.6}),
                                       ("simple_replay_buffer", {"priority_interpolation_eta": 0.9}),
                                       ("prioritized_replay_buffer", {"batch_length": 2}),
                                       ("priority_queue", {"warmup_transitions": 10})])
def test_an_argument_of_another_kind_is_refused_as_srl_refuses_it(name, arg):
    base = {"simple_queue": {}, "priority_queue": {},
            "simple_replay_buffer": dict(max_size=8, batch_size=2, warmup_transitions=4),
            "prioritized_replay_buffer": dict(max_size=8, batch_size=2, warmup_transitions=4, sample_length=5)}[name]
    with pytest.raises(TypeError, match=f"{name}: unexpected keyword argument '{next(iter(arg))}'"):
        make_buffer(name, **base, **arg)


def test_a_uniform_buffer_that_could_never_draw_is_refused():
    with pytest.raises(ConfigError, match="batch_size"):
        make_buffer("simple_replay_buffer", max_size=4, batch_size=8, warmup_transitions=5, sample_length=5)
    with pytest.raises(ConfigError, match="batch_length"):
        make_buffer("simple_replay_buffer", max_size=8, batch_size=2, warmup_transitions=5, sample_length=5,
                    batch_length=2)


def test_numpy_integers_are_taken_as_srl_takes_them():
    q = make_buffer("priority_queue", max_size=np.int64(8), reuses=np.int64(2), batch_size=np.int64(2))
    assert q.reuses == 2 and q.batch_size == 2
    make_buffer("simple_queue", max_size=np.float64(100.0), batch_size=np.int32(4))


@pytest.mark.parametrize("lease_depth, seed_offset", [(-1, 0), (True, 0), (2, "x"), (2, 1.5)])
def test_enable_options_are_checked(lease_depth, seed_offset):
    with pytest.raises(ConfigError, match="lease_depth|seed_offset"):
        check_options(lease_depth, seed_offset)
    with pytest.raises(ConfigError, match="lease_depth|seed_offset"):
        make_buffer("priority_queue", lease_depth=lease_depth, seed_offset=seed_offset)


def test_a_later_sample_whose_values_the_first_samples_dtype_would_change_is_refused():
    """Found by a review (session 24): a queue kind cast a later sample into the first one's dtypes
    (same_kind): int64 2**40 into an int32 slot was stored as 0. Integers the slot holds exactly and
    floats it holds without overflow are still taken (as before); others are refused naming the field. (``conform`` is what the queue
    kinds' put runs on each sample; the put itself needs SRL's samples: tests/srl_venv.)"""
    from conduit_core.errors import SpecError
    from conduit_core.queues.sample_layout import conform, layout_of
    first = {"obs": np.zeros((2, 3), np.float32), "version": np.zeros(2, np.int32)}
    layout = layout_of(first)
    ok = conform({"obs": np.ones((2, 3), np.float64), "version": np.array([1, 2], np.int64)}, layout)
    assert ok["version"].tolist() == [1, 2]
    with pytest.raises(SpecError, match="version.dtype"):
        conform({"obs": np.ones((2, 3), np.float32), "version": np.array([0, 2 ** 40], np.int64)}, layout)
    rounded = conform({"obs": np.full((2, 3), 0.1, np.float64), "version": np.zeros(2, np.int32)}, layout)
    assert rounded["obs"].dtype == np.float64   # taken (stored as float32, rounded, as SRL's replay stores it)
    with pytest.raises(SpecError, match="obs.dtype"):
        conform({"obs": np.full((2, 3), 1e300, np.float64), "version": np.zeros(2, np.int32)}, layout)
