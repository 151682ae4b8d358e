"""RLlib's offline pre-learner (BC reading recorded episodes) with its own buffer and with Conduit's,
both arms in turns on the same batches of episodes: what each call of the pre-learner costs, and the
buffer's share of it (``add`` of the call's episodes and the ``sample`` of the learner's batch: the
experience path RLlib exposes before its learner connector).

    conduit bench rllib-bc [--episodes 64] [--per-call 8] [--rounds 5] [--out report.json]
    (python -m benchmarks.rllib.offline ...)

Episodes are generated (``conduit_rllib.workloads.recorded_episodes``: CartPole, no dataset downloaded)
and packed as RLlib records them; each round builds a fresh pre-learner per arm (RLlib's
``OfflinePreLearner``, as a Ray Data worker builds it, in this process) and hands it the same calls of
``--per-call`` packed episodes, as Ray Data hands each worker a batch (after ``--warmup`` rounds not
counted: the first calls pay imports and set-up), both buffers seeded alike (RLlib's own is unseeded)
and evicting whole episodes past ``--capacity``, each handed a call's episodes in id order (RLlib hands a
set, whose order differs between two decodings: the arms would store different episodes). Each round builds each arm's buffer anew, so Conduit's
arm pays its data plane's build every round. Reported per arm: the median per
call of the whole pre-learner call and of its buffer part; ratios are medians over rounds of the
per-round ratio Conduit / RLlib (paired, as the other benches).
"""

from __future__ import annotations

import argparse
import gc
import time

import numpy as np

from ..common import machine, write_json


class TimedBuffer:
    """Wraps a buffer's ``add`` and ``sample`` with a clock; everything else passes through."""

    def __init__(self, inner) -> None:
        self.inner, self.add_s, self.sample_s = inner, 0.0, 0.0

    def add(self, episodes, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return self.inner.add(episodes, *args, **kwargs)
        finally:
            self.add_s += time.perf_counter() - t0

    def sample(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return self.inner.sample(*args, **kwargs)
        finally:
            self.sample_s += time.perf_counter() - t0

    def __getattr__(self, name):
        return getattr(self.inner, name)


def run_arm(arm: str, calls: list[np.ndarray], *, capacity: int, batch: int, seed: int) -> dict:
    import conduit_rllib
    from conduit_rllib import workloads
    config = workloads.offline_config("BC", capacity=capacity, batch=batch)
    if arm == "conduit":
        config = conduit_rllib.enable(config, seed=seed)
    pre = workloads.pre_learner(config)
    if arm == "rllib":
        pre.episode_buffer.rng = np.random.default_rng(seed)   # (RLlib's is unseeded: both arms seeded alike)
    # RLlib hands its buffer a set of episodes, whose order differs between two decodings of the same bytes;
    # in id order both arms store and evict the same episodes, so they do the same work
    validate = pre._validate_episodes
    pre._validate_episodes = lambda episodes: sorted(validate(episodes), key=lambda e: e.id_)
    pre.episode_buffer = timed = TimedBuffer(pre.episode_buffer)
    gc.collect()   # the other arm's garbage (RLlib's buffer deep-copies every episode) is not this arm's time
    t0 = time.perf_counter()
    for items in calls:
        pre({"item": items})
    total = time.perf_counter() - t0
    return {"call_ms": total / len(calls) * 1e3, "buffer_ms": (timed.add_s + timed.sample_s) / len(calls) * 1e3,
            "add_ms": timed.add_s / len(calls) * 1e3, "sample_ms": timed.sample_s / len(calls) * 1e3,
            "stored_steps": int(timed.get_num_timesteps()), "evicted_episodes": int(timed.get_num_episodes_evicted())}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="conduit bench rllib-bc", description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=int, default=64, help="recorded CartPole episodes (generated)")
    ap.add_argument("--per-call", type=int, default=8, help="episodes per pre-learner call (a Ray Data batch)")
    ap.add_argument("--batch", type=int, default=256, help="train_batch_size_per_learner (the learner's batch)")
    ap.add_argument("--capacity", type=int, default=2000, help="the pre-learner buffer's capacity in steps (64 "
                    "episodes hold about 4,000: the buffer evicts, as a long offline run's does)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of both arms in turns")
    ap.add_argument("--warmup", type=int, default=1, help="rounds of both arms first, not counted (imports, "
                    "first-call set-up)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="the JSON report")
    a = ap.parse_args(argv)
    from conduit_rllib import workloads
    items = workloads.recorded_episodes("CartPole-v1", episodes=a.episodes, seed=a.seed)
    calls = [np.array(items[i:i + a.per_call], dtype=object) for i in range(0, len(items), a.per_call)]
    for _ in range(a.warmup):
        for arm in ("rllib", "conduit"):
            run_arm(arm, calls, capacity=a.capacity, batch=a.batch, seed=a.seed)
    rounds = []
    for r in range(a.rounds):
        order = ("rllib", "conduit") if r % 2 == 0 else ("conduit", "rllib")
        rounds.append({arm: run_arm(arm, calls, capacity=a.capacity, batch=a.batch, seed=a.seed) for arm in order})
        row = rounds[-1]
        print(f"round {r + 1}: call {row['rllib']['call_ms']:.2f} / {row['conduit']['call_ms']:.2f} ms, "
              f"buffer {row['rllib']['buffer_ms']:.2f} / {row['conduit']['buffer_ms']:.2f} ms (RLlib / Conduit)",
              flush=True)

    def med(arm: str, key: str) -> float:
        return float(np.median([r[arm][key] for r in rounds]))

    def ratio(key: str) -> float:
        return float(np.median([r["conduit"][key] / r["rllib"][key] for r in rounds]))

    report = {"workload": "rllib-bc-offline-cartpole", "episodes": a.episodes, "per_call": a.per_call,
              "warmup": a.warmup,
              "batch": a.batch, "capacity": a.capacity, "rounds": rounds,
              "median_ms": {arm: {k: med(arm, k) for k in ("call_ms", "buffer_ms", "add_ms", "sample_ms")}
                            for arm in ("rllib", "conduit")},
              "call_ratio": ratio("call_ms"), "buffer_ratio": ratio("buffer_ms"), "add_ratio": ratio("add_ms"),
              "sample_ratio": ratio("sample_ms"), "machine": machine()}
    m = report["median_ms"]
    print(f"per-arm medians per pre-learner call, RLlib / Conduit: whole call {m['rllib']['call_ms']:.2f} / "
          f"{m['conduit']['call_ms']:.2f} ms, buffer (add + sample) {m['rllib']['buffer_ms']:.2f} / "
          f"{m['conduit']['buffer_ms']:.2f} ms")
    print(f"medians of the paired per-round ratios, Conduit / RLlib: whole call {report['call_ratio']:.3f}x, "
          f"buffer {report['buffer_ratio']:.3f}x (add {report['add_ratio']:.3f}x, sample {report['sample_ratio']:.3f}x)")
    if a.out:
        write_json(a.out, report)
    return report


if __name__ == "__main__":
    main()
