"""Memory tiers: where a shard of the buffer lives, and how its memory is allocated.

    PAGEABLE  ordinary host memory (what Reverb and RLlib use)
    SHARED    host memory in a POSIX shared-memory segment, attachable by another process
    PINNED    page-locked host memory: fast, asynchronous host->device copies (needs CUDA)
    DEVICE    accelerator memory on one GPU (needs CUDA)

Allocation is lazy wherever the OS allows it (``torch.empty`` and ``/dev/shm``
segments commit pages on first touch), so a 1M-transition buffer costs only what
has been written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import math
import mmap
import secrets
import sys
import weakref
from enum import Enum
from multiprocessing import resource_tracker, shared_memory

import numpy as np
import torch

from ..errors import ConfigError
from .page_commit import CommitAhead

if TYPE_CHECKING:
    from .page_commit import CommitAhead


class Tier(str, Enum):
    PAGEABLE = "pageable"
    SHARED = "shared"
    PINNED = "pinned"
    DEVICE = "device"
    REMOTE = "remote"   # a Ray actor, possibly on another node (see remote.py)

    @classmethod
    def parse(cls, value: "Tier | str", *, argument: str = "tier") -> "Tier":
        if isinstance(value, Tier):
            return value
        try:
            return cls(str(value).lower())
        except ValueError:
            raise ConfigError(argument, f"one of {[t.value for t in cls]}", repr(value),
                              "pick a tier name such as 'pageable'") from None

    @property
    def needs_cuda(self) -> bool:
        return self in (Tier.PINNED, Tier.DEVICE)

    @property
    def is_local_host(self) -> bool:
        return self in (Tier.PAGEABLE, Tier.SHARED, Tier.PINNED)


def cuda_available() -> bool:
    return torch.cuda.is_available()


def require_tier_available(tier: Tier) -> None:
    if tier.needs_cuda and not cuda_available():
        raise ConfigError("tier", "a tier this machine has (pageable or shared without CUDA)",
                          repr(tier.value), "use tier='pageable' or 'shared' on a machine without CUDA")


class SharedSegment:
    """A named POSIX shared-memory segment viewed as one tensor; ``close()`` unlinks it.

    The owner creates it; another process attaches by ``name`` (see ``attach``). The
    tensor is a view: drop it (and any numpy view) before ``close()``.
    """

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, *, name: str | None = None,
                 create: bool = True):
        itemsize = torch.empty((), dtype=dtype).element_size()
        nbytes = max(1, math.prod(shape) * itemsize)
        self.shape, self.dtype, self.owner = tuple(shape), dtype, create
        self._shm = shared_memory.SharedMemory(
            name=name or f"conduit_{secrets.token_hex(6)}", create=create, size=nbytes if create else 0)
        if not create:
            # The attaching process must not unlink the segment at exit: only the owner does.
            try:
                resource_tracker.unregister(self._shm._name, "shared_memory")  # type: ignore[attr-defined]
            except Exception:  # pragma: no cover - tracker layout differs across versions
                pass
        if create:  # unlink even if close() is never called (the process exits, the owner is dropped)
            self._finalizer = weakref.finalize(self, _unlink_quietly, self._shm.name)
        flat = torch.frombuffer(self._shm.buf, dtype=torch.uint8, count=nbytes)
        self.tensor = flat.view(dtype)[: math.prod(shape)].view(shape) if shape else flat.view(dtype)[:1]

    @property
    def name(self) -> str:
        return self._shm.name

    def close(self) -> None:
        self.tensor = None  # type: ignore[assignment]
        try:
            self._shm.close()
        except BufferError:
            # A view escaped; the mapping is released when the last view dies.
            pass
        if self.owner:
            try:
                self._shm.unlink()
            except FileNotFoundError:
                pass
            self._finalizer.detach()


# Host columns and indexes from this size up are mapped with huge pages asked for (numpy's own
# zeros and empty got none on this machine's madvise-mode kernel, measured): a random gather from a 1M-row CartPole column takes a TLB miss per
# row on 4 KB pages (32 rows x 6 columns: 3.5 us on 4 KB pages, 2.1 us on 2 MB pages, measured).
LAZY_THRESHOLD = 4 << 20


class LazyHostSegment:
    """Anonymous private memory mapped with MAP_NORESERVE: pages are committed on first
    write, and a large reservation (a 1M-transition Atari ring) is not refused up front
    by the kernel's overcommit heuristic. Capacity planning, not the allocator, keeps
    what is written within physical memory. Transparent huge pages are asked for
    (``MADV_HUGEPAGE``; the kernel may decline): random row gathers then miss the TLB far
    less often."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype):
        itemsize = torch.empty((), dtype=dtype).element_size()
        nbytes = max(1, math.prod(shape) * itemsize)
        self._mm = lazy_huge_map(nbytes)
        self.tensor = torch.frombuffer(self._mm, dtype=torch.uint8, count=nbytes).view(dtype).view(shape)

    def commit_ahead(self, *, name: str) -> CommitAhead:
        """A committer of this mapping's pages ahead of a writer that fills it in order (see
        ``page_commit``); the caller closes it before this segment."""
        return CommitAhead(self._mm, len(self._mm), name=name)

    def close(self) -> None:
        self.tensor = None  # type: ignore[assignment]
        try:
            self._mm.close()
        except BufferError:
            pass  # a view escaped; the mapping goes when the last view dies


def lazy_huge_map(nbytes: int) -> mmap.mmap:
    """An anonymous private mapping of ``nbytes``, committed on first write (MAP_NORESERVE),
    with transparent huge pages asked for (the kernel may decline)."""
    # Python < 3.13 lacks the constant; 0x4000 is MAP_NORESERVE on Linux.
    noreserve = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform.startswith("linux") else 0)
    mm = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | noreserve)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            mm.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # pragma: no cover - a kernel without transparent huge pages
            pass
    return mm


def host_zeros(count: int, dtype: Any) -> np.ndarray:
    """Zeros for a large host index read at random rows (priority trees, ring metadata): from
    LAZY_THRESHOLD up, a lazy huge-page mapping (numpy's zeros gets 4 KB pages here), so a
    tree walk or a per-row lookup misses the TLB far less; below it, np.zeros. The array
    keeps its mapping alive and unmaps it when it goes."""
    dtype = np.dtype(dtype)
    nbytes = int(count) * dtype.itemsize
    if nbytes < LAZY_THRESHOLD:
        return np.zeros(count, dtype=dtype)
    return np.frombuffer(lazy_huge_map(nbytes), dtype=dtype, count=count)


def _unlink_quietly(name: str) -> None:
    try:
        seg = shared_memory.SharedMemory(name=name)
        seg.close()
        seg.unlink()
    except (FileNotFoundError, OSError):
        pass


def allocate(tier: Tier, shape: tuple[int, ...], dtype: torch.dtype, *,
             device: torch.device | str | None = None) -> tuple[torch.Tensor, "SharedSegment | LazyHostSegment | None"]:
    """Allocate one column of a shard on ``tier``. Returns the tensor and, for SHARED,
    the segment that owns its memory (the caller closes it)."""
    require_tier_available(tier)
    if tier is Tier.PAGEABLE:
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        if nbytes >= LAZY_THRESHOLD:
            seg = LazyHostSegment(shape, dtype)
            return seg.tensor, seg
        return torch.empty(shape, dtype=dtype), None
    if tier is Tier.SHARED:
        seg = SharedSegment(shape, dtype)
        return seg.tensor, seg
    if tier is Tier.PINNED:
        return torch.empty(shape, dtype=dtype, pin_memory=True), None
    dev = torch.device(device if device is not None else "cuda")
    if dev.type == "cpu":
        raise ConfigError("device", "a CUDA device for tier 'device'", str(dev), "pass device='cuda:0'")
    return torch.empty(shape, dtype=dtype, device=dev), None


def numpy_view(t: torch.Tensor) -> np.ndarray | None:
    """A zero-copy numpy view of a host tensor (numpy gathers are the fastest on CPU), else None."""
    if t.device.type != "cpu" or t.dtype == torch.bfloat16:
        return None
    return t.numpy()
