"""Shards: where a contiguous range of the ring's slots lives, behind one small interface.

    ShardSpec("pinned", 500_000)                  # what a user or a placement asks for
    ShardSpec("remote", 500_000, node="node-2")
    ShardSpec("disk", 10_000_000, path="/nvme")   # a kind registered by its own module

    ColumnarStorage ── [ LocalShard | MappedShard | RemoteShard | DiskShard | your own ]

The storage routes slots to shards and assembles batches; a shard holds every field's column
for its slots and answers four questions: write these rows, gather these rows (for several
fields at once, so a remote shard makes one call), put these rows on a device, close. A new
kind of storage is one module: a ``Shard`` subclass decorated with ``@register_shard_kind``
(see ``disk_shard.py``, the whole of the disk tier, and docs/writing-an-adapter.md §6).

A ``ShardSpec`` names a memory ``tier`` (what placement and the capacity check account for)
and the ``kind`` of shard that implements it; the kind defaults from the tier (``local``,
``mapped`` for ``access="mapped"``, ``remote``), and a registered kind's name may stand in
for the tier (``ShardSpec("disk", n)``: the kind's own default tier is used).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, ClassVar, Mapping, Sequence

import numpy as np
import torch

from ..errors import CapacityError, ConfigError
from ..memory.budget import available_bytes, fmt, needed_bytes
from ..memory.staging import check_access
from ..memory.tiers import Tier

if TYPE_CHECKING:
    from ..schema.spec import ExperienceSpec

# Modules that register the kinds the core ships, imported on first lookup (not at import
# time: a shard module imports this one).
_BUILTIN_KIND_MODULES = ("conduit_core.storage.local_shard", "conduit_core.remote.remote_shard", "conduit_core.storage.disk_shard")
_KINDS: dict[str, type["Shard"]] = {}
_builtins_loaded = False


def register_shard_kind(cls: type["Shard"]) -> type["Shard"]:
    """Class decorator: make ``cls`` the shard for ``ShardSpec(kind=cls.kind)``."""
    if not (isinstance(cls, type) and issubclass(cls, Shard)) or not cls.kind:
        raise ConfigError("register_shard_kind", "a Shard subclass with a non-empty `kind`", repr(cls),
                          "subclass conduit_core.Shard and set kind = 'my_kind'")
    if cls.kind in {t.value for t in Tier} and cls.kind != cls.default_tier.value:
        raise ConfigError(f"{cls.__name__}.kind", "a name that is not a tier's", repr(cls.kind),
                          "name the kind after how it stores rows, e.g. 'disk'")
    _KINDS[cls.kind] = cls
    return cls


def shard_kinds() -> dict[str, type["Shard"]]:
    """Every registered kind, by name."""
    global _builtins_loaded
    if not _builtins_loaded:
        _builtins_loaded = True
        for module in _BUILTIN_KIND_MODULES:
            importlib.import_module(module)
    return dict(_KINDS)


def shard_class(kind: str) -> type["Shard"]:
    kinds = shard_kinds()
    if kind not in kinds:
        raise ConfigError("ShardSpec.kind", f"one of the registered shard kinds {sorted(kinds)}", repr(kind),
                          "import the module that registers it (@register_shard_kind) before building the buffer")
    return kinds[kind]


def default_kind(tier: Tier, access: str) -> str:
    if tier is Tier.REMOTE:
        return "remote"
    return "mapped" if access == "mapped" else "local"


@dataclass(frozen=True)
class ShardSpec:
    """A contiguous range of ``capacity`` slots placed on ``tier`` (``device`` for DEVICE),
    stored by the shard ``kind`` (default: the tier's own)."""

    tier: Tier
    capacity: int
    device: str | None = None
    node: str | None = None    # REMOTE: the Ray custom resource that pins the shard's actor to a node
    access: str = "copy"       # how a GPU learner reads it: "copy" (host gather + async copy) or
                               # "mapped" (the device gathers from pinned memory in place, as Gear)
    kind: str | None = None    # which Shard class stores it (registered kinds: shard_kinds())
    path: str | None = None    # file-backed kinds (disk): the folder their files go in

    def __post_init__(self) -> None:
        tier, kind = self.tier, self.kind
        if isinstance(tier, str) and not isinstance(tier, Tier) and tier.lower() not in {t.value for t in Tier}:
            kinds = shard_kinds()
            if tier.lower() not in kinds:
                raise ConfigError("ShardSpec.tier", f"one of the tiers {[t.value for t in Tier]} or a registered "
                                  f"shard kind {sorted(kinds)}", repr(tier), "pick a tier name such as 'pageable'")
            kind, tier = tier.lower(), kinds[tier.lower()].default_tier
        object.__setattr__(self, "tier", Tier.parse(tier, argument="ShardSpec.tier"))
        if isinstance(self.capacity, bool) or int(self.capacity) <= 0:
            raise ConfigError("ShardSpec.capacity", "a positive number of slots", self.capacity,
                              "give every shard at least one slot")
        check_access(self.access, self.tier.value)
        object.__setattr__(self, "kind", kind or default_kind(self.tier, self.access))
        shard_class(self.kind)   # an unknown kind fails here, where the user wrote it

    def to_config(self) -> dict:
        return {"tier": self.tier.value, "capacity": int(self.capacity), "device": self.device, "node": self.node,
                "access": self.access, "kind": self.kind, "path": self.path}


def even_shards(capacity: int, tiers: Sequence[Tier | str], device: str | None = None) -> list[ShardSpec]:
    """Split ``capacity`` into one shard per tier, as evenly as possible."""
    k = len(tiers)
    base, extra = divmod(capacity, k)
    return [ShardSpec(t, base + (i < extra), device) for i, t in enumerate(tiers)]


Gathered = Callable[[], dict[str, torch.Tensor]]


class Shard:
    """The contract between the storage and one shard. Slots are local: ``0 .. capacity-1``.

    Subclasses set ``kind`` and ``default_tier`` and implement ``write``, ``begin_gather``
    and ``close``; a host-memory kind also answers ``column``/``host_column`` so the storage's
    one-shard fast path (one ``ndarray.take`` per field) serves it. Stored rows are encoded
    (the storage decodes); a shard never sees rings, selectors or episodes.
    """

    kind: ClassVar[str] = ""
    # whether the shard can be lost while the buffer runs (another process or node): its
    # operations may raise ShardLost and run under the buffer's recovery. A kind that does not
    # say otherwise is treated as one that can; a kind in this process's memory sets False, and
    # its writes and draws then skip the recovery wrapper (the hot path).
    can_be_lost: ClassVar[bool] = True
    default_tier: ClassVar[Tier] = Tier.PAGEABLE

    def __init__(self, spec: ExperienceSpec, layout: ShardSpec) -> None:
        self.spec = spec
        self.layout = layout
        self.capacity = int(layout.capacity)
        self.index = 0   # which of its storage's shards this is (the storage sets it; errors name it)

    # ------------------------------------------------------------ before building
    @classmethod
    def check_spec(cls, spec: ExperienceSpec, layout: ShardSpec) -> None:
        """Refuse (ConfigError) an experience spec this kind cannot store, before anything is built."""

    @classmethod
    def memory_needed(cls, layout: ShardSpec, row_bytes: int) -> dict[Tier, int]:
        """Bytes this shard takes from each memory tier (checked against what is free before
        anything is allocated). Pinned pages come from host RAM."""
        tier = Tier.PAGEABLE if layout.tier is Tier.PINNED else layout.tier
        return {tier: layout.capacity * row_bytes}

    def ready(self) -> None:
        """Block until the shard can serve (a remote actor started). Called once, after every
        shard of a layout has been started, so their start-ups overlap."""

    # ------------------------------------------------------------ the contract
    @property
    def on_host(self) -> bool:
        """Every column is a host tensor that ``column`` returns (the fast paths read it)."""
        return False

    def column(self, name: str) -> torch.Tensor | None:
        """The field's whole column as one tensor over local slots, where there is one."""
        return None

    def host_column(self, name: str) -> np.ndarray | None:
        """A numpy view of the field's column (host memory, a dtype numpy has), else None."""
        return None

    def write(self, start: int, columns: Mapping[str, np.ndarray | torch.Tensor], first: int, n: int) -> None:
        """Store rows ``first .. first+n`` of ``columns`` (encoded) at local slots ``start ..``."""
        raise NotImplementedError

    def begin_gather(self, local: np.ndarray, names: Sequence[str], target: torch.device) -> Gathered:
        """Start gathering the stored rows at ``local`` (1-D) for ``names``; the returned call
        finishes it: ``{name: tensor [len(local), *stored_shape]}``, on ``target`` or on the
        host (the storage moves it). Every shard's gather is started before any is finished,
        so remote shards answer concurrently."""
        raise NotImplementedError

    def to_device(self, names: Sequence[str], local: np.ndarray, target: torch.device) -> dict[str, torch.Tensor]:
        """The rows at ``local`` on a GPU ``target`` (host kinds override this with staging)."""
        got = self.begin_gather(local, names, target)()
        return {name: t.to(target) for name, t in got.items()}

    def segment_name(self, name: str) -> str:
        """The shared-memory segment holding the field's column ('' when it is not shared)."""
        return ""

    def replacement(self, *, timeout: float) -> tuple["Shard", str]:
        """A new, empty shard for this one after it was lost, and where it runs. Only kinds
        that can be lost (remote) have one."""
        raise ConfigError(f"{type(self).__name__}", "a shard kind that can be replaced (remote)", self.kind,
                          "only remote shards are lost and replaced")

    def close(self) -> None:
        raise NotImplementedError


def check_layout_fits(capacity: int, spec: ExperienceSpec, shards: Sequence[ShardSpec],
                      selector_bytes_per_slot: int) -> None:
    """Refuse a capacity the tiers cannot hold, before anything is allocated: each shard's
    columns on the tiers its kind takes memory from (``Shard.memory_needed``), plus the
    per-slot metadata (and the selector's per-slot state, e.g. priority trees) in host or
    shared memory."""
    row = spec.stored_bytes_per_transition
    meta = needed_bytes(capacity, 0, selector_bytes_per_slot=selector_bytes_per_slot)
    need: dict[Tier, int] = {}
    for shard in shards:
        for tier, n in shard_class(shard.kind).memory_needed(shard, row).items():
            need[tier] = need.get(tier, 0) + n
    meta_tier = Tier.SHARED if any(s.tier is Tier.SHARED for s in shards) else Tier.PAGEABLE
    need[meta_tier] = need.get(meta_tier, 0) + meta
    for tier, n in need.items():
        free = available_bytes(tier)
        if free is not None and n > free:
            raise CapacityError(
                f"capacity: {capacity} transitions of {row} B need {fmt(n)} on tier '{tier.value}' (columns and "
                f"per-slot metadata{', priority trees' if selector_bytes_per_slot > 0 else ''}), {fmt(free)} is free "
                "there. Fix: lower capacity, or place part of it on another tier (shards=[ShardSpec(...), ...]; "
                "`conduit plan` sizes them).")
