"""The buffer's ingestion side: RLlib episode chunks stored in Conduit's core, with the
eviction rule of the RLlib buffer it stands in for.

``ConduitEpisodeReplayBuffer.add`` turns each chunk into columns and hands the chunks
over as ``(episode, columns, source, steps)``; this object stores them as rollouts,
``ingest_granularity`` per ingestion operator call, and keeps what delivery reads
beside the rows:

- sources: an RLlib episode id maps to one Conduit source (the core's episode key) while
  the episode runs; a done or evicted episode's id starts a new source if it comes back;
- the ledger (``episode_ledger``): which episodes are stored and where; its plans decide
  the evictions (``add_as_prioritized``: once per call, ``add_as_uniform``: after every
  chunk), carried out here with the data plane's ``evict``;
- the infos (``info_store``) and, for an episode stored from mid-way, its first chunk's
  lookback step (``columns.chunk_lookback_row``), recorded once the chunk is stored;
- ``added``: the steps stored so far (the n-th stored step has seq n).

The buffer builds the data plane on its first add (or restore) and ``attach``-es it
here; nothing is stored before that.

A chunk is an RLlib episode (its columns stored through the data plane) or a
``source_ingest.WrittenChunk`` (its rows staged by an env runner's writer: committed
through ``ExperienceBuffer.commit``, under the source this plan gives its episode). Both
go through the same plan; a call holds one kind (the buffer splits mixed lists).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from conduit_core import ExperienceDataPlane, Rollout

from .episode_ledger import EpisodeLedger
from .info_store import InfoStore
from .columns import episode_infos
from .source_ingest import chunk_infos, chunk_lookback


class EpisodeIngest:
    """Stores episode chunks in the data plane; owns the source map, the lookback rows and
    the count of stored steps, and writes the ledger and the infos it is given."""

    def __init__(self, ledger: EpisodeLedger, infos: InfoStore, *, capacity: int, store_infos: bool):
        self.ledger = ledger                     # stored episodes and RLlib's eviction rule
        self.infos = infos                       # RLlib's infos, beside the rows
        self.capacity = capacity                 # RLlib's capacity, in steps
        self.store_infos = store_infos
        self.edp: ExperienceDataPlane | None = None  # from attach()
        self.ring = 0                            # the data plane's slots (> capacity: ring_slack)
        self.sources: dict[str, int] = {}        # RLlib episode id -> source, while the episode runs
        self.source_ids: dict[int, str] = {}     # and back
        self.next_source = 0
        self.lookback_rows: dict[int, dict] = {}  # source -> its first chunk's lookback step (see columns)
        self.added = 0                           # steps stored
        self.duplicates = 0                      # written chunks committed before (a retried add)
        self.lost_rows = 0                       # written rows whose staging shard was gone at commit
        self.losses_seen = 0                     # the buffer's shard losses the ledger has dropped (sync_losses)

    def attach(self, edp: ExperienceDataPlane, *, ring: int) -> None:
        """Store into ``edp``, a data plane of ``ring`` slots."""
        self.edp, self.ring = edp, ring

    def source_of(self, ep) -> int:
        """The source (Conduit's episode key) of an RLlib episode id, a new one if none is open."""
        src = self.sources.get(ep.id_)
        if src is None:
            src = self.sources[ep.id_] = self.next_source
            self.source_ids[src] = ep.id_
            self.next_source += 1
        return src

    def continuing_source(self, ep, ends: dict) -> int:
        """The source of chunk ``ep`` in an ``add()``: its episode's where the chunk starts where the
        episode's stored steps (or an earlier chunk of this add, in ``ends``) end, else a new one.
        A chunk that starts later (RLlib dropped a ``sample()`` in between: ``sample_timeout_s``)
        starts a new part, so no n-step window or sequence runs across the missing steps (RLlib's
        own buffer fails there: ``concat_episode`` asserts the steps meet)."""
        src = self.sources.get(ep.id_)
        if src is not None:
            end = ends.get(src)
            if end is None:
                rec = self.ledger.episodes.get(src)
                end = None if rec is None else rec.t_started + rec.rows
            if end is not None and ep.t_started != end:
                self._forget_source(src)
                src = None
        if src is None:
            src = self.source_of(ep)
        ends[src] = ep.t_started + len(ep)
        return src

    # ------------------------------------------------------------------ adds
    def add_as_prioritized(self, chunks) -> None:
        """``PrioritizedEpisodeReplayBuffer.add``: one decision for the whole call (``plan``)."""
        if self._add_whole(chunks):
            return
        evict, drop = self.ledger.plan([(src, n) for _, _, src, n in chunks], self.capacity)
        keep = [c for c in chunks if c[2] not in drop] if drop else chunks
        if sum(n for *_, n in keep) > self.ring:
            from conduit_core import CapacityError
            raise CapacityError(f"add(): {sum(n for *_, n in keep)} new steps in one call exceed the buffer's ring "
                                f"of {self.ring} slots (capacity {self.capacity} x (1 + ring_slack)); RLlib's buffer "
                                "would hold them, over its capacity, until the next add evicts them. Nothing was "
                                "stored or evicted. Fix: raise the replay buffer's capacity (or ring_slack), or hand "
                                "over fewer steps per add.")
        for src in evict:
            self._evict_episode(src)
        dropped = [ep.receipt for ep, _, src, _ in chunks if src in drop and getattr(ep, "receipt", None)] \
            if drop else None
        if dropped:   # RLlib's rule drops them: their staged rows were never accepted
            from conduit_core.source.source_commit import decline
            decline(self.edp.buffer, dropped)
        for ep, _, src, _ in chunks:
            if ep.is_done or src in drop:  # over, or evicted: its id starts a new episode if it comes back
                self._forget_source(src)
        self._ingest_in_groups([(Rollout(cols, source=src, rows=n), ep) for ep, cols, src, n in keep])
        for ep, _, _, _ in keep:
            if ep.is_done:
                self._forget_source(self.sources.get(ep.id_, -1))

    def _add_whole(self, chunks) -> bool:
        """``add_as_prioritized``'s steps for episode chunks that all stay whole (an env step's
        add: one chunk, or two where an episode ended): none of their episodes is evicted by the
        plan, no stored episode is cut early by the ring, one ingestion operator call takes them
        all; without the general route's lists and groups. False (nothing done) otherwise."""
        if len(chunks) > self.edp.schedule.ingest_granularity:
            return False
        for ep, *_ in chunks:   # (a loop, not a generator: every env step's add comes here)
            if getattr(ep, "receipt", None) is not None:
                return False
        total = sum(n for *_, n in chunks) if len(chunks) > 1 else chunks[0][3]
        evict = () if self.ledger.rows + total <= self.capacity else \
            self.ledger.plan([(src, n) for _, _, src, n in chunks], self.capacity)[0]
        cutoff = self.added + total - self.ring   # (> 0 once the ring went round: the rows it overwrites)
        if total > self.ring or (evict and any(src in evict for _, _, src, _ in chunks)) \
                or (cutoff > 0 and self.ledger.ring_conflicts(cutoff)):
            return False
        for old in evict:
            self._evict_episode(old)
        if cutoff > 0:
            self.ledger.forget_below(cutoff)
        for ep, _, src, _ in chunks:
            if ep.is_done:   # over: its id starts a new episode if it comes back
                self._forget_source(src)
        if len(chunks) > 1:
            self._ingest([(Rollout(cols, source=src, rows=n), ep) for ep, cols, src, n in chunks])
            return True
        ep, cols, src, n = chunks[0]
        info = episode_infos(ep, n) if self.store_infos else None
        r = Rollout(cols, source=src, rows=n)
        self.edp.ingest_many([r])   # refuses bad input before storing anything: then nothing is recorded
        self._record(r, ep, info, self.added)
        return True

    def add_as_uniform(self, chunks) -> None:
        """``EpisodeReplayBuffer.add``: chunk by chunk, evicting after each (``plan_per_chunk``)."""
        sources: dict = {}  # plan key -> Conduit source
        group: list[tuple[Rollout, Any]] = []
        for step in self.ledger.plan_per_chunk([(src, n) for _, _, src, n in chunks], self.capacity):
            if step[0] == "add":
                _, i, key = step
                ep, cols, src, n = chunks[i]
                if key not in sources:
                    if isinstance(key, tuple):  # its episode left earlier in this call: it starts over
                        self._forget_source(src)
                        sources[key] = self.source_of(ep)
                    else:
                        sources[key] = key
                group.append((Rollout(cols, source=sources[key], rows=n), ep, key))
                continue
            sources.update(self._ingest_in_groups(group))  # what the plan added is stored before anything leaves
            group = []
            src = sources.get(step[1], step[1])
            if src in self.ledger.episodes:  # (not if the ring already cut it early)
                self._evict_episode(src)
        sources.update(self._ingest_in_groups(group))
        for ep, _, src, _ in chunks:
            if ep.is_done:
                self._forget_source(self.sources.get(ep.id_, src))

    # --------------------------------------------------------------- storing
    def _ingest_in_groups(self, rollouts: list) -> dict:
        """Store ``(rollout, episode[, plan key])`` items, ``ingest_granularity`` per call.

        The ring is larger than capacity; where these rows would still overwrite a stored
        step, the episode it would cut leaves first, whole (counted in ``eviction_report``
        as early: not RLlib's rule, raise ``ring_slack``), and a chunk of such an episode
        starts a new one. Returns plan key -> the source its chunks now go to."""
        moved: dict = {}
        if not rollouts:
            return moved
        cutoff = self.added + sum(item[0].rows for item in rollouts) - self.ring
        if cutoff > 0:
            early = set(self.ledger.ring_conflicts(cutoff))
            for src in early:
                self._evict_episode(src, early=True)
            self.ledger.forget_below(cutoff)
            fixed, renamed = [], {}
            for item in rollouts:
                r, ep = item[0], item[1]
                if r.source in early:
                    new = renamed.setdefault(r.source, self.source_of(ep))
                    r = Rollout(r.data, source=new, rows=r.rows)
                    if len(item) > 2:
                        moved[item[2]] = new
                fixed.append((r, ep))
            rollouts = fixed
        g = self.edp.schedule.ingest_granularity
        for k in range(0, len(rollouts), g):
            self._ingest([(item[0], item[1]) for item in rollouts[k:k + g]])
        return moved

    def _forget_source(self, src: int) -> None:
        ep_id = self.source_ids.pop(src, None)
        if ep_id is not None and self.sources.get(ep_id) == src:
            del self.sources[ep_id]

    def _evict_episode(self, src: int, *, early: bool = False) -> None:
        ranges = self.ledger.remove(src, early=early)
        self.lookback_rows.pop(src, None)
        self._forget_source(src)
        self.edp.evict(np.concatenate([np.arange(r.start, r.stop, dtype=np.int64) for r in ranges]))

    def _ingest(self, group: list[tuple[Rollout, Any]]) -> None:
        if getattr(group[0][1], "receipt", None) is not None:
            return self._commit_written(group)
        infos = [chunk_infos(ep, r.rows) if self.store_infos else None for r, ep in group]
        try:
            self.edp.ingest_many([r for r, _ in group])  # refuses bad input before storing any of the group
            stored = len(group)
        except BaseException as exc:
            stored = len(getattr(exc, "stored_tickets", ()))  # a later failure: the first ones are stored
            raise
        finally:
            for (r, ep), info in zip(group[:stored], infos):  # stored rows take the next seqs, in order
                self._record(r, ep, info, self.added)

    def _record(self, r: Rollout, ep, info, first: int) -> None:
        """A stored chunk: its episode's ledger entry, infos and lookback row (rows from seq ``first``)."""
        if r.source not in self.ledger.episodes and ep.t_started > 0:  # a stored episode starts mid-way
            row = chunk_lookback(ep)
            if row is not None:
                self.lookback_rows[r.source] = row
        self.ledger.record(r.source, first, r.rows, id_=ep.id_, t_started=ep.t_started)
        if info is not None:
            self.infos.put(first, info)
        self.added = first + r.rows

    def _commit_written(self, group: list[tuple[Rollout, Any]]) -> None:
        """Chunks env runners wrote: their receipts committed (each once), under the sources
        this plan gave their episodes. A chunk whose staged rows are gone is reported and
        left out (the commit's report says what the buffer took, at the seqs it took them)."""
        from dataclasses import replace

        from conduit_core import SemanticError
        buf = self.edp.buffer
        try:
            report = buf.commit([replace(ep.receipt, source=r.source) for r, ep in group])
        except BaseException as exc:   # what was stored before the failure is recorded, or a retry would skip it
            report = getattr(exc, "commit_report", None)   # what this commit stored before it failed
            done = {rec.key: seq for rec, seq in report.committed} if report is not None else {}
            for r, ep in group:
                seq = done.get(ep.receipt.key)
                if seq is not None and seq == self.added:
                    self._record(r, ep, ep.infos if self.store_infos else None, seq)
            raise
        lost = {rec.key for rec, _ in report.never_accepted}
        first = {rec.key: seq for rec, seq in report.committed}
        gaps = set()   # sources with a chunk lost in this call (the ring ended their part there)
        for r, ep in group:
            seq = first.get(ep.receipt.key)
            if ep.receipt.key in lost:   # its steps never arrived: the episode's next chunk starts a new part
                self._forget_source(r.source)
                gaps.add(r.source)
            if seq is None:
                continue
            if r.source in gaps:   # a later chunk of it in this call, stored: it starts that new part
                gaps.discard(r.source)
                self._split_after_gap(r.source, ep.id_)
            if seq != self.added:
                raise SemanticError(f"commit of writer {ep.receipt.writer[:8]} ticket {ep.receipt.ticket}: expected "
                                    f"its rows at seq {self.added} (the adapter is the buffer's only writer), got "
                                    f"{seq}. Fix: do not add to the buffer's data plane outside this adapter")
            self._record(r, ep, ep.infos if self.store_infos else None, seq)
        self.duplicates += len(report.duplicates)
        self.lost_rows += sum(rec.n for rec, _ in report.never_accepted)

    def _split_after_gap(self, src: int, ep_id: str) -> None:
        """Chunks of ``src`` were stored in one call after one of its chunks was lost: the steps
        stored before the gap become a part of their own (a new source, same place in the arrival
        order), and ``src`` goes on from the chunk after the gap (its next chunk continues it)."""
        if src in self.ledger.episodes:
            retired = self._new_source()
            self.ledger.retire(src, retired)
            if src in self.lookback_rows:
                self.lookback_rows[retired] = self.lookback_rows.pop(src)
        self.sources[ep_id] = src
        self.source_ids[src] = ep_id

    def sync_losses(self) -> int:
        """Drop the episodes with rows on remote shards lost since the last call (``drop_lost``);
        returns how many losses were new."""
        losses = self.edp.buffer.recovery.losses
        if len(losses) == self.losses_seen:   # (the usual case: one comparison)
            return 0
        new = losses[self.losses_seen:] if len(losses) > self.losses_seen else losses
        self.losses_seen = len(losses)
        self.drop_lost(new)
        return len(new)

    def after_losses(self, draw):
        """``draw()`` (a draw that reads rows it picked from the ledger) on a ledger synced with
        the buffer's losses; a read that finds rows lost under it (the shard died since the last
        sync: ``RowsNotStored``) is drawn again once the ledger knows."""
        from conduit_core import RowsNotStored
        self.sync_losses()
        try:
            return draw()
        except RowsNotStored:
            if not self.sync_losses():
                raise
            return draw()

    def drop_lost(self, losses) -> int:
        """The steps of stored episodes that ``losses`` (``ShardLoss``es: rows of a lost shard)
        took leave the ledger; what is left of each such episode splits into parts at the gaps
        (``EpisodeLedger.drop_steps``: no window, sequence or rebuilt episode runs across missing
        steps; RLlib's rule then evicts the parts whole, oldest first). A part after a gap has no
        lookback step (the step before it was lost). Returns the episodes cut."""
        runs = [run for loss in losses for run in loss.seq_runs]
        cut = self.ledger.holding(runs)
        for src in cut:
            lookback, t0 = self.lookback_rows.pop(src, None), self.ledger.episodes[src].t_started
            before = set(self.ledger.episodes)
            still = self.ledger.drop_steps(src, runs, self._new_source)
            first = next((s for s in self.ledger.episodes if s not in before or s == src), None)
            if lookback is not None and first is not None and self.ledger.episodes[first].t_started == t0:
                self.lookback_rows[first] = lookback   # the part that starts where the stored episode did
            if not still:
                self._forget_source(src)
        return len(cut)

    def _new_source(self) -> int:
        src, self.next_source = self.next_source, self.next_source + 1
        return src

    # ------------------------------------------------------------------ state
    def state(self) -> dict:
        """The source map, the count of stored steps and the lookback rows (plain values)."""
        return {"sources": [[k, v] for k, v in self.sources.items()], "next_source": self.next_source,
                "added": self.added, "source_ids": [[k, v] for k, v in self.source_ids.items()],
                "lookback_rows": [[src, row["cols"], row["info"]] for src, row in self.lookback_rows.items()]}

    def load(self, state: dict) -> None:
        self.sources = {k: int(v) for k, v in state["sources"]}
        self.next_source = int(state["next_source"])
        self.added = int(state["added"])
        self.source_ids = {int(k): v for k, v in state.get("source_ids", [])}
        self.lookback_rows = {int(src): {"cols": {k: np.asarray(v) for k, v in c.items()}, "info": i}
                              for src, c, i in state.get("lookback_rows", [])}
