"""The rows an n-step window walk may read, fetched in one gather before it walks.

Why: where the storage offers no host views the native walk can read (a remote shard, several
shards, a reward or done column with a codec), windows are walked by the Python reference
(``EpisodeWalk.sample_windows_reference``). It read each row's reward and done flags as it went,
one ``storage.gather`` per field and step; on a remote shard each of those is a Ray round trip.
A B=32 draw with RLlib's n-step (2, 5) made about 250 of them: 0.56 s per ``sample()`` in RLlib's
DQN with env runners writing at the source (one shard, an actor), where the learner's update
takes milliseconds.

The rows a pool of uniforms can reach are known before the walk. Every try takes the same number
of uniforms (``need``: the start, and n where n is drawn), so each try's start follows from its
own first uniform alone, and its window runs at most ``n_hi - 1`` rows down the episode links,
which are metadata on this host. So ``window_candidates`` lists them (a pure function of the
source, the selector's tree and the uniforms), ``PrefetchedRows`` fetches them in one gather
(each shard's part started before any is awaited), and the walk reads them from there,
operation for operation as before: the same uniforms consumed, the same rows read, the same
values. The vectorized walk of the shortened-window rule (``EpisodeWalk.n_step_returns_numpy``)
read each field once per step, ``3 * n`` round trips; it reads ``linked_rows`` the same way. tests/core/test_review_regressions.py compares it with the native walk, and
tests/core/test_walk_rows.py counts the gathers and compares several shards and a remote
one with one host shard.
"""

from __future__ import annotations

import numpy as np


def window_candidates(source: tuple, selector, u: np.ndarray, n_lo: int, n_hi: int) -> np.ndarray:
    """Every slot the reference walk may read for the uniforms ``u`` drawn from ``source``
    (``window_source``'s tuple): each try's start and up to ``n_hi - 2`` successors along its
    episode's stored links, sorted and unique. A superset: the walk stops earlier at a done row,
    and the last tries of the pool are read only where the earlier ones were redrawn."""
    prioritized, sums, _mins, _tsize, lo, count, cap, seq, next_seq = source
    need = 2 if n_hi - n_lo > 1 else 1
    tries = u.shape[0] // need
    if tries == 0:
        return np.empty(0, dtype=np.int64)
    first = u[0:tries * need:need]   # each try's first uniform picks its start, as the walk does
    if prioritized:
        starts = np.asarray(selector.index.find_prefixsum(first * float(sums[1])), dtype=np.int64)
    else:
        offsets = np.minimum((first * float(count)).astype(np.int64), count - 1)
        starts = (lo + offsets) % cap
    chain = [starts]
    cur = starts
    for _ in range(n_hi - 2):   # a window of n rows reads its start and n - 1 successors; n <= n_hi - 1
        nxt = next_seq[cur]
        nslot = nxt % cap
        linked = (nxt >= 0) & (seq[nslot] == nxt)   # a successor overwritten or removed ends the walk
        if not linked.any():
            break
        cur = nslot[linked]
        chain.append(cur)
    return np.unique(np.concatenate(chain))


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
        if self._slots.size:
            pos = np.minimum(np.searchsorted(self._slots, slots), self._slots.shape[0] - 1)
            if np.array_equal(self._slots[pos], slots):
                return self._columns[name][pos]
        return self._storage.gather(slots, fields=[name])[name].numpy()


class ScratchWalkViews:
    """Ring-sized reward and done columns for the native walk (``_sumtree.sample_windows``) over
    storage it cannot read directly: ``fill`` writes the rows a walk may read (one gather) and
    ``clear`` takes them out again once it has walked. Every other row holds a NaN reward and
    both done flags set, so a walk that read a row it was not given would deliver NaN returns and
    cut windows: loud, and caught by the tests that compare it with one host shard's walk.
    Allocated once per ring size (6 bytes a row; untouched pages cost no memory)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.reward = np.full(capacity, np.nan, dtype=np.float32)
        self.terminated = np.ones(capacity, dtype=np.uint8)
        self.truncated = np.ones(capacity, dtype=np.uint8)

    def fill(self, storage, slots: np.ndarray, done_fields: tuple[str, ...]) -> tuple[np.ndarray, ...] | None:
        """The walk's views with the rows at ``slots`` written in; None (nothing written) where the
        stored columns are not what the native walk reads (float32 reward, two bool done flags)."""
        if not slots.size:
            return self.reward, self.terminated, self.truncated
        got = storage.gather(slots, fields=["reward", *done_fields])
        reward, *done = (got[name].numpy() for name in ("reward", *done_fields))
        if reward.dtype != np.float32 or len(done) != 2 or any(d.dtype != np.bool_ for d in done):
            return None
        self.reward[slots] = reward
        self.terminated[slots] = done[0]
        self.truncated[slots] = done[1]
        return self.reward, self.terminated, self.truncated

    def clear(self, slots: np.ndarray) -> None:
        self.reward[slots] = np.nan
        self.terminated[slots] = 1
        self.truncated[slots] = 1
