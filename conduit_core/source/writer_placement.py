"""Where a source's writer stages its rows: the remote shard it is handed (``ExperienceBuffer.writer``).

``assign_sources`` is the pure decision (a shard on the source's own node where there is one, the
least loaded; else the least loaded of all); ``shard_nodes`` asks the shards' actors where they run;
``make_writer`` builds the writer. Split from ``source_commit`` (the driver's commit of receipts).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from ..errors import ConfigError
from ..remote.wire import REMOTE_CALL_TIMEOUT_S
from .source_writer import SourceWriter

log = logging.getLogger("conduit")


def make_writer(buf, *, source: int, shard: int | None = None, node: str | None = None) -> SourceWriter:
    """``ExperienceBuffer.writer``: a writer for one source that stages in remote shard
    ``shard``, or in the remote shard whose actor runs on Ray node ``node`` (e.g. the caller's
    ``ray.get_runtime_context().get_node_id()``), or by default in remote shard ``source``
    modulo their number."""
    remote = {i: p for i, p in enumerate(buf.storage.parts) if getattr(p, "begin_pull", None) is not None}
    if not remote:
        raise ConfigError("writer()", "a buffer with remote shards (ShardSpec('remote', n, node=...))",
                          "no remote shard", "add through ExperienceBuffer.add, or place shards on the nodes")
    if shard is None and node is not None:
        shard = assign_sources({source: node}, shard_nodes(buf))[source]
    if shard is None:
        shard = sorted(remote)[int(source) % len(remote)]
    if shard not in remote:
        raise ConfigError("shard", f"the index of a remote shard, one of {sorted(remote)}", shard,
                          "pick a remote shard (or pass node= and let the buffer pick)")
    return SourceWriter(spec_config=buf.spec.to_config(), capacity=buf.capacity, done_fields=buf.done_fields,
                        actor=remote[shard].actor, shard=shard, source=source, buffer=buf.ingest_ledger.buffer)


def shard_nodes(buf) -> dict[int, str]:
    """The Ray node each remote shard's actor runs on. A shard whose actor is gone is left out (its
    loss is recorded when an operation on the buffer reaches it): writers go to the others
    meanwhile, where asking it raised (RLlib's runners got no writers at all)."""
    import ray

    remote = {i: p for i, p in enumerate(buf.storage.parts) if getattr(p, "begin_pull", None) is not None}
    refs = {i: p.actor.node_id.remote() for i, p in remote.items()}
    out = {}
    for i, ref in refs.items():
        try:
            out[i] = ray.get(ref, timeout=REMOTE_CALL_TIMEOUT_S)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError):
            log.warning("conduit: remote shard %d does not answer; no writer is placed there", i)
    return out


def assign_sources(source_nodes: Mapping[int, str | None], shard_nodes: Mapping[int, str]) -> dict[int, int]:
    """Pure: a shard per source, one on the source's own node where there is one (the least
    loaded of them), else the least loaded of all; ties go to the lower index."""
    if not shard_nodes:
        raise ConfigError("shard_nodes", "at least one remote shard", "none", "place a remote shard on a node")
    load = {s: 0 for s in shard_nodes}
    out = {}
    for source in sorted(source_nodes):
        near = [s for s, node in shard_nodes.items() if node == source_nodes[source]]
        pick = min(near or list(shard_nodes), key=lambda s: (load[s], s))
        load[pick] += 1
        out[source] = pick
    return out
