"""Reused host output arrays for deliveries (``ExperienceBuffer(reuse_outputs=k)``)."""

from __future__ import annotations

import math

import numpy as np
import torch

# Where a decode's host output comes from: numpy's allocator, not torch's. Inside RLlib's Qbert run
# torch.empty's 3.6 MB blocks were faulted in anew for every batch (the replay sample() took 1.57 vs
# 1.14 ms: benchmarks/bench_decode_memory.py, which swaps this to compare).
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

    Batches drawn ahead of the learner (a data plane's prepared deliveries) take entries too,
    before the learner has them, and those a guard discards never reach it: ``reserve`` sizes
    the rings for that, so the learner's batches keep their ``kept`` deliveries of validity
    whatever is prepared (and thrown away) meanwhile."""

    def __init__(self, depth: int, layout: dict[str, tuple[tuple[int, ...], np.dtype]]):
        self.kept, self.depth, self.layout = depth, depth, layout
        self._rings: dict[tuple, list[tuple[dict[str, np.ndarray], dict[str, torch.Tensor]]]] = {}
        self._next: dict[tuple, int] = {}
        self._weights: dict[int, list[tuple[np.ndarray, torch.Tensor]]] = {}
        self._next_weights: dict[int, int] = {}

    def reserve(self, prepared: int) -> None:
        """Room for up to ``prepared`` batches drawn ahead at a time. Between a batch's delivery
        and the ``kept``-th after it, a data plane draws at most ``prepared`` ahead after each
        delivery and one at each (all prepared ones discarded, as a priority update makes them
        stale): ``kept * (prepared + 1)`` entries keep it. The pool only grows (an entry in use is
        never dropped); rings grow at their next use."""
        self.depth = max(self.depth, self.kept * (max(0, int(prepared)) + 1))

    def get(self, lead: tuple[int, ...]) -> tuple[dict[str, np.ndarray], dict[str, torch.Tensor]]:
        """The next (arrays, their tensor views) for batches of leading shape ``lead``."""
        ring = self._rings.get(lead)
        if ring is None:
            ring = self._rings[lead] = []
            self._next[lead] = 0
        while len(ring) < self.depth:
            arrays = {name: np.empty((*lead, *shape), dtype=dt) for name, (shape, dt) in self.layout.items()}
            ring.append((arrays, {name: torch.from_numpy(a) for name, a in arrays.items()}))
        i = self._next[lead]
        self._next[lead] = (i + 1) % len(ring)
        return ring[i]

    def windows(self, b: int, names: tuple[str, ...]) -> "WindowOutputs":
        """The next entry for a batch of ``b`` n-step windows of the stored fields ``names`` (the
        windows' first- and last-step columns), without handing it out (``took_windows`` does, once
        the batch is drawn). The n-step walk writes into it as it draws, so a batch of windows wraps
        no arrays; a draw that fails may have written into it, so the ring keeps one entry more
        than ``depth``: the one due next is never a batch still valid. Valid as long as a pooled
        1-step batch."""
        key = (b, names)
        ring = self._rings.get(key)
        if ring is None:
            ring = self._rings[key] = []
            self._next[key] = 0
        while len(ring) < self.depth + 1:
            ring.append(WindowOutputs(b, {name: self.layout[name] for name in names}))
        return ring[self._next[key]]

    def took_windows(self, b: int, names: tuple[str, ...]) -> None:
        """The entry ``windows(b, names)`` gave is handed out: the next batch gets the one after it."""
        key = (b, names)
        self._next[key] = (self._next[key] + 1) % len(self._rings[key])

    def next_weights(self, n: int) -> tuple[np.ndarray, torch.Tensor]:
        """The next of the pool's reused float32 ``[n]`` arrays for a batch's importance weights,
        with its tensor view, without handing it out (``advance_weights`` does): a selector writes
        the weights straight into it (wrapping a fresh array costs more than the draw's weights),
        and a draw that fails leaves the ring where it was. Valid as long as the batch's other
        outputs."""
        ring = self._weights.get(n)
        if ring is None:
            ring = self._weights[n] = []
            self._next_weights[n] = 0
        while len(ring) < self.depth:
            a = np.empty(n, dtype=np.float32)
            ring.append((a, torch.from_numpy(a)))
        i = self._next_weights[n]
        array, tensor = ring[i]
        if tensor.shape != array.shape or tensor.requires_grad:   # changed in place by an earlier batch
            tensor = torch.from_numpy(array)
            ring[i] = (array, tensor)
        return array, tensor

    def advance_weights(self, n: int) -> None:
        """The entry ``next_weights(n)`` gave is handed out: the next batch gets the one after it."""
        self._next_weights[n] = (self._next_weights[n] + 1) % len(self._weights[n])


class WindowOutputs:
    """One pool entry for a batch of n-step windows: the stored fields' columns, and the walk's
    own outputs (``reward``: the float32 return, ``n_step``: the steps, ``weights``), kept apart
    so that no stored field's name (``weights``, ``n_step``) can stand in for them."""

    __slots__ = ("columns", "column_tensors", "walk", "walk_tensors")

    def __init__(self, b: int, layout: dict[str, tuple[tuple[int, ...], np.dtype]]):
        self.columns = {name: np.empty((b, *shape), dtype=dt) for name, (shape, dt) in layout.items()}
        self.column_tensors = {name: torch.from_numpy(a) for name, a in self.columns.items()}
        self.walk = {"reward": np.empty(b, np.float32), "n_step": np.empty(b, np.int64),
                     "weights": np.empty(b, np.float32)}
        self.walk_tensors = {name: torch.from_numpy(a) for name, a in self.walk.items()}

    def hand_out(self, names: tuple[str, ...]) -> dict[str, torch.Tensor]:
        """The batch's columns: ``names`` in order (stored fields; ``reward`` is the return), then
        ``n_step``, as the fresh route builds them (the walk's ``n_step`` over a stored one)."""
        out = {}
        for name in (*names, "n_step"):
            own = name == "reward" or name == "n_step"
            arrays, tensors = (self.walk, self.walk_tensors) if own else (self.columns, self.column_tensors)
            t, a = tensors[name], arrays[name]
            if t.shape != a.shape or t.requires_grad:   # changed in place by an earlier batch (handed_out)
                t = tensors[name] = torch.from_numpy(a)
            out[name] = t
        return out

    def weights_tensor(self) -> torch.Tensor:
        """The walk's weights as ``handed_out`` gives them (inline: a delivery's hot path)."""
        t, a = self.walk_tensors["weights"], self.walk["weights"]
        if t.shape != a.shape or t.requires_grad:
            t = self.walk_tensors["weights"] = torch.from_numpy(a)
        return t
