"""The experience buffer: a ring of rows (which seq lives in which slot) over columnar storage, a
selector and a rate limiter, with its insert (all or nothing), its draws (single rows, n-step
windows, sequences, consumed FIFO), episode walks, state, shard loss and online migration.
``replay``, ``prioritized_replay`` and ``queue`` are its presets."""

from .experience_buffer import ExperienceBuffer, prioritized_replay, queue, replay
from .migration import BackgroundMigration
from .ring import Ring
from .shard_loss import ShardLoss

__all__ = ["BackgroundMigration", "ExperienceBuffer", "Ring", "ShardLoss", "prioritized_replay", "queue", "replay"]
