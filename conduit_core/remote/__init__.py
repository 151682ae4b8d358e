"""Remote: shards held by Ray actors, on another node if asked (the ``remote`` shard kind), the
staging area where writers at the source leave rows for them, how columns travel between them,
and the local Ray session Conduit's own tools start. Ray is imported only when one is used."""

from .ray_local import init_local
from .remote_shard import RemoteShard, ShardActor, spawn, wait_ready
from .wire import INLINE_BYTES, REMOTE_CALL_TIMEOUT_S, cut_columns, join_reply, reply_layout, reply_pieces

__all__ = ["INLINE_BYTES", "REMOTE_CALL_TIMEOUT_S", "RemoteShard", "ShardActor", "cut_columns", "init_local",
           "join_reply", "reply_layout", "reply_pieces", "spawn", "wait_ready"]
