"""Shards in this process's memory: host tiers (pageable, shared, pinned) and GPU memory.

``LocalShard`` allocates one tensor per field on its tier (``tiers.allocate``) and keeps a
numpy view of each host column, because ``ndarray.take`` is the fastest random gather on
CPU. A GPU reader gets host rows through page-locked staging and one asynchronous copy per
batch (``staging.PinnedStaging.copy_packed``). ``MappedShard`` is the other route for
pinned memory: the device gathers the rows in place (``access="mapped"``, as Gear does).
A subclass that only changes where the memory comes from overrides ``allocate`` (see
``disk_shard.py``).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import torch

from ..memory.staging import PinnedStaging, device_alias, take_into
from ..memory.tiers import SharedSegment, allocate, numpy_view
from ..schema.spec import as_tensor
from .shards import Gathered, Shard, ShardSpec, register_shard_kind


@register_shard_kind
class LocalShard(Shard):
    """Every field's column as one tensor on the shard's tier, in this process."""

    kind = "local"
    can_be_lost = False   # this process's memory: it goes only with the process

    def __init__(self, spec, layout: ShardSpec):
        super().__init__(spec, layout)
        self._owners: dict[str, object] = {}   # memory owners (shared segments, mappings, files), per field
        self._columns: dict[str, torch.Tensor] = {}
        self._views: dict[str, np.ndarray | None] = {}
        self._staging: PinnedStaging | None = None   # host -> device copies (made on first use)
        try:
            for f in spec:
                t, owner = self.allocate((self.capacity, *f.stored_shape), f.stored_dtype)
                if owner is not None:
                    self._owners[f.name] = owner
                self._columns[f.name] = t
                self._views[f.name] = numpy_view(t)
        except BaseException:
            self.close()
            raise

    def allocate(self, shape: tuple[int, ...], dtype: torch.dtype):
        """One column's memory: (tensor, its owner to close, or None)."""
        return allocate(self.layout.tier, shape, dtype, device=self.layout.device)

    @property
    def on_host(self) -> bool:
        return self.layout.tier.is_local_host

    def column(self, name: str) -> torch.Tensor | None:
        return self._columns[name]

    def host_column(self, name: str) -> np.ndarray | None:
        return self._views[name]

    def segment_name(self, name: str) -> str:
        owner = self._owners.get(name)
        return owner.name if isinstance(owner, SharedSegment) else ""

    def write(self, start: int, columns: Mapping[str, np.ndarray | torch.Tensor], first: int, n: int) -> None:
        for name, src in columns.items():
            dst = self._views[name]
            if dst is not None and isinstance(src, np.ndarray):
                dst[start: start + n] = src[first: first + n]
            else:
                self._columns[name][start: start + n].copy_(as_tensor(src)[first: first + n])

    def begin_gather(self, local: np.ndarray, names: Sequence[str], target: torch.device) -> Gathered:
        if target.type == "cuda" and self.on_host:
            return lambda: self.to_device(names, local, target)
        index: dict[str, torch.Tensor] = {}   # the slots as a tensor, once per device, not once per field

        def gathered() -> dict[str, torch.Tensor]:
            out = {}
            for name in names:
                col = self._columns[name]
                key = str(col.device)
                if key not in index:
                    index[key] = torch.from_numpy(local).to(col.device)
                out[name] = torch.index_select(col, 0, index[key])
            return out
        return gathered

    def to_device(self, names: Sequence[str], local: np.ndarray, target: torch.device) -> dict[str, torch.Tensor]:
        """Host rows on the GPU: gathered on the host into page-locked staging and copied
        asynchronously, every field in one copy."""
        if not self.on_host:
            return super().to_device(names, local, target)
        cols = [self._columns[name] for name in names]
        parts = [(take_into(col, self._views[name], local), local.shape[0], tuple(col.shape[1:]), col.dtype)
                 for name, col in zip(names, cols)]
        if self._staging is None:
            self._staging = PinnedStaging()
        return dict(zip(names, self._staging.copy_packed("rows", parts, target)))

    def close(self) -> None:
        if self._staging is not None:
            self._staging.close()  # waits for copies still reading the staging buffers
            self._staging = None
        self._columns = {}
        self._views = {}
        for owner in self._owners.values():
            owner.close()
        self._owners = {}


@register_shard_kind
class MappedShard(LocalShard):
    """Pinned host memory the GPU reads in place: a batch is one device-side gather over the
    host link, no CPU gather and no staging copy (``access="mapped"``)."""

    kind = "mapped"

    def __init__(self, spec, layout: ShardSpec):
        super().__init__(spec, layout)
        self._aliases: dict[tuple[str, str], torch.Tensor] = {}   # device views of the pinned columns

    def to_device(self, names: Sequence[str], local: np.ndarray, target: torch.device) -> dict[str, torch.Tensor]:
        out = {}
        index = torch.from_numpy(local).to(target)
        for name in names:
            key = (name, str(target))
            alias = self._aliases.get(key)
            if alias is None:
                alias = self._aliases[key] = device_alias(self._columns[name], target)
            out[name] = torch.index_select(alias, 0, index)
        return out

    def close(self) -> None:
        self._aliases = {}
        super().close()
