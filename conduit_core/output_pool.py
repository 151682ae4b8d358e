"""Reused host output arrays for deliveries (``ExperienceBuffer(reuse_outputs=k)``)."""

from __future__ import annotations

import numpy as np
import torch


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
    before the learner has them: ``reserve`` adds that many, so the learner's batches keep
    their ``kept`` deliveries of validity whatever is prepared meanwhile."""

    def __init__(self, depth: int, layout: dict[str, tuple[tuple[int, ...], np.dtype]]):
        self.kept, self.depth, self.layout = depth, depth, layout
        self._rings: dict[tuple, list[tuple[dict[str, np.ndarray], dict[str, torch.Tensor]]]] = {}
        self._next: dict[tuple, int] = {}
        self._weights: dict[int, list[tuple[np.ndarray, torch.Tensor]]] = {}
        self._next_weights: dict[int, int] = {}

    def reserve(self, prepared: int) -> None:
        """Room for ``prepared`` batches drawn but not handed out yet. The pool only grows (an
        entry in use is never dropped); rings grow at their next use, after the entry due next,
        so every batch already handed out still has at least ``kept`` deliveries to go."""
        self.depth = max(self.depth, self.kept + max(0, int(prepared)))

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

    def windows(self, b: int, names: tuple[str, ...]) -> tuple[dict[str, np.ndarray], dict[str, torch.Tensor]]:
        """The next (arrays, tensor views) for a batch of ``b`` n-step windows: the stored
        fields ``names`` (the windows' first- and last-step columns), ``reward`` (the float32
        discounted return), ``n_step`` (int64 steps walked) and ``weights`` (float32). The n-step
        walk writes steps and weights in place, so a batch of windows wraps no arrays; it stays
        valid as long as a pooled 1-step batch."""
        key = (b, names)
        ring = self._rings.get(key)
        if ring is None:
            ring = self._rings[key] = []
            self._next[key] = 0
        while len(ring) < self.depth:
            arrays = {name: np.empty((b, *self.layout[name][0]), dtype=self.layout[name][1]) for name in names}
            arrays.update(reward=np.empty(b, np.float32), n_step=np.empty(b, np.int64), weights=np.empty(b, np.float32))
            ring.append((arrays, {name: torch.from_numpy(a) for name, a in arrays.items()}))
        i = self._next[key]
        self._next[key] = (i + 1) % len(ring)
        return ring[i]

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
