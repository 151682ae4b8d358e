"""Conduit adapter for Stable-Baselines3: a worked third-party example.

Stage map (SB3 stage -> Conduit control point):

    ReplayBuffer.add(obs, next_obs, action, reward, done, infos)  -> ingestion (a step staged; a block of
                                                                     up to 64 steps per ingestion)
    ReplayBuffer.sample(batch_size, env)                          -> delivery  (uniform selection + gather)

Use it through SB3's own argument: ``DQN(..., replay_buffer_class=ConduitReplayBuffer)`` (or
``ConduitDictReplayBuffer`` for dict observations); ``ConduitMetricsCallback`` puts the data plane's
metrics in SB3's logger. The conformance suite runs it as
``conduit conformance sb3``.
"""

__version__ = "0.1.0"

from .buffers import ConduitDictReplayBuffer, ConduitReplayBuffer  # noqa: E402
from .callbacks import ConduitMetricsCallback  # noqa: E402

__all__ = ["ConduitDictReplayBuffer", "ConduitMetricsCallback", "ConduitReplayBuffer"]
