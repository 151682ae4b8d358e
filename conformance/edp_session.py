"""Session helpers for adapters built on conduit_core's ExperienceDataPlane.

These read back what a data plane stored and delivered (ids are ``obs[:, 0]``; the
delivered rows' contents under the suite's names, ``Delivered.rows``), so an adapter's
Session only has to implement its own ingestion and delivery calls.
"""

from __future__ import annotations

import numpy as np

from conduit_core import Batch, ExperienceDataPlane
from conduit_core.queues import VersionWindowQueue

from .harness import ROW_FIELDS, AsyncQueue, Delivered


def stored_ids(edp: ExperienceDataPlane, id_field: str = "obs") -> np.ndarray:
    """Ids of what the buffer holds now, in insertion order (FIFO: the unconsumed part)."""
    edp.flush()
    return stored_ids_of_buffer(edp.buffer, id_field)


def stored_ids_of_buffer(buffer, id_field: str = "obs") -> np.ndarray:
    """Ids an ExperienceBuffer holds now, in insertion order (FIFO: the unconsumed part): the first
    element of each row's ``id_field``. Name the field that carries the id: for a dict observation
    the key's own field (``"obs.id"``: nested fields are stored under dotted names), since a dict's
    first element is whichever key sorts first (gymnasium sorts them), not necessarily the id."""
    if id_field not in buffer.spec:
        raise KeyError(f"id_field: expected one of the buffer's fields {list(buffer.spec.names)}, got {id_field!r}. "
                       "Fix: pass the field that carries the rollout ids (a dict observation's key as 'obs.KEY')")
    state = buffer.state_dict()
    seq = state["meta"]["seq"]
    kept = seq >= 0                  # removed rows (evict, early eviction) hold -1
    order = np.flatnonzero(kept)[np.argsort(seq[kept])]
    ids = np.asarray(state["data"][id_field])[order]
    ids = ids.reshape(ids.shape[0], -1)[:, 0] if ids.size else np.zeros(0, np.int64)   # (an empty buffer holds none)
    seq = seq[order]
    if buffer.selector.consumes:
        ids = ids[seq >= state["counters"]["head"]]
    return ids.astype(np.int64)


def rows_of(columns, names: dict[str, str] | None = None) -> dict[str, np.ndarray]:
    """``Delivered.rows`` from the columns a learner receives (tensors or arrays): ``names`` maps
    each suite key (``ROW_FIELDS``) to the framework's column name (None: the same names); a
    column the learner does not get is left out. Copied: delivered batches may reuse their memory."""
    names = names or {k: k for k in ROW_FIELDS}
    out = {}
    for key, col in names.items():
        if col in columns:
            v = columns[col]
            out[key] = np.array(v.detach().cpu().numpy() if hasattr(v, "detach") else v, copy=True)
    return out


def delivered(batch: Batch, id_field: str = "obs", names: dict[str, str] | None = None) -> Delivered:
    """A Batch the learner receives as it is; ``names``: see ``rows_of``."""
    col = batch[id_field]
    ids = col.reshape(batch.size, -1)[:, 0] if batch.size else col.new_zeros(0)
    ids = ids.cpu().numpy().astype(np.int64)
    return Delivered(ids=ids, versions=batch.versions, weights=None if batch.weights is None else
                     batch.weights.cpu().numpy(), inserted_at_selection=batch.inserted_at_selection, handle=batch,
                     rows=rows_of(batch, names))


class VersionWindowAsync(AsyncQueue):
    """The suite's view (capability 'async') of conduit_core's :class:`VersionWindowQueue`: for an
    adapter whose asynchronous trainer takes its samples from one (its ``async_queue`` returns this over
    the queue its trainer uses)."""

    def __init__(self, queue: VersionWindowQueue):
        self.queue = queue

    def try_admit(self):
        return self.queue.try_admit()

    def put(self, ticket, item, *, versions):
        self.queue.put(ticket, item, versions=versions)

    def try_take(self, n):
        taken = self.queue.try_take(n)
        return None if taken is None else [t.item for t in taken]

    def publish_version(self, version):
        self.queue.publish_version(version)

    def pending(self):
        return self.queue.pending_items()

    def close(self):
        self.queue.close()
