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

from .options import ConduitOptions

__all__ = ["ConduitOptions", "enable"]


def enable(config, **options):
    """Opt an RLlib ``AlgorithmConfig`` (DQN, SAC, TQC or PPO) into Conduit; returns the config.

    Options (all keyword, validated now): see :class:`ConduitOptions`."""
    from .opt_in import enable as _enable
    return _enable(config, **options)
