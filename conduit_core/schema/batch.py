"""What delivery hands to a learner: a dict of tensors plus where each row came from."""

from __future__ import annotations

import numpy as np
import torch

from ..errors import ConfigError

try:
    from .._native._rows import draw_counts as _c_draw_counts
except ImportError:  # pragma: no cover - no C compiler at install time: numpy's route
    _c_draw_counts = None


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
    - ``sources``: the source (episode stream) each row was ingested from, where the
      delivery route records it (one-step and n-step draws), else None
    - ``n_steps``: the ``n_step`` column's values as the host array the walk wrote, where the
      route has one (numpy's view of a handed-out tensor costs more than the reads it serves)
    - ``redraws``: items drawn again by the redraw rule while selecting these rows (a window
      past its episode's stored end; of a draw split into several batches, on the first)
    - ``holds``: for a batch in a buffer's reused outputs (``reuse_outputs``), the token that keeps
      that memory from being reused while the batch, a part of it (``split``) or its host copy
      (``to("cpu")``) lives; None for fresh memory
    """

    slots: np.ndarray
    seqs: np.ndarray
    versions: np.ndarray
    weights: torch.Tensor | None
    inserted_at_selection: int
    sources: np.ndarray | None
    n_steps: np.ndarray | None
    redraws: int
    holds: object | None

    def __init__(self, data: dict[str, torch.Tensor], *, slots: np.ndarray, seqs: np.ndarray,
                 versions: np.ndarray, weights: torch.Tensor | None = None, inserted_at_selection: int = 0,
                 sources: np.ndarray | None = None, n_steps: np.ndarray | None = None, redraws: int = 0,
                 holds: object | None = None):
        super().__init__(data)
        self.holds = holds
        self.slots, self.seqs, self.versions = slots, seqs, versions
        self.weights = weights
        self.inserted_at_selection = inserted_at_selection
        self.sources, self.n_steps, self.redraws = sources, n_steps, redraws

    def draw_counts(self) -> tuple[int, int, int]:
        """(distinct rows, distinct sources, sum of the ``n_step`` column): how varied the draw was,
        which RLlib's buffers log per sample; -1 for sources not recorded or no ``n_step``
        column. One native call where it can (this runs on every training step)."""
        steps = self.n_steps
        if steps is None:
            n = self.get("n_step")
            steps = None if n is None else n.cpu().numpy()
        if _c_draw_counts is not None:
            got = _c_draw_counts(self.seqs, self.sources, steps)
            if got is not None:
                return got
        return (int(np.unique(self.seqs).size), -1 if self.sources is None else int(np.unique(self.sources).size),
                -1 if steps is None else int(steps.sum()))

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
                     inserted_at_selection=self.inserted_at_selection, sources=self.sources,
                     n_steps=self.n_steps if torch.device(device).type == "cpu" else None,   # (pooled: host only)
                     redraws=self.redraws, holds=self.holds if torch.device(device).type == "cpu" else None)

    def clone(self) -> "Batch":
        """A copy that owns its memory (delivered batches may reuse output buffers)."""
        data = {k: v.clone() for k, v in self.items()}
        w = None if self.weights is None else self.weights.clone()
        return Batch(data, slots=self.slots.copy(), seqs=self.seqs.copy(), versions=self.versions.copy(),
                     weights=w, inserted_at_selection=self.inserted_at_selection,
                     sources=None if self.sources is None else self.sources.copy(),
                     n_steps=None if self.n_steps is None else self.n_steps.copy(), redraws=self.redraws)

    def split(self, parts: int) -> list["Batch"]:
        """``parts`` batches of equal size, rows in order (views, no copy): what data-parallel
        learners each train on. The batch size must divide evenly (no learner gets a ragged part)."""
        size = self.size
        if parts < 1 or size % parts:
            raise ConfigError("parts", f"a divisor of the batch size {size}", parts,
                              "sample a batch size that is a multiple of the number of learners")
        step = size // parts
        out = []
        for i in range(parts):
            rows = slice(i * step, (i + 1) * step)
            out.append(Batch({k: v[rows] for k, v in self.items()}, slots=self.slots[rows], seqs=self.seqs[rows],
                             versions=self.versions[rows], weights=None if self.weights is None else self.weights[rows],
                             inserted_at_selection=self.inserted_at_selection,
                             sources=None if self.sources is None else self.sources[rows],
                             n_steps=None if self.n_steps is None else self.n_steps[rows],
                             redraws=self.redraws if i == 0 else 0, holds=self.holds))
        return out
