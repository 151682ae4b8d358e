"""``conduit_rllib.enable(config, **options)``: one call that sets up every extension point."""

from __future__ import annotations

import dataclasses

from conduit_core import ConfigError

from .options import ConduitOptions

BUFFER_TYPE = "conduit_rllib.replay_buffer.ConduitEpisodeReplayBuffer"


def enable(config, **options):
    opts = ConduitOptions.from_kwargs(options)
    from ray.rllib.algorithms.cql import CQLConfig
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.algorithms.marwil import MARWILConfig
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.algorithms.sac import SACConfig
    if isinstance(config, (MARWILConfig, CQLConfig)):   # BC is a MARWIL, CQL a SAC: offline first
        return _enable_offline(config, opts)
    if isinstance(config, (DQNConfig, SACConfig)):
        return _enable_replay(config, opts)
    if isinstance(config, PPOConfig):
        if opts.source_ingest:   # PPO's on-policy batches reach the learner connector, not a replay buffer
            raise ConfigError("source_ingest", "False for PPO (env runners write at the source for DQN, SAC and "
                              "TQC only)", True, "drop source_ingest=True for PPO, or use it with a DQN, SAC or "
                              "TQC config")
        from .ppo import enable_ppo
        return enable_ppo(config, opts)
    raise ConfigError("config", "a DQNConfig, SACConfig (TQCConfig too), PPOConfig, or an offline BCConfig, "
                      "MARWILConfig or CQLConfig (RLlib 2.60, new API stack)", type(config).__name__,
                      "use conduit_rllib with DQN, SAC, TQC, PPO, BC, MARWIL or CQL, or write an adapter "
                      "(docs/writing-an-adapter.md)")


def _replay_family(config):
    """(RLlib's algorithm, Conduit's, RLlib's torch learner, Conduit's) for a replay config.

    TQC before SAC before DQN: each is a subclass of the next in RLlib, and the learner
    and algorithm classes a config holds by default are its own algorithm's."""
    from ray.rllib.algorithms.dqn import DQN
    from ray.rllib.algorithms.dqn.torch.dqn_torch_learner import DQNTorchLearner
    from ray.rllib.algorithms.sac import SAC, SACConfig
    from ray.rllib.algorithms.sac.torch.sac_torch_learner import SACTorchLearner
    from ray.rllib.algorithms.tqc import TQC, TQCConfig
    from ray.rllib.algorithms.tqc.torch.tqc_torch_learner import TQCTorchLearner

    from .algorithms import ConduitDQN, ConduitSAC, ConduitTQC
    from .learner import ConduitDQNTorchLearner, ConduitSACTorchLearner, ConduitTQCTorchLearner
    if isinstance(config, TQCConfig):
        return TQC, ConduitTQC, TQCTorchLearner, ConduitTQCTorchLearner
    if isinstance(config, SACConfig):
        return SAC, ConduitSAC, SACTorchLearner, ConduitSACTorchLearner
    return DQN, ConduitDQN, DQNTorchLearner, ConduitDQNTorchLearner


def _enable_replay(config, opts: ConduitOptions):
    """DQN, SAC and TQC: one replay path (RLlib runs SAC and TQC with DQN's training step,
    DQN's buffer calls and the same train-batch columns); only the classes differ."""
    algo, conduit_algo, learner, conduit_learner = _replay_family(config)
    what = algo.__name__
    if config.framework_str != "torch":
        raise ConfigError("framework", "'torch'", repr(config.framework_str), "call config.framework('torch')")
    if config.is_multi_agent:
        raise ConfigError("config.multi_agent(policies=...)", f"a single-agent {what} config (conduit_rllib's "
                          "replay buffer stands in for RLlib's single-agent episode buffers)",
                          f"policies {sorted(map(str, config.policies))}",
                          f"run multi-agent {what} on RLlib's MultiAgentEpisodeReplayBuffer without "
                          "conduit_rllib.enable() (multi-agent PPO does run through Conduit)")
    rb = dict(config.replay_buffer_config)
    again = conduit_buffer_kwargs(rb)   # enable() called again: the buffer kind it chose stays
    rb_type = rb.pop("type", "PrioritizedEpisodeReplayBuffer")
    prioritized = again["prioritized"] if again is not None else buffer_kind(rb_type)
    rb.pop("prioritized", None)
    learner_cls = own_class(config.learner_class, learner, conduit_learner, "learner_class",
                            "config.learners(learner_class=...)")
    algo_cls = own_class(config.algo_class, algo, conduit_algo, "algo_class", "the config's algo_class")
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
    # SACConfig.validate() accepts only RLlib's four episode buffer names as the type, so a SAC
    # or TQC config keeps RLlib's name and the "conduit" key marks it (ConduitSAC builds it);
    # a DQN config names Conduit's class, which RLlib's own build then constructs.
    from ray.rllib.algorithms.dqn import DQNConfig
    names = {v: k for k, v in RLLIB_BUFFERS.items()}
    config.replay_buffer_config = {"type": BUFFER_TYPE if isinstance(config, DQNConfig) else names[prioritized],
                                   **keep, "prioritized": prioritized, "conduit": opts.to_dict(),
                                   "learner_shards": max(1, config.num_learners)}
    config.learners(learner_class=learner_cls)
    if opts.source_ingest:
        check_source_ingest(config)
        from .source_ingest import ConduitEnvRunner
        config.env_runners(env_runner_cls=ConduitEnvRunner)
    config.algo_class = algo_cls
    return config


#: what RLlib's offline pre-learner passes its buffer (``OfflinePreLearner.__init__``), and the keys of
#: ``prelearner_buffer_kwargs`` Conduit's buffer takes as RLlib's uniform buffer does
PRELEARNER_KWARGS = ("capacity", "batch_size_B", "batch_length_T", "metrics_num_episodes_for_smoothing")


def _enable_offline(config, opts: ConduitOptions):
    """BC, MARWIL and CQL: Conduit's buffer as the offline pre-learner's (``prelearner_buffer_class``),
    the buffer RLlib's ``OfflinePreLearner`` adds the episodes it reads to and samples each training
    batch from, uniformly, as RLlib's ``EpisodeReplayBuffer`` does (its default there). Only for recorded
    episodes (``input_read_episodes``, the route the tests hold equal to RLlib's): columns read as
    transitions go to the learner without a buffer, and sample batches are not certified here."""
    what = type(config).__name__
    if config.framework_str != "torch":
        raise ConfigError("framework", "'torch'", repr(config.framework_str), "call config.framework('torch')")
    if config.is_multi_agent:
        raise ConfigError("config.multi_agent(policies=...)", f"a single-agent {what}", f"policies "
                          f"{sorted(map(str, config.policies))}", f"run multi-agent {what} without conduit_rllib.enable()")
    if not config.input_read_episodes:
        raise ConfigError("config.offline_data(input_read_episodes=...)", "True: RLlib's pre-learner uses a buffer "
                          "for recorded episodes (sample batches are not certified here)", "False",
                          "record and read episodes (config.offline_data(input_read_episodes=True)); read as "
                          "transitions, RLlib feeds the learner without a buffer and Conduit is not in the path")
    if opts.mode != "sequential" or opts.source_ingest or opts.delivery not in (None, "episodes"):
        raise ConfigError("conduit_rllib.enable(mode=..., source_ingest=..., delivery=...)",
                          "mode='sequential', source_ingest=False, delivery None or 'episodes' for an offline config",
                          f"mode={opts.mode!r}, source_ingest={opts.source_ingest}, delivery={opts.delivery!r}",
                          "drop them: the pre-learner adds and samples in one call, with RLlib's connector pipeline")
    if getattr(config, "burnin_len", 0):
        raise ConfigError("burnin_len", "0 (RLlib's pre-learner then asks one-step episodes)",
                          repr(config.burnin_len), "run burn-in offline configs without conduit_rllib.enable(): "
                          "Conduit's buffer draws no burn-in windows")
    from .replay_buffer import ConduitEpisodeReplayBuffer
    if config.prelearner_buffer_class not in (None, ConduitEpisodeReplayBuffer):
        raise ConfigError("config.offline_data(prelearner_buffer_class=...)", "None (RLlib's EpisodeReplayBuffer) "
                          "for enable() to replace", config.prelearner_buffer_class.__name__,
                          "drop your buffer class, or run without conduit_rllib.enable() to keep it")
    kwargs = dict(config.prelearner_buffer_kwargs or {})
    kwargs.pop("conduit", None)   # enable() called again: its options are replaced
    kwargs.pop("fresh_seed", None)
    extra = sorted(set(kwargs) - set(PRELEARNER_KWARGS))
    if extra:
        raise ConfigError(f"prelearner_buffer_kwargs[{extra[0]!r}]", f"one of {list(PRELEARNER_KWARGS)}",
                          repr(extra[0]), "remove the key; Conduit's buffer has no equivalent")
    opts = dataclasses.replace(opts, delivery="episodes")   # the pre-learner runs RLlib's connectors on episodes
    # each Ray Data worker's pre-learner draws from its own fresh seed, as RLlib's unseeded buffer does,
    # unless the seed option fixes it
    config.offline_data(prelearner_buffer_class=ConduitEpisodeReplayBuffer,
                        prelearner_buffer_kwargs={**kwargs, "conduit": opts.to_dict(), "fresh_seed": True})
    return config


#: RLlib's two single-agent episode buffers, by the names ``replay_buffer_config["type"]`` takes
RLLIB_BUFFERS = {"EpisodeReplayBuffer": False, "PrioritizedEpisodeReplayBuffer": True}


def conduit_buffer_kwargs(rb: dict) -> dict | None:
    """The keyword arguments of ``ConduitEpisodeReplayBuffer`` a ``replay_buffer_config``
    that ``enable()`` wrote asks for (``prioritized`` among them), or None where it is not one:
    the type names Conduit's class (DQN), or RLlib's with the ``"conduit"`` key (SAC, TQC). The
    buffer kind is the type's where the type says it (RLlib's name, one a user set after
    ``enable()`` included), else the ``prioritized`` that ``enable()`` wrote."""
    rb_type = rb.get("type")
    if rb_type == BUFFER_TYPE:
        return {"prioritized": False, **{k: v for k, v in rb.items() if k != "type"}}
    if "conduit" in rb and isinstance(rb_type, str) and rb_type in RLLIB_BUFFERS:
        return {**{k: v for k, v in rb.items() if k != "type"}, "prioritized": RLLIB_BUFFERS[rb_type]}
    return None


def buffer_kind(rb_type) -> bool:
    """Whether the buffer type a DQN config names is RLlib's prioritized one (True) or its
    uniform one (False). Anything else is refused: Conduit's buffer stands in for exactly
    these two, and a subclass's own overrides (or a multi-agent buffer) would be dropped."""
    from ray.rllib.utils.replay_buffers.episode_replay_buffer import EpisodeReplayBuffer
    from ray.rllib.utils.replay_buffers.prioritized_episode_buffer import PrioritizedEpisodeReplayBuffer
    classes = {EpisodeReplayBuffer: False, PrioritizedEpisodeReplayBuffer: True}
    if isinstance(rb_type, type) and rb_type in classes:
        return classes[rb_type]
    if isinstance(rb_type, str):
        module, _, name = rb_type.rpartition(".")
        if name in RLLIB_BUFFERS and module in ("", "ray.rllib.utils.replay_buffers",
                                                f"ray.rllib.utils.replay_buffers.{_module_of(name)}"):
            return RLLIB_BUFFERS[name]
    shown = rb_type if isinstance(rb_type, str) else getattr(rb_type, "__qualname__", repr(rb_type))
    raise ConfigError("replay_buffer_config['type']", "RLlib's EpisodeReplayBuffer or PrioritizedEpisodeReplayBuffer",
                      repr(shown), "Conduit's buffer stands in for those two only (a subclass's overrides, or a "
                      "multi-agent buffer, would be dropped): use one of them, or run without conduit_rllib")


def _module_of(name: str) -> str:
    return "prioritized_episode_buffer" if name == "PrioritizedEpisodeReplayBuffer" else "episode_replay_buffer"


def own_class(current, default, conduit_cls, name: str, where: str):
    """The class ``enable()`` sets for ``name``: Conduit's where the config holds RLlib's
    default (or nothing), the config's own where it already subclasses Conduit's (an
    ``enable()`` called again, or a user's class built on Conduit's). A user's subclass of
    RLlib's class is refused: replacing it would drop its overrides (its loss, its training
    step) without a word."""
    if current is None or current is default:
        return conduit_cls
    if isinstance(current, type) and issubclass(current, conduit_cls):
        return current
    shown = getattr(current, "__qualname__", repr(current))
    raise ConfigError(name, f"RLlib's {default.__name__} or a subclass of "
                      f"{conduit_cls.__module__}.{conduit_cls.__name__}", shown,
                      f"derive {shown} from {conduit_cls.__module__}.{conduit_cls.__name__} (RLlib's "
                      f"{default.__name__} with Conduit's hooks) instead of {default.__name__}, and set it "
                      f"through {where} before conduit_rllib.enable()")


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
