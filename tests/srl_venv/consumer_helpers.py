"""Helpers for the consumer tests: samples that name their producer and sequence number, SRL's own
producers in forked processes, and draining a buffer. Real SRL throughout (its producers, its ZMQ
and shared-memory streams, its name resolution), nothing of SRL copied."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time

import numpy as np

T = 5
STREAM = "conduit_test"
CTX = mp.get_context("fork")


def sample(src: int, seq: int):
    from rlsrl.base.namedarray import NamedArray
    return NamedArray(obs=NamedArray(obs=np.full((T, 4), seq, np.float32)), src=np.full((T, 1), src, np.int64),
                      seq=np.full((T, 1), seq, np.int64), policy_state=None)


def worker_info(trial: str, index: int = 0):
    import rlsrl.api.config as cfg
    return cfg.WorkerInformation(experiment_name="conduit_consumer_test", trial_name=trial, worker_index=index)


def name_stream():
    import rlsrl.api.config as cfg
    return cfg.SampleStream(type_=cfg.SampleStream.Type.NAME, stream_name=STREAM)


def shm_stream(qsize: int, batch_size=None, reuses: int = 1):
    import rlsrl.api.config as cfg
    return cfg.SampleStream(type_=cfg.SampleStream.Type.SHARED_MEMORY, stream_name=STREAM,
                            plugin=cfg.SharedMemorySampleStreamPlugin(qsize=qsize, reuses=reuses, batch_size=batch_size))


def _produce(stream, info, src, n, pace_s, done, ctrl):
    import rlsrl.system.impl.local_sample  # noqa: F401 - registers SRL's shared-memory producer
    import rlsrl.system.impl.remote_sample  # noqa: F401 - registers SRL's ZMQ producers
    from rlsrl.system.api.sample_stream import make_producer
    producer = make_producer(stream, info, ctrl) if ctrl is not None else make_producer(stream, info)
    for i in range(n):
        producer.post(sample(src, i))
        producer.flush()
        if pace_s:
            time.sleep(pace_s)
    done.wait(120)        # ZMQ's LINGER is 0 in SRL's producer: stay until the consumer has everything
    os._exit(0)           # no interpreter teardown (SRL's name-resolve repositories reset on __del__)


def start_producers(stream, trial, counts, *, pace_s=0.0, ctrl=None):
    """One forked process per entry of ``counts`` (samples to push), SRL's own producer in each."""
    done = CTX.Event()
    procs = [CTX.Process(target=_produce, args=(stream, worker_info(trial, i), i, n, pace_s, done, ctrl), daemon=True)
             for i, n in enumerate(counts)]
    for p in procs:
        p.start()
    return procs, done


def drain(buffer) -> list[tuple[int, int]]:
    """(src, seq) of every sample in the buffer's entries, in get order (batched entries column by column)."""
    out = []
    while True:
        try:
            if buffer.empty():
                return out
            entry = buffer.get()
        except (queue.Empty, AssertionError):
            return out
        s = entry.sample
        src, seq = np.asarray(s.src), np.asarray(s.seq)
        if src.ndim == 2:                     # one sample [T, 1]
            out.append((int(src[0, 0]), int(seq[0, 0])))
        else:                                 # a batch [T, B, 1]
            out += [(int(a), int(b)) for a, b in zip(src[0, :, 0], seq[0, :, 0])]


def pump_until(consumer, buffer, got: list, stop, *, timeout=60.0, quiet_s=None):
    """consume_to + drain until ``stop(got)`` (or ``quiet_s`` without a new sample once stop holds)."""
    deadline, last_new = time.time() + timeout, time.time()
    while time.time() < deadline:
        if consumer.consume_to(buffer, max_iter=1024):
            last_new = time.time()
        new = drain(buffer)
        got += new
        if stop(got) and (quiet_s is None or time.time() - last_new >= quiet_s):
            return got
        if not new:
            time.sleep(0.002)
    raise AssertionError(f"timed out with {len(got)} samples; consumer stats {consumer.stats()}")


def per_source(got):
    by = {}
    for src, seq in got:
        by.setdefault(src, []).append(seq)
    return by


class GroupRecorder:
    """Records, for each put, which operator call (the consumer's group counter) it came in."""

    def __init__(self, inner, consumer):
        self.inner, self.consumer, self.group_of_put = inner, consumer, []

    def put(self, x):
        self.group_of_put.append(self.consumer.stats()["groups"])
        return self.inner.put(x)

    @property
    def put_batch(self):
        """The inner buffer's ``put_batch``, recorded as one group (AttributeError when it has none)."""
        inner = self.inner.put_batch

        def put_batch(xs):
            xs = list(xs)
            self.group_of_put.extend([self.consumer.stats()["groups"]] * len(xs))
            return inner(xs)
        return put_batch

    def __getattr__(self, name):
        return getattr(self.inner, name)
