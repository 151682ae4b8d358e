"""Scaling of the experience path on paper: 8 to 1,024 GPUs from the node presets and stated assumptions.

Pure functions, no I/O: :func:`simulate` returns one :class:`Point` per GPU count and layout;
``conduit simulate`` prints them with every assumption beside them. Nothing here is measured: it is
byte-and-bandwidth arithmetic over the node presets (the cost model's transfer terms; not its fitted
per-operator costs) carried to clusters this project cannot run on, so each number is only as good
as the assumptions it prints (link and memory bandwidths with their sources, the workload's sizes
and rates, the learner's compute time per step).

Model, per learner step, data-parallel learners (one per GPU), ``nodes = gpus / gpus_per_node``:

- compute: ``compute_s_per_sample * per_gpu_batch`` (strong scaling: the global batch is fixed, so the
  per-GPU batch shrinks; weak scaling: the per-GPU batch is fixed);
- gradient all-reduce, hierarchical ring: inside a node over the GPU-GPU link, across nodes over
  the node's NICs shared by its GPUs: ``2 (k-1)/k * grad_bytes / bw`` per level;
- the experience path of each layout:

  ``central``  one buffer node (a driver-side replay buffer, a Reverb/TransferQueue server): every
               GPU's inserts come in and every GPU's batch goes out through that node's NICs, and its
               memory copies serve all learners: the time grows with the GPU count;
  ``sharded``  Conduit's layout: a shard per node written where the data is produced (actors on the
               node, ingestion at the source), each learner gathers a uniform batch over all shards:
               a fraction ``(nodes-1)/nodes`` of its rows crosses the network, spread over every node's
               NICs; inserts and the host->GPU copy stay on the node.

- iteration = compute + all-reduce + exposed experience path, where the exposed part is the whole
  path (``sequential``) or what exceeds compute (``overlapped``: prepared while the learner computes).
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field

from ..errors import ConfigError
from .topology import PRESETS, Topology

GB = 1e9


@dataclass(frozen=True)
class Cluster:
    """A node preset plus what the presets do not hold: the network between nodes."""

    name: str
    node: Topology
    gpus_per_node: int
    nic_GBps_per_node: float      # all of a node's NICs, one direction
    nic_latency_us: float
    source: str
    memory_GBps_per_node: float   # what a buffer node's memory sustains for many concurrent copies
    memory_source: str

    @property
    def host_to_gpu_GBps(self) -> float:
        return self.node.link("pinned", "gpu0").bandwidth_GBps

    @property
    def gpu_to_gpu_GBps(self) -> float:
        """The bandwidth of the best ring through the node's GPUs: a ring is as fast as its slowest
        hop, so the best one maximises that (searched over every cycle; 8 GPUs: 5,040)."""
        gpus = sorted(t.name for t in self.node.tiers if t.kind == "device")
        bw = {(l.src, l.dst): l.bandwidth_GBps for l in self.node.links}
        best = 0.0
        for rest in itertools.permutations(gpus[1:]):
            cycle = (gpus[0],) + rest + (gpus[0],)
            best = max(best, min(bw.get((a, b), 0.0) for a, b in zip(cycle, cycle[1:])))
        return best


def a100_cluster() -> Cluster:
    return Cluster("DGX A100 SuperPOD", PRESETS["a100x8"](), 8, nic_GBps_per_node=8 * 25.0, nic_latency_us=5.0,
                   source="DGX A100: 8x ConnectX-6 HDR InfiniBand 200 Gb/s (25 GB/s) compute NICs per node "
                          "(NVIDIA DGX A100 user guide)",
                   memory_GBps_per_node=150.0,
                   memory_source="2x EPYC 7742, 16 DDR4-3200 channels: 410 GB/s peak, ~150 GB/s assumed for "
                                 "concurrent copies (read + write, NUMA)")


def frontier_cluster() -> Cluster:
    return Cluster("Frontier (HPE Cray EX, MI250X)", PRESETS["mi250x8"](), 8, nic_GBps_per_node=4 * 25.0,
                   nic_latency_us=3.0,
                   source="Frontier node: 4x HPE Slingshot 200 Gb/s (25 GB/s) NICs, one per MI250X "
                          "(OLCF Frontier user guide)",
                   memory_GBps_per_node=75.0,
                   memory_source="64-core EPYC 7A53, 8 DDR4-3200 channels: 205 GB/s peak, ~75 GB/s assumed for "
                                 "concurrent copies")


CLUSTERS = {"a100": a100_cluster, "frontier": frontier_cluster}


@dataclass(frozen=True)
class Workload:
    """One learner's experience path per step, and its compute. Sizes are what moves: stored
    (encoded) bytes per row for inserts, delivered (decoded) bytes per row for batches."""

    name: str
    row_bytes_stored: float
    row_bytes_delivered: float
    per_gpu_batch: int            # rows per learner step per GPU (weak scaling keeps it)
    inserts_per_step: float       # rows inserted per learner step per GPU
    compute_s_per_sample: float   # learner forward+backward per row
    grad_bytes: float
    notes: str = ""


WORKLOADS = {
    "dqn-atari": Workload("dqn-atari", row_bytes_stored=7_100 + 64, row_bytes_delivered=2 * 84 * 84 * 4 + 64,
                          per_gpu_batch=256, inserts_per_step=64, compute_s_per_sample=20e-6,
                          grad_bytes=4 * 1.69e6,
                          notes="Nature-CNN DQN; frames stored once (frame pool + codec: ~7.1 kB/row), delivered as "
                                "uint8 obs and next obs; replay ratio 4 (64 inserts per 256-row batch); "
                                "~20 us/sample on an A100 for forward+backward of the 1.69M-parameter CNN"),
    "ppo-atari": Workload("ppo-atari", row_bytes_stored=84 * 84 * 4 + 64, row_bytes_delivered=84 * 84 * 4 + 64,
                          per_gpu_batch=1024, inserts_per_step=1024, compute_s_per_sample=15e-6,
                          grad_bytes=4 * 1.69e6,
                          notes="on-policy: every row inserted once and delivered once (FIFO)"),
    "grpo-llm": Workload("grpo-llm", row_bytes_stored=4096 * 16, row_bytes_delivered=4096 * 16,
                         per_gpu_batch=8, inserts_per_step=8, compute_s_per_sample=0.45,
                         grad_bytes=2 * 1.5e9,
                         notes="GRPO, 1.5B model, 4,096-token sequences x 16 B/token (ids, masks, old/ref "
                               "log-probs, advantages); bf16 gradients; ~0.45 s/sequence forward+backward"),
}


@dataclass(frozen=True)
class Point:
    cluster: str
    workload: str
    scaling: str
    layout: str
    mode: str   # the schedule's mode (Schedule.mode): sequential or overlapped
    gpus: int
    nodes: int
    per_gpu_batch: float
    compute_s: float
    allreduce_s: float
    experience_s: float
    exposed_s: float
    iteration_s: float
    samples_per_s: float
    breakdown: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def _ring(k: int, nbytes: float, bw_GBps: float, lat_us: float) -> float:
    if k <= 1:
        return 0.0
    return 2 * (k - 1) / k * nbytes / (bw_GBps * GB) + 2 * (k - 1) * lat_us * 1e-6


def allreduce_s(c: Cluster, gpus: int, grad_bytes: float) -> float:
    """Hierarchical all-reduce: a ring inside each node, then across nodes with every GPU's share of
    the node's NICs (the inter-node ring carries grad_bytes / gpus_per_node per GPU)."""
    local = min(gpus, c.gpus_per_node)
    nodes = max(1, gpus // c.gpus_per_node)
    intra = _ring(local, grad_bytes, c.gpu_to_gpu_GBps, 8.0)
    inter = _ring(nodes, grad_bytes / local, c.nic_GBps_per_node / local, c.nic_latency_us)
    return intra + inter


def experience_s(c: Cluster, w: Workload, gpus: int, layout: str, per_gpu_batch: float) -> tuple[float, dict]:
    """Seconds per learner step spent moving experience, for every learner at once (they run in
    parallel; a shared resource serialises what crosses it)."""
    nodes = max(1, gpus // c.gpus_per_node)
    local = min(gpus, c.gpus_per_node)
    ins_bytes = w.inserts_per_step * w.row_bytes_stored          # per GPU per step
    out_bytes = per_gpu_batch * w.row_bytes_delivered             # per GPU per step
    h2d = out_bytes / (c.host_to_gpu_GBps * GB)                   # each GPU's own PCIe/IF link, in parallel
    if layout == "central":
        # every insert comes in and every batch goes out through the buffer node's NICs (its own node's
        # GPUs excepted; the two directions overlap), and its memory copies the whole cluster's rows
        remote = (gpus - local) / gpus
        net = gpus * max(ins_bytes, out_bytes) * remote / (c.nic_GBps_per_node * GB)
        mem = gpus * (ins_bytes + out_bytes) / (c.memory_GBps_per_node * GB)
        parts = {"network": net, "buffer_node_memory": mem, "host_to_gpu": h2d}
        return net + mem + h2d, parts
    if layout == "sharded":
        remote = (nodes - 1) / nodes
        # a learner's remote rows are spread over the other nodes; each node sends and receives
        # local * out_bytes * remote per step through its own NICs (duplex: the two directions overlap)
        net = local * out_bytes * remote / (c.nic_GBps_per_node * GB) + (c.nic_latency_us * 1e-6 if nodes > 1 else 0)
        mem = local * (ins_bytes + out_bytes) / (c.memory_GBps_per_node * GB)   # this node's shard only
        parts = {"network": net, "shard_memory": mem, "host_to_gpu": h2d}
        return net + mem + h2d, parts
    raise ConfigError("layout", "'central' or 'sharded'", repr(layout), "use one of the two layouts")


def simulate(cluster: str = "a100", workload: str = "dqn-atari", *, scaling: str = "weak",
             gpus: tuple[int, ...] = (8, 16, 32, 64, 128, 256, 512, 1024),
             layouts: tuple[str, ...] = ("central", "sharded"),
             modes: tuple[str, ...] = ("sequential", "overlapped"),
             global_batch: float | None = None) -> list[Point]:
    """One point per (GPU count, layout, schedule mode). Strong scaling splits ``global_batch`` (default:
    the per-GPU batch x 128, a large-scale global batch) over the GPUs; counts that would get less
    than one row per GPU are left out."""
    if cluster not in CLUSTERS:
        raise ConfigError("cluster", f"one of {sorted(CLUSTERS)}", repr(cluster), "pick a cluster preset")
    if workload not in WORKLOADS:
        raise ConfigError("workload", f"one of {sorted(WORKLOADS)}", repr(workload), "pick a workload")
    if scaling not in ("weak", "strong"):
        raise ConfigError("scaling", "'weak' or 'strong'", repr(scaling),
                          "weak keeps the per-GPU batch, strong keeps the global batch of the smallest run")
    c, w = CLUSTERS[cluster](), WORKLOADS[workload]
    for g in gpus:
        if g < 1 or (g > c.gpus_per_node and g % c.gpus_per_node):
            raise ConfigError("gpus", f"whole nodes of {c.gpus_per_node} GPUs", g, "use multiples of the node size")
    global_batch = float(global_batch or w.per_gpu_batch * 128)
    out = []
    for g in gpus:
        b = w.per_gpu_batch if scaling == "weak" else global_batch / g
        if b < 1:
            continue
        scale = b / w.per_gpu_batch   # inserts follow the batch (the replay ratio is kept)
        wl = Workload(**{**asdict(w), "inserts_per_step": w.inserts_per_step * scale})
        compute = w.compute_s_per_sample * b
        ar = allreduce_s(c, g, w.grad_bytes)
        for layout in layouts:
            exp, parts = experience_s(c, wl, g, layout, b)
            for mode in modes:
                exposed = exp if mode == "sequential" else max(0.0, exp - compute)
                it = compute + ar + exposed
                out.append(Point(c.name, w.name, scaling, layout, mode, g, max(1, g // c.gpus_per_node), b,
                                 compute, ar, exp, exposed, it, g * b / it, parts))
    return out


def assumptions(cluster: str, workload: str) -> list[str]:
    c, w = CLUSTERS[cluster](), WORKLOADS[workload]
    return [
        f"cluster: {c.name}; node preset {c.node.name} ({c.node.source})",
        f"network: {c.nic_GBps_per_node:.0f} GB/s per node per direction, {c.nic_latency_us:.0f} us ({c.source})",
        f"inside a node: host->GPU {c.host_to_gpu_GBps:.0f} GB/s (pinned), best GPU ring {c.gpu_to_gpu_GBps:.0f} GB/s "
        f"per hop, buffer memory {c.memory_GBps_per_node:.0f} GB/s ({c.memory_source})",
        "sensitivity: the central layout's time is mostly the buffer node's memory and NICs; halving or doubling "
        "the memory figure scales its memory term by 2x or 0.5x (see breakdown in --json)",
        f"workload {w.name}: {w.row_bytes_stored / 1e3:.1f} kB stored / {w.row_bytes_delivered / 1e3:.1f} kB "
        f"delivered per row, batch {w.per_gpu_batch}/GPU, {w.inserts_per_step:g} inserts per step per GPU, "
        f"compute {w.compute_s_per_sample * 1e6:.0f} us/sample, gradients {w.grad_bytes / 1e6:.0f} MB",
        f"  {w.notes}",
        "compute per sample is the workload's figure on every cluster (no per-GPU-model scaling)",
        "not modelled: stragglers, contention between the all-reduce and experience traffic on the NICs, "
        "actors' own compute (assumed to keep up), the buffer node's CPU limits beyond memory bandwidth",
    ]
