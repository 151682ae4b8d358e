"""``conduit_rllib.enable(config, **options)``: one call that sets up every extension point."""

from __future__ import annotations

from conduit_core import ConfigError

from .options import ConduitOptions

BUFFER_TYPE = "conduit_rllib.replay_buffer.ConduitEpisodeReplayBuffer"


def enable(config, **options):
    opts = ConduitOptions.from_kwargs(options)
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.algorithms.ppo import PPOConfig
    if isinstance(config, DQNConfig):
        return _enable_dqn(config, opts)
    if isinstance(config, PPOConfig):
        from .ppo import enable_ppo
        return enable_ppo(config, opts)
    raise ConfigError("config", "a DQNConfig or PPOConfig (RLlib 2.60, new API stack)", type(config).__name__,
                      "use conduit_rllib with DQN or PPO, or write an adapter (docs/writing-an-adapter.md)")


def _enable_dqn(config, opts: ConduitOptions):
    from .algorithms import ConduitDQN
    from .learner import ConduitDQNTorchLearner
    if config.framework_str != "torch":
        raise ConfigError("framework", "'torch'", repr(config.framework_str), "call config.framework('torch')")
    rb = dict(config.replay_buffer_config)
    rb_type = rb.pop("type", "PrioritizedEpisodeReplayBuffer")
    type_name = rb_type if isinstance(rb_type, str) else getattr(rb_type, "__name__", str(rb_type))
    if type_name == BUFFER_TYPE:
        prioritized = rb.pop("prioritized", False)
    else:
        prioritized = "Prioritized" in type_name
    keep = {k: rb[k] for k in ("capacity", "alpha", "beta") if k in rb}
    extra = sorted(set(rb) - {"capacity", "alpha", "beta", "conduit", "prioritized"})
    if extra:
        raise ConfigError(f"replay_buffer_config[{extra[0]!r}]", "capacity, alpha, beta", repr(extra[0]),
                          "remove the key; Conduit's buffer has no equivalent")
    # Assigned, not merged through config.training(): a merge would keep the old type's keys.
    config.replay_buffer_config = {"type": BUFFER_TYPE, **keep, "prioritized": prioritized,
                                   "conduit": opts.to_dict()}
    config.learners(learner_class=ConduitDQNTorchLearner)
    config.algo_class = ConduitDQN
    if config.num_learners > 0:
        raise ConfigError("num_learners", "0 (a local learner)", config.num_learners,
                          "set config.learners(num_learners=0); remote learners are not supported yet")
    return config
