"""How much memory a tier has free now, and what a buffer of a given capacity needs:
checked before anything is allocated, so a capacity too large for the machine is an error
with figures, not the kernel's out-of-memory killer."""

from __future__ import annotations

import os

import torch

from .tiers import Tier

META_BYTES_PER_SLOT = 4 * 8          # seq, version, source, next_seq (int64 each)
PRIORITY_BYTES_PER_SLOT = 2 * 2 * 8  # sum and min trees, 2x leaves (power of two), float64


def available_bytes(tier: Tier) -> int | None:
    """Bytes free for ``tier`` now (None where it cannot be told, e.g. a remote node)."""
    if tier in (Tier.PAGEABLE, Tier.PINNED):
        try:
            with open("/proc/meminfo") as fh:
                for line in fh:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None
    if tier is Tier.SHARED:
        try:
            st = os.statvfs("/dev/shm")
            return st.f_bavail * st.f_frsize
        except OSError:
            return None
    if tier is Tier.DEVICE:
        try:
            return int(torch.cuda.mem_get_info()[0]) if torch.cuda.is_available() else None
        except Exception:  # noqa: BLE001 - no device: nothing to check
            return None
    return None


def needed_bytes(capacity: int, row_bytes: int, *, selector_bytes_per_slot: int = 0) -> int:
    """Bytes a buffer of ``capacity`` rows needs: its columns, per-slot metadata and the
    selector's per-slot state (``Selector.bytes_per_slot``: a prioritized selector's trees)."""
    return capacity * (row_bytes + META_BYTES_PER_SLOT + selector_bytes_per_slot)


def fmt(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"
