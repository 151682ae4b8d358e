"""How columns travel between a shard's actor and its callers: cut into pieces that Ray carries
in the call itself (under its direct-call limit) instead of the object store, and joined again.
Both ends compute the same layout from the spec, so no piece carries its own description."""

from __future__ import annotations

import numpy as np

# Ray carries a return value under its direct-call limit (100 KB) in the reply and puts a
# larger one in the object store, which costs milliseconds more. Between two nodes of a local
# ray.cluster_utils.Cluster (benchmarks/plane/remote_reply.py, docs/benchmarks.md 5b): 128 KB
# whole 3.9 ms, in 2 pieces 0.9 ms; 1 MB 6.0 vs 1.7 ms; 4 MB 11.6 vs 9.0 ms (43 pieces).
# The longest a call to a shard's actor may take (the buffer's lock is held meanwhile): an actor
# alive but stuck ends in ExperienceTimeout instead of blocking every buffer operation.
REMOTE_CALL_TIMEOUT_S = 300.0
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


def cut_columns(spec, columns: dict[str, np.ndarray], n_rows: int) -> tuple[list[str], list[np.ndarray]]:
    """``columns`` cut as ``reply_layout`` cuts them, for a write: Ray inlines each argument
    under its direct-call limit too (sending 128 KB-1 MB: 0.24-0.39x the single-argument
    round trip in benchmarks/plane/remote_reply.py)."""
    names = list(columns)
    pieces = [columns[name][a:b] for name, cuts in reply_layout(spec, names, n_rows) for a, b in cuts]
    return names, pieces
