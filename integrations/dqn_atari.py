"""DQN on an Atari game (Qbert by default) with Conduit: RLlib's Atari preprocessing, small budget.

    python integrations/dqn_atari.py [--native] [--game ale_py:ALE/Qbert-v5] [--iterations 6]

RLlib's `wrap_atari_for_new_api_stack(dim=84, framestack=4)` delivers float32 84x84x4 stacks
(113 KB each). Conduit's ingestion recognises the normalisation (q/128 - 1) and the frame stack
on the first chunk and stores each frame once as uint8 (obs and next_obs share the frames),
verified bit for bit; delivery rebuilds the exact float32 stacks. On a CPU the torch update
dominates each training step (~0.6 s); the point of this run is the buffer's memory and the
exposed path, see `conduit bench rllib-dqn-atari`.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("OMP_NUM_THREADS", "1")


@dataclass
class Args:
    native: bool = False
    game: str = "ale_py:ALE/Qbert-v5"
    iterations: int = 6
    seed: int = 0


def main(args: Args) -> None:
    import ray

    import conduit_rllib
    from conduit_rllib.atari import dqn_atari

    from conduit_core.remote.ray_local import init_local
    init_local(num_cpus=2, object_store_memory=256 << 20, log_to_driver=False)  # loopback only
    config = dqn_atari(seed=args.seed, game=args.game, learning_starts=500, iteration_steps=250)
    if not args.native:
        conduit_rllib.enable(config, obs_codec="auto")     # lossless uint8 frames, stored once
    algo = config.build_algo()
    t0 = time.perf_counter()
    for i in range(args.iterations):
        result = algo.train()
        ret = result["env_runners"].get("episode_return_mean", float("nan"))
        steps = result["env_runners"]["num_env_steps_sampled_lifetime"]
        print(f"iter {i:3d}  env steps {steps:7.0f}  return {ret:7.1f}  {time.perf_counter() - t0:6.1f}s")
    buf = algo.local_replay_buffer
    if not args.native:
        b = buf.edp.buffer
        per = (b.storage.pool_bytes() + b.capacity * b.spec.stored_bytes_per_transition) / b.capacity
        print(f"conduit: {len(b)} transitions, {per / 1e3:.1f} KB per transition reserved "
              f"(RLlib's float32 stack: {84 * 84 * 4 * 4 / 1e3:.0f} KB for obs alone)")
    algo.stop()
    ray.shutdown()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--native", action="store_true")
    p.add_argument("--game", default=Args.game)
    p.add_argument("--iterations", type=int, default=Args.iterations)
    p.add_argument("--seed", type=int, default=Args.seed)
    main(Args(**vars(p.parse_args())))
