"""What delivery hands to a learner: a dict of tensors plus where each row came from."""

from __future__ import annotations

import numpy as np
import torch


class Batch(dict):
    """A training-ready batch: ``{field: tensor}`` with a leading batch dimension.

    Besides the data, a batch records provenance, which the guards and the conformance
    suite use and which priority updates need:

    - ``slots``: ring slot of each row (pass back to ``update_priorities``)
    - ``seqs``: global insertion number of each row (unique per transition ever stored)
    - ``versions``: policy version that produced each row
    - ``weights``: importance weights (prioritized selection) or None
    - ``inserted_at_selection``: how many items had been inserted when the rows were
      selected (delivery-time staleness is measured against it)
    """

    slots: np.ndarray
    seqs: np.ndarray
    versions: np.ndarray
    weights: torch.Tensor | None
    inserted_at_selection: int

    def __init__(self, data: dict[str, torch.Tensor], *, slots: np.ndarray, seqs: np.ndarray,
                 versions: np.ndarray, weights: torch.Tensor | None = None, inserted_at_selection: int = 0):
        super().__init__(data)
        self.slots, self.seqs, self.versions = slots, seqs, versions
        self.weights = weights
        self.inserted_at_selection = inserted_at_selection

    def __len__(self) -> int:  # number of fields, as for a dict
        return super().__len__()

    @property
    def size(self) -> int:
        """Number of rows (transitions or sequences)."""
        return int(self.seqs.shape[0])

    def to(self, device: torch.device | str, *, non_blocking: bool = False) -> "Batch":
        moved = {k: v.to(device, non_blocking=non_blocking) for k, v in self.items()}
        w = None if self.weights is None else self.weights.to(device, non_blocking=non_blocking)
        return Batch(moved, slots=self.slots, seqs=self.seqs, versions=self.versions, weights=w,
                     inserted_at_selection=self.inserted_at_selection)

    def clone(self) -> "Batch":
        """A copy that owns its memory (delivered batches may reuse output buffers)."""
        data = {k: v.clone() for k, v in self.items()}
        w = None if self.weights is None else self.weights.clone()
        return Batch(data, slots=self.slots.copy(), seqs=self.seqs.copy(), versions=self.versions.copy(),
                     weights=w, inserted_at_selection=self.inserted_at_selection)

    def split(self, parts: int) -> list["Batch"]:
        """``parts`` batches of equal size, rows in order (views, no copy): what data-parallel
        learners each train on. The batch size must divide evenly (no learner gets a ragged part)."""
        size = self.size
        if parts < 1 or size % parts:
            from .errors import ConfigError
            raise ConfigError("parts", f"a divisor of the batch size {size}", parts,
                              "sample a batch size that is a multiple of the number of learners")
        step = size // parts
        out = []
        for i in range(parts):
            rows = slice(i * step, (i + 1) * step)
            out.append(Batch({k: v[rows] for k, v in self.items()}, slots=self.slots[rows], seqs=self.seqs[rows],
                             versions=self.versions[rows], weights=None if self.weights is None else self.weights[rows],
                             inserted_at_selection=self.inserted_at_selection))
        return out
