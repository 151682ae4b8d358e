"""PPO on CartPole with Conduit as RLlib's experience path: a reference run, top to bottom.

    python integrations/ppo_cartpole.py [--native] [--iterations 15] [--seed 0]

Control points, per learner update:
  ingestion  RLlib's learner connector (GAE with the value forward pass), then the train batch
             written once into Conduit, tagged with the policy version (weights seq no)
  delivery   exactly that version's rows, consumed once, then epochs x minibatches as
             index_select per column on the learner's device (RLlib's cyclic order)
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
    iterations: int = 15
    seed: int = 0
    target_return: float = 150.0


def main(args: Args) -> None:
    import ray

    import conduit_rllib
    from conduit_rllib import workloads

    from conduit_core.remote.ray_local import init_local
    init_local(num_cpus=2, object_store_memory=256 << 20, log_to_driver=False)  # loopback only
    config = workloads.ppo_cartpole(seed=args.seed)       # RLlib's tuned PPO CartPole example
    if not args.native:
        conduit_rllib.enable(config)                       # learner class + checkpointing
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
    if not args.native:
        for module_id, path in algo.learner_group._learner.conduit_paths.items():
            m = path.edp.metrics()
            print(f"conduit ({module_id}): {m.ingest.calls} train batches ingested, {m.deliver.calls} delivered "
                  f"once each, {m.dropped_stale} stale rows dropped")
    algo.stop()
    ray.shutdown()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--native", action="store_true")
    p.add_argument("--iterations", type=int, default=Args.iterations)
    p.add_argument("--seed", type=int, default=Args.seed)
    main(Args(**vars(p.parse_args())))
