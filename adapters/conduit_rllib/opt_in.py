"""``conduit_rllib.enable(config, **options)``: one call that sets up every extension point."""

from __future__ import annotations

import dataclasses

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
        if opts.source_ingest:   # PPO's on-policy batches reach the learner connector, not a replay buffer
            raise ConfigError("source_ingest", "False for PPO (env runners write at the source for DQN only)",
                              True, "drop source_ingest=True for PPO, or use it with a DQNConfig")
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
    custom = custom_learner_pieces(config)
    if custom and opts.delivery == "columns":
        raise ConfigError("conduit_rllib.enable(delivery=...)", "'episodes' or None with learner connector pieces "
                          "of your own", "'columns'", f"the pieces ({custom}) read episodes and would not run on "
                          "columns; drop delivery='columns'")
    if opts.delivery is None:  # episodes only where the learner pipeline reads them
        opts = dataclasses.replace(opts, delivery="episodes" if custom else "columns")
    keep = {k: rb[k] for k in ("capacity", "alpha", "beta") if k in rb}
    extra = sorted(set(rb) - {"capacity", "alpha", "beta", "conduit", "prioritized", "learner_shards"})
    if extra:
        raise ConfigError(f"replay_buffer_config[{extra[0]!r}]", "capacity, alpha, beta", repr(extra[0]),
                          "remove the key; Conduit's buffer has no equivalent")
    # Assigned, not merged through config.training(): a merge would keep the old type's keys.
    config.replay_buffer_config = {"type": BUFFER_TYPE, **keep, "prioritized": prioritized,
                                   "conduit": opts.to_dict(), "learner_shards": max(1, config.num_learners)}
    config.learners(learner_class=ConduitDQNTorchLearner)
    if opts.source_ingest:
        check_source_ingest(config)
        from .source_ingest import ConduitEnvRunner
        config.env_runners(env_runner_cls=ConduitEnvRunner)
    config.algo_class = ConduitDQN
    return config


def custom_learner_pieces(config) -> str | None:
    """The learner connector pieces a user configured (named where the factory can be
    called without an env), or None: RLlib's default pipeline only."""
    factory = getattr(config, "_learner_connector", None)
    if factory is not None:
        name = getattr(factory, "__qualname__", None) or type(factory).__name__
        try:
            built = factory(config.observation_space, config.action_space)
            pieces = built if isinstance(built, (list, tuple)) else [built]
            name = ", ".join(type(p).__name__ for p in pieces) or name
        except Exception:  # noqa: BLE001 - naming is best effort
            pass
        return name
    if not getattr(config, "add_default_connectors_to_learner_pipeline", True):
        return "a learner pipeline without RLlib's default pieces"
    return None


def check_learner_connector(config) -> None:
    """At the learner's build: Conduit's columns skip RLlib's learner connector pipeline,
    so a config that has pieces of its own must have the buffer deliver episodes (which
    ``enable()`` arranges). Pieces added after ``enable()`` would silently not run: refused."""
    custom = custom_learner_pieces(config)
    delivery = ((getattr(config, "replay_buffer_config", None) or {}).get("conduit") or {}).get("delivery")
    if custom and delivery != "episodes":
        raise ConfigError("training(learner_connector=...)", "conduit_rllib.enable() called after the learner "
                          "connector pieces were configured", custom, "call conduit_rllib.enable(config) again: "
                          "the buffer then delivers RLlib episodes and RLlib's whole learner pipeline runs")


def check_source_ingest(config) -> None:
    """``source_ingest=True`` needs remote env runners (they hold the writers) of RLlib's own class."""
    if config.num_env_runners < 1:
        raise ConfigError("num_env_runners", "an int >= 1 with source_ingest=True", config.num_env_runners,
                          "call config.env_runners(num_env_runners=2) (or more), or drop source_ingest")
    cls = config.env_runner_cls
    if cls is not None and getattr(cls, "__name__", "") not in ("SingleAgentEnvRunner", "ConduitEnvRunner"):
        raise ConfigError("env_runner_cls", "RLlib's SingleAgentEnvRunner with source_ingest=True", cls.__name__,
                          "drop env_runner_cls (Conduit sets its subclass of RLlib's runner), or source_ingest")
