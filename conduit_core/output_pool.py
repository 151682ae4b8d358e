"""Reused host output arrays for deliveries (``ExperienceBuffer(reuse_outputs=k)``)."""

from __future__ import annotations

import numpy as np
import torch


class OutputPool:
    """Reused host output arrays: a delivered batch stays valid for ``depth`` more
    deliveries of the same shape. Avoids first-touch page faults on large gathers, and
    keeps each array's tensor view, so a delivery wraps no arrays."""

    def __init__(self, depth: int, layout: dict[str, tuple[tuple[int, ...], np.dtype]]):
        self.depth, self.layout = depth, layout
        self._rings: dict[tuple, list[tuple[dict[str, np.ndarray], dict[str, torch.Tensor]]]] = {}
        self._next: dict[tuple, int] = {}
        self._weights: dict[int, list[tuple[np.ndarray, torch.Tensor]]] = {}
        self._next_weights: dict[int, int] = {}

    def get(self, lead: tuple[int, ...]) -> tuple[dict[str, np.ndarray], dict[str, torch.Tensor]]:
        """The next (arrays, their tensor views) for batches of leading shape ``lead``."""
        ring = self._rings.get(lead)
        if ring is None:
            ring = self._rings[lead] = []
            for _ in range(self.depth):
                arrays = {name: np.empty((*lead, *shape), dtype=dt) for name, (shape, dt) in self.layout.items()}
                ring.append((arrays, {name: torch.from_numpy(a) for name, a in arrays.items()}))
            self._next[lead] = 0
        i = self._next[lead]
        self._next[lead] = (i + 1) % self.depth
        return ring[i]

    def weights(self, values: np.ndarray) -> torch.Tensor:
        """Importance weights (float32 ``[B]``) copied into the next of ``depth`` reused tensors:
        valid as long as the batch's other outputs (wrapping a fresh array costs more than the copy)."""
        n = values.shape[0]
        ring = self._weights.get(n)
        if ring is None:
            ring = self._weights[n] = [(a, torch.from_numpy(a)) for a in
                                       (np.empty(n, dtype=np.float32) for _ in range(self.depth))]
            self._next_weights[n] = 0
        i = self._next_weights[n]
        self._next_weights[n] = (i + 1) % self.depth
        array, tensor = ring[i]
        if tensor.shape != array.shape or tensor.requires_grad:   # changed in place by an earlier batch
            tensor = torch.from_numpy(array)
            ring[i] = (array, tensor)
        array[:] = values
        return tensor
