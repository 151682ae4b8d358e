"""Host -> device delivery: page-locked staging, and device-side access to pinned memory.

A batch gathered from host memory with ``numpy.take`` lands in fresh *pageable* memory, and
a pageable host->device copy is synchronous and slow (the driver bounces it through its own
pinned buffer). Every host tier therefore gathers into a reused page-locked staging buffer
and copies from there with ``non_blocking=True``: the copy runs on the copy engine while the
CPU returns to gather the next batch. A CUDA event per staging slot guards its reuse, so a
slot is never overwritten while the copy engine may still be reading it.

``device_alias`` is the other route, the one Gear takes: pinned memory is mapped into the
device's address space (CUDA unified addressing), so a kernel can gather the batch's rows
straight out of host memory over PCIe/NVLink-C2C, with no CPU gather and no staging copy.
Which route wins depends on the row size and the link (see ``placement``); both are
measured by ``benchmarks/buffer/gpu_tiers.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from ..errors import ConfigError

ACCESS_MODES = ("copy", "mapped")


def check_access(access: str, tier_value: str, *, argument: str = "ShardSpec.access") -> str:
    """``copy`` (gather on the host, then copy) works on every tier; ``mapped`` (the device
    reads the rows in place) needs page-locked memory."""
    if access not in ACCESS_MODES:
        raise ConfigError(argument, f"one of {ACCESS_MODES}", repr(access),
                          "use 'copy' (host gather + async copy) or 'mapped' (device reads pinned memory)")
    if access == "mapped" and tier_value != "pinned":
        raise ConfigError(argument, "'copy' for a tier other than 'pinned'", repr(access),
                          "use tier='pinned' for device-side access, or access='copy'")
    return access


class _DeviceArray:
    """The ``__cuda_array_interface__`` of page-locked host memory: with unified addressing the
    host pointer of memory from ``cudaHostAlloc`` is also valid on the device."""

    def __init__(self, t: torch.Tensor):
        try:
            typestr = t.numpy().dtype.str  # the array-interface type string, e.g. '<f4'
        except TypeError:  # a dtype numpy lacks (bfloat16)
            raise ConfigError("dtype", "a dtype numpy has, for device-side access", str(t.dtype),
                              "store the field as float32/uint8/int64, or use access='copy'") from None
        self._keep = t
        self.__cuda_array_interface__ = {"shape": tuple(t.shape), "typestr": typestr,
                                         "data": (t.data_ptr(), False), "version": 2,
                                         "strides": tuple(s * t.element_size() for s in t.stride())}


def device_alias(pinned: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A CUDA tensor viewing ``pinned``'s memory in place (no copy). Kernels reading it pull the
    bytes over the host link; the caller keeps ``pinned`` alive as long as the alias."""
    if not pinned.is_pinned():
        raise ConfigError("tier", "page-locked ('pinned') memory for device-side access", "pageable memory",
                          "place the shard on tier='pinned'")
    alias = torch.as_tensor(_DeviceArray(pinned), device=torch.device(device))
    if alias.data_ptr() != pinned.data_ptr():  # pragma: no cover - a torch that copied instead of aliasing
        raise RuntimeError("device_alias: torch copied the pinned memory instead of mapping it")
    return alias


_ALIGN = 64  # bytes: where each column of a packed copy starts
_LAYOUTS_KEPT = 32  # packed layouts (batch sizes x fields) remembered before starting over


@dataclass
class _Slot:
    host: torch.Tensor
    event: "torch.cuda.Event | None" = None
    views: dict = field(default_factory=dict)   # packed layouts' host views into ``host``


class PinnedStaging:
    """``depth`` page-locked buffers per field, reused round-robin for host -> device copies.

    ``copy(name, fill, rows, shape, dtype, device)`` hands ``fill`` the next slot (a host
    tensor of ``rows`` x ``shape``), lets it write the rows, starts the asynchronous copy and
    records the slot's event. Before a slot is refilled its previous copy is waited for;
    with ``depth`` >= 2 that wait is normally already over. A slot grows (never shrinks) to
    the largest batch asked of it. Not thread-safe: the buffer serialises its callers.
    """

    def __init__(self, depth: int = 3, *, pin: bool = True, event=None):
        """``pin=False`` and ``event`` (a factory of objects with ``record()`` and
        ``synchronize()``) exist for exercising the ring on a machine without CUDA."""
        if depth < 1:
            raise ConfigError("staging depth", ">= 1", depth, "keep at least one staging buffer per field")
        self.depth = depth
        self._pin = pin
        self._event = event if event is not None else torch.cuda.Event
        self._rings: dict[str, list[_Slot | None]] = {}
        self._next: dict[str, int] = {}
        self._layouts: dict[tuple, tuple[list, int]] = {}   # packed layout -> (spans, total bytes)

    def _slot(self, name: str, rows: int, shape: tuple[int, ...], dtype: torch.dtype) -> _Slot:
        ring = self._rings.setdefault(name, [None] * self.depth)
        i = self._next.get(name, 0)
        self._next[name] = (i + 1) % self.depth
        slot = ring[i]
        if slot is not None and slot.event is not None:
            slot.event.synchronize()  # the copy that last read this slot has finished
        if slot is None or slot.host.shape[0] < rows or slot.host.shape[1:] != shape or slot.host.dtype != dtype:
            slot = ring[i] = _Slot(torch.empty((max(rows, 1), *shape), dtype=dtype, pin_memory=self._pin))
        return slot

    def copy(self, name: str, fill, rows: int, shape: tuple[int, ...], dtype: torch.dtype,
             device: torch.device) -> torch.Tensor:
        slot = self._slot(name, rows, tuple(shape), dtype)
        host = slot.host[:rows]
        fill(host)
        out = host.to(device, non_blocking=True, copy=True)  # copy=True: never an alias of the slot
        if slot.event is None:
            slot.event = self._event()
        if device.type == "cuda":
            slot.event.record(torch.cuda.current_stream(device))
        else:
            slot.event.record()
        return out

    def copy_packed(self, name: str, parts: list[tuple], device: torch.device) -> list[torch.Tensor]:
        """Several columns in one page-locked slot and one asynchronous copy: ``parts`` is a list
        of ``(fill, rows, shape, dtype)``; returns one device tensor per part (disjoint views of
        one allocation). For small batches the per-copy cost dominates: one copy, not one per field."""
        layout = tuple((rows, tuple(shape), dtype) for _, rows, shape, dtype in parts)
        spans, total = self._layouts.get(layout, (None, 0))
        if spans is None:
            spans = []
            for rows, shape, dtype in layout:
                n = rows * math.prod(shape) * dtype.itemsize
                spans.append((total, n))
                total += -(-n // _ALIGN) * _ALIGN          # each part starts aligned for any dtype
            if len(self._layouts) >= _LAYOUTS_KEPT:  # batch sizes that vary without end: forget, don't grow
                self._layouts.clear()
            self._layouts[layout] = (spans, total)
        slot = self._slot(name, total, (), torch.uint8)
        views = slot.views.get(layout)
        if views is None:  # the host side of this layout, made once per slot
            if len(slot.views) >= _LAYOUTS_KEPT:
                slot.views.clear()
            views = slot.views[layout] = [slot.host[off:off + n].view(dtype).view(rows, *shape)
                                          for (rows, shape, dtype), (off, n) in zip(layout, spans)]
        for (fill, *_), view in zip(parts, views):
            fill(view)
        dev = slot.host[:total].to(device, non_blocking=True, copy=True)
        if slot.event is None:
            slot.event = self._event()
        slot.event.record(torch.cuda.current_stream(dev.device)) if device.type == "cuda" else slot.event.record()
        return [dev[off:off + n].view(dtype).view(rows, *shape)
                for (rows, shape, dtype), (off, n) in zip(layout, spans)]

    def nbytes(self) -> int:
        return sum(s.host.numel() * s.host.element_size() for ring in self._rings.values() for s in ring if s)

    def close(self) -> None:
        for ring in self._rings.values():
            for s in ring:
                if s is not None and s.event is not None:
                    s.event.synchronize()
        self._rings.clear()
        self._next.clear()


def take_into(column: torch.Tensor, view: np.ndarray | None, slots: np.ndarray):
    """A ``fill`` for ``PinnedStaging.copy``: the rows ``slots`` of a host column (numpy's
    gather where the dtype has a numpy view, else torch's)."""
    def fill(out: torch.Tensor) -> None:
        if view is not None:
            np.take(view, slots, axis=0, out=out.numpy(), mode="clip")
        else:
            torch.index_select(column, 0, torch.from_numpy(slots), out=out)
    return fill
