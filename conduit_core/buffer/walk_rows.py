"""The rows an n-step window walk may read, fetched in one gather before it walks.

Why: where the storage offers no host views the native walk can read directly (a remote shard,
several shards), windows were walked by the Python reference
(``EpisodeWalk.sample_windows_reference``), which read each row's reward and done flags as it
went: one ``storage.gather`` per field and step, and on a remote shard each of those a Ray round
trip. A B=32 draw with RLlib's n-step (2, 5) made 224-247 of them (0.4-0.56 s per ``sample()``;
in RLlib's DQN with env runners writing at the source, 15-17 s per 300-step iteration).

The rows a pool of uniforms can reach are known before the walk. Every try takes the same number
of uniforms (``need``: the start, and n where n is drawn), so each try's start follows from its
own first uniform alone, and its window runs at most ``n_hi - 1`` rows down the episode links,
which are metadata on this host. ``window_candidates`` lists them (from the source, the
selector's tree and the uniforms); ``ScratchWalkViews`` takes them in one gather (each shard's
part started before any is awaited) and the native walk runs on it, consuming the same uniforms
and reading the same values as on one host shard. Where the stored columns are not what the
native walk reads (a reward that is not one float32, done flags that are not bool), the Python
reference walks on ``PrefetchedRows`` instead, operation for operation as before. The vectorized
walk of the shortened-window rule (``EpisodeWalk.n_step_returns_numpy``), which read each field
once per step (``3 * n`` round trips), reads ``linked_rows`` the same way.

Tested: tests/core/test_walk_rows.py (two shards against one host shard, batch for batch, both
routes, and the gathers counted), tests/core/test_review_regressions.py (the native walk against
the Python reference), tests/distributed/test_remote_tier.py (a remote shard on a two-node
Cluster, its round trips counted).
"""

from __future__ import annotations

import numpy as np
import torch

from .ring import stored_successors

try:
    from .._native._sumtree import find as _c_find  # the prefix-sum search the native walk makes
except ImportError:  # pragma: no cover - no C compiler where it was installed
    _c_find = None


def window_candidates(source: tuple, selector, u: np.ndarray, n_lo: int, n_hi: int) -> np.ndarray:
    """Every slot the reference walk may read for the uniforms ``u`` drawn from ``source``
    (``window_source``'s tuple): each try's start and up to ``n_hi - 2`` successors along its
    episode's stored links, sorted and unique. A superset: the walk stops earlier at a done row,
    and the last tries of the pool are read only where the earlier ones were redrawn."""
    prioritized, sums, _mins, tsize, lo, count, cap, seq, next_seq = source
    need = 2 if n_hi - n_lo > 1 else 1
    tries = u.shape[0] // need
    if tries == 0:
        return np.empty(0, dtype=np.int64)
    first = u[0:tries * need:need]   # each try's first uniform picks its start, as the walk does
    if prioritized:   # the search the walk makes, on the trees it is given
        targets = np.ascontiguousarray(first * float(sums[1]))
        if _c_find is not None:
            starts = np.empty(tries, dtype=np.int64)
            _c_find(sums, tsize, targets, starts)
        else:   # pragma: no cover - no C helper: the selector's own search (the same descent)
            starts = np.asarray(selector.index.find_prefixsum(targets), dtype=np.int64)
    else:
        offsets = np.minimum((first * float(count)).astype(np.int64), count - 1)
        starts = (lo + offsets) % cap
    # a window of n rows reads its start and n - 1 successors; n <= n_hi - 1
    return linked_rows(stored_successors(seq, next_seq, cap), starts, n_hi - 1)


def linked_rows(successors, starts: np.ndarray, rows: int) -> np.ndarray:
    """``starts`` and up to ``rows - 1`` successors of each down its episode's stored links
    (``successors``: ``Ring.successors``), sorted and unique: every row a vectorized n-step walk
    of at most ``rows`` steps may read."""
    chain = [starts]
    cur = starts
    for _ in range(rows - 1):
        nxt, linked = successors(cur)
        if not linked.any():
            break
        cur = nxt[linked]
        chain.append(cur)
    return np.unique(np.concatenate(chain))


class PrefetchedRows:
    """Fields ``names`` of the rows at ``slots`` (sorted, unique), as ``storage.gather`` gives
    them, from one gather made at construction (each shard's part started before any is
    awaited). A slot outside ``slots`` (none, where ``window_candidates`` or ``linked_rows``
    listed them) is gathered then, on its own, so a read is never wrong."""

    def __init__(self, storage, slots: np.ndarray, names: tuple[str, ...]):
        self._storage, self._slots = storage, slots
        got = storage.gather(slots, fields=list(names)) if slots.size else {}
        self._columns = {name: got[name].numpy() for name in got}
        self._where = dict(zip(slots.tolist(), range(slots.shape[0])))

    def read(self, name: str, slot: int):
        """Field ``name`` of the row at ``slot`` (a scalar, as the Python walk reads it)."""
        i = self._where.get(slot)
        if i is None:
            return self._storage.gather(np.array([slot], dtype=np.int64), fields=[name])[name].numpy()[0]
        return self._columns[name][i]

    def take(self, name: str, slots: np.ndarray) -> np.ndarray:
        """Field ``name`` of the rows at ``slots`` (an array, as the vectorized walk reads it)."""
        if not self._slots.size:
            return self._storage.gather(slots, fields=[name])[name].numpy()
        pos = np.minimum(np.searchsorted(self._slots, slots), self._slots.shape[0] - 1)
        found = self._slots[pos] == slots
        if found.all():
            return self._columns[name][pos]
        out = self._columns[name][pos]   # (a fresh array: fancy indexing copies)
        out[~found] = self._storage.gather(slots[~found], fields=[name])[name].numpy()
        return out


class ScratchWalkViews:
    """Ring-sized reward and done columns for the native walk (``_sumtree.sample_windows``) over
    storage it cannot read directly: ``fill`` writes the rows a walk may read (one gather) and
    ``clear`` takes them out again once it has walked. Every other row holds a NaN reward and
    both done flags set, so a walk that read a row it was not given would deliver NaN returns and
    cut windows: loud, and caught by the tests that compare it with one host shard's walk.
    Allocated once per ring size: 6 bytes a row (6 MB for a million), written whole at first."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.reward = np.full(capacity, np.nan, dtype=np.float32)
        self.terminated = np.ones(capacity, dtype=np.uint8)
        self.truncated = np.ones(capacity, dtype=np.uint8)

    @staticmethod
    def reads(spec, done_fields: tuple[str, ...]) -> bool:
        """Whether the native walk can walk these fields as delivered: one float32 reward and two
        bool done flags per row (else the Python reference walks, on ``PrefetchedRows``)."""
        fields = ("reward", *done_fields)
        return len(done_fields) == 2 and all(f in spec and spec[f].shape == () for f in fields) \
            and spec["reward"].dtype == torch.float32 and all(spec[f].dtype == torch.bool for f in done_fields)

    def fill(self, storage, slots: np.ndarray, done_fields: tuple[str, ...]) -> tuple[np.ndarray, ...]:
        """The walk's views with the rows at ``slots`` written in (fields ``reads`` accepted)."""
        if not slots.size:
            return self.reward, self.terminated, self.truncated
        got = storage.gather(slots, fields=["reward", *done_fields])
        reward, *done = (got[name].numpy() for name in ("reward", *done_fields))
        self.reward[slots] = reward
        self.terminated[slots] = done[0]
        self.truncated[slots] = done[1]
        return self.reward, self.terminated, self.truncated

    def clear(self, slots: np.ndarray) -> None:
        self.reward[slots] = np.nan
        self.terminated[slots] = 1
        self.truncated[slots] = 1
