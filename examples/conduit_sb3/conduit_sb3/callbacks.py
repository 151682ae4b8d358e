"""The data plane's metrics in SB3's own logger (``conduit/...`` beside ``rollout/`` and ``train/``),
so a user sees Conduit working where they read the rest of their run (TensorBoard, CSV, stdout)."""

from __future__ import annotations

import logging

from stable_baselines3.common.callbacks import BaseCallback

from .buffers import _ConduitStorage

log = logging.getLogger(__name__)


class ConduitMetricsCallback(BaseCallback):
    """Records the replay buffer's data-plane metrics after each rollout collection, under
    ``conduit/``: the core's ``MetricsSnapshot.scalars()`` (``buffer_size``, ``inserted`` (rows stored so
    far), per control point the calls and the time the learner was blocked in it, e.g.
    ``conduit/deliver_blocked_ms``, cumulative, and the prepared-batch counters of an overlapped
    schedule). A model whose buffer is not Conduit's records nothing and says so once."""

    def _on_training_start(self) -> None:
        self._on = isinstance(getattr(self.model, "replay_buffer", None), _ConduitStorage)
        if not self._on:
            log.warning("conduit_sb3: ConduitMetricsCallback on a model whose replay buffer is %s, not Conduit's: "
                        "nothing to record (pass replay_buffer_class=ConduitReplayBuffer)",
                        type(getattr(self.model, "replay_buffer", None)).__name__)

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        if not self._on:
            return
        for name, value in self.model.replay_buffer.edp.metrics().scalars().items():
            self.logger.record(f"conduit/{name}", value)
