"""The reference RLlib configs Conduit is measured and tested on (one place, reused by the
integrations, the benchmark and the tests)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import gymnasium as gym
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.algorithms.sac import SACConfig
    from ray.rllib.offline.offline_prelearner import OfflinePreLearner


def dqn_cartpole(*, seed: int = 0, num_env_runners: int = 0, capacity: int = 50_000) -> DQNConfig:
    """RLlib 2.60's tuned DQN CartPole example (prioritized, n-step (2,5), double, dueling)."""
    from ray.rllib.algorithms.dqn import DQNConfig
    return (
        DQNConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=num_env_runners)
        .training(lr=5e-4, train_batch_size_per_learner=32, n_step=(2, 5), double_q=True, dueling=True,
                  num_atoms=1, noisy=False,
                  replay_buffer_config={"type": "PrioritizedEpisodeReplayBuffer", "capacity": capacity,
                                        "alpha": 0.6, "beta": 0.4})
        .rl_module(model_config={
            "fcnet_hiddens": [256], "fcnet_activation": "tanh", "epsilon": [(0, 1.0), (10000, 0.02)],
            "fcnet_bias_initializer": "zeros_", "head_fcnet_bias_initializer": "zeros_",
            "head_fcnet_hiddens": [256]})
        .reporting(min_sample_timesteps_per_iteration=1000)
        .debugging(seed=seed)
    )


def dqn_mountaincar(*, seed: int = 0, num_env_runners: int = 0, capacity: int = 50_000) -> DQNConfig:
    """The DQN CartPole settings on MountainCar-v0 (the paper's Figure 11 runs DQN there): the same
    replay path, with 200-step episodes that mostly end truncated and a -1 reward every step."""
    return dqn_cartpole(seed=seed, num_env_runners=num_env_runners, capacity=capacity).environment("MountainCar-v0")


def sac_pendulum(*, seed: int = 0, num_env_runners: int = 0, capacity: int = 100_000, tqc: bool = False,
                 hidden: int = 256, batch: int = 256, n_step: int | tuple[int, int] = (2, 5)) -> SACConfig:
    """RLlib 2.60's tuned SAC Pendulum example (``tuned_examples/sac/pendulum_sac.py``: prioritized
    replay with alpha 1 and beta 0, n-step (2, 5), two 256-unit layers, return -250 within 20,000
    steps); ``tqc=True``: the same settings on TQC, which RLlib builds on SAC. ``hidden``, ``batch``
    and ``n_step`` shrink it for tests."""
    from ray.rllib.algorithms.sac import SACConfig
    from ray.rllib.algorithms.tqc import TQCConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from torch import nn
    return (
        (TQCConfig() if tqc else SACConfig())
        .environment("Pendulum-v1")
        .env_runners(num_env_runners=num_env_runners)
        .training(initial_alpha=1.001, actor_lr=2e-4, critic_lr=8e-4, alpha_lr=9e-4, lr=None,
                  target_entropy="auto", n_step=n_step, tau=0.005, train_batch_size_per_learner=batch,
                  target_network_update_freq=1, num_steps_sampled_before_learning_starts=batch,
                  replay_buffer_config={"type": "PrioritizedEpisodeReplayBuffer", "capacity": capacity,
                                        "alpha": 1.0, "beta": 0.0})
        .rl_module(model_config=DefaultModelConfig(
            fcnet_hiddens=[hidden, hidden], fcnet_activation="relu", fcnet_kernel_initializer=nn.init.xavier_uniform_,
            head_fcnet_hiddens=[], head_fcnet_activation=None, head_fcnet_kernel_initializer="orthogonal_",
            head_fcnet_kernel_initializer_kwargs={"gain": 0.01}))
        .reporting(metrics_num_episodes_for_smoothing=5)
        .debugging(seed=seed)
    )


METAWORLD_ENV = "conduit-metaworld"


def metaworld_env(config: dict) -> gym.Env:
    """One Meta-World task as a gymnasium env (``Meta-World/MT1``: a single task, its goal varied
    per episode; 39-dim float64 observations, 4-dim actions, 500-step episodes). Imported here,
    in whichever process makes the env: the ``metaworld`` package registers its ids on import."""
    import gymnasium as gym
    try:
        import metaworld  # noqa: F401
    except ImportError as exc:
        raise ImportError("Meta-World workloads need the metaworld package (MuJoCo ships in its wheel). "
                          "Fix: pip install 'conduit-rllib[metaworld]' (or pip install metaworld)") from exc
    return gym.make("Meta-World/MT1", env_name=config.get("task", "reach-v3"), seed=config.get("seed", 0))


def sac_metaworld(*, task: str = "reach-v3", seed: int = 0, **sizes: int) -> SACConfig:
    """SAC on one Meta-World task with the Pendulum example's settings (``sac_pendulum``'s
    ``sizes``): the paper's continuous-control workload, at a size this machine runs in minutes."""
    from ray.tune.registry import register_env
    register_env(METAWORLD_ENV, metaworld_env)
    return sac_pendulum(seed=seed, **sizes).environment(METAWORLD_ENV, env_config={"task": task, "seed": seed})


def ppo_multi_agent_cartpole(*, seed: int = 0, num_agents: int = 2, shared: bool = False,
                             num_env_runners: int = 0) -> PPOConfig:
    """RLlib 2.60's multi-agent CartPole PPO example (``examples/multi_agent/multi_agent_cartpole.py``):
    ``num_agents`` CartPoles in one env, each agent on a policy of its own (``shared=False``: one
    module per agent, trained on its agent's rows) or all on one (``shared=True``: one module
    trained on every agent's rows), with the single-agent example's tuned PPO settings."""
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec
    from ray.rllib.examples.envs.classes.multi_agent import MultiAgentCartPole
    policies = ["shared"] if shared else [f"p{i}" for i in range(num_agents)]
    mapping = _shared_policy if shared else _own_policy
    return (
        PPOConfig()
        .environment(MultiAgentCartPole, env_config={"num_agents": num_agents})
        .env_runners(num_env_runners=num_env_runners)
        .multi_agent(policies=set(policies), policy_mapping_fn=mapping)
        .training(lr=3e-4, num_epochs=6, vf_loss_coeff=0.01)
        .rl_module(rl_module_spec=MultiRLModuleSpec(rl_module_specs={p: RLModuleSpec() for p in policies}),
                   model_config=DefaultModelConfig(fcnet_hiddens=[32], fcnet_activation="linear",
                                                   vf_share_layers=True))
        .debugging(seed=seed)
    )


def _own_policy(agent_id, episode, **kwargs):
    return f"p{agent_id}"


def _shared_policy(agent_id, episode, **kwargs):
    return "shared"


def ppo_cartpole(*, seed: int = 0, num_env_runners: int = 0) -> PPOConfig:
    """RLlib 2.60's tuned PPO CartPole example."""
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    return (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=num_env_runners)
        .training(lr=3e-4, num_epochs=6, vf_loss_coeff=0.01)
        .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[32], fcnet_activation="linear",
                                                   vf_share_layers=True))
        .debugging(seed=seed)
    )


def recorded_episodes(env_id: str = "CartPole-v1", *, episodes: int, seed: int = 0) -> list[bytes]:
    """Episodes as RLlib's offline env runner records them (``output_write_episodes``: each one's state
    packed with msgpack-numpy), the rows of a parquet ``item`` column that RLlib's offline pre-learner
    reads with ``input_read_episodes=True``. Generated here (no dataset is downloaded): CartPole with a
    balancing rule and half the actions random (a few to a few hundred steps), any other env with
    random actions; ids ``recorded-<seed>-<i>``, so the same call records the same episodes."""
    import gymnasium as gym
    import msgpack
    import numpy as np
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode
    try:
        import msgpack_numpy
    except ImportError as exc:
        raise ImportError("recorded episodes are packed with msgpack-numpy, as RLlib reads them. "
                          "Fix: pip install 'conduit-rllib[offline]'") from exc
    env = gym.make(env_id)
    env.action_space.seed(seed)
    rng = np.random.default_rng(seed)
    out = []
    for e in range(episodes):
        ep = SingleAgentEpisode(id_=f"recorded-{seed}-{e}", observation_space=env.observation_space,
                                action_space=env.action_space)
        obs, info = env.reset(seed=seed * 1000 + e)
        ep.add_env_reset(obs, info)
        done = False
        while not done:
            if env_id != "CartPole-v1":
                action = env.action_space.sample()
            elif rng.random() < 0.5:
                action = int(obs[2] + 0.3 * obs[3] > 0)
            else:
                action = int(rng.integers(2))
            obs, reward, terminated, truncated, info = env.step(action)
            ep.add_env_step(obs, action, reward, info, terminated=terminated, truncated=truncated)
            done = terminated or truncated
        out.append(msgpack.packb(ep.get_state(), default=msgpack_numpy.encode))
    return out


def offline_config(algo: str = "BC", *, env_id: str = "CartPole-v1", capacity: int = 2000, batch: int = 32,
                   lookback: int = 1, input_: list[str] | None = None) -> AlgorithmConfig:
    """BC, MARWIL or CQL reading recorded episodes of ``env_id`` (``input_read_episodes``), its
    pre-learner's buffer at ``capacity`` steps. ``input_``: the parquet files (None: a placeholder,
    for a pre-learner called in-process)."""
    import gymnasium as gym
    from ray.rllib.algorithms.bc import BCConfig
    from ray.rllib.algorithms.cql import CQLConfig
    from ray.rllib.algorithms.marwil import MARWILConfig
    env = gym.make(env_id)
    config = {"BC": BCConfig, "MARWIL": MARWILConfig, "CQL": CQLConfig}[algo]()
    config.environment(observation_space=env.observation_space, action_space=env.action_space)
    config.env_runners(episode_lookback_horizon=lookback)
    config.training(train_batch_size_per_learner=batch)
    return config.offline_data(input_=input_ or ["(read by the caller)"], input_read_episodes=True,
                               prelearner_buffer_kwargs={"capacity": capacity})


def pre_learner(config: AlgorithmConfig) -> OfflinePreLearner:
    """RLlib's offline pre-learner for ``config``, as ``OfflineData`` builds one in each Ray Data worker
    (its module built from the config's spec, weights from ``torch.manual_seed(0)``: two built alike
    compute alike)."""
    import torch
    from ray.rllib.offline.offline_prelearner import OfflinePreLearner
    spaces = (config.observation_space, config.action_space)
    torch.manual_seed(0)
    spec = config.get_multi_rl_module_spec(spaces={"__env__": spaces, "default_policy": spaces}, inference_only=False)
    return OfflinePreLearner(config=config, spaces=spaces, module_spec=spec)
