"""The disk tier: a shard whose columns are memory-mapped files on a local disk.

For a replay buffer larger than RAM (a 10M-transition Atari ring), or one that should not
compete with the learner for host memory: the rows live in files (one per field, in a fresh
folder under ``ShardSpec.path``, removed on close) and the OS page cache keeps the hot ones in
memory. Reads are ``ndarray.take`` over the mapping, so the storage's one-shard fast path and
every delivery path serve it unchanged; a GPU reader gets its rows through the same staging
copy as host memory. TorchRL's ``LazyMemmapStorage`` is the same idea.

This module is the whole of the tier (the example of a new storage kind in
docs/writing-an-adapter.md §6): a ``LocalShard`` whose memory comes from files, a disk-space
check instead of a RAM check, and a close that removes the files.

    ExperienceBuffer(spec=spec, capacity=n, shards=[ShardSpec("disk", n, path="/nvme/replay")])
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile

import numpy as np
import torch

from ..errors import CapacityError, ConfigError
from ..memory.budget import fmt
from ..memory.tiers import Tier
from .local_shard import LocalShard
from .shards import ShardSpec, register_shard_kind


@register_shard_kind
class DiskShard(LocalShard):
    """Columns in ``np.memmap`` files under ``layout.path`` (default: the system's temp folder)."""

    kind = "disk"
    default_tier = Tier.PAGEABLE   # read through the page cache, into host memory

    def __init__(self, spec, layout: ShardSpec):
        if layout.tier is not Tier.PAGEABLE:
            raise ConfigError("ShardSpec.tier", "'pageable' for a disk shard (its rows are read through host "
                              "memory)", repr(layout.tier.value), "use ShardSpec('disk', n, path=...)")
        base = _folder(layout)
        self.folder = tempfile.mkdtemp(prefix="conduit-disk-", dir=base)
        try:
            super().__init__(spec, layout)
        except BaseException:
            shutil.rmtree(self.folder, ignore_errors=True)
            raise

    @classmethod
    def memory_needed(cls, layout: ShardSpec, row_bytes: int) -> dict[Tier, int]:
        need = layout.capacity * row_bytes
        free = shutil.disk_usage(_folder(layout)).free
        if need > free:
            raise CapacityError(f"ShardSpec.path: a disk shard of {layout.capacity} rows of {row_bytes} B needs "
                                f"{fmt(need)}, {fmt(free)} is free under {_folder(layout)!r}. Fix: point path at "
                                "a larger disk or lower the shard's capacity.")
        return {}   # no RAM is reserved: the page cache gives back what it holds under pressure

    def allocate(self, shape: tuple[int, ...], dtype: torch.dtype):
        """A file of the column's size, mapped; bfloat16 (which numpy lacks) is stored as int16 bits."""
        np_dtype = np.int16 if dtype == torch.bfloat16 else torch.empty((), dtype=dtype).numpy().dtype
        path = os.path.join(self.folder, f"column{len(os.listdir(self.folder))}.bin")
        mapped = np.memmap(path, dtype=np_dtype, mode="w+", shape=shape if math.prod(shape) else (1,))
        tensor = torch.from_numpy(mapped) if math.prod(shape) else torch.from_numpy(mapped)[:0].view(shape)
        return (tensor.view(torch.bfloat16) if dtype == torch.bfloat16 else tensor), _MappedFile(mapped)

    def close(self) -> None:
        super().close()
        shutil.rmtree(self.folder, ignore_errors=True)


class _MappedFile:
    """Owns one mapping. Closing drops it: the mapping is unmapped when its last view goes (a
    delivered batch may still view it); nothing is flushed, a replay buffer's files are scratch."""

    def __init__(self, mapped: np.memmap):
        self.mapped = mapped

    def close(self) -> None:
        self.mapped = None


def _folder(layout: ShardSpec) -> str:
    folder = layout.path or tempfile.gettempdir()
    if not os.path.isdir(folder):
        raise ConfigError("ShardSpec.path", "an existing folder for the disk shard's files", repr(folder),
                          "create it first, or leave path=None for the system's temp folder")
    return folder
