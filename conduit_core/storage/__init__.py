"""Storage: rows by slot in shards, one column per field. ``ColumnarStorage`` routes slots to its
shards; a shard (in this process's memory, memory-mapped on disk, or held by a Ray actor: see
``conduit_core.remote``) writes and gathers rows. Storage knows rows, not what they mean."""

from .columnar import ColumnarStorage
from .disk_shard import DiskShard
from .local_shard import LocalShard, MappedShard
from .shards import Shard, ShardSpec, even_shards, register_shard_kind, shard_kinds

__all__ = ["ColumnarStorage", "DiskShard", "LocalShard", "MappedShard", "Shard", "ShardSpec", "even_shards",
           "register_shard_kind", "shard_kinds"]
