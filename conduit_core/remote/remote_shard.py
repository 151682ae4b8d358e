"""The remote tier: a shard of the buffer held by a Ray actor, on another node if asked.

Distributed means Ray: a ``ShardSpec(tier="remote", capacity=n, node="<custom resource>")``
places its slot range in a ``ShardActor`` pinned (through a Ray custom resource) to
the node that advertises that resource. Writes ship the rows' stored (encoded) columns in
one call; a gather ships the wanted slots back, one call per remote shard for all fields.
Either way the columns travel cut into pieces under Ray's direct-call limit (``wire.reply_pieces``),
which Ray carries in the call itself instead of the object store. Ray is imported only when a
remote shard is built.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import torch

from ..errors import ConfigError, ExperienceTimeout, ShardLost, StagedRowsLost, StateError
from ..memory.tiers import Tier
from ..schema.spec import ExperienceSpec
from ..storage.columnar import ColumnarStorage
from ..storage.shards import Gathered, Shard, ShardSpec, register_shard_kind
from .staging_area import PULL_FAILED, STAGING_GROUP, StagingArea
from .wire import REMOTE_CALL_TIMEOUT_S, cut_columns, join_reply, reply_layout


class ShardActor(StagingArea):
    """The actor's body: a one-shard pageable ColumnarStorage of the same spec, and the
    staging area of the writers at the source that stage here (source_writer.py)."""

    def __init__(self, spec_config: list, capacity: int):
        self.storage = ColumnarStorage(spec=ExperienceSpec.from_config(spec_config),
                                       shards=[ShardSpec("pageable", capacity)])
        self.init_staging()

    def write_pieces(self, start: int, n: int, names: list[str], *pieces) -> None:
        """Write ``n`` rows at ``start``: the columns cut by ``cut_columns``, one argument per piece."""
        self.storage.write(start, join_reply(reply_layout(self.storage.spec, names, n), list(pieces)), n)

    def gather_columns(self, slots: np.ndarray, fields: list[str]):
        """The wanted rows as ``reply_layout`` cuts them: one return value per piece (call
        with ``num_returns`` = the layout's length)."""
        out = []
        for name, pieces in reply_layout(self.storage.spec, fields, len(slots)):
            col = self.storage.gather_stored(name, slots).numpy()
            out += [col[a:b] for a, b in pieces]
        return tuple(out) if len(out) > 1 else out[0]

    def node_id(self) -> str:
        import ray
        return ray.get_runtime_context().get_node_id()

    def close(self) -> None:
        self.storage.close()


def spawn(spec_config: list, capacity: int, node: str | None):
    import ray

    if not ray.is_initialized():
        raise ConfigError("tier 'remote'", "a running Ray session (ray.init or a cluster)", "none",
                          "call ray.init(address=...) before building a buffer with remote shards")
    # staging calls get their own thread: an actor pulling staged rows from another never waits on a busy one
    actor_cls = ray.remote(num_cpus=0, concurrency_groups={STAGING_GROUP: 1})(ShardActor)
    opts = {"resources": {node: 0.001}} if node else {}
    return actor_cls.options(**opts).remote(spec_config, capacity)


def wait_ready(actors: dict, nodes: dict, timeout: float = 600.0) -> None:
    """Block until every shard's actor runs. An actor's process takes about a second to start
    (measured: the first write to a fresh remote shard waited 1.3 s), so a buffer waits for
    it once, when built, instead of its first insert or delivery. An actor that can never start
    is a node resource no node advertises: refused at once, naming it. Otherwise the wait is for a
    process to start, which on a machine whose cores are all busy takes minutes (docs/benchmarks.md
    §11b): ``timeout`` bounds only that."""
    import ray

    wanted = sorted({str(n) for n in nodes.values() if n})
    advertised = ray.cluster_resources()
    missing = [n for n in wanted if n not in advertised]
    if missing:
        raise StateError(f"remote shards {sorted(actors)}: no node advertises the custom resources {missing}, so their "
                         f"actors cannot start. Fix: start the node with resources={{{missing[0]!r}: 1}} (ray start "
                         "--resources or cluster_utils.Cluster.add_node), or place the shards on a node that has it "
                         "(ray.cluster_resources())")
    try:
        ray.get([a.node_id.remote() for a in actors.values()], timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        raise StateError(f"remote shards {sorted(actors)}: their actors did not start within {timeout:.0f} s. "
                         f"Fix: check that a node advertises the custom resources {sorted(set(map(str, nodes.values())))} "
                         f"(ray.cluster_resources()) and has memory for the shard") from None


@register_shard_kind
class RemoteShard(Shard):
    """This process's handle on a ``ShardActor``: writes and gathers are calls to it, and an
    actor that died (or whose node left) surfaces as ``ShardLost`` for the buffer to handle."""

    kind = "remote"
    default_tier = Tier.REMOTE

    def __init__(self, spec, layout: ShardSpec, *, node: str | None = None, pin: bool = True):
        super().__init__(spec, layout)
        self.placed_on = layout.node if pin else node   # the node resource it asked for (None: any node)
        self.actor = spawn(spec.to_config(), self.capacity, self.placed_on)

    @classmethod
    def check_spec(cls, spec, layout: ShardSpec) -> None:
        if any(f.codec.frame_pool is not None for f in spec):
            raise ConfigError("shards", "local tiers for specs with frame pools", "a remote shard",
                              "keep frame-stacked buffers on local tiers")

    @classmethod
    def memory_needed(cls, layout: ShardSpec, row_bytes: int) -> dict[Tier, int]:
        return {}   # another node's memory: that node's actor refuses what it cannot hold

    def ready(self, timeout: float = 600.0) -> None:
        wait_ready({self.index: self.actor}, {self.index: self.placed_on}, timeout=timeout)

    def write(self, start: int, columns: Mapping[str, np.ndarray | torch.Tensor], first: int, n: int) -> None:
        staged = getattr(columns, "staged", None)   # rows a SourceWriter staged: the actor takes them itself
        if staged is not None:
            self.check_pulled(self._get(self.actor.write_staged.remote(start, *staged.key, first, n, staged.actor)),
                              staged)
            return
        part = {name: (src.numpy() if isinstance(src, torch.Tensor) else np.asarray(src))[first: first + n]
                for name, src in columns.items()}
        names, pieces = cut_columns(self.spec, part, n)
        self._get(self.actor.write_pieces.remote(start, n, names, *pieces))

    def begin_pull(self, staged, first: int, n: int):
        """Start making rows ``first .. first+n`` of a staged rollout local to this shard's actor
        (pulled actor to actor); the returned call finishes it (ShardLost: this shard is lost;
        StagedRowsLost: the staging actor is)."""
        ref = self.actor.pull_staged.remote(*staged.key, first, n, staged.actor)
        refs = getattr(staged, "pull_refs", None)
        if refs is not None:
            refs.setdefault(self.actor, []).append(ref)
        return lambda: self.check_pulled(self._get(ref), staged)

    def check_pulled(self, status: str, staged) -> None:
        if status.startswith(PULL_FAILED):   # the rows are still staged: this commit failed, not them
            raise RuntimeError(f"writer {staged.key[0][:8]} ticket {staged.key[1]}: shard {self.index} could not "
                               f"make its rows local ({status}); nothing of the receipt was stored and its rows "
                               "are still staged. Fix: commit the receipt again once the cause is gone")
        if status != "ok":
            raise StagedRowsLost(f"writer {staged.key[0][:8]} ticket {staged.key[1]}: the rows staged in shard "
                                 f"{staged.shard} are gone ({status}); they were never accepted. Fix: write them again "
                                 "through a new writer (ExperienceBuffer.writer)")

    def begin_gather(self, local: np.ndarray, names: Sequence[str], target: torch.device) -> Gathered:
        import ray
        names = list(names)
        layout = reply_layout(self.spec, names, local.size)
        k = sum(len(p) for _, p in layout)
        try:
            refs = self.actor.gather_columns.options(num_returns=k).remote(local, names)
        except ray.exceptions.RayActorError as exc:
            raise ShardLost(self.index, self.layout.node, exc, part=self) from exc

        def gathered() -> dict[str, torch.Tensor]:
            cols = join_reply(layout, self._get(refs if k > 1 else [refs]))
            return {name: torch.from_numpy(np.require(cols[name], requirements="W")) for name in names}
        return gathered

    def _get(self, refs):
        """``ray.get``; an actor that died (or whose node left) is ShardLost, one that does not
        answer within ``REMOTE_CALL_TIMEOUT_S`` an ExperienceTimeout."""
        import ray
        try:
            return ray.get(refs, timeout=REMOTE_CALL_TIMEOUT_S)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
            raise ShardLost(self.index, self.layout.node, exc, part=self) from exc
        except ray.exceptions.GetTimeoutError as exc:
            raise ExperienceTimeout(f"remote shard {self.index} (node {self.layout.node!r}): no answer in "
                                    f"{REMOTE_CALL_TIMEOUT_S:.0f} s. Fix: check the node's load and its actor "
                                    "(ray list actors), then retry") from exc

    def replacement(self, *, timeout: float) -> tuple["RemoteShard", str]:
        """A new, empty actor: on this shard's node if it is still there, else on any node."""
        import ray
        self.close()
        for node in (self.layout.node, None):
            try:
                new = RemoteShard(self.spec, self.layout, node=node, pin=False)
            except Exception:  # noqa: BLE001 - no Ray, or it refused the actor: try anywhere
                continue
            new.index = self.index
            try:
                new.ready(timeout if node is None else min(timeout, 15.0))
            except Exception:  # noqa: BLE001 - that node is gone too: try anywhere
                new.close()
                continue
            return new, ray.get(new.actor.node_id.remote())
        raise ShardLost(self.index, self.layout.node, RuntimeError("no node could host its replacement"))

    def close(self) -> None:
        try:
            import ray
            ray.kill(self.actor)
        except Exception:  # noqa: BLE001 - the actor or the cluster is gone already
            pass
