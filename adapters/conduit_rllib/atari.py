"""The Atari DQN workload (the paper's Qbert): RLlib's own Atari preprocessing, small budget.

Observations come from ``wrap_atari_for_new_api_stack(..., dim=84, framestack=4)``: grayscale
84x84 frames normalised to ``q/128 - 1`` (float32) and stacked 4 deep on the last axis, i.e.
113 KB per observation. With ``obs_codec='auto'`` Conduit stores each frame once as uint8
(see ``conduit_core.schema.framestack``), bit-exact on delivery.
"""

from __future__ import annotations

ENV_NAME = "conduit-atari"


def make_atari_env(cfg: dict | None = None):
    try:
        import ale_py
        import cv2  # noqa: F401 - RLlib's Atari wrappers resize frames with it
    except ImportError as exc:
        raise ImportError(f"the Atari workload needs {exc.name}: expected the 'atari' extra of conduit-rllib, got it "
                          "missing. Fix: pip install 'conduit-rllib[atari]' (from a checkout: pip install -e "
                          "'adapters/conduit_rllib[atari]')", name=exc.name) from None
    import gymnasium as gym
    from ray.rllib.env.wrappers.atari_wrappers import wrap_atari_for_new_api_stack
    cfg = dict(cfg or {})
    game = cfg.pop("game", "ale_py:ALE/Qbert-v5")
    gym.register_envs(ale_py)
    env = gym.make(game, frameskip=1, repeat_action_probability=0.0, **cfg)
    return wrap_atari_for_new_api_stack(env, dim=84, framestack=4)


def dqn_atari(*, seed: int = 0, game: str = "ale_py:ALE/Qbert-v5", capacity: int = 100_000,
              learning_starts: int = 1000, iteration_steps: int = 250):
    """DQN on an Atari game with RLlib's Atari wrappers, sized for a CPU: a 100k buffer,
    learning after 1000 steps, ``iteration_steps`` env steps per iteration."""
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.tune.registry import register_env
    register_env(ENV_NAME, make_atari_env)
    return (
        DQNConfig()
        .environment(ENV_NAME, env_config={"game": game}, clip_rewards=True)
        .env_runners(num_env_runners=0, rollout_fragment_length=4)
        .training(lr=1e-4, train_batch_size_per_learner=32, n_step=1, double_q=True, dueling=True,
                  num_atoms=1, noisy=False, target_network_update_freq=2000,
                  num_steps_sampled_before_learning_starts=learning_starts,
                  replay_buffer_config={"type": "PrioritizedEpisodeReplayBuffer", "capacity": capacity,
                                        "alpha": 0.5, "beta": 0.4})
        .rl_module(model_config={"epsilon": [(0, 1.0), (100_000, 0.01)], "head_fcnet_hiddens": [256]})
        .reporting(min_sample_timesteps_per_iteration=iteration_steps)
        .debugging(seed=seed)
    )
