"""The data plane's placement calls: ``migrate`` and ``replan`` move the buffer to other
shards while ingestion and delivery go on (``migration`` does the copy, ``placement``
the plan). Mixed into ``ExperienceDataPlane``."""

from __future__ import annotations


class PlacementMixin:
    """Needs the data plane's ``buffer``, ``_cond``, ``_prepared`` and ``_check_usable``."""

    def migrate(self, *, shards, capacity: int | None = None, background: bool = True,
                max_hold_s: float = 0.002, chunk_bytes: int | None = None):
        """Move the buffer to ``shards`` (optionally growing ``capacity``) while ingestion and
        delivery go on. Returns a handle whose ``wait()`` joins the copy (background), or
        None after a blocking migration. Prepared deliveries are dropped (their rows may move).
        In the background, each chunk of the copy holds the buffer's lock about ``max_hold_s``
        (the longest a delivery or insert waits for it); ``chunk_bytes`` fixes the chunk size
        instead. A blocking migration copies in the largest chunks, since everything waits
        for it anyway."""
        from .migration import MAX_CHUNK_BYTES, BackgroundMigration, begin_migration
        self._check_usable()
        with self._cond:
            self._prepared.drop_locked()
        m = begin_migration(self.buffer, shards=shards, capacity=capacity, max_hold_s=max_hold_s,
                            chunk_bytes=chunk_bytes if background else MAX_CHUNK_BYTES, start=not background)
        if background:
            return BackgroundMigration(m)
        try:
            m.finish()
        except BaseException:   # before the swap: the buffer keeps its layout, the new one (its actors) goes
            if not m.done:
                m.abort()
            raise
        return None

    def replan(self, plan, topology, *, background: bool = True, max_hold_s: float = 0.002,
               chunk_bytes: int | None = None):
        """Carry out a placement ``Plan`` (see placement.plan) on ``topology``: one shard per
        assigned tier (a 'remote' tier's name is the Ray custom resource of its node)."""
        from .placement import shard_specs
        return self.migrate(shards=shard_specs(plan, topology), capacity=sum(a.slots for a in plan.assignments),
                            background=background, max_hold_s=max_hold_s, chunk_bytes=chunk_bytes)
