"""The data plane's metrics in SB3's own logger (``conduit/...`` beside ``rollout/`` and ``train/``),
so a user sees Conduit working where they read the rest of their run (TensorBoard, CSV, stdout)."""

from __future__ import annotations

import logging

from stable_baselines3.common.callbacks import BaseCallback

from .buffers import _ConduitStorage

log = logging.getLogger(__name__)


class ConduitMetricsCallback(BaseCallback):
    """Records the replay buffer's data-plane metrics after each rollout collection:
    ``conduit/buffer_size``, ``conduit/inserted`` (rows stored so far), per control point the calls and
    the time the learner was blocked in it (``conduit/ingest_blocked_ms``, ``conduit/deliver_blocked_ms``,
    cumulative), and the prepared-batch counters of an overlapped schedule. A model whose buffer is not
    Conduit's records nothing and says so once."""

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
        m = self.model.replay_buffer.edp.metrics()
        record = self.logger.record
        record("conduit/buffer_size", m.buffer_size)
        record("conduit/inserted", m.inserted)
        for point in ("ingest", "deliver"):
            cp = getattr(m, point)
            record(f"conduit/{point}_calls", cp.calls)
            record(f"conduit/{point}_blocked_ms", cp.blocked_s * 1e3)
        if m.prefetch_hits or m.prefetch_discards:
            record("conduit/prefetch_hits", m.prefetch_hits)
            record("conduit/prefetch_discards", m.prefetch_discards)
