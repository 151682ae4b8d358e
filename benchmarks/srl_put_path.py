"""The SRL queue adapter's put path in its two parts: the codec's flatten of a sample and
``EntryQueue.put`` of the flat fields (priority_queue layout, B=32), on benchmarks.srl_buffers'
MAPPO CartPole sample (14 fields, T=51). Run in SRL's venv; to compare two versions of the code,
run it against each checkout in turn, several times, and compare the minima (the machine is noisy):

    PYTHONPATH=CHECKOUT:CHECKOUT/adapters $CONDUIT_SRL_PYTHON -m benchmarks.srl_put_path
"""

from __future__ import annotations

import inspect
import statistics
import time

import numpy as np


def main(reps: int = 7) -> None:
    from conduit_core.queues.entry_queue import EntryQueue
    from conduit_srl import samples

    from .srl_buffers import make_sample
    rng = np.random.default_rng(0)
    xs = [make_sample(51, (4,), np.float32, rng) for _ in range(256)]
    grow = {"grow": True} if "grow" in inspect.signature(samples.SampleCodec).parameters else {}
    codec = samples.SampleCodec(xs[0], **grow)
    flats = [codec.flatten(x) for x in xs]

    def flatten() -> float:
        t0 = time.perf_counter()
        for _ in range(20):
            for x in xs:
                codec.flatten(x)
        return (time.perf_counter() - t0) / (20 * len(xs)) * 1e6

    def put() -> float:
        q = EntryQueue(max_entries=4, batch_size=32, serve="freshest", overflow="drop_lowest")
        t0 = time.perf_counter()
        for _ in range(20):
            for f in flats:
                q.put(f)
        return (time.perf_counter() - t0) / (20 * len(flats)) * 1e6

    print(f"{len(flats[0])} flat fields per sample")
    for fn in (flatten, put):
        fn()
        runs = [fn() for _ in range(reps)]
        print(f"{fn.__name__:8s} us/sample  min {min(runs):.2f}  median {statistics.median(runs):.2f}")


if __name__ == "__main__":
    main()
