"""The trainer main thread's cost per sample received: SRL's own consumer vs Conduit's, with the
actors out of the way (the integration is actor-bound on 2 cores, so there the consumer cannot show).

For each stream, a producer keeps the stream full and the consumer's ``consume_to`` is timed (the
calling thread's CPU time inside the call, divided by the samples it stored), into a buffer that only counts (the
consumer alone) and into each side's own ``priority_queue`` (B=16): SRL's consumer into SRL's
buffer, Conduit's into Conduit's. Samples shaped as the integration's MAPPO CartPole samples
(T=51, 12 fields).

- ``shm``: SRL's ``SharedMemorySampleProducer`` in this process refills the dock (256 slots) before
  each timed call; the consumers read it through the stream's ``OutOfOrderSharedMemoryControl``,
  the arms interleaved repetition by repetition.
- ``zmq``: SRL's ``NameResolvingSampleProducer`` in a forked process pushes as fast as it can.

    PYTHONPATH=.:adapters /work/srl-venv/bin/python -m integrations.srl_cartpole.consumer_cost --reps 5
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import time

import numpy as np

T, QSIZE, EXP = 51, 256, "conduit-consumer-cost"
ARMS = ("srl", "conduit-g1", "conduit-g16")


def sample(i: int):
    from rlsrl.base.namedarray import NamedArray
    f = np.float32
    return NamedArray(obs=NamedArray(obs=np.full((T, 4), i, f)), action=NamedArray(x=np.zeros((T, 1), np.int32)),
                      analyzed_result=NamedArray(log_probs=np.zeros((T, 1), f), value=np.zeros((T, 1), f),
                                                 ret=np.zeros((T, 1), f), adv=np.zeros((T, 1), f)),
                      reward=np.zeros((T, 1), f), done=np.zeros((T, 1), np.uint8),
                      truncated=np.zeros((T, 1), np.uint8), on_reset=np.zeros((T, 1), np.uint8),
                      policy_version_steps=np.zeros((T, 1), np.int64), policy_state=None)


class Count:
    """A buffer that only counts what it is given."""

    def __init__(self):
        self.n = 0

    def put(self, x):
        self.n += 1

    def put_batch(self, xs):
        self.n += len(xs)


def buffers(side: str):
    if side == "srl":
        from rlsrl.base.buffer import PriorityQueueBuffer
        return {"none": Count(), "own": PriorityQueueBuffer(max_size=32, reuses=1, batch_size=16)}
    from conduit_srl import make_buffer
    return {"none": Count(), "own": make_buffer("priority_queue", max_size=32, reuses=1, batch_size=16)}


def timed(consumer, buffer, refill, n_target: int) -> float:
    """CPU seconds of this thread inside consume_to per sample stored, over ``n_target`` samples (thread
    time, not wall time: on a shared 2-core machine wall time is mostly other processes' preemption)."""
    spent, stored = 0.0, 0
    while stored < n_target:
        refill()
        t = time.thread_time()
        got = consumer.consume_to(buffer, max_iter=1024)
        spent += time.thread_time() - t
        stored += got
        if buffer.__class__.__name__ != "Count" and hasattr(buffer, "get"):
            while not buffer.empty():
                buffer.get()
    return spent / stored


def shm_arms(reps: int, n: int, trial: str) -> dict:
    """All arms on one stream, interleaved repetition by repetition (the machine's drift hits all alike)."""
    import rlsrl.api.config as cfg
    import rlsrl.system.impl.local_sample  # noqa: F401
    from rlsrl.base import shared_memory
    from rlsrl.system.api.sample_stream import make_consumer, make_producer
    import conduit_srl
    info = cfg.WorkerInformation(experiment_name=EXP, trial_name=trial)
    stream = cfg.SampleStream(type_=cfg.SampleStream.Type.SHARED_MEMORY, stream_name="s",
                              plugin=cfg.SharedMemorySampleStreamPlugin(qsize=QSIZE))
    ctrl = shared_memory.OutOfOrderSharedMemoryControl(EXP, trial, "s_spl_ctrl", qsize=QSIZE)
    producer = make_producer(stream, info, ctrl)
    x = sample(0)

    def refill():
        for _ in range(QSIZE // 2):
            producer.post(x)
        producer.flush()
    refill()
    consumers = {"srl": make_consumer(stream, info, ctrl)}
    for arm in ARMS[1:]:
        consumers[arm] = conduit_srl.sample_consumer(stream, g_ing=int(arm[len("conduit-g"):]), max_delay_s=0.0)
        consumers[arm].bind(worker_info=info, ctrl=ctrl)
    bufs = {arm: buffers("srl" if arm == "srl" else "conduit") for arm in ARMS}
    times = {(arm, k): [] for arm in ARMS for k in ("none", "own")}
    for _ in range(reps):
        for arm in ARMS:
            for k, b in bufs[arm].items():
                times[(arm, k)].append(timed(consumers[arm], b, refill, n))
    for c in consumers.values():
        c.close()
    producer.close()
    ctrl.close()
    return {arm: {k: statistics.median(times[(arm, k)]) for k in ("none", "own")} for arm in ARMS}


def _push(trial, stop):
    import rlsrl.api.config as cfg
    import rlsrl.system.impl.remote_sample  # noqa: F401
    from rlsrl.system.api.sample_stream import make_producer
    p = make_producer(cfg.SampleStream(type_=cfg.SampleStream.Type.NAME, stream_name="s"),
                      cfg.WorkerInformation(experiment_name=EXP, trial_name=trial))
    x = sample(0)
    while not stop.is_set():
        for _ in range(16):
            p.post(x)
        p.flush()
    os._exit(0)


def zmq_arm(arm: str, reps: int, n: int, trial: str) -> dict:
    import rlsrl.api.config as cfg
    import rlsrl.system.impl.remote_sample  # noqa: F401
    from rlsrl.system.api.sample_stream import make_consumer
    import conduit_srl
    info = cfg.WorkerInformation(experiment_name=EXP, trial_name=trial)
    stream = cfg.SampleStream(type_=cfg.SampleStream.Type.NAME, stream_name="s")
    if arm == "srl":
        consumer = make_consumer(stream, info)
    else:
        consumer = conduit_srl.sample_consumer(stream, g_ing=int(arm[len("conduit-g"):]), max_delay_s=0.0)
        consumer.bind(worker_info=info)
        consumer.open()
    ctx = mp.get_context("fork")
    stop = ctx.Event()
    proc = ctx.Process(target=_push, args=(trial, stop), daemon=True)
    proc.start()
    try:
        out = {k: statistics.median(timed(consumer, b, lambda: None, n) for _ in range(reps))
               for k, b in buffers("srl" if arm == "srl" else "conduit").items()}
    finally:
        stop.set()
        proc.join(10)
    consumer.close()
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--samples", type=int, default=2000, help="samples per timed repetition")
    p.add_argument("--json", default="out/srl_consumer_cost.json")
    a = p.parse_args(argv)
    import rlsrl.base.name_resolve as name_resolve
    name_resolve.reconfigure("memory")
    results = {f"shm/{arm}": r for arm, r in shm_arms(a.reps, a.samples, f"shmp{os.getpid()}").items()}
    for arm in ARMS:   # one socket per consumer: one arm at a time
        results[f"zmq/{arm}"] = zmq_arm(arm, a.reps, a.samples, f"zmq{arm.replace('-', '')}p{os.getpid()}")
    for key, r in results.items():
        print(f"{key:<16} CPU us/sample: consumer alone {1e6 * r['none']:.1f}, "
              f"with its own priority_queue {1e6 * r['own']:.1f}", flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    with open(a.json, "w") as fh:
        json.dump(dict(args=vars(a), us_per_sample={k: {b: 1e6 * v for b, v in r.items()}
                                                    for k, r in results.items()}), fh, indent=1)


if __name__ == "__main__":
    main()
