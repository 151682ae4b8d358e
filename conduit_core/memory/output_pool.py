"""Reused host output arrays for deliveries (``ExperienceBuffer(reuse_outputs=k)``)."""

from __future__ import annotations

import collections
import math
import weakref

import numpy as np
import torch

# Where a decode's host output comes from: numpy's allocator, not torch's. Inside RLlib's Qbert run
# torch.empty's multi-MB blocks were faulted in anew for every batch, numpy's were reused
# (measured in the run: docs/benchmarks-history.md, section 3b).
output_empty = np.empty


def aligned_empty(shape: tuple[int, ...], dtype) -> np.ndarray:
    """``output_empty``'s array for ``shape`` starting on a 64-byte boundary (malloc gives 16), so
    the native decode may write a large batch with non-temporal stores (aligned ones only)."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize   # (np.prod of a tuple: ~4 us of a decode's ~10 here)
    raw = output_empty(nbytes + 64, np.uint8)
    skip = -raw.ctypes.data % 64
    return raw[skip:skip + nbytes].view(dtype).reshape(shape)


def handed_out(names, out: dict[str, np.ndarray], out_tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensor views of reused arrays ``out[name]`` as a batch hands them out. A wrapper an
    earlier batch changed in place (``unsqueeze_``, ``requires_grad_``) is replaced by a fresh
    one for the same memory, so that change stays in that batch."""
    result = {}
    for name in names:
        t, a = out_tensors[name], out[name]
        if t.shape != a.shape or t.requires_grad:
            t = out_tensors[name] = torch.from_numpy(a)
        result[name] = t
    return result


class OutputPool:
    """Reused host output arrays: a delivered batch stays valid for ``kept`` more deliveries
    of the same shape. Avoids first-touch page faults on large gathers, and keeps each array's
    tensor view, so a delivery wraps no arrays.

    What keeps a batch's memory from being reused is held, not counted: each entry a draw
    fills is bound (``bind``) to a token its Batch carries (``Batch.holds``, shared with its
    parts), and an entry whose token is alive is never handed out again: the ring grows a
    fresh entry in its place. The pool holds the tokens of the last ``kept`` draws, and a data
    plane those of the last ``kept`` batches it handed to the learner (``hold``), so that
    prepared batches discarded, failed draws and a pool grown mid-run never use up a learner's
    batch before its ``kept`` deliveries, whether or not the learner keeps its Batch object."""

    def __init__(self, depth: int, layout: dict[str, tuple[tuple[int, ...], np.dtype]]):
        self.kept, self.depth, self.layout = depth, depth, layout
        self._rings: dict[tuple, list[_Entry]] = {}   # per kind and shape: entries, oldest first from the cursor
        self._next: dict[tuple, int] = {}
        self._taken: list[_Entry] = []                 # entries filled since the last bind
        self._drawn: collections.deque = collections.deque(maxlen=depth)    # the last draws' tokens
        self._handed: collections.deque = collections.deque(maxlen=depth)   # a data plane's last hand-outs

    def reserve(self, prepared: int) -> None:
        """Room for up to ``prepared`` batches drawn ahead at a time: entries made ahead of use
        (``kept * (prepared + 1)``), so that a data plane's refills allocate nothing in the
        steady state. Validity does not depend on it (tokens do); rings grow at their next use."""
        self.depth = max(self.depth, self.kept * (max(0, int(prepared)) + 1))

    def _due(self, key: tuple, make, arg) -> "_Entry":
        """The entry the next batch of ``key`` fills: the oldest one no live batch holds. Entries
        still held (a learner keeping a batch long) are stepped over, keeping their order; a
        fresh entry is made only when the ring is short of ``depth + 1`` (the last ``kept`` draws
        are held, and a failed draw writes into the one due next) or every entry is held. A ring
        grown for batches held long drops its free entries beyond ``depth + 1`` (but the one it
        fills), so a batch kept for the whole run costs one entry, not an allocation per draw."""
        ring = self._rings.get(key)
        if ring is None:
            ring = self._rings[key] = []
            self._next[key] = 0
        i, n = self._next[key], len(ring)
        if n == self.depth + 1:   # the steady state: the oldest entry, free (inline: a delivery's hot path)
            entry = ring[i]
            ref = entry.ref
            if ref is None or ref() is None:
                return entry
        free = _first_free(ring, i, n) if n > self.depth else None
        if free is None:   # short of depth + 1, or every entry held: grow, in age order
            ring.insert(i, _Entry(make(arg)))
            return ring[i]
        if free != i:      # held entries stepped over: the free one moves to the cursor
            entry = ring.pop(free)
            i -= free < i
            ring.insert(i, entry)
        while n > self.depth + 1:   # grown for batches held, since let go: return the memory
            spare = _first_free(ring, (i + 1) % n, n - 1)
            if spare is None:
                break
            ring.pop(spare)
            i -= spare < i
            n -= 1
        self._next[key] = i
        return ring[i]

    def _advance(self, key: tuple) -> None:
        ring, i = self._rings[key], self._next[key]
        entry = ring[i]
        entry.ref = _pending   # held until its draw's bind (or a later one, if the draw fails)
        taken = self._taken
        taken.append(entry)
        self._next[key] = (i + 1) % len(ring)
        if len(taken) > _UNBOUND_LIMIT:   # entries no draw bound (gather() called on its own): let the oldest go
            for old in taken[:-_UNBOUND_KEEP]:
                if old.ref is _pending:
                    old.ref = None
            del taken[:-_UNBOUND_KEEP]

    def get(self, lead: tuple[int, ...]) -> tuple[dict[str, np.ndarray], dict[str, torch.Tensor]]:
        """The next (arrays, their tensor views) for batches of leading shape ``lead``."""
        key = ("rows", lead)
        entry = self._due(key, self._make_rows, lead)
        self._advance(key)
        return entry.payload

    def get_weighted(self, b: int) -> tuple[dict[str, np.ndarray], dict[str, torch.Tensor], list]:
        """``get((b,))``'s (arrays, tensor views) and ``[float32 [b] weights array, its tensor view]``
        in one entry, handed out at once: a 1-step draw that writes its importance weights in place
        (``row_draw``) takes one entry per batch, not two."""
        key = ("rows+weights", b)
        entry = self._due(key, self._make_rows_weighted, b)
        self._advance(key)
        pair = entry.payload[2]
        if pair[1].requires_grad or pair[1].shape != pair[0].shape:   # changed in place by an earlier batch
            pair[1] = torch.from_numpy(pair[0])
        return entry.payload

    def _make_rows(self, lead: tuple[int, ...]):
        arrays = {name: np.empty((*lead, *shape), dtype=dt) for name, (shape, dt) in self.layout.items()}
        return arrays, {name: torch.from_numpy(a) for name, a in arrays.items()}

    def _make_rows_weighted(self, b: int):
        w = np.empty(b, dtype=np.float32)
        return (*self._make_rows((b,)), [w, torch.from_numpy(w)])

    def windows(self, b: int, names: tuple[str, ...]) -> "WindowOutputs":
        """The next entry for a batch of ``b`` n-step windows of the stored fields ``names`` (the
        windows' first- and last-step columns), without handing it out (``took_windows`` does, once
        the batch is drawn). The n-step walk writes into it as it draws, so a batch of windows wraps
        no arrays; a draw that fails may have written into it, so the ring keeps one entry more
        than ``depth``: the one due next is never a batch still valid. Valid as long as a pooled
        1-step batch."""
        return self._due(("windows", b, names), self._make_windows, (b, names)).payload

    def _make_windows(self, key: tuple[int, tuple[str, ...]]) -> "WindowOutputs":
        b, names = key
        return WindowOutputs(b, {name: self.layout[name] for name in names})

    def took_windows(self, b: int, names: tuple[str, ...]) -> None:
        """The entry ``windows(b, names)`` gave is handed out: the next batch gets the one after it."""
        self._advance(("windows", b, names))

    def next_weights(self, n: int) -> tuple[np.ndarray, torch.Tensor]:
        """The next of the pool's reused float32 ``[n]`` arrays for a batch's importance weights,
        with its tensor view, without handing it out (``advance_weights`` does): a selector writes
        the weights straight into it (wrapping a fresh array costs more than the draw's weights),
        and a draw that fails leaves the ring where it was. Valid as long as the batch's other
        outputs."""
        entry = self._due(("weights", n), _make_weights, n)
        pair = entry.payload
        if pair[1].shape != pair[0].shape or pair[1].requires_grad:   # changed in place by an earlier batch
            pair[1] = torch.from_numpy(pair[0])
        return pair[0], pair[1]

    def advance_weights(self, n: int) -> None:
        """The entry ``next_weights(n)`` gave is handed out: the next batch gets the one after it."""
        self._advance(("weights", n))

    def bind(self, batch) -> None:
        """The entries filled since the last bind now belong to ``batch``: a token for them goes
        on ``batch.holds`` (its parts share it), and they are not reused while it lives. Called
        once per draw, the lock held, once its Batch exists; entries a failed draw filled go
        to the next bind (held a little longer: memory, never data)."""
        if not self._taken:
            return
        token = _Token()
        ref = weakref.ref(token)
        for entry in self._taken:
            entry.ref = ref
        self._taken.clear()
        batch.holds = token
        self._drawn.append(token)

    def hold(self, batch) -> None:
        """``batch`` was handed to the learner by a data plane that draws ahead: its memory is
        kept for the learner's next ``kept`` batches, whatever is drawn and discarded meanwhile."""
        if batch.holds is not None:
            self._handed.append(batch.holds)


class _Entry:
    """One reusable output of a ring, and the token of the batch that holds it (a weakref)."""

    __slots__ = ("payload", "ref")

    def __init__(self, payload):
        self.payload, self.ref = payload, None

    def held(self) -> bool:
        ref = self.ref
        return ref is not None and ref() is not None


def _make_weights(n: int) -> list:
    a = np.empty(n, dtype=np.float32)
    return [a, torch.from_numpy(a)]


_UNBOUND_LIMIT, _UNBOUND_KEEP = 64, 8   # a draw takes 1-3 entries: more pending than this were never bound


def _pending():
    """The ``ref`` of an entry filled by a draw not yet bound: held (never the draw's next entry)."""
    return True


def _first_free(ring: list["_Entry"], start: int, count: int) -> int | None:
    """The index of the first entry no batch holds among ``count`` from ``start`` (wrapping)."""
    n = len(ring)
    for k in range(count):
        j = (start + k) % n
        if not ring[j].held():
            return j
    return None


class _Token:
    """What a pooled batch holds (``Batch.holds``): its entries are not reused while it lives."""

    __slots__ = ("__weakref__",)


class WindowOutputs:
    """One pool entry for a batch of n-step windows: the stored fields' columns, and the walk's
    own outputs (``reward``: the float32 return, ``n_step``: the steps, ``weights``), kept apart
    so that no stored field's name (``weights``, ``n_step``) can stand in for them."""

    __slots__ = ("columns", "column_tensors", "walk", "walk_tensors", "_routes")

    def __init__(self, b: int, layout: dict[str, tuple[tuple[int, ...], np.dtype]]):
        self.columns = {name: np.empty((b, *shape), dtype=dt) for name, (shape, dt) in layout.items()}
        self.column_tensors = {name: torch.from_numpy(a) for name, a in self.columns.items()}
        self.walk = {"reward": np.empty(b, np.float32), "n_step": np.empty(b, np.int64),
                     "weights": np.empty(b, np.float32)}
        self.walk_tensors = {name: torch.from_numpy(a) for name, a in self.walk.items()}
        self._routes: dict = {}   # names -> ((name, its tensors, its arrays), ...), as hand_out reads them

    def hand_out(self, names: tuple[str, ...]) -> dict[str, torch.Tensor]:
        """The batch's columns: ``names`` in order (stored fields; ``reward`` is the return), then
        ``n_step``, as the fresh route builds them (the walk's ``n_step`` over a stored one)."""
        route = self._routes.get(names)
        if route is None:
            route = self._routes[names] = tuple(
                (name, self.walk_tensors, self.walk) if name == "reward" or name == "n_step"
                else (name, self.column_tensors, self.columns) for name in (*names, "n_step"))
        out = {}
        for name, tensors, arrays in route:
            t = tensors[name]
            if t.requires_grad or t.shape != arrays[name].shape:   # changed in place by an earlier batch (handed_out)
                t = tensors[name] = torch.from_numpy(arrays[name])
            out[name] = t
        return out

    def weights_tensor(self) -> torch.Tensor:
        """The walk's weights as ``handed_out`` gives them (inline: a delivery's hot path)."""
        t, a = self.walk_tensors["weights"], self.walk["weights"]
        if t.shape != a.shape or t.requires_grad:
            t = self.walk_tensors["weights"] = torch.from_numpy(a)
        return t
