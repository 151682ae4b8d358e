"""DQN on CartPole with Conduit as RLlib's experience path: a reference run, top to bottom.

    python integrations/dqn_cartpole.py [--native] [--iterations 20] [--seed 0]

Control points, as RLlib's DQN training step drives them:
  ingestion  local_replay_buffer.add(episodes)   -> episode chunks become columns, once
  delivery   local_replay_buffer.sample(...)     -> prioritized n-step batch, gathered columnar
             learner connector                   -> the batch as the learner's tensors (no re-batching)
             update_priorities(td_errors)        -> the delivered rows' new priorities
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
    native: bool = False        # run unmodified RLlib instead
    iterations: int = 20
    seed: int = 0
    target_return: float = 150.0


def main(args: Args) -> None:
    import ray

    import conduit_rllib
    from conduit_rllib import workloads

    from conduit_core.remote.ray_local import init_local
    init_local(num_cpus=2, object_store_memory=256 << 20, log_to_driver=False)  # loopback only
    # 1. RLlib's tuned DQN CartPole config, unchanged.
    config = workloads.dqn_cartpole(seed=args.seed)
    # 2. One call routes the experience path through Conduit (sequential: RLlib's exact semantics).
    if not args.native:
        conduit_rllib.enable(config, mode="sequential")
    algo = config.build_algo()
    t0 = time.perf_counter()
    for i in range(args.iterations):
        result = algo.train()
        ret = result["env_runners"].get("episode_return_mean", float("nan"))
        steps = result["env_runners"]["num_env_steps_sampled_lifetime"]
        print(f"iter {i:3d}  env steps {steps:7.0f}  return {ret:7.1f}  {time.perf_counter() - t0:6.1f}s")
        if ret >= args.target_return:
            print(f"reached return {args.target_return} after {steps:.0f} env steps")
            break
    # 3. The data plane's own metrics: what each control point cost the caller.
    if not args.native:
        m = algo.local_replay_buffer.conduit_metrics()
        print(f"conduit: ingest {m.ingest.blocked_s:.3f}s / deliver {m.deliver.blocked_s:.3f}s / "
              f"priorities {m.priorities.blocked_s:.3f}s caller-blocked, {m.inserted} transitions stored")
    algo.stop()
    ray.shutdown()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--native", action="store_true")
    p.add_argument("--iterations", type=int, default=Args.iterations)
    p.add_argument("--seed", type=int, default=Args.seed)
    main(Args(**vars(p.parse_args())))
