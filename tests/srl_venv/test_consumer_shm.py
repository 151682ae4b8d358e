"""Conduit's SampleConsumer on SRL's real shared-memory sample stream, set up by SRL's own launcher
code (``make_worker_control``: the stream's ``OutOfOrderSharedMemoryControl``, ``stream_index``),
the trainer config pickled as SRL sends it to its worker, the consumer bound by Conduit's trainer
worker step (``bind_consumer``), SRL's ``SharedMemorySampleProducer`` in forked processes.

The sample dock is created before the producers fork (SRL's producers race to create it when two
start at once: scripts/srl/README.md); everything else is SRL's."""

import glob
import pickle
import types
from collections import Counter

import numpy as np
import pytest
from consumer_helpers import (GroupRecorder, drain, per_source, pump_until, sample, shm_stream, start_producers,
                              STREAM)

from conduit_srl.buffers import make_buffer as conduit_make_buffer
from conduit_srl.consumer import sample_consumer
from conduit_srl.trainer_worker import bind_consumer

EXP = "conduit_consumer_test"


@pytest.fixture(autouse=True)
def memory_name_resolve():
    import rlsrl.base.name_resolve as name_resolve
    name_resolve.reconfigure("memory")
    yield
    name_resolve.clear_subtree("/")


def launch(trial, stream, consumer, *, actors=2, zero_copy=False, buffer_args=None):
    """SRL's launcher-side plumbing for one trainer (consumer) and ``actors`` actors on ``stream``."""
    import rlsrl.api.config as cfg
    from rlsrl.base import shared_memory
    from rlsrl.system.api.worker_control import make_worker_control
    tw = cfg.TrainerWorker(policy_name="default", trainer="null", policy="null", sample_stream=consumer,
                           buffer_zero_copy=zero_copy, buffer_args=dict(buffer_args or {}))
    aws = [cfg.ActorWorker(env="null", sample_streams=[stream], inference_streams=[], agent_specs=[])
           for _ in range(actors)]
    setup = cfg.ExperimentConfig(actors=aws, trainers=[tw])
    setup.set_worker_information(EXP, trial)
    setup, ctrls, _ = make_worker_control(EXP, trial, setup)
    tw = pickle.loads(pickle.dumps(setup.trainers[0]))          # as SRL sends it to the trainer worker
    assert bind_consumer(types.SimpleNamespace(ctrl=ctrls["trainer"][0]), tw)
    writer = shared_memory.writer_make_shared_memory_dock(sample(0, 0), stream.qsize, EXP, trial, STREAM + "_sample")
    return tw, ctrls["trainer"][0].spl_ctrls, writer


def finish(consumer, ctrls, writer, procs, done):
    done.set()
    consumer.close()
    writer.close()
    for c in ctrls:
        c.close()
    for p in procs:
        p.join(10)


@pytest.mark.parametrize("g_ing", [1, 8])
def test_oldest_first_receives_exactly_what_was_pushed_in_each_producers_order(g_ing):
    trial = f"shmold{g_ing}"
    stream = shm_stream(qsize=32)
    tw, ctrls, writer = launch(trial, stream, sample_consumer(stream, g_ing=g_ing, max_delay_s=60.0, shm_order="old"))
    consumer = tw.sample_stream
    buffer = GroupRecorder(conduit_make_buffer("simple_queue", max_size=10**6), consumer)
    counts = [160, 160]                                       # 40 groups of 8; 32 slots: producers wait for room
    procs, done = start_producers(stream, trial, counts, ctrl=ctrls[0])
    try:
        got = pump_until(consumer, buffer, [], lambda g: len(g) >= sum(counts))
        assert consumer.consume_to(buffer, max_iter=1024) == 0 and drain(buffer) == []
        by = per_source(got)
        assert by == {0: list(range(160)), 1: list(range(160))}
        st = consumer.stats()
        assert (st["received"], st["put"], st["staged"], st["rejected"], st["undecodable"]) == (320, 320, 0, 0, 0)
        assert Counter(Counter(buffer.group_of_put).values()) == {g_ing: 320 // g_ing}
    finally:
        finish(consumer, ctrls, writer, procs, done)


def test_srls_freshest_first_order_still_receives_each_sample_exactly_once():
    trial = "shmfresh"
    stream = shm_stream(qsize=16)
    tw, ctrls, writer = launch(trial, stream, sample_consumer(stream, g_ing=4, max_delay_s=0.01))
    consumer = tw.sample_stream
    buffer = conduit_make_buffer("priority_queue", batch_size=4, max_size=10**6)
    procs, done = start_producers(stream, trial, [120, 80], ctrl=ctrls[0])
    try:
        got = pump_until(consumer, buffer, [], lambda g: len(g) >= 200)
        by = per_source(got)
        assert sorted(by[0]) == list(range(120)) and sorted(by[1]) == list(range(80))
        assert consumer.stats()["received"] == consumer.stats()["put"] == 200
    finally:
        finish(consumer, ctrls, writer, procs, done)


@pytest.mark.parametrize("reuses", [1, 2])
def test_buffer_zero_copy_batches_in_the_stream_and_reshapes_the_actors_stream(reuses):
    trial = f"shmzc{reuses}"
    stream = shm_stream(qsize=1024)
    consumer = sample_consumer(stream, g_ing=2, max_delay_s=0.01)
    tw, ctrls, writer = launch(trial, stream, consumer, zero_copy=True,
                               buffer_args=dict(batch_size=4, reuses=reuses, max_size=8))
    # SRL's config moved batching into the stream, on the object the actors hold too
    assert (stream.batch_size, stream.reuses, stream.qsize) == (4, reuses, 32)
    assert (tw.buffer_name, tw.buffer_args) == ("simple_queue", dict(max_size=100))
    consumer = tw.sample_stream
    buffer = conduit_make_buffer(tw.buffer_name, **tw.buffer_args)
    procs, done = start_producers(stream, trial, [48, 48], ctrl=ctrls[0])
    entries = []

    class Keep:   # what the stream hands the buffer, kept
        def put(self, x):
            entries.append(x)
            buffer.put(x)

        def empty(self):   # (nothing for pump_until to drain: the entries are checked below)
            return True
    try:
        pump_until(consumer, Keep(), [], lambda _: len(entries) >= 96 * reuses // 4 - 1, timeout=60, quiet_s=1.0)
        assert all(np.asarray(e.seq).shape == (5, 4, 1) for e in entries)
        assert buffer.qsize() == len(entries)
        assert np.shares_memory(buffer.get().sample.seq, entries[0].seq)   # the stream's batch, no copy
        seen = Counter((int(a), int(b)) for e in entries for a, b in zip(e.src[0, :, 0], e.seq[0, :, 0]))
        if reuses == 1:
            assert seen == Counter({(s, i): 1 for s in (0, 1) for i in range(48)})   # each sample once
        else:
            # each sample at most `reuses` times; SRL's control serves a read only from 4 distinct slots, so
            # fewer than 4 slots with reuses left can stay readable at the end (the stream's rule, not ours)
            assert set(seen) <= {(s, i) for s in (0, 1) for i in range(48)} and max(seen.values()) <= reuses
            assert sum(reuses - seen[(s, i)] for s in (0, 1) for i in range(48)) <= 3 * reuses
        assert consumer.stats()["received"] == consumer.stats()["put"] == len(entries)
    finally:
        finish(consumer, ctrls, writer, procs, done)


def test_close_unmaps_and_unlinks_the_sample_dock():
    trial = "shmclose"
    stream = shm_stream(qsize=8)
    tw, ctrls, writer = launch(trial, stream, sample_consumer(stream), actors=1)
    consumer = tw.sample_stream
    buffer = conduit_make_buffer("simple_queue", max_size=100)
    assert consumer.consume_to(buffer) == 0 and consumer.stats()["opened"]   # the dock exists: attached
    procs, done = start_producers(stream, trial, [3], ctrl=ctrls[0])
    try:
        pump_until(consumer, buffer, [], lambda g: len(g) >= 3)
        dock = consumer._source._dock
        assert glob.glob(f"/dev/shm/*{trial}*_sample_*")
        consumer.close()
        assert consumer._source._dock is None and dock._shms == []
        assert not glob.glob(f"/dev/shm/*{trial}*_sample_*")
    finally:
        finish(consumer, ctrls, writer, procs, done)


def test_an_unbound_shared_memory_consumer_says_how_to_get_the_control():
    from conduit_core.errors import ConfigError
    import rlsrl.api.config as cfg
    consumer = sample_consumer(shm_stream(qsize=8))
    with pytest.raises(ConfigError, match="spl_ctrls"):
        consumer.bind(worker_info=cfg.WorkerInformation(experiment_name=EXP, trial_name="x"))
