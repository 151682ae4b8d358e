"""Columnar storage: one preallocated tensor per field per shard, addressed by ring slot.

    slot:     0 ........................................ capacity-1
    shards:   [ shard 0: tier A ][ shard 1: tier B ][ shard 2 ... ]
    columns:  obs      [c0, *obs.stored_shape]   [c1, ...]
              action   [c0]                      [c1]
              ...

The storage knows nothing about rings, selectors or semantics: it writes contiguous
runs of slots and gathers arbitrary slots, vectorized, decoding on the target device.
Host shards are gathered with ``np.take(..., out=...)`` into reused output buffers
(the fastest random gather on CPU); device shards with ``torch.index_select``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import torch

from .errors import CapacityError, ConfigError, ShardLost
from .framestack import FramePool, FrameStackCodec, PooledDecoder, frames_of, pool_frames
from .spec import ExperienceSpec, as_tensor
from .staging import PinnedStaging, check_access, device_alias, take_into
from .tiers import SharedSegment, Tier, allocate, numpy_view


_CPU = torch.device("cpu")


@dataclass(frozen=True)
class ShardSpec:
    """A contiguous range of ``capacity`` slots placed on ``tier`` (``device`` for DEVICE)."""

    tier: Tier
    capacity: int
    device: str | None = None
    node: str | None = None    # REMOTE: the Ray custom resource that pins the shard's actor to a node
    access: str = "copy"       # how a GPU learner reads it: "copy" (host gather + async copy) or
                               # "mapped" (the device gathers from pinned memory in place, as Gear)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tier", Tier.parse(self.tier, argument="ShardSpec.tier"))
        if int(self.capacity) <= 0:
            raise ConfigError("ShardSpec.capacity", "a positive number of slots", self.capacity,
                              "give every shard at least one slot")
        check_access(self.access, self.tier.value)

    def to_config(self) -> dict:
        return {"tier": self.tier.value, "capacity": int(self.capacity), "device": self.device, "node": self.node,
                "access": self.access}


def even_shards(capacity: int, tiers: Sequence[Tier | str], device: str | None = None) -> list[ShardSpec]:
    """Split ``capacity`` into one shard per tier, as evenly as possible."""
    k = len(tiers)
    base, extra = divmod(capacity, k)
    return [ShardSpec(Tier.parse(t), base + (i < extra), device) for i, t in enumerate(tiers)]


class ColumnarStorage:
    """Per-field, per-shard tensors. Not thread-safe by itself: the buffer serialises access."""

    def __init__(self, *, spec: ExperienceSpec, shards: Sequence[ShardSpec]):
        if not shards:
            raise ConfigError("shards", "at least one ShardSpec", "none", "pass shards=[ShardSpec('pageable', n)]")
        self.spec = spec
        self.shards = list(shards)
        self.capacity = sum(s.capacity for s in self.shards)
        self.bounds = np.cumsum([0] + [s.capacity for s in self.shards])  # shard i = [b_i, b_{i+1})
        self._segments: list = []  # owners of shared / lazily mapped memory
        self.columns: dict[str, list[torch.Tensor]] = {}
        self._np: dict[str, list[np.ndarray | None]] = {}
        self.actors: dict[int, object] = {}  # shard index -> RemoteShard actor
        for i, sh in enumerate(self.shards):
            if sh.tier is Tier.REMOTE:
                if any(isinstance(f.codec, FrameStackCodec) for f in spec):
                    raise ConfigError("shards", "local tiers for specs with frame pools", "a remote shard",
                                      "keep frame-stacked buffers on local tiers")
                from .remote import spawn
                self.actors[i] = spawn(spec.to_config(), sh.capacity, sh.node)
        if self.actors:
            from .remote import wait_ready
            try:
                wait_ready(self.actors, {i: self.shards[i].node for i in self.actors})
            except BaseException:
                import ray
                for actor in self.actors.values():  # no actor left behind by a layout not built
                    ray.kill(actor)
                raise
        for f in spec:
            cols, views = [], []
            for i, sh in enumerate(self.shards):
                if sh.tier is Tier.REMOTE:
                    cols.append(None)
                    views.append(None)
                    continue
                t, seg = allocate(sh.tier, (sh.capacity, *f.stored_shape), f.stored_dtype, device=sh.device)
                if seg is not None:
                    self._segments.append(seg)
                cols.append(t)
                views.append(numpy_view(t))
            self.columns[f.name] = cols
            self._np[f.name] = views
        self._single_host = len(self.shards) == 1 and self.shards[0].tier.is_local_host
        self._staging: PinnedStaging | None = None        # host -> device copies (made on first use)
        self._aliases: dict[tuple[str, int, str], torch.Tensor] = {}  # device views of "mapped" shards
        self.pools = self._make_pools()
        # Decoders per field: None (identity), the field's codec, or a frame-pool reader.
        self.decoders = {}
        for f in spec:
            if isinstance(f.codec, FrameStackCodec):
                self.decoders[f.name] = PooledDecoder(self.pools[f.codec.pool], f.codec)
            else:
                self.decoders[f.name] = None if f.codec.is_identity else f.codec
        # The hot path's plan, computed once: (name, numpy view or None, decoder or None, dtype)
        self._plan = [(f.name, self._np[f.name][0], self.decoders[f.name], f.dtype) for f in spec]
        # every field a plain numpy column of one host shard: delivery is one take per field
        self._plain_host = self._single_host and all(v is not None and d is None for _, v, d, _ in self._plan)

    def _make_pools(self) -> dict[str, FramePool]:
        groups: dict[str, list] = {}
        for f in self.spec:
            if isinstance(f.codec, FrameStackCodec):
                groups.setdefault(f.codec.pool, []).append(f)
        pools = {}
        for name, fields in groups.items():
            c0 = fields[0].codec
            shape0, dt0 = c0.frame_shape(fields[0].shape), c0.frame_dtype(fields[0].dtype)
            for f in fields[1:]:
                if f.codec.k != c0.k or f.codec.frame_shape(f.shape) != shape0 or f.codec.frame_dtype(f.dtype) != dt0:
                    raise ConfigError(f"{f.name}.codec", f"the frame shape/dtype/k of pool {name!r}",
                                      f"{f.codec.frame_shape(f.shape)}", "give fields sharing a pool equal frames")
            host_tier = Tier.SHARED if any(s.tier is Tier.SHARED for s in self.shards) else Tier.PAGEABLE
            pools[name] = FramePool(name=name, frames=pool_frames(self.capacity, c0, len(fields)), frame_shape=shape0,
                                    dtype=dt0, k=c0.k, tier=host_tier)
            pools[name].fields = [f.name for f in fields]
        return pools

    def plan_frames(self, enc: dict, n: int) -> list:
        """Intern stacked fields' frames: replaces each pooled column in ``enc`` by its
        last-frame ids and returns the pending pool writes (committed by ``commit_frames``
        once the buffer has evicted what the new frames overwrite)."""
        pending = []
        for pool in self.pools.values():
            codecs = [self.spec[f].codec for f in pool.fields]
            stacks = np.stack([frames_of(c, enc[f]) for c, f in zip(codecs, pool.fields)], axis=1)
            # row-major: r0f0, r0f1, r1f0...; one copy into C order (np.stack keeps the views' layout)
            stacks = np.ascontiguousarray(stacks.reshape(n * len(pool.fields), *stacks.shape[2:]))
            last, sel, count = pool.plan(stacks)
            ids = last.reshape(n, len(pool.fields))
            for j, f in enumerate(pool.fields):
                enc[f] = ids[:, j].copy()
            pending.append((pool, stacks, sel, count, last))
        return pending

    @staticmethod
    def commit_frames(pending: list) -> None:
        for pool, stacks, sel, count, last in pending:
            pool.write(stacks, sel, count, last)

    def pool_bytes(self) -> int:
        return sum(p.capacity * int(np.prod(p.frame_shape)) * p.tensor.element_size() for p in self.pools.values())

    def stored_numpy_dtypes(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """(stored row shape, numpy dtype) per field, for callers that pre-allocate outputs."""
        return {f.name: (f.stored_shape, np.dtype(str(f.stored_dtype).replace("torch.", "")))
                for f in self.spec if f.stored_dtype != torch.bfloat16}

    # ----------------------------------------------------------------- info
    def shared_segment_names(self) -> dict[str, list[str]]:
        """Names of the shared segments, per field, for another process to attach (SHARED only)."""
        shared = iter(s for s in self._segments if isinstance(s, SharedSegment))
        return {f.name: [next(shared).name if sh.tier is Tier.SHARED else "" for sh in self.shards]
                for f in self.spec}

    def host_view(self, name: str) -> np.ndarray | None:
        """The stored column as one numpy array when it is one host shard, else None."""
        return self._np[name][0] if self._single_host else None

    def shard_of(self, slots: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.bounds, slots, side="right") - 1

    # ---------------------------------------------------------------- write
    def write(self, start: int, columns: Mapping[str, torch.Tensor], n: int) -> None:
        """Write ``n`` encoded rows at ring slots ``start, start+1, ...`` (wrapping)."""
        if n > self.capacity:
            raise CapacityError(f"batch of {n} transitions is larger than the buffer capacity "
                                f"{self.capacity}. Fix: raise capacity or split the batch.")
        slot = start % self.capacity
        if self._single_host and slot + n <= self.capacity:  # the common case: one run, one host shard
            for name, src in columns.items():
                dst = self._np[name][0]
                if dst is not None and isinstance(src, np.ndarray):
                    dst[slot: slot + n] = src
                else:
                    self.columns[name][0][slot: slot + n].copy_(as_tensor(src))
            return
        done = 0
        while done < n:
            shard = int(np.searchsorted(self.bounds, slot, side="right") - 1)
            lo, hi = int(self.bounds[shard]), int(self.bounds[shard + 1])
            run = min(n - done, hi - slot)
            if shard in self.actors:
                import ray
                from .remote import cut_columns
                part = {name: (src.numpy() if isinstance(src, torch.Tensor) else np.asarray(src))[done: done + run]
                        for name, src in columns.items()}
                names, pieces = cut_columns(self.spec, part, run)
                self._remote_get(shard, lambda a: a.write_pieces.remote(slot - lo, run, names, *pieces))
                done += run
                slot = (slot + run) % self.capacity
                continue
            for name, src in columns.items():
                dst = self._np[name][shard]
                if dst is not None and isinstance(src, np.ndarray):
                    dst[slot - lo: slot - lo + run] = src[done: done + run]
                else:
                    self.columns[name][shard][slot - lo: slot - lo + run].copy_(as_tensor(src)[done: done + run])
            done += run
            slot = (slot + run) % self.capacity

    def read_rows(self, start: int, n: int) -> dict[str, torch.Tensor]:
        """Stored (encoded) rows ``start .. start+n`` (no wrap) on the host: for state dicts."""
        return {name: self._gather_stored(name, np.arange(start, start + n, dtype=np.int64), None, torch.device("cpu"))
                for name in self.columns}

    # --------------------------------------------------------------- gather
    def gather(self, slots: np.ndarray, *, device: torch.device | None = None,
               out: Mapping[str, np.ndarray] | None = None,
               fields: Sequence[str] | None = None,
               out_tensors: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Decoded rows at ``slots`` (int64 array of any shape), on ``device`` (host if None).

        ``out`` optionally gives reused host output arrays of the stored shape, which
        avoids first-touch page faults on large batches (the caller owns their lifetime);
        ``out_tensors``, their tensor views, spares wrapping them again (a view that a caller
        changed in place, shape or requires_grad, is replaced in that mapping by a fresh one).
        """
        target = device if device is not None else _CPU
        if self._single_host and slots.ndim == 1:
            return self._gather_fast(slots, target, out, fields, out_tensors)
        names = list(fields if fields is not None else self.columns)
        remote = self._gather_remote(slots.reshape(-1), names) if self.actors else None
        route = None if self._single_host else _Route(self, slots.reshape(-1))  # once for every field
        result: dict[str, torch.Tensor] = {}
        for name in names:
            f = self.spec[name]
            dec = self.decoders[name]
            if isinstance(dec, PooledDecoder):  # frame ids stay on the host; the stacks go to the target
                ids = self._gather_stored(name, slots, None, _CPU, remote, route)
                result[name] = dec.decode(ids, f.dtype, device=target)
                continue
            stored = self._gather_stored(name, slots, None if out is None else out.get(name), target, remote, route)
            if stored.device != target:
                stored = stored.to(target, non_blocking=stored.is_pinned())
            result[name] = stored if dec is None else dec.decode(stored, f.dtype)
        return result

    def _gather_fast(self, slots: np.ndarray, target: torch.device, out, fields=None,
                     out_tensors=None) -> dict[str, torch.Tensor]:
        """One host shard, 1-D slots: one ``ndarray.take`` per field, nothing else (for a GPU
        target, into page-locked staging and on with an asynchronous copy)."""
        if target.type == "cpu" and fields is None and out is not None and out_tensors is not None \
                and self._plain_host:
            result = {}
            for name, view, _, _ in self._plan:   # the hot path: reused outputs, no codec, no wrapping
                view.take(slots, axis=0, out=out[name], mode="clip")
                t = out_tensors[name]
                if t.shape != out[name].shape or t.requires_grad:
                    # an earlier batch changed this wrapper in place (unsqueeze_, requires_grad_): a fresh
                    # one for the same memory, so that change stays in that batch
                    t = out_tensors[name] = torch.from_numpy(out[name])
                result[name] = t
            return result
        result = {}
        on_host = target.type == "cpu"
        staged: dict[str, torch.Tensor] = {}
        if not on_host and self.shards[0].access != "mapped":  # every staged column: one slot, one copy
            names = [name for name, _, codec, _ in self._plan
                     if (fields is None or name in fields) and not isinstance(codec, PooledDecoder)]
            cols = [self.columns[name][0] for name in names]
            parts = [(take_into(col, self._np[name][0], slots), slots.shape[0], tuple(col.shape[1:]), col.dtype)
                     for name, col in zip(names, cols)]
            if self._staging is None:
                self._staging = PinnedStaging()
            staged.update(zip(names, self._staging.copy_packed("rows", parts, target)))
        for name, view, codec, dtype in self._plan:
            if fields is not None and name not in fields:
                continue
            if isinstance(codec, PooledDecoder):  # frame ids stay on the host; the stacks go to the target
                result[name] = codec.decode(torch.from_numpy(view.take(slots, axis=0)), dtype, device=target)
                continue
            if name in staged:
                t = staged[name]
            elif not on_host:
                t = self._to_device(name, 0, slots, target)
            elif view is not None:
                if out is None:
                    t = torch.from_numpy(view.take(slots, axis=0))
                else:
                    view.take(slots, axis=0, out=out[name], mode="clip")
                    t = out_tensors.get(name) if out_tensors is not None else None
                    if t is None or t.shape != out[name].shape or t.requires_grad:
                        t = torch.from_numpy(out[name])
                        if out_tensors is not None:
                            out_tensors[name] = t
            else:
                t = torch.index_select(self.columns[name][0], 0, torch.from_numpy(slots))
            result[name] = t if codec is None else codec.decode(t, dtype)
        return result

    def _to_device(self, name: str, shard: int, local: np.ndarray, target: torch.device) -> torch.Tensor:
        """Rows ``local`` of a host shard's column, on the GPU ``target``: gathered by the
        device from pinned memory (``access="mapped"``), else gathered on the host into
        page-locked staging and copied asynchronously (see ``staging``)."""
        col = self.columns[name][shard]
        if self.shards[shard].access == "mapped":
            key = (name, shard, str(target))
            alias = self._aliases.get(key)
            if alias is None:
                alias = self._aliases[key] = device_alias(col, target)
            return torch.index_select(alias, 0, torch.from_numpy(local).to(target))
        if self._staging is None:
            self._staging = PinnedStaging()
        fill = take_into(col, self._np[name][shard], local)
        return self._staging.copy(f"{name}/{shard}", fill, local.shape[0], tuple(col.shape[1:]), col.dtype, target)

    def _gather_remote(self, flat: np.ndarray, names: list[str]) -> dict[int, tuple[np.ndarray, dict]]:
        """One call per remote shard: its positions in ``flat`` and the wanted fields' rows
        (returned in pieces that Ray carries in the reply: see remote.reply_pieces)."""
        import ray

        from .remote import join_reply, reply_layout
        shard_ids = self.shard_of(flat)
        calls = {}
        for s, actor in self.actors.items():
            pos = np.nonzero(shard_ids == s)[0]
            if pos.size:
                layout = reply_layout(self.spec, names, pos.size)
                k = sum(len(p) for _, p in layout)
                try:
                    refs = actor.gather_columns.options(num_returns=k).remote(flat[pos] - self.bounds[s], names)
                except ray.exceptions.RayActorError as exc:
                    raise ShardLost(s, self.shards[s].node, exc) from exc
                calls[s] = (pos, layout, refs if k > 1 else [refs])
        return {s: (pos, join_reply(layout, self._remote_get(s, lambda a, r=refs: r)))
                for s, (pos, layout, refs) in calls.items()}

    def _remote_get(self, shard: int, call):
        """``ray.get`` of ``call(actor)``; an actor that died (or whose node left) is ShardLost."""
        import ray
        try:
            return ray.get(call(self.actors[shard]))
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
            raise ShardLost(shard, self.shards[shard].node, exc) from exc

    def replace_shard(self, shard: int, *, timeout: float = 60.0) -> str:
        """A new, empty actor for a lost remote shard: on its node if that is still there,
        else on any node. Returns the Ray node id it runs on."""
        import ray

        from .remote import spawn, wait_ready
        try:
            ray.kill(self.actors[shard])
        except Exception:  # noqa: BLE001 - it is gone already
            pass
        for node in (self.shards[shard].node, None):
            actor = spawn(self.spec.to_config(), self.shards[shard].capacity, node)
            try:
                wait_ready({shard: actor}, {shard: node}, timeout=timeout if node is None else min(timeout, 15.0))
            except Exception:  # noqa: BLE001 - that node is gone too: try anywhere
                try:
                    ray.kill(actor)
                except Exception:  # noqa: BLE001
                    pass
                continue
            self.actors[shard] = actor
            return ray.get(actor.node_id.remote())
        raise ShardLost(shard, self.shards[shard].node, RuntimeError("no node could host its replacement"))

    def gather_stored(self, name: str, slots: np.ndarray) -> torch.Tensor:
        """Field ``name`` of the rows at ``slots`` as stored (encoded, not decoded), on the host:
        what a layout copy or a remote shard's reply moves."""
        return self._gather_stored(name, slots, None, _CPU)

    def _gather_stored(self, name: str, slots: np.ndarray, out: np.ndarray | None,
                       target: torch.device, remote: dict | None = None, route: _Route | None = None) -> torch.Tensor:
        flat = slots.reshape(-1)
        lead = slots.shape
        if self._single_host:
            view = self._np[name][0]
            if view is not None:
                if out is None:
                    res = np.take(view, flat, axis=0)
                else:
                    res = np.take(view, flat, axis=0, out=out.reshape((-1, *view.shape[1:])))
                return torch.from_numpy(res).view(*lead, *view.shape[1:])
            col = self.columns[name][0]
            return torch.index_select(col, 0, torch.from_numpy(flat)).view(*lead, *col.shape[1:])
        # Several shards (or a device shard): gather each shard's part where it lives,
        # then assemble on the target device, moving only the stored (encoded) bytes.
        f = self.spec[name]
        route = route if route is not None else _Route(self, flat)
        if self.actors and remote is None:
            remote = self._gather_remote(flat, [name])
        if route.whole is not None and route.whole not in self.actors:  # one local shard: no scatter
            return self._shard_part(name, route.whole, route, target).view(*lead, *f.stored_shape)
        res_t = torch.empty((flat.shape[0], *f.stored_shape), dtype=f.stored_dtype, device=target)
        for s, pos, _ in route.parts:
            if s in self.actors:
                _, cols = remote[s]
                part = torch.from_numpy(np.require(cols[name], requirements='W')).to(target)
            else:
                part = self._shard_part(name, s, route, target)
            res_t[route.index(("pos", s), pos, target)] = part
        return res_t.view(*lead, *f.stored_shape)

    def _shard_part(self, name: str, s: int, route: _Route, target: torch.device) -> torch.Tensor:
        """The rows of local shard ``s`` that ``route`` wants, on ``target``."""
        local = route.local(s)
        col = self.columns[name][s]
        if target.type == "cuda" and col.device.type == "cpu":
            return self._to_device(name, s, local, target)
        return torch.index_select(col, 0, route.index(("local", s), local, col.device)).to(target)

    # ---------------------------------------------------------------- close
    def close(self) -> None:
        self._aliases = {}
        if self._staging is not None:
            self._staging.close()  # waits for copies still reading the staging buffers
            self._staging = None
        self.columns = {}
        self._np = {}
        self._plan = []
        self._plain_host = False
        for pool in self.pools.values():
            pool.close()
        for seg in self._segments:
            seg.close()
        self._segments = []
        if self.actors:
            import ray
            for actor in self.actors.values():
                try:
                    ray.kill(actor)
                except Exception:  # the cluster may already be gone
                    pass
            self.actors = {}


class _Route:
    """Where the rows of one gather live: per shard, their positions in the batch and their
    local slots, with index tensors moved to a device once per gather, not once per field."""

    def __init__(self, storage: ColumnarStorage, flat: np.ndarray):
        shard_ids = storage.shard_of(flat)
        self.parts: list[tuple[int, np.ndarray, np.ndarray]] = []
        for s in np.unique(shard_ids):
            pos = np.nonzero(shard_ids == s)[0]
            self.parts.append((int(s), pos, flat[pos] - storage.bounds[s]))
        self.whole = self.parts[0][0] if len(self.parts) == 1 else None   # one shard holds every row
        self._local = {s: local for s, _, local in self.parts}
        self._tensors: dict[tuple, torch.Tensor] = {}

    def local(self, shard: int) -> np.ndarray:
        return self._local[shard]

    def index(self, key: tuple, arr: np.ndarray, device: torch.device) -> torch.Tensor:
        t = self._tensors.get((key, str(device)))
        if t is None:
            t = self._tensors[(key, str(device))] = torch.from_numpy(arr).to(device)
        return t
