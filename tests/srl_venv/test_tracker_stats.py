"""Conduit's counters in SRL's tracker: Conduit's trainer worker adds its buffer's ``stats()`` to each
poll's logged step stats (SRL's terminal log and wandb), as ``conduit/<name>``; SRL's own buffers,
which have none, leave the stats as SRL made them. (A real run's log shows them:
``integrations/srl_cartpole``, docs/quickstart.md.)"""

import numpy as np
from rlsrl.base.buffer import PriorityQueueBuffer
from rlsrl.system.api.worker_base import LogEntry, PollResult

from conduit_srl.buffers import make_buffer
from conduit_srl.trainer_worker import buffer_stats_into, worker_class
from test_buffers_vs_srl import sample


class Worker:   # what buffer_stats_into reads of SRL's TrainerWorker: its name-mangled buffer
    def __init__(self, buffer):
        self._TrainerWorker__buffer = buffer


def test_a_logged_poll_carries_the_buffers_counters_and_srls_stats_stay():
    buf = make_buffer("priority_queue", batch_size=2, max_size=1)
    for i in range(6):        # three batches formed, one queue slot: two dropped on overflow
        buf.put(sample(i))
    buf.get()
    r = PollResult(sample_count=2, batch_count=1, log_entry=LogEntry(stats={"loss": 0.5}, step=3))
    buffer_stats_into(Worker(buf), r)
    stats = r.log_entry.stats
    assert stats["loss"] == 0.5
    assert (stats["conduit/samples_put"], stats["conduit/entries_formed"], stats["conduit/served"],
            stats["conduit/dropped_overflow"]) == (6, 3, 1, 2)
    assert all(isinstance(v, (int, float)) and not isinstance(v, np.ndarray) for v in stats.values())


def test_a_poll_without_a_step_and_srls_own_buffer_are_left_alone():
    quiet = PollResult(sample_count=0, batch_count=0, log_entry=None)
    buffer_stats_into(Worker(make_buffer("priority_queue")), quiet)
    assert quiet.log_entry is None
    r = PollResult(sample_count=2, batch_count=1, log_entry=LogEntry(stats={"loss": 0.5}, step=3))
    buffer_stats_into(Worker(PriorityQueueBuffer()), r)
    assert r.log_entry.stats == {"loss": 0.5}


def test_conduits_trainer_worker_polls_through_it_and_srl_keeps_the_buffer_where_it_reads_it():
    import inspect

    from rlsrl.system.impl.trainer_worker import TrainerWorker
    assert worker_class()._poll is not TrainerWorker._poll   # (SRL's own poll, then the counters)
    # SRL's worker stores its buffer as self.__buffer (name-mangled _TrainerWorker__buffer): a rename in
    # SRL would make the counters vanish silently, so the source is read
    assert "self.__buffer = buffer_api.make_buffer(" in inspect.getsource(TrainerWorker)
