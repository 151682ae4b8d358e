"""The remote tier: a shard of the buffer held by a Ray actor, on another node if asked.

Distributed means Ray: a ``ShardSpec(tier="remote", capacity=n, node="<custom resource>")``
places its slot range in a ``RemoteShard`` actor pinned (through a Ray custom resource) to
the node that advertises that resource. Writes ship the rows' stored (encoded) columns in
one call; a gather ships the wanted slots back, one call per remote shard for all fields.
Ray is imported only when a remote shard is built.
"""

from __future__ import annotations

import numpy as np


# Ray carries a return value under its direct-call limit (100 KB) in the reply and puts a
# larger one in the object store, which costs milliseconds more. Between two nodes of a local
# ray.cluster_utils.Cluster (benchmarks/bench_remote_reply.py, docs/benchmarks.md 5b): 128 KB
# whole 4.1 ms, in 2 pieces 0.9 ms; 1 MB 5.3 vs 2.3 ms; 4 MB 13.0 vs 9.7 ms (43 pieces).
INLINE_BYTES = 96 << 10     # one piece: under the direct-call limit
INLINE_UP_TO = 2 << 20      # a larger column goes whole, through the object store


def reply_pieces(n_rows: int, row_bytes: int) -> list[tuple[int, int]]:
    """Row ranges a gathered column of ``n_rows`` comes back in, one return value each:
    pieces under Ray's direct-call limit up to ``INLINE_UP_TO`` bytes in all, else whole."""
    total = n_rows * row_bytes
    if n_rows == 0 or total <= INLINE_BYTES or total > INLINE_UP_TO:
        return [(0, n_rows)]
    per = max(1, INLINE_BYTES // max(1, row_bytes))
    return [(a, min(a + per, n_rows)) for a in range(0, n_rows, per)]


def reply_layout(spec, fields: list[str], n_rows: int) -> list[tuple[str, list[tuple[int, int]]]]:
    """The pieces of every wanted field, in return order (both ends of a gather compute it)."""
    return [(name, reply_pieces(n_rows, spec[name].stored_bytes)) for name in fields]


def join_reply(layout, values: list) -> dict[str, np.ndarray]:
    """Reassemble ``gather_columns``' return values into one array per field."""
    out, i = {}, 0
    for name, pieces in layout:
        parts = values[i:i + len(pieces)]
        i += len(pieces)
        out[name] = parts[0] if len(parts) == 1 else np.concatenate(parts)
    return out


class RemoteShard:
    """The actor's body: a one-shard pageable ColumnarStorage of the same spec."""

    def __init__(self, spec_config: list, capacity: int):
        from .spec import ExperienceSpec
        from .storage import ColumnarStorage, ShardSpec
        self.storage = ColumnarStorage(spec=ExperienceSpec.from_config(spec_config),
                                       shards=[ShardSpec("pageable", capacity)])

    def write(self, start: int, columns: dict, n: int) -> None:
        self.storage.write(start, columns, n)

    def gather(self, slots: np.ndarray, fields: list[str]) -> dict[str, np.ndarray]:
        values = self.gather_columns(slots, fields)
        layout = reply_layout(self.storage.spec, fields, len(slots))
        return join_reply(layout, list(values) if isinstance(values, tuple) else [values])

    def gather_columns(self, slots: np.ndarray, fields: list[str]):
        """The wanted rows as ``reply_layout`` cuts them: one return value per piece (call
        with ``num_returns`` = the layout's length)."""
        import torch
        cpu = torch.device("cpu")
        out = []
        for name, pieces in reply_layout(self.storage.spec, fields, len(slots)):
            col = self.storage._gather_stored(name, slots, None, cpu).numpy()
            out += [col[a:b] for a, b in pieces]
        return tuple(out) if len(out) > 1 else out[0]

    def node_id(self) -> str:
        import ray
        return ray.get_runtime_context().get_node_id()

    def close(self) -> None:
        self.storage.close()


def spawn(spec_config: list, capacity: int, node: str | None):
    import ray

    from .errors import ConfigError
    if not ray.is_initialized():
        raise ConfigError("tier 'remote'", "a running Ray session (ray.init or a cluster)", "none",
                          "call ray.init(address=...) before building a buffer with remote shards")
    actor_cls = ray.remote(num_cpus=0)(RemoteShard)
    opts = {"resources": {node: 0.001}} if node else {}
    return actor_cls.options(**opts).remote(spec_config, capacity)
