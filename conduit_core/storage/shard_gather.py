"""Stored rows gathered across a layout's shards: started on every shard before any is awaited.

Why: a remote shard answers a gather in a Ray round trip (3-5 ms on one machine's Cluster, more
across hosts). Where a delivery needs several gathers whose slots are all known (an n-step
window's first rows and its last rows), starting each shard's part of every one of them before
finishing any lets them travel together: one round trip's wait instead of one per gather
(``ColumnarStorage.gather_each``). Host shards gather when finished, as before.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from .shards import Gathered


def begin_stored_gather(parts: Sequence, bounds: np.ndarray, spec, flat: np.ndarray, names: list[str],
                        target: torch.device) -> Gathered:
    """Start gathering the stored rows at ``flat`` (ring slots, 1-D) for ``names`` from the shards
    ``parts`` (shard i holds slots ``bounds[i] .. bounds[i+1]``); the returned call finishes it:
    ``{name: tensor [len(flat), *stored_shape]}`` on ``target``, only the stored (encoded) bytes
    moved. Every shard's part is started here (host shards' rows are taken here: ``host_rows``)."""
    if not flat.size or not names:
        empty = {name: torch.empty((0, *spec[name].stored_shape), dtype=spec[name].stored_dtype, device=target)
                 for name in names}
        return lambda: empty
    shard_ids = np.searchsorted(bounds, flat, side="right") - 1
    first = int(shard_ids[0])
    if target.type == "cpu":
        rows = host_rows(parts, bounds, flat, shard_ids, names)
        if rows is not None:
            return lambda: rows
    if (shard_ids == first).all():   # one shard holds every row: no scatter
        finish_one = parts[first].begin_gather(flat - int(bounds[first]), names, target)

        def one() -> dict:
            return {name: t if t.device == target else t.to(target) for name, t in finish_one().items()}
        return one
    started = []
    for s in np.unique(shard_ids):
        pos = np.nonzero(shard_ids == s)[0]
        started.append((pos, parts[s].begin_gather(flat[pos] - bounds[s], names, target)))

    def scattered() -> dict:
        res = {name: torch.empty((flat.shape[0], *spec[name].stored_shape), dtype=spec[name].stored_dtype,
                                 device=target) for name in names}
        for pos, finish in started:
            index = torch.from_numpy(pos).to(target)
            for name, part in finish().items():
                res[name][index] = part if part.device == target else part.to(target)
        return res
    return scattered


def host_rows(parts: Sequence, bounds: np.ndarray, flat: np.ndarray, shard_ids: np.ndarray,
              names: list[str]) -> dict | None:
    """The rows at ``flat`` (``shard_ids``: each one's shard) taken with numpy where every shard
    they fall in holds every field of ``names`` as a host numpy column (``Shard.host_column``),
    else None (the shards' own gathers then run). Host shards have nothing to wait for, so their
    rows are taken at once into fresh arrays: per field, one numpy fancy-index read per shard and
    its scatter into the batch's array, where torch's per-shard ``index_select`` and index
    assignment into fresh tensors took most of a draw over two host shards (docs/benchmarks.md
    section 17b)."""
    if not flat.size:
        return None
    shards = np.unique(shard_ids)
    columns = []
    for s in shards.tolist():
        cols = [parts[s].host_column(name) for name in names]
        if any(c is None for c in cols):
            return None
        columns.append((s, cols))
    if len(columns) == 1:
        s, cols = columns[0]
        local = flat - int(bounds[s])
        return {name: torch.from_numpy(np.take(col, local, axis=0)) for name, col in zip(names, cols)}
    out = [np.empty((flat.shape[0], *col.shape[1:]), dtype=col.dtype) for col in columns[0][1]]
    for s, cols in columns:
        pos = np.flatnonzero(shard_ids == s)
        local = flat[pos] - int(bounds[s])
        for res, col in zip(out, cols):
            res[pos] = col[local]
    return {name: torch.from_numpy(res) for name, res in zip(names, out)}
