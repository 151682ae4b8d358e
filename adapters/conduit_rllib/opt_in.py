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
    extra = sorted(set(rb) - {"capacity", "alpha", "beta", "conduit", "prioritized", "learner_shards"})
    if extra:
        raise ConfigError(f"replay_buffer_config[{extra[0]!r}]", "capacity, alpha, beta", repr(extra[0]),
                          "remove the key; Conduit's buffer has no equivalent")
    # Assigned, not merged through config.training(): a merge would keep the old type's keys.
    config.replay_buffer_config = {"type": BUFFER_TYPE, **keep, "prioritized": prioritized,
                                   "conduit": opts.to_dict(), "learner_shards": max(1, config.num_learners)}
    check_learner_connector(config)
    config.learners(learner_class=ConduitDQNTorchLearner)
    config.algo_class = ConduitDQN
    return config


def check_learner_connector(config) -> None:
    """Conduit's DQN learner takes the delivered columns in place of RLlib's learner
    connector pipeline (which would re-batch one-step episodes). A connector piece the
    user added there would silently not run, so such a config is refused, naming it."""
    factory = getattr(config, "_learner_connector", None)
    if factory is not None:
        name = getattr(factory, "__qualname__", None) or type(factory).__name__
        try:  # name the pieces themselves where the factory can be called without an env
            built = factory(config.observation_space, config.action_space)
            pieces = built if isinstance(built, (list, tuple)) else [built]
            name = ", ".join(type(p).__name__ for p in pieces) or name
        except Exception:  # noqa: BLE001 - naming is best effort; the refusal is not
            pass
        raise ConfigError("training(learner_connector=...)", "no custom learner connector pieces with conduit_rllib "
                          "(DQN)", name, "Conduit delivers the learner's columns directly and would skip these "
                          "pieces; move the transform into an env-to-module connector or a Conduit delivery hook "
                          "(ExperienceDataPlane.add_delivery_hook), or disable conduit_rllib for this config")
    if not getattr(config, "add_default_connectors_to_learner_pipeline", True):
        raise ConfigError("training(add_default_connectors_to_learner_pipeline=...)", "True with conduit_rllib (DQN)",
                          False, "Conduit builds the learner's default columns itself; keep the default pipeline "
                          "or disable conduit_rllib for this config")
