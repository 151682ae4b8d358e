"""The remote tier: a shard of the buffer held by a Ray actor, on another node if asked.

Distributed means Ray: a ``ShardSpec(tier="remote", capacity=n, node="<custom resource>")``
places its slot range in a ``RemoteShard`` actor pinned (through a Ray custom resource) to
the node that advertises that resource. Writes ship the rows' stored (encoded) columns in
one call; a gather ships the wanted slots back, one call per remote shard for all fields.
Ray is imported only when a remote shard is built.
"""

from __future__ import annotations

import numpy as np


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
        return dict(zip(fields, self.gather_columns(slots, fields)))

    def gather_columns(self, slots: np.ndarray, fields: list[str]):
        """One return value per field (call with ``num_returns=len(fields)``): Ray inlines a
        return under its direct-call limit (100 KB) in the reply, and puts a larger one in the
        object store, which costs milliseconds more. A batch's columns are each small, so
        returning them apart keeps a typical gather on the fast path."""
        import torch
        cpu = torch.device("cpu")
        cols = tuple(self.storage._gather_stored(name, slots, None, cpu).numpy() for name in fields)
        return cols if len(cols) > 1 else cols[0]

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
