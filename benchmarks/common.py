"""Shared helpers for the benchmarks: repeated timing, medians, ratios, tables."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

# the checkout the lab lives in (integrations/, adapters/): runs that launch a framework's own
# launcher start it from there
REPO = Path(__file__).resolve().parents[1]


def time_per_call(fn: Callable[[], object], *, calls: int, reps: int) -> list[float]:
    """Seconds per call, one value per repetition (each repetition = ``calls`` calls)."""
    fn()  # warm-up
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t0) / calls)
    return out


def paired_times(arms: dict[str, tuple[Callable[[], object], int]], *, reps: int) -> dict[str, list[float]]:
    """Seconds per call of each arm ``{name: (fn, calls)}``, one value per repetition, the arms
    taken in turns (repetition i of every arm before repetition i + 1 of any): ratios of the
    same repetition (``ratio_stats``) then compare the same stretch of a noisy machine. Each
    repetition starts with a tenth of its calls untimed: that re-warms the arm's call path, but
    it does not give back the data cache the arm before it evicted, so an arm whose working set
    is large (a 1M-leaf priority tree) times slower here than alone, as it would inside a
    learner whose update evicts it too (docs/benchmarks.md §1 gives both)."""
    out: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(reps):
        for name, (fn, calls) in arms.items():
            for _ in range(max(1, calls // 10)):
                fn()  # warm-up
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            out[name].append((time.perf_counter() - t0) / calls)
    return out


def median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def ratio_stats(num: list[float], den: list[float]) -> dict:
    """min/median/max of the per-repetition ratios num/den (same repetitions paired)."""
    r = [a / b for a, b in zip(num, den)]
    return {"min": min(r), "median": statistics.median(r), "max": max(r)}


def memcpy_bandwidth(nbytes: int = 256 << 20, reps: int = 5) -> float:
    """The machine's plain large-copy bandwidth (GB/s) into a pre-touched buffer."""
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        ts.append(time.perf_counter() - t0)
    return nbytes / statistics.median(ts) / 1e9


def machine() -> dict:
    import torch
    return {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
            "torch": torch.__version__, "numpy": np.__version__, "cuda": torch.cuda.is_available()}


def write_json(path: str, payload: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as fh:
        json.dump(payload, fh, indent=2, default=float)


def report(out: dict, module: str, argv: list[str] | None, path: str | None) -> None:
    """A probe's result with the command that made it (``python -m benchmarks.<module> ...``):
    printed, and written to ``path`` when one is given."""
    out["command"] = f"python -m benchmarks.{module} " + " ".join(sys.argv[1:] if argv is None else argv)
    print(json.dumps(out, indent=1))
    if path:
        write_json(path, out)


def fmt_table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = lambda r: "  ".join(str(x).rjust(w) for x, w in zip(r, widths))
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


@contextmanager
def two_node_cluster(object_store_bytes: int = 256 << 20) -> Iterator:
    """A two-node ``ray.cluster_utils.Cluster`` on this machine, Ray connected to it: the head
    (one CPU) and a second node offering the custom resource ``node1`` (one CPU), where a remote
    shard or actor is placed with ``resources={"node1": ...}``. Yields the ``ray`` module; shuts
    Ray and the cluster down on the way out, also after a failure."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    from ray.cluster_utils import Cluster
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": object_store_bytes})
    try:
        cluster.add_node(num_cpus=1, resources={"node1": 1}, object_store_memory=object_store_bytes)
        ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False, configure_logging=False)
        try:
            cluster.wait_for_nodes()
            yield ray
        finally:
            ray.shutdown()
    finally:
        cluster.shutdown()
