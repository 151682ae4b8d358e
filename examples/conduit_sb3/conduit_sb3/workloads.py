"""SB3's DQN on CartPole-v1, natively or with its replay buffer served by Conduit: the
convergence level's workload (learning speed there depends on what the buffer delivers).

Hyperparameters are RL Zoo's for DQN CartPole-v1 (rl-baselines3-zoo ``hyperparams/dqn.yml``).
A run stops when the mean return of the last ``WINDOW`` training episodes reaches
``THRESHOLD``, or at ``BUDGET`` env steps (then it is censored at the budget)."""

from __future__ import annotations

import numpy as np

THRESHOLD = 150.0
WINDOW = 20
BUDGET = 40_000
ZOO = dict(learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1000, gamma=0.99,
           target_update_interval=10, train_freq=256, gradient_steps=128, exploration_fraction=0.16,
           exploration_final_eps=0.04, policy_kwargs=dict(net_arch=[256, 256]))


def run_dqn_cartpole(path: str, seed: int, *, budget: int = BUDGET):
    """``path``: 'native' (SB3's ReplayBuffer) or 'conduit' (ConduitReplayBuffer, its own stream);
    returns the suite's ``ConvergenceResult``."""
    import torch
    from stable_baselines3 import DQN

    from conduit_conformance import ConvergenceResult   # (the suite: the [test] extra, not needed to train)
    from stable_baselines3.common.callbacks import BaseCallback

    from .buffers import ConduitReplayBuffer

    if path not in ("native", "conduit"):
        raise ValueError(f"path: expected 'native' or 'conduit', got {path!r}")
    torch.set_num_threads(1)
    returns: list[float] = []

    class StopAtThreshold(BaseCallback):
        def _on_step(self) -> bool:
            for info in self.locals.get("infos", []):
                if "episode" in info:
                    returns.append(float(info["episode"]["r"]))
            return not (len(returns) >= WINDOW and np.mean(returns[-WINDOW:]) >= THRESHOLD)

    kw = {} if path == "native" else {"replay_buffer_class": ConduitReplayBuffer}
    model = DQN("MlpPolicy", "CartPole-v1", seed=seed, device="cpu", verbose=0, **ZOO, **kw)
    try:
        model.learn(budget, callback=StopAtThreshold())
        reached = len(returns) >= WINDOW and np.mean(returns[-WINDOW:]) >= THRESHOLD
        return ConvergenceResult(bool(reached), int(model.num_timesteps if reached else budget), returns)
    finally:
        if path == "conduit":
            model.replay_buffer.close()
        model.env.close()
