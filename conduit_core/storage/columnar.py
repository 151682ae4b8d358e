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

from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from ..errors import CapacityError, ConfigError
from ..memory.output_pool import handed_out
from ..memory.tiers import Tier
from ..schema.framestack import FramePool, frames_of, klast_columns, pool_frames
from ..schema.spec import ExperienceSpec, as_tensor
from .shard_gather import begin_stored_gather
from .shards import Shard, ShardSpec, even_shards, shard_class

try:   # every column of an insert, and of a reused-output gather, in one C call
    from .._native._rows import copy_rows as _c_copy_rows
    from .._native._rows import gather_rows as _c_gather_rows
    from .._native._rows import take_rows as _c_take_rows
except ImportError:  # pragma: no cover - no C compiler where it was installed
    _c_copy_rows = _c_gather_rows = _c_take_rows = None

__all__ = ["ColumnarStorage", "ShardSpec", "even_shards"]


_CPU = torch.device("cpu")
# the most columns the native take copies in one pass (_rows.c take_rows)
TAKE_COLUMNS_MAX = 16


class ColumnarStorage:
    """Slots routed to shard objects (``shards.Shard``); frame pools and decoding on top.
    Not thread-safe by itself: the buffer serialises access."""

    def __init__(self, *, spec: ExperienceSpec, shards: Sequence[ShardSpec]):
        if not shards:
            raise ConfigError("shards", "at least one ShardSpec", "none", "pass shards=[ShardSpec('pageable', n)]")
        self.spec = spec
        self.shards = list(shards)          # the layout asked for (ShardSpecs)
        self.capacity = sum(s.capacity for s in self.shards)
        self.bounds = np.cumsum([0] + [s.capacity for s in self.shards])  # shard i = [b_i, b_{i+1})
        for layout in self.shards:
            shard_class(layout.kind).check_spec(spec, layout)
        self.parts: list[Shard] = []        # the shard objects holding the rows, one per ShardSpec
        self.pools: dict[str, FramePool] = {}
        try:
            for i, layout in enumerate(self.shards):
                part = shard_class(layout.kind)(spec, layout)
                part.index = i
                self.parts.append(part)
            for part in self.parts:   # after every start: remote actors start up concurrently
                part.ready()
            self.pools = self._make_pools()
        except BaseException:   # a layout not built leaves nothing behind (memory, segments, actors)
            self.close()
            raise
        self._single_host = len(self.parts) == 1 and self.parts[0].on_host
        self.may_lose_shards = any(part.can_be_lost for part in self.parts)   # replacements are of the same kind
        # Decoders per field, each made by the field's codec (None: stored as delivered), and the
        # fields whose stored values stay on the host (ids into a host frame pool)
        self._decoders = {f.name: None if f.codec.is_identity else f.codec.storage_decoder(self.pools) for f in spec}
        self._host_stored = frozenset(name for name, d in self._decoders.items() if d is not None and d.keeps_stored_on_host)
        # The hot path's plan, computed once: (name, numpy view or None, decoder or None, dtype)
        self._plan = [(f.name, self.parts[0].host_column(f.name) if self._single_host else None,
                       self._decoders[f.name], f.dtype) for f in spec]
        # every field a plain numpy column of one host shard: delivery is one take per field
        self._plain_host = self._single_host and all(v is not None and d is None for _, v, d, _ in self._plan)
        # ... and an insert is one C call copying every column (wrapping at the ring's end)
        self._copy_targets = tuple((name, v) for name, v, _, _ in self._plan) if self._plain_host else None
        self._copy_names = tuple(name for name, _ in self._copy_targets or ())
        self._take_plans: dict = {}   # field names (a tuple) -> their columns, for take_fresh
        self._into_plans: dict = {}   # and (name, column) pairs, for take_into

    def _make_pools(self) -> dict[str, FramePool]:
        groups: dict[str, list] = {}
        for f in self.spec:
            if f.codec.frame_pool is not None:
                groups.setdefault(f.codec.frame_pool, []).append(f)
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
            stacks = klast_columns(pool, codecs, [enc[f] for f in pool.fields])
            if stacks is not None:   # the k frames last (RLlib's Atari layout): read in place, no transposed copy
                last, sel, count = pool.plan_klast(stacks)
            else:
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
        return {f.name: [part.segment_name(f.name) for part in self.parts] for f in self.spec}

    def host_view(self, name: str) -> np.ndarray | None:
        """The stored column as one numpy array when it is one host shard, else None."""
        return self.parts[0].host_column(name) if self._single_host else None

    def shard_of(self, slots: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.bounds, slots, side="right") - 1

    # ---------------------------------------------------------------- write
    def write(self, start: int, columns: Mapping[str, torch.Tensor], n: int) -> None:
        """Write ``n`` encoded rows at ring slots ``start, start+1, ...`` (wrapping)."""
        if n > self.capacity:
            raise CapacityError(f"batch of {n} transitions is larger than the buffer capacity "
                                f"{self.capacity}. Fix: raise capacity or split the batch.")
        slot = start % self.capacity
        if self._copy_targets is not None and type(columns) is dict and _c_copy_rows is not None \
                and _c_copy_rows(columns, self._copy_targets, slot, n):
            return
        if self._single_host and slot + n <= self.capacity:  # the common case: one run, one host shard
            part = self.parts[0]
            for name, src in columns.items():
                dst = part.host_column(name)
                if dst is not None and isinstance(src, np.ndarray):
                    dst[slot: slot + n] = src
                else:
                    part.column(name)[slot: slot + n].copy_(as_tensor(src))
            return
        done = 0
        while done < n:
            shard = int(np.searchsorted(self.bounds, slot, side="right") - 1)
            lo, hi = int(self.bounds[shard]), int(self.bounds[shard + 1])
            run = min(n - done, hi - slot)
            self.parts[shard].write(slot - lo, columns, done, run)
            done += run
            slot = (slot + run) % self.capacity

    def read_rows(self, start: int, n: int) -> dict[str, torch.Tensor]:
        """Stored (encoded) rows ``start .. start+n`` (no wrap) on the host: for state dicts."""
        flat = np.arange(start, start + n, dtype=np.int64)
        return begin_stored_gather(self.parts, self.bounds, self.spec, flat, list(self.spec.names), _CPU)()

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
        if self._single_host:   # one host shard, slots of any shape (sequences): a take per field
            names = list(fields if fields is not None else self.spec.names)
            return {name: self._decode(name, self._take(name, slots, None if out is None or name in self._host_stored
                                                        else out.get(name)), target) for name in names}
        return self._begin_gather(slots, target, fields)()

    def gather_each(self, requests: Sequence[tuple[np.ndarray, Sequence[str]]], *,
                    device: torch.device | None = None) -> list[dict[str, torch.Tensor]]:
        """``gather(slots, device=device, fields=fields)`` for each ``(slots, fields)`` of
        ``requests``, with every shard's part of every one started before any is finished: over a
        remote shard, one round trip's wait for all of them (shard_gather.py)."""
        target = device if device is not None else _CPU
        if self._single_host:
            return [self.gather(slots, device=device, fields=fields) for slots, fields in requests]
        finishes = [self._begin_gather(slots, target, fields) for slots, fields in requests]
        return [finish() for finish in finishes]

    def _begin_gather(self, slots: np.ndarray, target: torch.device, fields) -> Callable[[], dict[str, torch.Tensor]]:
        """``gather`` over several shards or a remote one, started; the result finishes and decodes it."""
        names = list(fields if fields is not None else self.spec.names)
        pooled = [n for n in names if n in self._host_stored]
        flat = slots.reshape(-1)
        rows = begin_stored_gather(self.parts, self.bounds, self.spec, flat, [n for n in names if n not in pooled],
                                   target)
        frame_ids = begin_stored_gather(self.parts, self.bounds, self.spec, flat, pooled, _CPU) if pooled else None

        def finish() -> dict[str, torch.Tensor]:
            stored = rows()
            if frame_ids is not None:  # frame ids stay on the host; the stacks go to the target
                stored.update(frame_ids())
            return {name: self._decode(name, stored[name].view(*slots.shape, *self.spec[name].stored_shape), target)
                    for name in names}
        return finish

    def _decode(self, name: str, stored: torch.Tensor, target: torch.device) -> torch.Tensor:
        dec, f = self._decoders[name], self.spec[name]
        if name in self._host_stored:
            return dec.decode(stored, f.dtype, device=target)
        if stored.device != target:
            stored = stored.to(target, non_blocking=stored.is_pinned())
        return stored if dec is None else dec.decode(stored, f.dtype, target)

    def _take(self, name: str, slots: np.ndarray, out: np.ndarray | None) -> torch.Tensor:
        """One host shard: the stored rows at ``slots`` (any shape), into ``out`` if given."""
        part = self.parts[0]
        view = part.host_column(name)
        if view is None:
            col = part.column(name)
            return torch.index_select(col, 0, torch.from_numpy(slots.reshape(-1))).view(*slots.shape, *col.shape[1:])
        res = np.take(view, slots.reshape(-1), axis=0,
                      out=None if out is None else out.reshape((-1, *view.shape[1:])))
        return torch.from_numpy(res).view(*slots.shape, *view.shape[1:])

    def row_copy_targets(self) -> tuple | None:
        """``(name, ring column)`` per field where every field is a plain numpy column of one
        host shard (what ``_rows.copy_rows`` copies a batch into, as ``write`` does), else None."""
        return self._copy_targets

    def fills_outputs(self) -> bool:
        """Whether ``gather`` writes host rows into the ``out`` arrays it is given (one host
        shard); other layouts return fresh tensors and leave ``out`` untouched."""
        return self._single_host

    def gather_reused(self, slots: np.ndarray, out: Mapping[str, np.ndarray],
                      out_tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Every field's rows at ``slots`` (1-D) into the reused host arrays ``out``, handed out
        as their tensor views ``out_tensors``: one native gather and no per-row work. Only where
        ``takes_into`` (one plain host shard, no codec)."""
        if _c_gather_rows is None or not _c_gather_rows(slots, self._copy_targets, out):
            for name, view in self._copy_targets:
                view.take(slots, axis=0, out=out[name], mode="clip")
        return handed_out(self._copy_names, out, out_tensors)

    def takes_into(self) -> bool:
        """Whether ``take_into`` fills reused outputs (one host shard of plain columns)."""
        return self._plain_host

    def take_into(self, slots: np.ndarray, names: tuple[str, ...], out: Mapping[str, np.ndarray]) -> None:
        """``take_fresh`` into the reused host arrays ``out`` (1-D ``slots``): one native pass, no
        array made (the caller hands out their tensor views). Only where ``takes_into``."""
        plan = self._into_plans.get(names)
        if plan is None:
            plan = self.into_plan(names)
        if _c_gather_rows is None or not _c_gather_rows(slots, plan, out):
            for name, view in plan:   # (numpy names a slot out of range)
                view.take(slots, axis=0, out=out[name])

    def into_plan(self, names: tuple[str, ...]) -> tuple[tuple[str, np.ndarray], ...]:
        """``take_into``'s (name, stored column) pairs for ``names``, as the native gather takes
        them (only where ``takes_into``): a caller that draws many batches keeps it for this
        storage's life and gathers without the call."""
        plan = self._into_plans.get(names)
        if plan is None:
            views = dict(self._copy_targets)
            plan = self._into_plans[names] = tuple((name, views[name]) for name in names)
        return plan

    def takes_fresh(self, names: tuple[str, ...]) -> bool:
        """Whether ``take_fresh`` serves ``names``: one host shard of plain columns (nothing to
        decode), the C helper built, and no more columns than its one pass takes."""
        return self._plain_host and _c_take_rows is not None and len(names) <= TAKE_COLUMNS_MAX

    def take_fresh(self, slots: np.ndarray, names: tuple[str, ...]) -> dict[str, torch.Tensor]:
        """``names`` at 1-D int64 ``slots`` as fresh host tensors, in one native pass. Only where
        ``takes_fresh(names)``: the n-step windows' two gathers take this route, the others
        ``gather``."""
        if not names:
            return {}
        plan = self._take_plans.get(names)
        if plan is None:
            views = dict(self._copy_targets)
            plan = self._take_plans[names] = tuple(views[n] for n in names)
        taken = _c_take_rows(slots, plan)
        if taken is None:   # (slots a draw made: 1-D int64, inside the ring)
            raise RuntimeError(f"the native take refused {len(names)} plain columns at slots of dtype {slots.dtype}, "
                               f"shape {slots.shape}: a bug in the draw that made them; please report it")
        return {name: torch.from_numpy(a) for name, a in zip(names, taken)}

    def _gather_fast(self, slots: np.ndarray, target: torch.device, out, fields=None,
                     out_tensors=None) -> dict[str, torch.Tensor]:
        """One host shard, 1-D slots: one ``ndarray.take`` per field, nothing else (for a GPU
        target, the shard's staging copy or its mapped gather)."""
        if target.type == "cpu" and fields is None and out is not None and out_tensors is not None \
                and self._plain_host:
            return self.gather_reused(slots, out, out_tensors)
        on_host = target.type == "cpu"
        if on_host and out is None and self._plain_host and _c_take_rows is not None:
            # fresh outputs of a plain host shard (n-step windows, field subsets): one native pass
            picked = [(name, view) for name, view in self._copy_targets if fields is None or name in fields]
            taken = _c_take_rows(slots, tuple(view for _, view in picked))
            if taken is not None:
                return {name: torch.from_numpy(a) for (name, _), a in zip(picked, taken)}
        result = {}
        staged: dict[str, torch.Tensor] = {}
        if not on_host:  # every non-pooled column in one staging copy (or one mapped gather each)
            names = [name for name, _, _, _ in self._plan
                     if (fields is None or name in fields) and name not in self._host_stored]
            staged = self.parts[0].to_device(names, slots, target)
        for name, view, codec, dtype in self._plan:
            if fields is not None and name not in fields:
                continue
            if name in self._host_stored:  # frame ids stay on the host; the stacks go to the target
                result[name] = codec.decode(torch.from_numpy(view.take(slots, axis=0)), dtype, device=target)
                continue
            if name in staged:
                t = staged[name]
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
                t = torch.index_select(self.parts[0].column(name), 0, torch.from_numpy(slots))
            result[name] = t if codec is None else codec.decode(t, dtype, target)
        return result

    def gather_stored(self, name: str, slots: np.ndarray) -> torch.Tensor:
        """Field ``name`` of the rows at ``slots`` as stored (encoded, not decoded), on the host:
        what a layout copy or a remote shard's reply moves."""
        if self._single_host:
            return self._take(name, np.asarray(slots), None)
        flat = np.asarray(slots).reshape(-1)
        got = begin_stored_gather(self.parts, self.bounds, self.spec, flat, [name], _CPU)()
        return got[name].view(*np.shape(slots), *self.spec[name].stored_shape)

    def replace_shard(self, shard: int, *, timeout: float = 60.0) -> str:
        """A new, empty shard in place of a lost one (a remote actor that died or whose node
        left): on its node if that is still there, else on any node. Returns where it runs."""
        new, where = self.parts[shard].replacement(timeout=timeout)
        new.index = shard
        self.parts[shard] = new
        return where

    # ---------------------------------------------------------------- close
    def close(self) -> None:
        self._plan = []
        self._plain_host = False
        self._copy_targets = None
        self._take_plans, self._into_plans = {}, {}
        for pool in self.pools.values():
            pool.close()
        for part in self.parts:
            part.close()
        self.parts = []
