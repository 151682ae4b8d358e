"""The disk tier: a shard whose columns are memory-mapped files on a local disk.

For a replay buffer larger than RAM (a 10M-transition Atari ring), or one that should not
compete with the learner for host memory: the rows live in files (one per field) under
``ShardSpec.path`` and the OS page cache keeps the hot ones in memory. Each file's blocks are
reserved on the disk when it is made (``posix_fallocate``, not a sparse file): a disk that fills
later, or another shard in the same folder, can never leave a write without its block (which the
kernel would answer with SIGBUS, killing the process). A disk without the room is a
``CapacityError`` at construction, naming the folder. Each file is unlinked as soon as it is
mapped, so its blocks go back to the disk when the shard closes or its process dies, SIGKILL
included: nothing is left behind. Reads are ``ndarray.take`` over the mapping, so the storage's one-shard fast path and
every delivery path serve it unchanged; a GPU reader gets its rows through the same staging
copy as host memory. TorchRL's ``LazyMemmapStorage`` is the same idea.

This module is the whole of the tier (the example of a new storage kind in
docs/writing-an-adapter.md §6): a ``LocalShard`` whose memory comes from files, a disk-space
check instead of a RAM check, and a close that removes the files.

    ExperienceBuffer(spec=spec, capacity=n, shards=[ShardSpec("disk", n, path="/nvme/replay")])
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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

if TYPE_CHECKING:
    from ..schema.spec import ExperienceSpec


@register_shard_kind
class DiskShard(LocalShard):
    """Columns in ``np.memmap`` files under ``layout.path`` (default: the system's temp folder)."""

    kind = "disk"
    default_tier = Tier.PAGEABLE   # read through the page cache, into host memory

    def __init__(self, spec: ExperienceSpec, layout: ShardSpec) -> None:
        if layout.tier is not Tier.PAGEABLE:
            raise ConfigError("ShardSpec.tier", "'pageable' for a disk shard (its rows are read through host "
                              "memory)", repr(layout.tier.value), "use ShardSpec('disk', n, path=...)")
        base = _folder(layout)
        self.folder = tempfile.mkdtemp(prefix="conduit-disk-", dir=base)
        self.columns_made = 0
        try:
            super().__init__(spec, layout)
        finally:   # every column's file is unlinked once mapped: the folder is empty now, and goes
            shutil.rmtree(self.folder, ignore_errors=True)

    @classmethod
    def memory_needed(cls, layout: ShardSpec, row_bytes: int) -> dict[Tier, int]:
        need = layout.capacity * row_bytes
        free = shutil.disk_usage(_folder(layout)).free
        if need > free:
            raise CapacityError(f"ShardSpec.path: a disk shard of {layout.capacity} rows of {row_bytes} B needs "
                                f"{fmt(need)}, {fmt(free)} is free under {_folder(layout)!r}. Fix: point path at "
                                "a larger disk or lower the shard's capacity.")
        return {}   # no RAM is reserved: the page cache gives back what it holds under pressure

    def allocate(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A file of the column's size with its blocks reserved, mapped, then unlinked; bfloat16
        (which numpy lacks) is stored as int16 bits."""
        np_dtype = np.int16 if dtype == torch.bfloat16 else torch.empty((), dtype=dtype).numpy().dtype
        shape_on_disk = shape if math.prod(shape) else (1,)
        nbytes = math.prod(shape_on_disk) * np.dtype(np_dtype).itemsize
        path = os.path.join(self.folder, f"column{self.columns_made}.bin")
        self.columns_made += 1
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                reserve(fd, nbytes, path)
                with os.fdopen(os.dup(fd), "r+b") as fh:   # (the mapping outlives the file object)
                    mapped = np.memmap(fh, dtype=np_dtype, mode="r+", shape=shape_on_disk)
            finally:
                os.close(fd)
        finally:
            try:
                os.unlink(path)   # the mapping keeps the blocks; the name is not needed any more
            except FileNotFoundError:
                pass
        tensor = torch.from_numpy(mapped) if math.prod(shape) else torch.from_numpy(mapped)[:0].view(shape)
        return (tensor.view(torch.bfloat16) if dtype == torch.bfloat16 else tensor), _MappedFile(mapped)


class _MappedFile:
    """Owns one mapping. Closing drops it: the mapping is unmapped when its last view goes (a
    delivered batch may still view it); nothing is flushed, a replay buffer's files are scratch."""

    def __init__(self, mapped: np.memmap):
        self.mapped = mapped

    def close(self) -> None:
        self.mapped = None


def reserve(fd: int, nbytes: int, path: str) -> None:
    """Give the file ``nbytes`` of real blocks now (never a sparse file the mapping fills later)."""
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as exc:
        free = shutil.disk_usage(os.path.dirname(path)).free
        raise CapacityError(f"ShardSpec.path: a disk shard's column needs {fmt(nbytes)} reserved under "
                            f"{os.path.dirname(os.path.dirname(path))!r}, and the disk refused ({exc.strerror}; "
                            f"{fmt(free)} free now, other files or shards there included). Fix: point path at a "
                            "disk with room, or lower the shard's capacity; nothing was stored") from None


def _folder(layout: ShardSpec) -> str:
    folder = layout.path or tempfile.gettempdir()
    if not os.path.isdir(folder):
        raise ConfigError("ShardSpec.path", "an existing folder for the disk shard's files", repr(folder),
                          "create it first, or leave path=None for the system's temp folder")
    return folder
