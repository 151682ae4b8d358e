"""Conduit for RLlib 2.60 (new API stack), without changing RLlib's execution logic.

One call opts an algorithm config in::

    import conduit_rllib
    config = conduit_rllib.enable(DQNConfig().environment("CartPole-v1"), mode="sequential")
    algo = config.build_algo()

Stage map (RLlib stage -> Conduit control point):

    env runners' episodes ---------> ingestion   (episodes -> columns, once; codecs; links)
    local_replay_buffer.sample() --> delivery    (select, n-step, gather, weights)
    learner connector pipeline ----> delivery    (columns -> the learner's tensors, device move)
    update_priorities(td_error) ---> delivery    (priority update of the delivered rows)
    Algorithm.save_to_path --------> state       (the buffer saved beside the checkpoint)

Everything is reached through RLlib's own extension points: ``replay_buffer_config``
(for DQN the dotted-string type; for SAC and TQC, whose validation takes only RLlib's
buffer names, RLlib's name and a ``"conduit"`` key), ``.learners(learner_class=...)`` and
the config's ``algo_class`` (a subclass that builds Conduit's buffer and adds buffer
checkpointing, writers for ``source_ingest`` and the data plane's counters in the result).
Build with ``config.build_algo()`` (or ``tune.Tuner(config.algo_class, ...)``): RLlib's
own class ignores the ``"conduit"`` key, which the learner then refuses at its first
update. RLlib is imported lazily: importing this package costs nothing until ``enable``
is called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .options import ConduitOptions

if TYPE_CHECKING:
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

__all__ = ["ConduitOptions", "enable"]


def enable(config: AlgorithmConfig, *, mode: str = "sequential", worker: str = "thread", staleness: int = 0,
           depth: int = 2, obs_codec: str | None = "auto", tier: str = "pageable", reuse_outputs: int = 2,
           seed: int | None = None, delivery_granularity: int = 1, ingest_granularity: int = 16,
           autotune_settle: tuple[int, int] = (40, 2000), autotune_steps_per_phase: int = 40,
           restore_missing_buffer: bool = False, ring_slack: float = 0.25, delivery: str | None = None,
           store_infos: bool = True, source_ingest: bool = False, source_nodes: tuple[str, ...] = (),
           **misspelt: Any) -> AlgorithmConfig:
    """Opt an RLlib ``AlgorithmConfig`` (DQN, SAC, TQC, PPO, or offline BC, MARWIL or CQL reading
    recorded episodes) into Conduit; returns the config.

    Every option is :class:`ConduitOptions`' field of the same name and default (a test holds
    them equal), validated now. The ones most runs set:

    - ``mode``: 'sequential' (RLlib's exact semantics, inline), 'overlapped' (a worker ingests and
      prepares the next batch) or 'auto' (profile, then the cost model decides);
    - ``staleness``: inserts a prepared batch may miss (0: RLlib's semantics);
    - ``tier``: where the buffer lives ('pageable', 'pinned', 'device', ...; ``conduit info`` lists them);
    - ``delivery``: 'columns' (the learner's tensors), 'episodes' (RLlib's whole learner connector
      pipeline runs) or None (episodes only where the config has connector pieces of its own);
    - ``source_ingest``: remote env runners write their chunks into the buffer at the source (DQN,
      SAC, TQC).

    ``misspelt``: an unknown name is refused naming the known ones (ConfigError), and the old
    ``schedule=`` is taken as ``mode=`` with a DeprecationWarning."""
    options = dict(mode=mode, worker=worker, staleness=staleness, depth=depth, obs_codec=obs_codec, tier=tier,
                   reuse_outputs=reuse_outputs, seed=seed, delivery_granularity=delivery_granularity,
                   ingest_granularity=ingest_granularity, autotune_settle=autotune_settle,
                   autotune_steps_per_phase=autotune_steps_per_phase, restore_missing_buffer=restore_missing_buffer,
                   ring_slack=ring_slack, delivery=delivery, store_infos=store_infos, source_ingest=source_ingest,
                   source_nodes=source_nodes)
    if "schedule" in misspelt and mode == "sequential":
        del options["mode"]   # (ConduitOptions.from_kwargs maps the old name, warning)
    from .opt_in import enable as _enable
    return _enable(config, **options, **misspelt)
