"""RLlib's eviction rule, as bookkeeping over Conduit's ring: which episodes are stored,
where their steps sit (seq ranges), and which to evict when new steps come in.

RLlib's episode buffers hold whole episodes in the order they first arrived and, when an
``add()`` takes them past ``capacity`` steps, evict the oldest episodes, whole, until the
steps fit or one episode is left (an episode longer than capacity is held, overflowing);
a new chunk of an episode evicted in the same call is dropped, and later chunks of it
start a new episode (``PrioritizedEpisodeReplayBuffer.add``). Conduit's ring would evict
the oldest *steps* instead. The ledger makes the decisions (pure: ``plan``); the buffer
carries them out with ``ExperienceBuffer.evict``.

The ring itself is larger than ``capacity`` (``ring_slack``), so what RLlib keeps stays
stored; if the ring would still overwrite a stored step (episodes interleaved across many
env runners, or one episode longer than the ring), ``ring_conflicts`` names the episodes
it would cut and the buffer evicts them whole (counted: a deviation from RLlib's rule).

Seqs are counted by the adapter (the n-th stored step has seq n): the adapter is the
buffer's only writer, refuses bad input before accepting it, and records a chunk only once
it is stored (a group that fails part-way names the rollouts it stored).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

import numpy as np

from conduit_core import SemanticError


@dataclass
class EpisodeRecord:
    rows: int = 0                                   # steps stored
    chunks: list[tuple[int, int]] = field(default_factory=list)  # (first seq, steps)
    id_: str | None = None                          # RLlib's episode id
    t_started: int = 0                              # env step of the first stored step

    def seqs(self) -> list[range]:
        return [range(first, first + n) for first, n in self.chunks]


class EpisodeIndex:
    """Where stored steps sit in their episodes, as RLlib's buffers address them: episode
    (in arrival order) and step within the stored episode. Built from the ledger's records
    (immutable; the ledger builds a new one after a change). Every lookup is vectorized."""

    def __init__(self, episodes: "OrderedDict[int, EpisodeRecord]"):
        self.sources = np.fromiter(episodes.keys(), dtype=np.int64, count=len(episodes))
        self.records = list(episodes.values())
        self.lengths = np.fromiter((r.rows for r in self.records), dtype=np.int64, count=len(self.records))
        self.starts = np.concatenate([[0], np.cumsum(self.lengths)])  # global step index of each episode's step 0
        self.total = int(self.starts[-1])
        chunks = [(first, n, e) for e, r in enumerate(self.records) for first, n in r.chunks]
        c = np.array(chunks, dtype=np.int64).reshape(-1, 3)
        self._first, self._n, self._ep = c[:, 0], c[:, 1], c[:, 2]
        # chunks in episode order are in global-step order too
        self._gpos = np.concatenate([[0], np.cumsum(self._n)[:-1]]) if c.shape[0] else np.zeros(0, np.int64)
        self._by_seq = np.argsort(self._first, kind="stable")

    def seq_at(self, episode: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """Seq of step ``pos`` of stored episode number ``episode`` (arrival order)."""
        g = self.starts[np.asarray(episode)] + np.asarray(pos)
        k = np.searchsorted(self._gpos, g, side="right") - 1
        return self._first[k] + (g - self._gpos[k])

    def from_global(self, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(episode, step) of global stored-step indices (RLlib's ``_indices`` order)."""
        e = np.searchsorted(self.starts, g, side="right") - 1
        return e, g - self.starts[e]

    def locate(self, seqs) -> tuple[np.ndarray, np.ndarray]:
        """(episode, step within the stored episode) of stored rows ``seqs``."""
        seqs = np.asarray(seqs, dtype=np.int64)
        first = self._first[self._by_seq]
        k = np.searchsorted(first, seqs, side="right") - 1
        ok = k >= 0
        kk = self._by_seq[np.where(ok, k, 0)]
        ok &= seqs < self._first[kk] + self._n[kk]
        if not ok.all():
            raise SemanticError(f"episode ledger: seq {int(seqs[np.argmin(ok)])} is in no stored episode. "
                                "Fix: this is a bookkeeping bug in conduit_rllib; please report it.")
        e = self._ep[kk]
        pos = self._gpos[kk] - self.starts[e] + (seqs - self._first[kk])
        return e, pos


class EpisodeLedger:
    def __init__(self) -> None:
        self.episodes: OrderedDict[int, EpisodeRecord] = OrderedDict()  # source -> record, first arrival order
        self.rows = 0                                # steps stored
        self.evicted_episodes = 0
        self.evicted_rows = 0
        self.early_episodes = 0                      # evicted because the ring would cut them (not RLlib's rule)
        self.lost_episodes = 0                       # episodes whose every step a lost shard took (not evicted)
        self.lost_rows = 0                           # steps lost shards took (drop_steps)
        self._by_seq: deque[tuple[int, int, int]] = deque()  # (first seq, steps, source), in seq order
        self._index: EpisodeIndex | None = None      # built on demand, dropped on every change
        self._ids: dict[str, int] | None = None      # the same for stored_ids()

    # ------------------------------------------------------------- decisions (pure)
    def plan(self, new: list[tuple[int, int]], capacity: int) -> tuple[list[int], set[int]]:
        """RLlib's rule for one ``add()`` of chunks ``new`` = [(source, steps), ...]: the
        stored episodes to evict (oldest first) and the new chunks' sources to drop."""
        total = self.rows + sum(n for _, n in new)
        if total <= capacity:   # the usual call: nothing leaves (no pass over the stored episodes)
            return [], set()
        new_sources = {s for s, _ in new}
        # episodes stored or arriving; RLlib stops evicting when one is left
        remaining = len(self.episodes) + sum(1 for s in new_sources if s not in self.episodes)
        evict: list[int] = []
        for src, rec in self.episodes.items():
            if total <= capacity or remaining == 1:
                break
            evict.append(src)
            remaining -= 1
            total -= rec.rows + sum(n for s, n in new if s == src)
        return evict, set(evict) & new_sources

    def plan_per_chunk(self, new: list[tuple[int, int]], capacity: int) -> list[tuple]:
        """RLlib's ``EpisodeReplayBuffer.add`` (the uniform buffer's rule, unlike the
        prioritized one's ``plan``): chunk by chunk, each joins its episode (or starts one at
        the end), then the oldest episodes leave, whole, while the steps exceed ``capacity``
        and more than one episode is stored; an episode evicted in this call that gets
        another chunk later starts over as a new episode. Pure. Returns the steps in order:
        ``("add", i, key)`` (chunk i joins episode ``key``) and ``("evict", key)``, where
        ``key`` is a stored source or ``("new", i)`` for an episode restarted by chunk i."""
        order: OrderedDict = OrderedDict((src, rec.rows) for src, rec in self.episodes.items())
        total = self.rows
        alias: dict = {}
        evicted: set = set()
        steps: list[tuple] = []
        for i, (src, n) in enumerate(new):
            key = alias.get(src, src)
            if key in evicted:
                key = alias[src] = ("new", i)
            order[key] = order.get(key, 0) + n
            total += n
            steps.append(("add", i, key))
            while total > capacity and len(order) > 1:
                old, rows = order.popitem(last=False)
                evicted.add(old)
                total -= rows
                steps.append(("evict", old))
        return steps

    def ring_conflicts(self, cutoff: int) -> list[int]:
        """Stored episodes with a step below seq ``cutoff`` (the ring is about to overwrite it)."""
        out = []
        for first, n, src in self._by_seq:
            if first >= cutoff:
                break
            if src in self.episodes and src not in out:
                out.append(src)
        return out

    # ------------------------------------------------------------- bookkeeping
    def _changed(self) -> None:
        self._index = self._ids = None

    def stored_ids(self) -> dict[str, int]:
        """RLlib's ids of the stored episodes, each with its position among them (oldest first):
        built once after each change (RLlib's offline pre-learner asks once per episode it reads)."""
        if self._ids is None:
            self._ids = {rec.id_: i for i, rec in enumerate(self.episodes.values()) if rec.id_ is not None}
        return self._ids

    def index(self) -> EpisodeIndex:
        if self._index is None:
            self._index = EpisodeIndex(self.episodes)
        return self._index

    def record(self, source: int, first: int, n: int, *, id_: str | None = None, t_started: int = 0) -> None:
        self._changed()
        rec = self.episodes.get(source)
        if rec is None:
            rec = self.episodes[source] = EpisodeRecord(id_=id_, t_started=int(t_started))
        rec.rows += n
        rec.chunks.append((first, n))
        self.rows += n
        self._by_seq.append((first, n, source))

    def remove(self, source: int, *, early: bool = False) -> list[range]:
        """Forget an episode; returns the seq ranges of its steps (for ``evict``)."""
        self._changed()
        rec = self.episodes.pop(source)
        self.rows -= rec.rows
        self.evicted_episodes += 1
        self.evicted_rows += rec.rows
        self.early_episodes += early
        return rec.seqs()

    def holding(self, runs) -> list[int]:
        """Sources of the stored episodes with a step in any of the seq runs ``runs``
        ((first, last) each, inclusive; ``ShardLoss.seq_runs``)."""
        if not runs:
            return []
        lo, hi = np.array([a for a, _ in runs], np.int64), np.array([b for _, b in runs], np.int64)
        out = []
        for src, rec in self.episodes.items():
            for first, n in rec.chunks:   # a run [a, b] meets [first, first + n) where a < first + n and b >= first
                if np.any((lo < first + n) & (hi >= first)):
                    out.append(src)
                    break
        return out

    def drop_steps(self, source: int, runs, new_source) -> bool:
        """Forget the steps of ``source``'s episode whose seqs lie in ``runs`` (rows a lost shard
        took); the steps left split into parts at each gap, in the episode's place of the arrival
        order, each a new source (``new_source()``) but the last, which keeps ``source`` if it
        reaches the episode's stored end (its next chunk continues it). Counted in ``lost_rows``
        (and ``lost_episodes`` if no step is left). Returns whether ``source`` is still stored."""
        self._changed()
        rec = self.episodes[source]
        seqs = np.concatenate([np.arange(a, a + n, dtype=np.int64) for a, n in rec.chunks])
        gone = np.zeros(seqs.size, bool)
        for a, b in runs:
            gone |= (seqs >= a) & (seqs <= b)
        edges = np.flatnonzero(np.diff(np.concatenate([[1], gone.view(np.int8), [1]])))   # kept runs: [edges[2i], edges[2i+1])
        parts = []
        for i, j in zip(edges[::2].tolist(), edges[1::2].tolist()):
            run = seqs[i:j]
            cut = np.flatnonzero(np.diff(run) != 1) + 1   # chunks: runs of consecutive seqs
            starts = np.concatenate([[0], cut]).tolist()
            ends = np.concatenate([cut, [run.size]]).tolist()
            parts.append(EpisodeRecord(rows=j - i, chunks=[(int(run[a]), b - a) for a, b in zip(starts, ends)],
                                       id_=rec.id_, t_started=rec.t_started + i))
        lost = int(gone.sum())
        self.rows -= lost
        self.lost_rows += lost
        self.lost_episodes += not parts
        keeps = bool(parts) and not gone[-1]
        named = [(new_source(), p) for p in (parts[:-1] if keeps else parts)] + ([(source, parts[-1])] if keeps else [])
        out: OrderedDict = OrderedDict()
        for s, r in self.episodes.items():
            if s == source:
                out.update(named)
            else:
                out[s] = r
        self.episodes = out
        self._by_seq = deque(sorted((a, n, s) for s, r in out.items() for a, n in r.chunks))
        return keeps

    def retire(self, source: int, new_source: int) -> None:
        """The stored steps of ``source`` become the episode part ``new_source``, in the same place
        of the arrival order (``source``'s later steps start a new part: steps in between are
        missing)."""
        self._changed()
        self.episodes = OrderedDict((new_source if s == source else s, r) for s, r in self.episodes.items())
        self._by_seq = deque((a, n, new_source if s == source else s) for a, n, s in self._by_seq)

    def stored_seqs(self) -> np.ndarray:
        """The seqs of every stored step, episode by episode (arrival order), chunk by chunk."""
        ranges = [r for rec in self.episodes.values() for r in rec.seqs()]
        return (np.concatenate([np.arange(r.start, r.stop, dtype=np.int64) for r in ranges]) if ranges
                else np.zeros(0, dtype=np.int64))

    def forget_below(self, cutoff: int) -> None:
        """Drop index entries wholly below ``cutoff`` (the ring has reused their slots)."""
        while self._by_seq and self._by_seq[0][0] + self._by_seq[0][1] <= cutoff:
            self._by_seq.popleft()

    # ------------------------------------------------------------------- state
    def state(self) -> dict:
        return {"episodes": [[s, r.rows, [list(c) for c in r.chunks], r.id_, r.t_started]
                             for s, r in self.episodes.items()],
                "by_seq": [list(x) for x in self._by_seq], "rows": self.rows,
                "evicted": [self.evicted_episodes, self.evicted_rows, self.early_episodes],
                "lost": [self.lost_episodes, self.lost_rows]}

    def load(self, state: dict) -> None:
        self._changed()
        self.episodes = OrderedDict(
            (int(e[0]), EpisodeRecord(int(e[1]), [(int(a), int(b)) for a, b in e[2]],
                                      *((e[3], int(e[4])) if len(e) > 3 else ())))  # ids: since 2026-11-30
            for e in state["episodes"])
        self._by_seq = deque((int(a), int(b), int(c)) for a, b, c in state["by_seq"])
        self.rows = int(state["rows"])
        self.evicted_episodes, self.evicted_rows, self.early_episodes = (int(x) for x in state["evicted"])
        self.lost_episodes, self.lost_rows = (int(x) for x in state.get("lost", (0, 0)))   # since 2026-12-03
