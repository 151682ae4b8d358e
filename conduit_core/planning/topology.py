"""Topology: the memory tiers a run can place experience on, and the links between them.

A Topology is data (frozen, JSON round trip): tiers with a capacity, links with a
bandwidth and a latency, the core count. It is *measured* on the current machine by
``probe()`` (``conduit probe``), or loaded from a file, or taken from a preset for
machines we cannot measure here. The planner and the cost model read it; nothing in
it does I/O.

    tier names: "host" (pageable), "shm" (shared host), "pinned", "gpu0".."gpuN",
                "node1".. (another Ray node, reached over the network)
    a link (src, dst) is directional; host<->gpu links differ for pinned and pageable.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property

import numpy as np
import torch

from ..errors import ConfigError
from ..memory.staging import device_alias

GB = 1e9


@dataclass(frozen=True)
class TierInfo:
    name: str
    kind: str                  # "pageable" | "shared" | "pinned" | "device" | "remote"
    capacity_bytes: int
    device: str | None = None  # e.g. "cuda:0" for kind "device"

    def __post_init__(self) -> None:
        if self.kind not in ("pageable", "shared", "pinned", "device", "remote"):
            raise ConfigError("TierInfo.kind", "pageable/shared/pinned/device/remote", repr(self.kind),
                              "use one of the tier kinds")
        if self.capacity_bytes < 0:
            raise ConfigError("TierInfo.capacity_bytes", ">= 0", self.capacity_bytes, "give the usable bytes")


@dataclass(frozen=True)
class Link:
    src: str
    dst: str
    bandwidth_GBps: float
    latency_us: float = 5.0

    def seconds(self, nbytes: float) -> float:
        return self.latency_us * 1e-6 + nbytes / (self.bandwidth_GBps * GB)


@dataclass(frozen=True)
class Topology:
    name: str
    tiers: tuple[TierInfo, ...]
    links: tuple[Link, ...]
    cores: int
    source: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)

    def tier(self, name: str) -> TierInfo:
        for t in self.tiers:
            if t.name == name:
                return t
        raise ConfigError("tier", f"one of {[t.name for t in self.tiers]}", repr(name),
                          "name a tier of this topology (see `conduit probe`)")

    @cached_property
    def _links(self) -> dict[tuple[str, str], Link]:
        return {(l.src, l.dst): l for l in self.links}

    def link(self, src: str, dst: str) -> Link:
        """The link src -> dst (a tier reading itself is a local copy at its own bandwidth)."""
        l = self._links.get((src, dst))
        if l is not None:
            return l
        raise ConfigError("link", f"a link {src} -> {dst} in topology {self.name!r}", "none",
                          "add the link to the topology file, or probe the machine")

    def has_link(self, src: str, dst: str) -> bool:
        try:
            self.link(src, dst)
            return True
        except ConfigError:
            return False

    # ------------------------------------------------------------------ io
    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Topology":
        return cls(name=d["name"], tiers=tuple(TierInfo(**t) for t in d["tiers"]),
                   links=tuple(Link(**l) for l in d["links"]), cores=int(d["cores"]), source=d.get("source", ""),
                   notes=tuple(d.get("notes", ())))

    def save(self, path: str) -> None:
        with open(path, "w") as fh:
            json.dump(self.to_dict(), fh, indent=2)

    @classmethod
    def load(cls, path: str) -> "Topology":
        with open(path) as fh:
            return cls.from_dict(json.load(fh))


# --------------------------------------------------------------------- presets
def _host_links(bw: float, tiers=("host", "shm", "pinned")) -> list[Link]:
    """Host-memory tiers copy among themselves at the host's memcpy bandwidth."""
    return [Link(a, b, bw, 1.0) for a in tiers for b in tiers]

def a100_nvlink_8() -> Topology:
    """NVIDIA DGX A100: 8x A100 80 GB on NVSwitch (NVLink 3: 300 GB/s per direction per GPU),
    PCIe 4.0 x16 to the host (~24 GB/s pinned, ~12 GB/s pageable per direction), 2 TB host
    memory, 2x 64-core EPYC 7742. Sources: NVIDIA DGX A100 datasheet and user guide; A100
    Tensor Core GPU architecture whitepaper (NVLink 3, 600 GB/s total bidirectional per GPU).
    Host-copy and pageable figures are typical measured values, not datasheet numbers."""
    tiers = [TierInfo("host", "pageable", 1800 * 10**9), TierInfo("pinned", "pinned", 512 * 10**9),
             TierInfo("shm", "shared", 900 * 10**9)]
    tiers += [TierInfo(f"gpu{i}", "device", 70 * 10**9, f"cuda:{i}") for i in range(8)]
    links = _host_links(20.0)
    for i in range(8):
        g = f"gpu{i}"
        links += [Link("pinned", g, 24.0, 10.0), Link(g, "pinned", 24.0, 10.0),
                  Link("host", g, 12.0, 15.0), Link(g, "host", 12.0, 15.0),
                  Link("shm", g, 12.0, 15.0), Link(g, g, 1500.0, 5.0)]
        for j in range(8):
            if i != j:
                links.append(Link(g, f"gpu{j}", 300.0, 8.0))
    return Topology("dgx-a100-8x-nvlink", tuple(tiers), tuple(links), cores=128,
                    source="NVIDIA DGX A100 datasheet/user guide; NVIDIA A100 architecture whitepaper")


def mi250x_8() -> Topology:
    """One HPE Cray EX (Frontier-class) node: 4x AMD MI250X = 8 GCDs of 64 GB HBM2e. GCD<->GCD
    links are non-uniform: the two GCDs of one MI250X share 4 Infinity Fabric links (200 GB/s
    per direction); GCDs on different MI250Xs are joined by 2 or 1 links (100 or 50 GB/s per
    direction) or none (routed through a peer). Each GCD reaches the 64-core EPYC host over
    Infinity Fabric at 36 GB/s per direction; 512 GB DDR4. Source: OLCF Frontier User Guide,
    system overview node diagram (link counts per GCD pair); AMD CDNA 2 whitepaper."""
    tiers = [TierInfo("host", "pageable", 480 * 10**9), TierInfo("pinned", "pinned", 200 * 10**9),
             TierInfo("shm", "shared", 240 * 10**9)]
    tiers += [TierInfo(f"gpu{i}", "device", 60 * 10**9, f"cuda:{i}") for i in range(8)]
    links = _host_links(18.0)
    # Per-direction GB/s between GCD pairs: same package 200; 2 links 100; 1 link 50; else via a peer.
    pair = {}
    for a in range(0, 8, 2):
        pair[(a, a + 1)] = 200.0
    for (a, b, bw) in [(0, 2, 50.0), (1, 3, 50.0), (0, 6, 50.0), (1, 7, 50.0), (2, 4, 50.0), (3, 5, 50.0),
                       (4, 6, 100.0), (5, 7, 100.0), (2, 6, 50.0), (3, 7, 50.0), (0, 4, 50.0), (1, 5, 50.0)]:
        pair[(a, b)] = bw
    for i in range(8):
        g = f"gpu{i}"
        links += [Link("pinned", g, 36.0, 10.0), Link(g, "pinned", 36.0, 10.0),
                  Link("host", g, 14.0, 15.0), Link(g, "host", 14.0, 15.0), Link("shm", g, 14.0, 15.0),
                  Link(g, g, 1300.0, 5.0)]
        for j in range(8):
            if i != j:
                bw = pair.get((min(i, j), max(i, j)), 25.0)  # no direct link: half of a 50 GB/s hop
                links.append(Link(g, f"gpu{j}", bw, 10.0 if bw >= 50 else 20.0))
    return Topology("frontier-mi250x-8gcd", tuple(tiers), tuple(links), cores=64,
                    source="OLCF Frontier User Guide (node diagram); AMD CDNA 2 architecture whitepaper")


PRESETS = {"a100x8": a100_nvlink_8, "mi250x8": mi250x_8}


# ----------------------------------------------------------------------- probe
def _copy_bandwidth(nbytes: int, reps: int, make_src, make_dst, sync=lambda: None) -> float:
    src, dst = make_src(nbytes), make_dst(nbytes)
    dst.copy_(src)
    sync()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        sync()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return nbytes / ts[len(ts) // 2] / GB


MAPPED_PREFIX = "mapped:"   # link "mapped:pinned" -> gpuN: the device reading pinned memory in place (Gear)
MAPPED_ROW_BYTES = 4096


def _mapped_gather_bandwidth(nbytes: int, reps: int, device: str) -> float:
    """GB/s of a device kernel gathering random ``MAPPED_ROW_BYTES`` rows straight out of
    mapped pinned memory: the read path of ``ShardSpec(access="mapped")``."""

    row = MAPPED_ROW_BYTES // 4
    rows = max(1, nbytes // MAPPED_ROW_BYTES)
    host = torch.ones((rows, row), dtype=torch.float32, pin_memory=True)
    alias = device_alias(host, device)
    idx = torch.randint(0, rows, (rows,), device=device)
    out = torch.index_select(alias, 0, idx)
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.index_select(alias, 0, idx, out=out)
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return rows * MAPPED_ROW_BYTES / ts[len(ts) // 2] / GB


def probe(*, nbytes: int = 256 << 20, reps: int = 5) -> Topology:
    """Measure this machine: host memory copy, shared memory, and with CUDA the pinned and
    pageable host<->device and device<->device copies. Capacities are what is free now."""
    mem_avail = _meminfo("MemAvailable") or 8 * 10**9
    shm = os.statvfs("/dev/shm") if os.path.exists("/dev/shm") else None
    shm_free = shm.f_bavail * shm.f_frsize if shm else 0
    cpu = lambda n: torch.empty(n, dtype=torch.uint8).fill_(1)
    host_bw = _copy_bandwidth(nbytes, reps, cpu, cpu)
    tiers = [TierInfo("host", "pageable", int(mem_avail * 0.8)), TierInfo("shm", "shared", int(shm_free * 0.8))]
    links = _host_links(host_bw, ("host", "shm"))
    notes = [f"host memcpy {host_bw:.1f} GB/s ({nbytes >> 20} MiB, median of {reps})"]
    if torch.cuda.is_available():
        tiers.append(TierInfo("pinned", "pinned", int(mem_avail * 0.4)))
        links = [l for l in links if "pinned" not in (l.src, l.dst)] + _host_links(host_bw)
        links = list({(l.src, l.dst): l for l in links}.values())
        sync = torch.cuda.synchronize
        for i in range(torch.cuda.device_count()):
            g, dev = f"gpu{i}", f"cuda:{i}"
            free, _total = torch.cuda.mem_get_info(i)
            tiers.append(TierInfo(g, "device", int(free * 0.8), dev))
            gpu = lambda n, d=dev: torch.empty(n, dtype=torch.uint8, device=d)
            pinned = lambda n: torch.empty(n, dtype=torch.uint8, pin_memory=True)
            h2d_p = _copy_bandwidth(nbytes, reps, pinned, gpu, sync)
            d2h_p = _copy_bandwidth(nbytes, reps, gpu, pinned, sync)
            h2d = _copy_bandwidth(nbytes, reps, cpu, gpu, sync)
            d2h = _copy_bandwidth(nbytes, reps, gpu, cpu, sync)
            d2d = _copy_bandwidth(nbytes, reps, gpu, gpu, sync)
            mapped = _mapped_gather_bandwidth(nbytes, reps, dev)
            links += [Link("pinned", g, h2d_p, 10.0), Link(g, "pinned", d2h_p, 10.0), Link("host", g, h2d, 15.0),
                      Link(g, "host", d2h, 15.0), Link("shm", g, h2d, 15.0), Link(g, g, d2d, 5.0),
                      Link(MAPPED_PREFIX + "pinned", g, mapped, 5.0)]
            notes.append(f"{g}: H2D pinned {h2d_p:.1f}, pageable {h2d:.1f}; D2H pinned {d2h_p:.1f}, "
                         f"pageable {d2h:.1f}; D2D {d2d:.1f}; device gathering {MAPPED_ROW_BYTES} B rows "
                         f"from mapped pinned memory {mapped:.1f} GB/s")
    return Topology(f"probed-{os.uname().nodename}", tuple(tiers), tuple(links), cores=os.cpu_count() or 1,
                    source="conduit probe (measured)", notes=tuple(notes))


class _LinkProbe:
    """Ray actor body for ``probe_remote``: receives and returns byte arrays (what a remote
    shard's writes and gathers move), and reports the node's free memory."""

    def take(self, data) -> int:
        return len(data)

    def give(self, nbytes: int):
        return np.ones(nbytes, dtype=np.uint8)

    def free_bytes(self) -> int:
        return _meminfo("MemAvailable") or 0


def probe_remote(node: str, *, nbytes: int = 16 << 20, reps: int = 5, memory_share: float = 0.5,
                 local: str = "host") -> tuple[TierInfo, list[Link]]:
    """Measure a Ray node as a tier: ``node`` is the custom resource that pins an actor to it
    (as ``ShardSpec(tier="remote", node=...)`` does). Latency: the median round trip of an
    empty call; bandwidth: ``nbytes`` sent to the actor and fetched from it (the transfers a
    remote shard's writes and gathers make), median of ``reps``, latency subtracted. The
    tier's capacity is ``memory_share`` of the node's free memory. Needs a running Ray session."""
    import ray
    if not ray.is_initialized():
        raise ConfigError("probe_remote", "a running Ray session", "none",
                          "call ray.init(address=...) before probing a remote node")
    actor = ray.remote(num_cpus=0)(_LinkProbe).options(resources={node: 0.001}).remote()
    try:
        payload = np.ones(nbytes, dtype=np.uint8)
        ray.get([actor.take.remote(b""), actor.give.remote(1)])  # start the actor, warm both paths

        def median(call) -> float:
            ts = []
            for _ in range(reps):
                t0 = time.perf_counter()
                ray.get(call())
                ts.append(time.perf_counter() - t0)
            return sorted(ts)[len(ts) // 2]

        lat = median(lambda: actor.take.remote(b""))
        up = median(lambda: actor.take.remote(payload))
        down = median(lambda: actor.give.remote(nbytes))
        free = ray.get(actor.free_bytes.remote())
    finally:
        ray.kill(actor)
    bw = lambda t: nbytes / max(t - lat, 1e-9) / GB
    links = [Link(local, node, bw(up), lat * 1e6), Link(node, local, bw(down), lat * 1e6)]
    return TierInfo(node, "remote", int(free * memory_share)), links


def with_remote_nodes(topology: Topology, nodes: list[str], **probe_kw) -> Topology:
    """``topology`` plus each Ray node in ``nodes`` (custom resource names) as a measured
    'remote' tier, linked to the host (``probe_remote``): what ``conduit probe --remote-node``
    writes, so ``conduit plan`` can spill a buffer onto other nodes."""
    tiers, links, notes = list(topology.tiers), list(topology.links), list(topology.notes)
    for node in nodes:
        tier, node_links = probe_remote(node, **probe_kw)
        tiers.append(tier)
        links += node_links
        up, down = node_links
        notes.append(f"{node}: host -> node {up.bandwidth_GBps:.2f} GB/s, node -> host {down.bandwidth_GBps:.2f} "
                     f"GB/s, {up.latency_us:.0f} us per call (through a Ray actor)")
    return replace(topology, tiers=tuple(tiers), links=tuple(links), notes=tuple(notes))


def _meminfo(key: str) -> int | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
