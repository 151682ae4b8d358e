"""Placement: which tier holds which part of the buffer. A pure decision.

``plan(workload, topology)`` assigns the buffer's slots to tiers (one shard per tier used)
to minimise the predicted per-step delivery plus ingestion time, never exceeding a tier's
capacity, and says why. The model, per learner step:

    delivery  = max_links sum_(i on link) [ lat(i -> learner) + B * f_i * bytes / bw(i -> learner) ]
    ingestion = max_links sum_(i on link) [ lat(actors -> i) + I * f_i * bytes / bw(actors -> i) ]

(shards are read concurrently over their own links; host-memory tiers share the host's link)

with f_i the fraction of slots on tier i (uniform selection reads, and the ring writes,
each tier in proportion to its share), B the batch size, I the inserts per step and
``bytes`` the stored bytes per transition. A host tier read by a GPU learner costs its route
(``route_seconds``): with access "copy" the CPU gathers the rows at the host's copy bandwidth
and the copy engine moves them over the host link; with access "mapped" (pinned memory
only, Gear's route) the device gathers them in place over the link, no CPU gather. Pinned
tiers take the cheaper of the two per workload (``best_access``). The per-slot cost of a
tier is linear, so the optimum fills tiers cheapest-first; the latency terms make a tier worth using only if it
takes a real share, which ``plan`` checks by trying every prefix of the ranking.

Baselines are the fixed placements of existing systems (``fixed_plan``): pageable host
(Reverb, RLlib), pinned host (SRL), pinned host read by the device (Gear), one GPU, all GPUs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dataclasses import dataclass, field

from ..errors import CapacityError, ConfigError
from ..storage.shards import ShardSpec
from .topology import MAPPED_PREFIX, Topology

if TYPE_CHECKING:
    from .topology import Link


@dataclass(frozen=True)
class Workload:
    transition_bytes: int          # stored bytes per transition (after codecs)
    capacity: int                  # transitions the buffer must hold
    batch_size: int                # rows per delivery
    inserts_per_step: float = 1.0  # transitions ingested per learner step
    learner: str = "host"          # tier the learner reads from (its device), e.g. "gpu0"
    actors: str = "host"           # tier the actors' rollouts arrive in
    learners: tuple[str, ...] = () # data-parallel learners (all read B rows each); default (learner,)

    def __post_init__(self) -> None:
        for name in ("transition_bytes", "capacity", "batch_size"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"Workload.{name}", "> 0", getattr(self, name), f"give a positive {name}")

    @property
    def total_bytes(self) -> int:
        return self.transition_bytes * self.capacity

    @property
    def readers(self) -> tuple[str, ...]:
        return self.learners or (self.learner,)


@dataclass(frozen=True)
class Assignment:
    tier: str
    slots: int
    access: str = "copy"   # how a GPU learner reads this tier: "copy" or "mapped" (see staging.py)


@dataclass(frozen=True)
class Plan:
    name: str
    assignments: tuple[Assignment, ...]
    delivery_s: float
    ingest_s: float
    explanation: tuple[str, ...] = field(default_factory=tuple)

    @property
    def total_s(self) -> float:
        return self.delivery_s + self.ingest_s

    def fractions(self) -> dict[str, float]:
        n = sum(a.slots for a in self.assignments)
        return {a.tier: a.slots / n for a in self.assignments}

    def render(self) -> str:
        lines = [f"plan {self.name}: predicted delivery {self.delivery_s * 1e3:.3f} ms + ingestion "
                 f"{self.ingest_s * 1e3:.3f} ms = {self.total_s * 1e3:.3f} ms per step"]
        for a in self.assignments:
            lines.append(f"  {a.tier:8s} {a.slots:>12,d} slots" + ("  (read in place by the device)"
                                                                   if a.access == "mapped" else ""))
        lines += [f"  - {e}" for e in self.explanation]
        return "\n".join(lines)


HOST_KINDS = ("pageable", "shared", "pinned")


def _size(nbytes: float) -> str:
    """Bytes for a message: GB, or MB below a gigabyte (so small budgets do not read 0.0 GB)."""
    return f"{nbytes / 1e9:.1f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.1f} MB"


def _host_to_device(topology: Topology, tier: str, reader: str) -> bool:
    return topology.tier(tier).kind in HOST_KINDS and topology.tier(reader).kind == "device"


def mapped_link(topology: Topology, tier: str, reader: str) -> Link:
    """The link a device uses to gather from ``tier``'s pinned memory in place: the probed
    ``mapped:<tier>`` link, else (presets, files without it) the tier's DMA link, i.e. the
    assumption that in-place reads of whole rows reach the copy engine's bandwidth."""
    key = MAPPED_PREFIX + tier
    return topology.link(key, reader) if topology.has_link(key, reader) else topology.link(tier, reader)


def route_seconds(topology: Topology, tier: str, reader: str, nbytes: float, access: str = "copy", *,
                  latency: bool = True) -> float:
    """Seconds to deliver ``nbytes`` of rows from ``tier`` to ``reader``. Host -> device with
    "copy": the CPU gathers at the host's copy bandwidth, then the link moves the rows; with
    "mapped": the device gathers over the link (no host gather). Otherwise: the link alone.
    ``latency=False``: the bandwidth part only."""
    link = mapped_link(topology, tier, reader) if access == "mapped" else topology.link(tier, reader)
    t = link.seconds(nbytes) if latency else nbytes / (link.bandwidth_GBps * 1e9)
    if access == "copy" and _host_to_device(topology, tier, reader) and topology.has_link(tier, tier):
        t += nbytes / (topology.link(tier, tier).bandwidth_GBps * 1e9)
    return t


def best_access(workload: Workload, topology: Topology, tier: str) -> str:
    """"mapped" when every reader is a device and reading the pinned tier in place is cheaper
    for this workload than gathering on the host and copying; else "copy". A pure decision."""
    if topology.tier(tier).kind != "pinned" or not all(topology.tier(r).kind == "device" for r in workload.readers):
        return "copy"
    rows = workload.batch_size * workload.transition_bytes
    cost = {a: sum(route_seconds(topology, tier, r, rows, a) for r in workload.readers) for a in ("copy", "mapped")}
    return "mapped" if cost["mapped"] < cost["copy"] else "copy"


def _costs(workload: Workload, topology: Topology, tiers: list[str], fractions: list[float],
           access: dict[str, str] | None = None) -> tuple[float, float]:
    """Shards are read (and written) concurrently, each over its own link, so a step waits
    for the slowest shard; shards reached over the *same* link (e.g. host and shm to a GPU
    both cross its PCIe link) share it and add up."""
    b = workload.transition_bytes
    access = access or {}
    deliver = 0.0
    for reader in workload.readers:
        per_link: dict[tuple, float] = {}
        for t, f in zip(tiers, fractions):
            if f > 0:
                key = _link_group(topology, t, reader)
                per_link[key] = per_link.get(key, 0.0) + route_seconds(
                    topology, t, reader, workload.batch_size * f * b, access.get(t, "copy"))
        deliver += max(per_link.values(), default=0.0)
    per_link = {}
    for t, f in zip(tiers, fractions):
        if f > 0:
            key = _link_group(topology, workload.actors, t)
            per_link[key] = per_link.get(key, 0.0) + topology.link(workload.actors, t).seconds(
                workload.inserts_per_step * f * b)
    return deliver, max(per_link.values(), default=0.0)


def _link_group(topology: Topology, src: str, dst: str) -> tuple:
    """Links that share hardware: every host-memory tier reaches a device over its one host link."""
    s_kind, d_kind = topology.tier(src).kind, topology.tier(dst).kind
    return ("host" if s_kind in HOST_KINDS else src, "host" if d_kind in HOST_KINDS else dst)


def per_slot_cost(workload: Workload, topology: Topology, tier: str, access: str | None = None) -> float:
    """Seconds per step that one unit of slot fraction on ``tier`` costs (bandwidth part),
    read with ``access`` (default: the tier's best)."""
    b = workload.transition_bytes
    access = access or best_access(workload, topology, tier)
    c = sum(route_seconds(topology, tier, r, workload.batch_size * b, access, latency=False) for r in workload.readers)
    return c + workload.inserts_per_step * b / (topology.link(workload.actors, tier).bandwidth_GBps * 1e9)


def usable(topology: Topology, workload: Workload) -> list[str]:
    """Tiers that every reader and the actors can reach."""
    out = []
    for t in topology.tiers:
        if all(topology.has_link(t.name, r) for r in workload.readers) and topology.has_link(workload.actors, t.name):
            out.append(t.name)
    return out


def _fill(workload: Workload, topology: Topology, order: list[str]) -> list[tuple[str, int]] | None:
    left = workload.capacity
    out = []
    for t in order:
        if left <= 0:
            break
        cap_slots = topology.tier(t).capacity_bytes // workload.transition_bytes
        take = min(left, cap_slots)
        if take > 0:
            out.append((t, int(take)))
            left -= take
    return out if left <= 0 else None


def _balanced(workload: Workload, topology: Topology, order: list[str], *, even: bool = False
              ) -> list[tuple[str, int]] | None:
    """Shares proportional to each tier's bandwidth to the (first) learner (or equal, with
    ``even``), capped by capacity (water-filling): shards read in parallel finish together."""
    reader = workload.readers[0]
    caps = {t: topology.tier(t).capacity_bytes // workload.transition_bytes for t in order}
    if sum(caps.values()) < workload.capacity:
        return None
    share: dict[str, int] = {}
    left, free = workload.capacity, list(order)
    while left > 0 and free:
        bw = {t: 1.0 if even else topology.link(t, reader).bandwidth_GBps for t in free}
        total = sum(bw.values())
        capped = [t for t in free if left * bw[t] / total >= caps[t] - share.get(t, 0)]
        if not capped:
            alloc = {t: int(left * bw[t] / total) for t in free}
            alloc[free[0]] += left - sum(alloc.values())
            for t, v in alloc.items():
                share[t] = share.get(t, 0) + v
            left = 0
            break
        for t in capped:
            take = caps[t] - share.get(t, 0)
            share[t] = share.get(t, 0) + take
            left -= take
            free.remove(t)
    if left > 0:
        return None
    return [(t, share[t]) for t in order if share.get(t, 0) > 0]


def _plan_from(name: str, workload: Workload, topology: Topology, assign: list[tuple[str, int]],
               why: list[str], access: dict[str, str] | None = None) -> Plan:
    n = sum(s for _, s in assign)
    access = access or {}
    d, i = _costs(workload, topology, [t for t, _ in assign], [s / n for _, s in assign], access)
    return Plan(name, tuple(Assignment(t, s, access.get(t, "copy")) for t, s in assign), d, i, tuple(why))


def _subsets(ranked: list[str], exhaustive_up_to: int = 12):
    """Every non-empty subset (in rank order) for small topologies, else every prefix."""
    n = len(ranked)
    if n > exhaustive_up_to:
        for k in range(1, n + 1):
            yield ranked[:k]
        return
    for mask in range(1, 1 << n):
        yield [ranked[i] for i in range(n) if mask >> i & 1]


def plan(workload: Workload, topology: Topology) -> Plan:
    """The capacity-constrained, bandwidth-aware placement with the lowest predicted cost."""
    tiers = usable(topology, workload)
    if not tiers:
        raise ConfigError("topology", f"a tier reachable from {workload.readers} and {workload.actors}", "none",
                          "add links between the learner's device and a memory tier")
    access = {t: best_access(workload, topology, t) for t in tiers}
    ranked = sorted(tiers, key=lambda t: per_slot_cost(workload, topology, t, access[t]))
    best: Plan | None = None
    for subset in _subsets(ranked):  # latency decides how many tiers; two ways to share among them
        for assign in (_fill(workload, topology, subset), _balanced(workload, topology, subset),
                       _balanced(workload, topology, subset, even=True)):
            if assign is None:
                continue
            cand = _plan_from("conduit", workload, topology, assign, [], access)
            if best is None or cand.total_s < best.total_s - 1e-12:
                best = cand
    if best is None:
        total = sum(topology.tier(t).capacity_bytes for t in tiers)
        raise CapacityError(f"capacity: {_size(workload.total_bytes)} wanted "
                            f"({workload.capacity:,} x {workload.transition_bytes} B), the reachable tiers hold "
                            f"{_size(total)}. Fix: lower the capacity, add a tier, or use a codec.")
    why = ["tiers ranked by cost per slot share: " + ", ".join(
        f"{t}{' (mapped)' if access[t] == 'mapped' else ''} {per_slot_cost(workload, topology, t, access[t]) * 1e3:.3f} ms"
        for t in ranked)]
    for a in best.assignments:
        cap = topology.tier(a.tier).capacity_bytes
        used = a.slots * workload.transition_bytes
        why.append(f"{a.tier}: {used / 1e9:.2f} of {cap / 1e9:.2f} GB "
                   f"({'full' if used + workload.transition_bytes > cap else 'room left'})")
    return Plan("conduit", best.assignments, best.delivery_s, best.ingest_s, tuple(why))


def shard_specs(plan_: Plan, topology: Topology) -> list:
    """The ``ShardSpec``s that carry out ``plan_`` (one shard per assigned tier; a 'remote'
    tier's name is the Ray custom resource of its node; pinned shards keep their access)."""
    out = []
    for a in plan_.assignments:
        t = topology.tier(a.tier)
        out.append(ShardSpec(t.kind, a.slots, device=t.device, node=t.name if t.kind == "remote" else None,
                             access=a.access))
    return out


BASELINES = ("pageable", "pinned", "gear", "single-gpu", "all-gpus")


def fixed_plan(kind: str, workload: Workload, topology: Topology) -> Plan:
    """A fixed placement of an existing system (raises CapacityError when it cannot hold the buffer)."""
    gpus = [t.name for t in topology.tiers if t.kind == "device"]
    if kind == "pageable":        # Reverb, RLlib
        order, why = ["host"], "pageable host memory (Reverb, RLlib)"
    elif kind == "pinned":        # SRL
        order, why = ["pinned"], "pinned host memory (SRL)"
    elif kind == "gear":          # pinned host, read by the device directly
        order, why = ["pinned"], "pinned host memory with device-side access (Gear)"
    elif kind == "single-gpu":
        order, why = [workload.learner if workload.learner in gpus else (gpus[:1] or ["-"])[0]], "one GPU's memory"
    elif kind == "all-gpus":
        order, why = gpus, "all GPUs' memory, evenly"
    else:
        raise ConfigError("baseline", f"one of {BASELINES}", repr(kind), "pick a known baseline")
    if not order:   # all-gpus on a topology without GPUs (e.g. a CPU machine's probe)
        raise CapacityError(f"baseline {kind}: this topology has no GPU tier")
    for t in order:
        if t not in [x.name for x in topology.tiers]:
            raise CapacityError(f"baseline {kind}: this topology has no tier {t!r}")
    if kind == "all-gpus":
        per = -(-workload.capacity // len(order))
        assign = [(t, min(per, workload.capacity - i * per)) for i, t in enumerate(order)]
        if any(s * workload.transition_bytes > topology.tier(t).capacity_bytes for t, s in assign):
            raise CapacityError(f"baseline all-gpus: {_size(workload.total_bytes)} does not fit the GPUs")
    else:
        assign = _fill(workload, topology, order)
        if assign is None:
            raise CapacityError(f"baseline {kind}: {_size(workload.total_bytes)} does not fit {order[0]} "
                                f"({_size(topology.tier(order[0]).capacity_bytes)})")
    # Gear: the device reads pinned memory in place (no host gather); the others copy.
    access = {"pinned": "mapped"} if kind == "gear" else {}
    return _plan_from(kind, workload, topology, assign, [why], access)


def greedy_plan(workload: Workload, topology: Topology) -> Plan:
    """Greedy: the single fastest tier, and fail when it is full (no spill)."""
    tiers = usable(topology, workload)
    best = min(tiers, key=lambda t: per_slot_cost(workload, topology, t))
    assign = _fill(workload, topology, [best])
    if assign is None:
        raise CapacityError(f"greedy: the fastest tier {best} holds "
                            f"{_size(topology.tier(best).capacity_bytes)}, {_size(workload.total_bytes)} wanted. "
                            "Fix: a placement that spills to the next tier (plan)")
    return _plan_from("greedy", workload, topology, assign, [f"fastest tier only: {best}"],
                      {best: best_access(workload, topology, best)})


def conservative_plan(workload: Workload, topology: Topology) -> Plan:
    """Conservative: the whole buffer in the largest reachable tier, sized for the worst case
    from the start and never moved: pageable host memory on one machine (as Reverb and
    RLlib), a bigger node's memory where this host's budget is the smaller one."""
    largest = max(usable(topology, workload), key=lambda t: topology.tier(t).capacity_bytes)
    if topology.tier(largest).kind == "pageable":
        return fixed_plan("pageable", workload, topology)
    assign = _fill(workload, topology, [largest])
    if assign is None:
        raise CapacityError(f"conservative: the largest tier {largest} holds "
                            f"{_size(topology.tier(largest).capacity_bytes)}, "
                            f"{_size(workload.total_bytes)} wanted")
    return _plan_from("conservative", workload, topology, assign, [f"largest tier only: {largest}"])
