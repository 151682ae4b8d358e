"""Where the decoded Atari batch's memory comes from, inside RLlib's DQN on Qbert with Conduit:
torch's CPU allocator (``torch.empty``) vs numpy's (``np.empty``), in turns, in the same algorithm.

Out of such a process the two cost about the same (``bench_frame_decode --hold 3``); inside it, with
RLlib's learner, env runner and Ray around, torch's 3.6 MB blocks were faulted in anew for every
batch. The arms swap the frame decoder's allocator between training iterations and time the
replay buffer's ``sample()`` (the delivery the learner waits for).

    python -m benchmarks.bench_decode_memory [--warmup 6] [--rounds 4] [--iters 1]     # ~5 min
"""

from __future__ import annotations

import argparse
import statistics
import time
import types

import numpy as np
import torch


def _torch_empty(shape, dtype):
    return torch.empty(shape, dtype=torch.from_numpy(np.empty(0, dtype)).dtype).numpy()


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_decode_memory", description=__doc__.split("\n\n")[0])
    p.add_argument("--warmup", type=int, default=6, help="training iterations before timing")
    p.add_argument("--rounds", type=int, default=4, help="rounds over the arms, each arm first in turn")
    p.add_argument("--iters", type=int, default=1, help="training iterations per arm per round")
    a = p.parse_args(argv)
    from conduit_core.memory import output_pool

    from . import rllib_bench
    rllib_bench._init_ray()
    args = types.SimpleNamespace(seed=0, mode="sequential", worker="thread", staleness=0, game="ale_py:ALE/Qbert-v5",
                                 atari_learning_starts=500, atari_iteration_steps=100)
    algo = rllib_bench._build("dqn-atari", "conduit", args)
    for _ in range(a.warmup):
        algo.train()
    buf = algo.local_replay_buffer
    allocators = {"torch": _torch_empty, "numpy": np.empty}
    times: dict[str, list[float]] = {arm: [] for arm in allocators}
    inner, arm = buf.sample, "numpy"

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            times[arm].append(time.perf_counter() - t0)
    buf.sample = timed
    order = list(allocators)
    saved = output_pool.output_empty
    try:
        for r in range(a.rounds):
            for arm in order[r % 2:] + order[:r % 2]:
                output_pool.output_empty = allocators[arm]
                for _ in range(a.iters):
                    algo.train()
    finally:
        output_pool.output_empty = saved
        algo.stop()
    med = {arm: statistics.median(ts) * 1e3 for arm, ts in times.items()}
    print("Qbert DQN with Conduit, replay sample() medians: " + ", ".join(
        f"{arm} {ms:.3f} ms ({len(times[arm])} calls)" for arm, ms in med.items()))
    return med


if __name__ == "__main__":
    main()
