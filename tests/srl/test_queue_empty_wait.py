"""The queue kinds' ``empty_wait_s`` without SRL: 0 answers at once (SRL's timing), a bad value is
refused naming it. The wake on a forming batch needs SRL's samples:
tests/srl_venv/test_buffers_vs_srl.py::test_empty_hands_over_a_batch_as_it_forms."""

import time

import pytest

from conduit_core.errors import ConfigError
from conduit_srl.queue_buffer import ConduitQueueBuffer


def test_no_wait_answers_at_once():
    buf = ConduitQueueBuffer("priority_queue", batch_size=2, empty_wait_s=0)
    t0 = time.perf_counter()
    assert buf.empty() is True and time.perf_counter() - t0 < 1.0   # (a wait would be the whole empty_wait_s)


@pytest.mark.parametrize("bad", [-0.1, 2.0, "0.05", True, None])
def test_a_bad_wait_is_refused_naming_it(bad):
    with pytest.raises(ConfigError, match="empty_wait_s"):
        ConduitQueueBuffer("priority_queue", empty_wait_s=bad)
