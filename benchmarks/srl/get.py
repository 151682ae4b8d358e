"""The training thread's ``get`` while the main thread puts: SRL's priority queue vs Conduit's, one run.

    PYTHONPATH=.:adapters $CONDUIT_SRL_PYTHON -m benchmarks.srl.get --seconds 10 --reps 3 --json out/srl_get.json

SRL's trainer worker puts on its main thread (``consume_to``) and gets on its training thread; here
the same two threads over the same MAPPO CartPole samples (``buffers.make_sample``), trainer-bound
as in docs §13's reuses=64 run. Main thread: per sample ``--receive-us`` of Python work that holds the
GIL (the stream's decode), puts in groups of ``--group`` (SRL: ``put`` each; Conduit: ``put_batch``, its
consumer at g_ing=16), paced to ``--rate`` samples/s. Training thread: ``get`` when not ``empty``, then
a step of ``--step-ms`` of numpy work (releases the GIL, as torch's kernels do) and ``--step-py-ms`` of
Python. Timed: each ``get`` call (wall, on the training thread). Arms alternate, ``--reps`` each.

``--kind simple_replay_buffer|prioritized_replay_buffer``: SRL's replay kinds instead, three arms: SRL's
own, Conduit's sequential delivery, Conduit's delivery prepared ahead by a thread
(``Schedule.overlapped(delivery_granularity=--g-del, depth=--depth)``; prioritized: an update after
each step, right before the next get, as SRL's trainer makes). The buffer is filled (``--max-size`` samples) before the clock runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import numpy as np

from .buffers import make_sample


def _spin(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def run_arm(buffer, samples, *, seconds, group, receive_us, rate, step_ms, step_py_ms, grouped,
            prioritized=False, step_sleep=False) -> dict:
    stop = threading.Event()
    gets: list[float] = []
    a = np.random.default_rng(0).standard_normal((192, 192))

    def train():
        while not stop.is_set():
            if buffer.empty():
                time.sleep(0.0005)
                continue
            t0 = time.perf_counter()
            e = buffer.get()
            gets.append(time.perf_counter() - t0)
            _ = e.sample.obs.obs
            if step_sleep:  # a GPU step: the trainer waits, the core is free
                time.sleep(step_ms * 1e-3)
            end = time.perf_counter() + (0 if step_sleep else step_ms * 1e-3)
            while time.perf_counter() < end:
                a @ a
            _spin(step_py_ms * 1e3)
            if prioritized:  # after the step, right before the next get: SRL's trainer's order
                buffer.update_priorities(e.sampling_indices, np.ones(len(e.sampling_indices)))

    t = threading.Thread(target=train, name="bench-train")
    t.start()
    put_s, n_put, i = 0.0, 0, 0
    t_start = time.perf_counter()
    try:
        while time.perf_counter() - t_start < seconds:
            g = [samples[(i + k) % len(samples)] for k in range(group)]
            i += group
            _spin(receive_us * group)
            t0 = time.perf_counter()
            if grouped:
                buffer.put_batch(g)
            else:
                for s in g:
                    buffer.put(s)
            put_s += time.perf_counter() - t0
            n_put += group
            lag = n_put / rate - (time.perf_counter() - t_start)
            if lag > 0:
                time.sleep(lag)
    finally:
        stop.set()
        t.join()
    us = sorted(x * 1e6 for x in gets)
    return dict(gets=len(us), get_mean_us=statistics.fmean(us) if us else float("nan"),
                get_p50_us=us[len(us) // 2] if us else float("nan"),
                get_p99_us=us[int(len(us) * 0.99)] if us else float("nan"), get_max_us=us[-1] if us else float("nan"),
                get_over_1ms=sum(x > 1000 for x in us), put_us_per_sample=put_s / max(n_put, 1) * 1e6)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--reuses", type=int, default=64)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--group", type=int, default=16)
    p.add_argument("--receive-us", type=float, default=50.0)
    p.add_argument("--rate", type=float, default=1000.0)
    p.add_argument("--step-ms", type=float, default=8.0)
    p.add_argument("--step-py-ms", type=float, default=2.0)
    p.add_argument("--json", default=None)
    p.add_argument("--kind", default="priority_queue",
                   choices=("priority_queue", "simple_replay_buffer", "prioritized_replay_buffer"))
    p.add_argument("--max-size", type=int, default=256, help="replay kinds: samples stored")
    p.add_argument("--g-del", type=int, default=1, help="replay kinds: batches per preparing call")
    p.add_argument("--depth", type=int, default=2, help="replay kinds: batches prepared ahead at most")
    p.add_argument("--step-sleep", action="store_true", help="the step's --step-ms is a sleep (a GPU step), "
                   "not numpy work")
    args = p.parse_args(argv)
    from conduit_srl.queue_buffer import ConduitQueueBuffer
    from rlsrl.base.buffer import PriorityQueueBuffer

    rng = np.random.default_rng(0)
    samples = [make_sample(51, (4,), np.float32, rng) for _ in range(64)]
    if args.kind == "priority_queue":
        arms = {"srl": lambda: (PriorityQueueBuffer(max_size=16, reuses=args.reuses, batch_size=args.batch), False),
                "conduit": lambda: (ConduitQueueBuffer("priority_queue", max_size=16, reuses=args.reuses,
                                                       batch_size=args.batch), True)}
    else:
        arms = replay_arms(args, samples)
    kw = dict(seconds=args.seconds, group=args.group, receive_us=args.receive_us, rate=args.rate,
              step_ms=args.step_ms, step_py_ms=args.step_py_ms, prioritized=args.kind == "prioritized_replay_buffer", step_sleep=args.step_sleep)
    runs: dict[str, list] = {k: [] for k in arms}
    for rep in range(args.reps):
        for name, make in arms.items():
            buffer, grouped = make()
            r = run_arm(buffer, samples, grouped=grouped, **kw)
            if hasattr(buffer, "close"):
                buffer.close()
            runs[name].append(r)
            print(f"rep {rep} {name:8s} gets {r['gets']:5d}  get mean {r['get_mean_us']:8.1f} us  p50 "
                  f"{r['get_p50_us']:6.1f}  p99 {r['get_p99_us']:8.1f}  max {r['get_max_us']:8.1f}  >1ms "
                  f"{r['get_over_1ms']:3d}  put {r['put_us_per_sample']:6.1f} us/sample"
                  f"{'  ' + str(buffer.stats()) if name == 'conduit-prepared' else ''}", flush=True)
    med = {k: {m: statistics.median(r[m] for r in v) for m in v[0]} for k, v in runs.items()}
    ratio = med["conduit"]["get_mean_us"] / med["srl"]["get_mean_us"]
    print("median of reps: " + ", ".join(f"{k} get mean {m['get_mean_us']:.1f} us p50 {m['get_p50_us']:.1f} us"
                                         for k, m in med.items()) + f" (conduit/srl mean {ratio:.2f}x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), runs=runs, median=med, ratio_get_mean=ratio), f, indent=1)
    return 0


def replay_arms(args, samples) -> dict:
    """SRL's replay kind, Conduit's with sequential delivery and with delivery prepared ahead; each
    filled with ``--max-size`` samples before the clock runs (puts during the run go on at ``--rate``)."""
    import torch
    from conduit_srl.buffers import make_buffer
    from rlsrl.base import buffer as srl_buffer

    from conduit_core.planning.schedule import Schedule
    if not torch.cuda.is_available():  # SRL's replay buffers pin their storage; on CPU that is the identity
        torch.Tensor.pin_memory = lambda self, *a, **k: self
    buffer_args = dict(max_size=args.max_size, batch_size=args.batch, warmup_transitions=0, sample_length=51,
                       seed=0)
    if args.kind == "prioritized_replay_buffer":
        buffer_args.update(alpha=0.6, beta=0.4, priority_interpolation_eta=0.9)
    else:
        buffer_args.update(batch_length=51)
    ahead = Schedule.overlapped(delivery_granularity=args.g_del, depth=args.depth)

    def filled(make, grouped):
        def build():
            b = make()
            for i in range(args.max_size):
                b.put(samples[i % len(samples)])
            return b, grouped
        return build
    return {"srl": filled(lambda: srl_buffer.make_buffer(args.kind, **buffer_args), False),
            "conduit": filled(lambda: make_buffer(args.kind, **buffer_args), True),
            "conduit-prepared": filled(lambda: make_buffer(args.kind, delivery=ahead, **buffer_args), True)}


if __name__ == "__main__":
    raise SystemExit(main())
