"""Sampling that follows episodes: n-step returns and fixed-length sequences.

Both walk the per-slot episode links the buffer keeps (``next_seq``: the seq of a row's
successor in its source's episode, checked against the slot's current ``seq`` so a
successor that was overwritten or evicted ends the walk). A walk stops at a done row,
so neither ever crosses an episode boundary, even when several sources' rollouts
interleave in the ring. The n-step walk runs in the C helper when the columns allow it
(float32 rewards, bool done flags), directly on one host shard's columns, and on the rows it
may reach fetched in one gather where the storage is several shards or a remote one
(``walk_rows``); else in Python or vectorized numpy. All give identical results (tested).

A part of its own: ``EpisodeWalk`` holds only the spec's view of episodes (which fields
end one) and is handed the ring, storage, selector and RNG it walks at each call, so it
reads nothing of the buffer but those parts' public contracts. The buffer holds the lock.
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import ConfigError, SemanticError, SpecError
from .walk_rows import PrefetchedRows, ScratchWalkViews, linked_rows, window_candidates

try:  # the C helper's n-step walk (same results as the numpy path)
    from .._native._sumtree import nstep as _c_nstep
    from .._native._sumtree import sample_windows as _c_sample_windows
except ImportError:  # pragma: no cover
    _c_nstep = _c_sample_windows = None

EPISODE_END_RULES = ("shorten", "redraw")
NATIVE_WALK = _c_sample_windows is not None   # draw_windows walks in C over EpisodeWalk.native_views
NO_TREE = (np.zeros(2), np.full(2, np.inf))  # what the uniform walk passes for the trees it does not read


def n_step_range(n_step) -> tuple[int, int]:
    """``n_step`` (an int, or ``(lo, hi)`` drawn from ``[lo, hi)`` as RLlib draws it) as a
    half-open range; ``(lo, lo)`` means ``lo``."""
    if isinstance(n_step, tuple):
        lo, hi = int(n_step[0]), int(n_step[1])
        hi = max(hi, lo + 1)
    else:
        lo = int(n_step)
        hi = lo + 1
    if lo < 1:
        raise ConfigError("n_step", ">= 1", lo, "use n_step=1 for one-step returns")
    return lo, hi


def windows_too_short(tries: int, filled: int, b: int, n_lo: int, n_hi: int) -> SemanticError:
    """The redraw rule gave up: too few stored windows fit their episodes."""
    return SemanticError(
        f"n_step: {tries} draws found only {filled} of {b} items whose n-step window ({n_lo}.."
        f"{n_hi - 1} steps) fits in its stored episode; the stored episodes are too short for "
        "this n. Fix: sample with a smaller n_step, store longer episodes, or use episode_end='shorten'.")


def window_source(ring, selector, beta, stored: int | None) -> tuple[tuple, float]:
    """What a window draw selects from, as ``draw_windows`` takes it: ((prioritized, sum tree, min
    tree, tree size, lo, count, the ring's capacity, seq and next_seq arrays), beta). A weighted
    selector draws from its trees over the ``stored`` rows (the buffer's size, holes left out;
    None: asked of the ring), with ``beta`` or its own; a uniform one over the ring's live seqs
    ``[lo, lo + count)``, weights 1."""
    meta = ring.meta
    if selector.weighted:
        sums, mins, tsize = selector.trees
        count = ring.inserted - ring.lo() - ring.holes if stored is None else stored
        return ((True, sums, mins, tsize, 0, count, ring.capacity, meta["seq"], meta["next_seq"]),
                selector.beta if beta is None else float(beta))
    lo = ring.lo()
    return (False, NO_TREE[0], NO_TREE[1], 1, lo, ring.inserted - lo, ring.capacity, meta["seq"], meta["next_seq"]), 0.0


def draw_windows(views, rng, source: tuple, n_lo: int, n_hi: int, gamma: float, beta: float, redraw: bool,
                 out: tuple, *, reference=None) -> None:
    """Fill ``out`` = (slots, weights, returns, last slots, steps) with ``len(slots)`` windows drawn
    from ``source`` (``window_source``'s): the native walk over ``views`` (``EpisodeWalk.native_views``), or
    ``reference`` (the same arguments, operation for operation) where there are none. Uniforms
    come from ``rng`` in pools sized for the redraws to come, so every route consumes the RNG
    alike (the native walk draws them itself from ``rng``'s bit generator: the values
    ``rng.random`` would give, without a numpy call and an array per pool); a draw that keeps
    finding too few windows that fit gives up (``windows_too_short``).
    Returns the items drawn, redrawn ones included (``len(slots)`` plus the redraws)."""
    slots = out[0]
    b = slots.shape[0]
    per_try = 2 if n_hi - n_lo > 1 else 1
    filled, tries, limit = 0, 0, 64 * b + 4096
    bits = rng.bit_generator if views is not None and type(rng) is np.random.Generator else None
    while filled < b:
        if tries > limit:
            raise windows_too_short(tries, filled, b, n_lo, n_hi)
        m = per_try * (b - filled) * (2 if redraw else 1) + (16 if redraw else 0)
        if bits is not None:   # the native walk draws the m uniforms rng.random(m) would (its lock held, as there)
            with bits.lock:
                filled, used = _c_sample_windows(*source, *views, (bits.capsule, m), n_lo, n_hi, gamma, beta,
                                                 redraw, *out, filled)
        elif views is not None:
            filled, used = _c_sample_windows(*source, *views, rng.random(m), n_lo, n_hi, gamma, beta, redraw, *out,
                                             filled)
        else:
            filled, used = reference(*source, rng.random(m), n_lo, n_hi, gamma, beta, redraw, *out, filled)
        tries += used // per_try
    return tries


class EpisodeWalk:
    """n-step windows and sequences, walked over the episode links of a ring."""

    def __init__(self, spec, done_fields: tuple[str, ...]):
        self.spec, self.done_fields = spec, done_fields
        self._window_plans: dict = {}   # fields asked for -> window_plan's answer
        self._n_step_ranges: dict = {}  # n_step -> n_step_range's answer (a sampler asks the same each step)
        self._n_step_fields_ok = False  # check_n_step_fields passed (the spec is fixed)
        self._scratch = None            # walk_prefetched's ScratchWalkViews (storage without walk views)
        self._views = (None, None)      # (storage, native_views' answer for it): one tuple, replaced whole

    def native_views(self, storage) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """What the native walk reads in place: the float32 ``reward`` column and the two bool done
        flags as uint8 views, where ``storage`` holds them as host columns of one shard
        (``host_view``); None otherwise (the walk fetches the rows it may reach, ``walk_prefetched``).
        The storage knows columns; which of them are rewards and episode ends is the walk's to say."""
        known = self._views
        if known[0] is storage:
            return known[1]
        views = None
        if _c_sample_windows is not None and "reward" in self.spec and len(self.done_fields) == 2:
            rew = storage.host_view("reward")
            done = [storage.host_view(f) for f in self.done_fields]
            if rew is not None and rew.dtype == np.float32 and all(d is not None and d.dtype == np.bool_ for d in done):
                views = (rew, done[0].view(np.uint8), done[1].view(np.uint8))
        self._views = (storage, views)
        return views

    def window_plan(self, fields) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
        """(the fields delivered, those read at a window's last step, those at its first)."""
        key = None if fields is None else tuple(fields)
        plan = self._window_plans.get(key)
        if plan is None:
            names = tuple(f for f in self.spec.names if key is None or f in key)
            # read at the window's last step: the look-ahead fields the spec declares, and the done flags
            last_fields = tuple(f for f in names if self.spec[f].window_step == "last" or f in self.done_fields)
            first_fields = tuple(f for f in names if f not in last_fields and f != "reward")
            plan = self._window_plans[key] = (names, last_fields, first_fields)
        return plan

    def check_n_step_fields(self) -> None:
        if self._n_step_fields_ok:
            return
        for need in ("reward", "next_obs"):
            if need not in self.spec:
                raise SpecError(need, "a field of the spec for n-step returns", "missing",
                                "declare it, or sample without n_step")
        self._n_step_fields_ok = True

    def n_step_columns(self, ring, storage, rng, slots, n_step, gamma, device,
                       fields=None) -> dict[str, torch.Tensor]:
        """The columns of n-step windows from start ``slots`` (the shortened-window rule)."""
        self.check_n_step_fields()
        b = slots.shape[0]
        if isinstance(n_step, tuple):
            lo, hi = n_step
            n = rng.integers(lo, hi, b) if hi > lo else np.full(b, lo)
        else:
            n = np.full(b, int(n_step))
        if (n < 1).any():
            raise ConfigError("n_step", ">= 1", int(n.min()), "use n_step=1 for one-step returns")
        ret, cur, steps = self.n_step_returns(ring, storage, slots, n, gamma)
        return self.window_columns(storage.gather_each, slots, ret, cur, steps, device, fields)

    def window_columns(self, gather_each, slots, ret, cur, steps, device, fields=None, *,
                       fresh=None, pooled=None) -> dict[str, torch.Tensor]:
        """Columns of n-step windows: first-step fields from ``slots``, ``next_obs`` and the
        done flags from the last step ``cur``, the discounted ``ret`` and ``n_step``
        (``fields``: only these of the spec's fields, ``n_step`` always). ``gather_each``:
        ``ColumnarStorage.gather_each``, both gathers started before either is finished (over a
        remote shard, one round trip for the two). ``fresh``: the storage, whose one-pass
        ``take_fresh`` serves host batches where it ``takes_fresh`` both gathers' fields.
        ``pooled``: ``delivery.window_outputs``'s (take_into, the output pool's
        ``WindowOutputs`` whose walk arrays hold ``steps``, its window plan, took): the columns go
        into its arrays (host batches)."""
        if pooled is not None:   # (delivery.window_outputs: the plan comes with the entry)
            take_into, entry, (names, last_fields, first_fields), _ = pooled
            take_into(slots, first_fields, entry.columns)
            take_into(cur, last_fields, entry.columns)
            entry.walk["reward"][:] = ret   # (float64 -> float32 as ret.astype(np.float32) rounds)
            return entry.hand_out(names)
        names, last_fields, first_fields = self.window_plan(fields)
        if fresh is not None and device is None and fresh.takes_fresh(first_fields) and fresh.takes_fresh(last_fields):
            data, last = fresh.take_fresh(slots, first_fields), fresh.take_fresh(cur, last_fields)
        else:
            data, last = gather_each([(slots, first_fields), (cur, last_fields)],
                                     device=None if device is None else torch.device(device))
        data.update(last)
        on = (lambda t: t) if device is None else (lambda t: t.to(torch.device(device)))
        if "reward" in names:
            data["reward"] = on(torch.from_numpy(ret.astype(np.float32)))
        data["n_step"] = on(torch.from_numpy(steps))
        return {name: data[name] for name in (*names, "n_step")}

    def sample_windows(self, ring, storage, selector, rng, batch_size: int, n_step, gamma: float,
                       beta: float | None, *, redraw: bool, out: tuple[np.ndarray, np.ndarray] | None = None,
                       stored: int | None = None):
        """Select ``batch_size`` items and walk their n-step windows in one native pass.

        Returns (start slots, weights or None, discounted return, last slot, steps, items redrawn); weights
        and steps go into ``out`` = (float32 weights, int64 steps) when given. With
        ``redraw`` an item whose window is cut short by its episode's stored end is drawn
        again, n included (RLlib's PrioritizedEpisodeReplayBuffer rule); without it the
        shorter window is delivered with its true length. Uniforms come from the buffer's
        RNG in pools; the C walk and the Python reference consume them identically. ``stored``:
        the buffer's size, where the caller has it under the same lock."""
        if not self._n_step_fields_ok:
            self.check_n_step_fields()
        span = self._n_step_ranges.get(n_step)
        if span is None:
            span = n_step_range(n_step)
            if len(self._n_step_ranges) < 64:
                self._n_step_ranges[n_step] = span
        n_lo, n_hi = span
        source, beta = window_source(ring, selector, beta, stored)
        prioritized = source[0]
        b = int(batch_size)
        slots = np.empty(b, dtype=np.int64)
        ret = np.empty(b, dtype=np.float64)
        last = np.empty(b, dtype=np.int64)
        if out is None:
            weights = np.empty(b, dtype=np.float32)   # every delivered item's written by the walk (1 when uniform)
            steps = np.empty(b, dtype=np.int64)
        else:
            weights, steps = out
        views = self.native_views(storage) if _c_sample_windows is not None else None
        reference = None if views is not None else (
            lambda *args: self.walk_prefetched(storage, selector, *args))
        drawn = draw_windows(views, rng, source, n_lo, n_hi, float(gamma), beta, redraw,
                             (slots, weights, ret, last, steps), reference=reference)
        return slots, (weights if prioritized else None), ret, last, steps, drawn - b

    def walk_prefetched(self, storage, selector, *args):
        """``draw_windows``'s walk where the storage offers no walk views (a remote shard, several
        shards): the native walk on ``ScratchWalkViews`` holding the rows it may reach, fetched in
        one gather (``walk_rows``), else (columns it cannot read, no C helper) the reference."""
        if _c_sample_windows is None or not ScratchWalkViews.reads(self.spec, self.done_fields):
            return self.sample_windows_reference(storage, selector, *args)
        source, (u, n_lo, n_hi) = args[:9], args[9:12]
        cap = source[6]
        scratch = self._scratch
        if scratch is None or scratch.capacity != cap:
            scratch = self._scratch = ScratchWalkViews(cap)
        rows = window_candidates(source, selector, u, n_lo, n_hi)
        try:
            return _c_sample_windows(*source, *scratch.fill(storage, rows, self.done_fields), *args[9:])
        finally:   # (a failed gather or walk too: the scratch holds nothing of it after)
            scratch.clear(rows)

    def sample_windows_reference(self, storage, selector, prioritized, sums, mins, tsize, lo, count, cap, seq, next_seq, u, n_lo,
                                  n_hi, gamma, beta, redraw, slots, weights, ret, last, steps, first):
        """The C ``sample_windows`` in Python, operation for operation (a fallback for
        columns the C walk cannot read, and its reference in tests). The rows it may read are
        fetched first, in one gather (``walk_rows``): on a remote shard, one round trip per
        call instead of one per row and field."""
        source = (prioritized, sums, mins, tsize, lo, count, cap, seq, next_seq)
        get = PrefetchedRows(storage, window_candidates(source, selector, u, n_lo, n_hi),
                             ("reward", *self.done_fields)).read
        need = 2 if n_hi - n_lo > 1 else 1
        total, pmin = float(sums[1]), float(mins[1])
        i, j, b, m = first, 0, slots.shape[0], u.shape[0]
        while i < b and j + need <= m:
            w = np.float32(1.0)
            if prioritized:
                start = int(selector.index.find_prefixsum(np.array([u[j] * total]))[0])
                j += 1
                if beta != 0.0:
                    w = np.float32(pow(float(sums[tsize + start]) / pmin, -beta))
            else:
                off = min(int(u[j] * float(count)), count - 1)
                j += 1
                start = (lo + off) % cap
                if int(seq[start]) != lo + off:  # a removed row: draw again
                    j += need - 1
                    continue
            n = n_lo
            if need == 2:
                n = min(n_lo + int(u[j] * float(n_hi - n_lo)), n_hi - 1)
                j += 1
            cur, k = start, 1
            r = float(np.float32(get("reward", cur)))
            while k < n and not any(bool(get(f, cur)) for f in self.done_fields):
                ns = int(next_seq[cur])
                if ns < 0 or int(seq[ns % cap]) != ns:
                    break
                cur = ns % cap
                r += pow(gamma, float(k)) * float(np.float32(get("reward", cur)))
                k += 1
            if redraw and k < n:
                continue
            slots[i], weights[i], ret[i], last[i], steps[i] = start, w, r, cur, k
            i += 1
        return i, j

    def n_step_returns(self, ring, storage, slots: np.ndarray, n: np.ndarray, gamma: float):
        """(discounted return, last slot, steps taken) per start slot, following episode links."""
        rew = storage.host_view("reward")
        done = [storage.host_view(f) for f in self.done_fields]
        if _c_nstep is not None and rew is not None and rew.dtype == np.float32 and len(done) == 2 \
                and all(d is not None and d.dtype == np.bool_ for d in done):
            b = slots.shape[0]
            ret = np.empty(b, dtype=np.float64)
            last = np.empty(b, dtype=np.int64)
            steps = np.empty(b, dtype=np.int64)
            _c_nstep(ring.meta["seq"], ring.meta["next_seq"], rew, done[0].view(np.uint8), done[1].view(np.uint8),
                     ring.capacity, np.ascontiguousarray(slots, dtype=np.int64),
                     np.ascontiguousarray(n, dtype=np.int64), float(gamma), ret, last, steps)
            return ret, last, steps
        return self.n_step_returns_numpy(ring, storage, slots, n, gamma)

    def n_step_returns_numpy(self, ring, storage, slots: np.ndarray, n: np.ndarray, gamma: float):
        """``n_step_returns`` in numpy, step by step over the batch, on the rows it may read
        fetched first in one gather (``walk_rows``)."""
        get = PrefetchedRows(storage, linked_rows(ring.successors, slots, int(n.max()) if n.size else 1),
                             ("reward", *self.done_fields)).take
        b = slots.shape[0]
        ret = get("reward", slots).astype(np.float64)
        cur = slots.copy()
        steps = np.ones(b, dtype=np.int64)
        alive = np.ones(b, dtype=bool)
        for f in self.done_fields:
            alive &= ~get(f, cur).astype(bool)
        for k in range(1, int(n.max())):
            want = alive & (k < n)
            if not want.any():
                break
            nxt, ok = ring.successors(cur)
            go = want & ok
            if not go.any():
                break
            cur_next = np.where(go, nxt, cur)   # (an unlinked row's "successor" is slot 0: not read)
            ret += np.where(go, (gamma ** k) * get("reward", cur_next).astype(np.float64), 0.0)
            cur = cur_next
            steps += go
            alive = go
            for f in self.done_fields:
                alive &= ~get(f, cur).astype(bool)
        return ret, cur, steps

    @staticmethod
    def sequence_grid(ring, starts: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
        """Slots of ``length`` consecutive steps from each start, and a mask that is False
        after the episode ends (those steps repeat the last real step)."""
        b = starts.shape[0]
        grid = np.empty((b, length), dtype=np.int64)
        mask = np.zeros((b, length), dtype=bool)
        cur = starts.copy()
        alive = np.ones(b, dtype=bool)
        for t in range(length):
            grid[:, t] = cur
            mask[:, t] = alive
            nxt, ok = ring.successors(cur)
            alive = alive & ok
            cur = np.where(alive, nxt, cur)
        return grid, mask
