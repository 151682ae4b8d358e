"""What ingestion costs in RLlib's buffer and in Conduit's, per env-runner hand-over, and
what keeping RLlib's infos and extra model outputs adds to Conduit's.

    python -m benchmarks.rllib.add            # ~1 min; docs/benchmarks.md section 10

Chunks come from RLlib's own env runner (DQN CartPole, 0 remote runners: real episodes,
with the ``weights_seq_no`` extra model output and ``{}`` infos), handed to each buffer as
DQN's training step hands them: one ``add()`` per sample of ``--steps`` env steps. Each
arm refills a fresh buffer with the same chunks; arms run in turns, ``--reps`` times;
medians per ``add()`` call.
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import numpy as np


def hand_overs(steps: int, calls: int, seed: int) -> list[list]:
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
    runner = SingleAgentEnvRunner(config=DQNConfig().environment("CartPole-v1").env_runners(num_env_runners=0)
                                  .debugging(seed=seed))
    return [runner.sample(num_timesteps=steps, random_actions=True) for _ in range(calls)]


def arms(capacity: int) -> dict:
    from conduit_rllib.columns import EXTRA, episode_columns
    from conduit_rllib.replay_buffer import ConduitEpisodeReplayBuffer
    from ray.rllib.utils.replay_buffers.prioritized_episode_buffer import (
        PrioritizedEpisodeReplayBuffer,
    )

    def without_extras(ep):
        return {k: v for k, v in episode_columns(ep).items() if not k.startswith(EXTRA)}

    bare = type("NoExtras", (ConduitEpisodeReplayBuffer,), {"columns_of": staticmethod(without_extras)})
    return {
        "rllib": lambda: PrioritizedEpisodeReplayBuffer(capacity=capacity, alpha=0.6),
        "conduit": lambda: ConduitEpisodeReplayBuffer(capacity=capacity, prioritized=True),
        "conduit, no infos": lambda: ConduitEpisodeReplayBuffer(capacity=capacity, prioritized=True,
                                                                conduit={"store_infos": False}),
        "conduit, no infos or extras": lambda: bare(capacity=capacity, prioritized=True,
                                                    conduit={"store_infos": False}),
    }


def run(steps: int, calls: int, reps: int, seed: int) -> dict:
    batches = hand_overs(steps, calls, seed)
    per_arm: dict[str, list[float]] = {name: [] for name in arms(1)}
    for _ in range(reps):
        for name, make in arms(steps * calls * 2).items():
            buf = make()
            copies = [copy.deepcopy(b) for b in batches]  # RLlib's add keeps (and mutates) what it gets
            t0 = time.perf_counter()
            for b in copies:
                buf.add(b)
            per_arm[name].append((time.perf_counter() - t0) / calls * 1e3)
            if hasattr(buf, "close"):
                buf.close()
    med = {name: float(np.median(v)) for name, v in per_arm.items()}
    return {"steps_per_add": steps, "adds": calls, "reps": reps, "ms_per_add": med,
            "ratio_to_rllib": {k: v / med["rllib"] for k, v in med.items()}}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=32, help="env steps per add() (DQN's rollout per training step)")
    ap.add_argument("--adds", type=int, default=200)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    out = run(a.steps, a.adds, a.reps, a.seed)
    for name, ms in out["ms_per_add"].items():
        print(f"{name:30s} {ms * 1e3:8.1f} us per add()   {out['ratio_to_rllib'][name]:.3f}x RLlib")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
