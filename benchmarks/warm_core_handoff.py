"""Would Conduit's buffer calls run faster on a core the learner never touches? (issue 18)

In RLlib's DQN on CartPole, Conduit's share of a training step (add, sample, priority
update, metrics) is mostly Python frames, and each costs about three times what it does with
warm caches, because the learner's update in between evicts them. A second thread pinned to
the other core, running only the buffer's calls, would keep its caches warm; the caller
then pays a hand-off each way (a lock released, a thread woken, the GIL passed).

This probe measures it in a real run: iterations alternate between the buffer's calls made
in the caller's thread (``direct``) and made by a worker thread (``handoff``: the caller pinned
to the first core it may run on, the worker to the second, unless ``--no-pin``), with the bench's own timers around
each call (``rllib_timing.PathTimer``). Prints each arm's exposed milliseconds per training
step by call, medians over the iterations.

    OMP_NUM_THREADS=1 python -m benchmarks.warm_core_handoff --rounds 3 --json docs/results/warm_core_handoff_s36.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading

from benchmarks.common import report

CALLS = ("add", "sample", "update_priorities", "get_metrics")


class Worker:
    """One thread that runs the calls handed to it, one at a time; the caller waits for each."""

    def __init__(self, core: int | None):
        self._request, self._reply = threading.Lock(), threading.Lock()
        self._request.acquire()
        self._reply.acquire()
        self._job = self._result = None
        self._core = core
        self._started: OSError | None = None   # the worker's pinning error, if any
        self._thread = threading.Thread(target=self._loop, name="warm-core-worker", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        try:
            if self._core is not None:
                os.sched_setaffinity(0, {self._core})   # (Linux: this thread only)
        except OSError as e:   # (reported to the first call: a caller never waits on a dead worker)
            self._started = e
        while True:
            self._request.acquire()
            if self._job is None:
                return
            fn, args, kwargs = self._job
            if self._started is not None:
                self._result = (False, self._started)
            else:
                try:
                    self._result = (True, fn(*args, **kwargs))
                except BaseException as e:
                    self._result = (False, e)
            self._reply.release()

    def call(self, fn, *args, **kwargs):
        if threading.current_thread() is self._thread:   # (a call made inside a handed-off call: run it here)
            return fn(*args, **kwargs)
        self._job = (fn, args, kwargs)
        self._request.release()
        self._reply.acquire()
        ok, value = self._result
        self._result = None
        if not ok:
            raise value
        return value

    def close(self) -> None:
        self._job = None
        self._request.release()
        self._thread.join()


def probe(rounds: int, warmup: int, seed: int, pin: bool) -> dict:
    from benchmarks import rllib_bench
    from benchmarks.rllib_conduit_path import _args

    if pin and (not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2):
        raise SystemExit("--pin needs two cores and os.sched_setaffinity: pass --no-pin")
    caller_core, worker_core = sorted(os.sched_getaffinity(0))[:2] if pin else (None, None)
    cores = os.sched_getaffinity(0) if pin else None
    per_arm: dict[str, list[dict]] = {"direct": [], "handoff": []}
    algo = rllib_bench._build("dqn", "conduit", _args("dqn", seed))
    worker = direct = None
    try:
        for _ in range(warmup):
            algo.train()
        buf, timer = algo.local_replay_buffer, algo._conduit_bench_timer
        direct = {name: getattr(buf, name) for name in CALLS}   # the bench's timed wrappers
        worker = Worker(worker_core)
        handed = {}
        for name in CALLS:
            inner = direct[name].__wrapped__
            handed[name] = timer.timed(name, lambda *a, _f=inner, **k: worker.call(_f, *a, **k))
        for _ in range(rounds):
            for arm in ("direct", "handoff"):
                for name in CALLS:
                    setattr(buf, name, (handed if arm == "handoff" else direct)[name])
                if pin:
                    os.sched_setaffinity(0, {caller_core} if arm == "handoff" else cores)
                timer.reset()
                algo.train()
                steps = max(1, timer.calls["sample"])
                per_arm[arm].append({k: v / steps * 1e3 for k, v in timer.seconds.items()})
    finally:
        if pin:
            os.sched_setaffinity(0, cores)
        if direct is not None:
            for name in CALLS:
                setattr(algo.local_replay_buffer, name, direct[name])
        if worker is not None:
            worker.close()
        algo.stop()
    out: dict = {"pin": pin, "rounds": rounds}
    for arm, runs in per_arm.items():
        keys = sorted({k for r in runs for k in r})
        med = {k: statistics.median(r.get(k, 0.0) for r in runs) for k in keys}
        out[arm] = {"ms_per_step_median": med,
                    "exposed_ms_per_step_median": statistics.median(sum(r.values()) for r in runs),
                    # the four calls the handoff arm hands over (the learner's batch building stays in both)
                    "handed_calls_ms_per_step_median": statistics.median(sum(r.get(k, 0.0) for k in CALLS)
                                                                         for r in runs)}
    out["handoff_over_direct"] = out["handoff"]["exposed_ms_per_step_median"] / out["direct"]["exposed_ms_per_step_median"]
    out["handed_calls_handoff_over_direct"] = (out["handoff"]["handed_calls_ms_per_step_median"]
                                               / out["direct"]["handed_calls_ms_per_step_median"])
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-pin", dest="pin", action="store_false")
    p.add_argument("--json")
    a = p.parse_args(argv)
    report(probe(a.rounds, a.warmup, a.seed, a.pin), "warm_core_handoff", argv, a.json)


if __name__ == "__main__":
    main()
