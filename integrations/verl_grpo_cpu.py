"""GRPO with verl's functions on a CPU, the post-generation path through Conduit: a reference run.

    python integrations/verl_grpo_cpu.py [--iterations 200] [--sequential]

A tiny random Qwen2 (2 layers) and a character tokenizer, both built offline, learn "a+b=" sums
(a, b in 0..4). Per iteration:

  rollout     the policy samples n=8 responses per prompt               (upstream actor)
  ingestion   balance, verl's NaiveRewardManager, old and reference log-probs,
              apply_kl_penalty, compute_advantage (GRPO): in chunks of whole prompt
              groups, overlapped across chunks                          (Conduit: GRPOIngestion)
  delivery    the update batch written once, taken once, padded and split per
              data-parallel rank, prepared while the caller moves on     (Conduit: UpdateBatchDelivery)
  learner     verl's PPO-clip policy loss, Adam

The mean reward rises over the run (a random policy scores ~0.03).
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")


@dataclass
class Args:
    iterations: int = 200
    prompts: int = 16
    n: int = 8
    lr: float = 5e-4
    seed: int = 0
    sequential: bool = False   # verl's own sequential path instead of Conduit's


def main(args: Args) -> list[float]:
    import numpy as np
    import torch
    from verl.trainer.ppo import core_algos

    from conduit_verl.delivery import UpdateBatchDelivery
    from conduit_verl.pipeline import GRPOIngestion, GRPOStages, sequential_grpo_path
    from conduit_verl.reference import (log_probs, make_model, make_reward_manager, make_tokenizer, policy_update,
                                        prompts, rollout)

    torch.set_num_threads(1)
    tok = make_tokenizer()
    policy, ref = make_model(len(tok), seed=args.seed), make_model(len(tok), seed=args.seed)
    ref.load_state_dict(policy.state_dict())
    policy.train()
    ref.eval()
    opt = torch.optim.Adam(policy.parameters(), lr=args.lr)
    reward_manager = make_reward_manager(tok)
    R = 3  # response length: up to two digits and <eos>
    stages = GRPOStages(
        reward_fn=lambda d: reward_manager(d),
        old_log_prob_fn=lambda d: log_probs(policy, d.batch["input_ids"], d.batch["attention_mask"], R),
        ref_log_prob_fn=lambda d: log_probs(ref, d.batch["input_ids"], d.batch["attention_mask"], R),
        kl_ctrl=core_algos.FixedKLController(0.001), dp_size=2)
    ingestion = GRPOIngestion(stages, groups_per_chunk=4, overlap=True)
    delivery = UpdateBatchDelivery(dp_size=2)
    rng = np.random.default_rng(args.seed)
    rewards = []
    t0 = time.perf_counter()
    try:
        for it in range(args.iterations):
            batch = rollout(policy, tok, prompts(rng, args.prompts), n=args.n, resp_len=R, seed=args.seed + it)
            if args.sequential:
                batch = sequential_grpo_path(batch, stages)
                shards = batch.chunk(2)
            else:
                batch = ingestion(batch)                  # ingestion: chunks of whole groups
                delivery.ingest(batch, version=it)        # written once, tagged with the iteration
                delivery.prepare(it)                      # built ahead of the learner's request
                shards, _pad = delivery.deliver(it)       # delivery: one batch per DP rank
            reward = float(batch.batch["token_level_scores"].sum(-1).mean())
            rewards.append(reward)
            policy_update(policy, opt, shards, resp_len=R)
            print(f"iter {it:3d}  mean reward {reward:.3f}  {time.perf_counter() - t0:6.1f}s", flush=True)
    finally:
        ingestion.close()
        delivery.close()
    return rewards


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--iterations", type=int, default=Args.iterations)
    p.add_argument("--lr", type=float, default=Args.lr)
    p.add_argument("--seed", type=int, default=Args.seed)
    p.add_argument("--sequential", action="store_true")
    a = p.parse_args()
    main(Args(iterations=a.iterations, seed=a.seed, sequential=a.sequential, lr=a.lr))
