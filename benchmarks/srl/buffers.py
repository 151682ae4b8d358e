"""SRL's buffers vs Conduit's: the work of the trainer worker's two threads, same samples, one run.

    $CONDUIT_SRL_PYTHON -m benchmarks.srl.buffers            # SRL's venv (scripts/srl); ~1 min

For each workload (a MAPPO CartPole sample and an Atari-sized one, both time-major with SRL's
field layout), the same samples are put into SRL's ``PriorityQueueBuffer`` (its default kind)
and into Conduit's, as ``consume_to`` puts them on the main thread, and every formed batch is
taken with ``get`` as the training thread takes it; both run on one thread here, so contention for
Conduit's lock between a put and a get is not in these figures. Printed per workload: put cost per sample
(main thread; SRL's includes the ``np.stack`` at every B-th put; ``conduit_g16``: Conduit's ``put_batch``
of 16 samples, what its consumer does at g_ing=16), get cost per batch (training
thread), and their ratios Conduit/SRL; medians over ``--reps`` repetitions. Also the replay
kinds (uniform and prioritized ``get`` of B chunks + priority update).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np


def make_sample(T: int, obs_shape: tuple, obs_dtype, rng):
    from rlsrl.api.trainer import SampleBatch
    from rlsrl.base.namedarray import NamedArray

    class Obs(NamedArray):
        def __init__(self, obs):
            super().__init__(obs=obs)

    class Act(NamedArray):
        def __init__(self, x):
            super().__init__(x=x)

    class Analyzed(NamedArray):
        def __init__(self, log_probs, value, ret):
            super().__init__(log_probs=log_probs, value=value, ret=ret)

    if np.dtype(obs_dtype).kind == "u":
        obs = rng.integers(0, 255, (T, *obs_shape), dtype=np.uint8)
    else:
        obs = rng.standard_normal((T, *obs_shape)).astype(obs_dtype)
    f = lambda *s: rng.standard_normal((T, *s)).astype(np.float32)
    return SampleBatch(obs=Obs(obs=obs), on_reset=np.zeros((T, 1), np.uint8), done=np.zeros((T, 1), np.uint8),
                       truncated=np.zeros((T, 1), np.uint8), action=Act(x=rng.integers(0, 2, (T, 1))),
                       reward=f(1), info_mask=np.zeros((T, 1), np.uint8),
                       analyzed_result=Analyzed(log_probs=f(1), value=f(1), ret=f(1)),
                       policy_version_steps=np.zeros((T, 1), np.int64))


def time_queue(buffer, samples, batches: int, warmup: int, group: int = 1) -> tuple[float, float]:
    """(seconds per put, seconds per get) over ``batches`` batches after ``warmup`` untimed ones (the
    first writes into fresh memory fault its pages in, in either arm). ``group > 1``: the samples go in
    ``put_batch`` calls of ``group`` (a consumer's g_ing); the put time is still per sample."""
    groups = [samples[i:i + group] for i in range(0, len(samples), group)]

    def put_all():
        spent = 0.0
        for g in groups:
            t0 = time.perf_counter()
            if group > 1:
                buffer.put_batch(g)
            else:
                buffer.put(g[0])
            spent += time.perf_counter() - t0
        return spent
    for _ in range(warmup):
        put_all()
        while not buffer.empty():
            buffer.get()
    t_put = t_get = 0.0
    n_put = n_get = 0
    for _ in range(batches):
        t_put += put_all()
        n_put += len(samples)
        while not buffer.empty():
            e = None  # the previous batch is freed here, outside the timed get (SRL's stacks are 46 MB on Atari)
            t0 = time.perf_counter()
            e = buffer.get()
            _ = e.sample.obs.obs  # the trainer touches the data
            t_get += time.perf_counter() - t0
            n_get += 1
    return t_put / n_put, t_get / max(n_get, 1)


def time_replay(buffer, samples, gets: int, prioritized: bool) -> float:
    for s in samples:
        buffer.put(s)
    t0 = time.perf_counter()
    for _ in range(gets):
        e = buffer.get()
        if prioritized:
            buffer.update_priorities(e.sampling_indices, np.random.random(len(e.sampling_indices)) + 0.1)
    return (time.perf_counter() - t0) / gets


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import torch
    if not torch.cuda.is_available():  # SRL's replay buffers pin memory, which needs CUDA
        torch.Tensor.pin_memory = lambda self, *a, **k: self
    from conduit_srl.buffers import ConduitQueueBuffer, make_buffer
    from rlsrl.base import buffer as srl

    rng = np.random.default_rng(0)
    workloads = {"cartpole_mappo": dict(T=51, obs=(4,), dtype=np.float32, B=32, batches=20),
                 "atari_mappo": dict(T=51, obs=(4, 84, 84), dtype=np.uint8, B=32, batches=8)}
    results = {}
    print(f"{'workload':16s} {'arm':8s} {'put us/sample':>14s} {'get us/batch':>13s}")
    for name, w in workloads.items():
        samples = [make_sample(w["T"], w["obs"], w["dtype"], rng) for _ in range(w["B"])]
        per_arm = {"srl": ([], []), "conduit": ([], []), "conduit_g16": ([], [])}
        for _ in range(args.reps):
            for arm in per_arm:
                kw = dict(max_size=16, reuses=1, batch_size=w["B"])
                buf = srl.PriorityQueueBuffer(**kw) if arm == "srl" else ConduitQueueBuffer("priority_queue", **kw)
                p, g = time_queue(buf, samples, w["batches"], warmup=20, group=16 if arm == "conduit_g16" else 1)
                per_arm[arm][0].append(p)
                per_arm[arm][1].append(g)
        row = {}
        for arm, (ps, gs) in per_arm.items():
            row[arm] = {"put_us": statistics.median(ps) * 1e6, "get_us": statistics.median(gs) * 1e6}
            print(f"{name:16s} {arm:8s} {row[arm]['put_us']:14.1f} {row[arm]['get_us']:13.1f}")
        row["ratio_put"] = row["conduit"]["put_us"] / row["srl"]["put_us"]
        row["ratio_put_g16"] = row["conduit_g16"]["put_us"] / row["srl"]["put_us"]
        row["ratio_get"] = row["conduit"]["get_us"] / row["srl"]["get_us"]
        row["ratio_main_thread_per_batch"] = ((row["conduit"]["put_us"] * w["B"]) /
                                              (row["srl"]["put_us"] * w["B"]))
        print(f"{name:16s} ratio    {row['ratio_put']:14.2f}x {row['ratio_get']:12.2f}x   (conduit / srl; "
              f"put_batch of 16: {row['ratio_put_g16']:.2f}x)")
        results[name] = row

    # replay kinds: a get of B chunks (+ the priority update for the prioritized kind)
    T, B, n = 51, 32, 512
    samples = [make_sample(T, (4,), np.float32, rng) for _ in range(n)]
    for s in samples:
        s.policy_name = None
    for kind in ("simple_replay_buffer", "prioritized_replay_buffer"):
        args_kw = dict(max_size=n, batch_size=B, warmup_transitions=0, seed=0, sample_length=T)
        if kind == "prioritized_replay_buffer":
            args_kw["priority_interpolation_eta"] = 0.9
        else:
            args_kw["batch_length"] = T
        times = {"srl": [], "conduit": []}
        for _ in range(args.reps):
            for arm in ("srl", "conduit"):
                buf = srl.make_buffer(kind, **args_kw) if arm == "srl" else make_buffer(kind, **args_kw)
                times[arm].append(time_replay(buf, samples, 200, kind.startswith("prioritized")))
        med = {arm: statistics.median(v) * 1e6 for arm, v in times.items()}
        results[kind] = dict(srl_get_us=med["srl"], conduit_get_us=med["conduit"],
                             ratio=med["conduit"] / med["srl"])
        print(f"{kind:26s} get(+update) us: srl {med['srl']:.1f}  conduit {med['conduit']:.1f}  "
              f"ratio {med['conduit'] / med['srl']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
