"""Ingestion at the source vs through the driver, and delivery, against the number of nodes.

A local ``ray.cluster_utils.Cluster``: a head (the driver) and up to 4 worker nodes. For N
nodes the buffer has one remote shard per worker node and one env-runner stand-in (a Ray
actor) per node that makes rollouts of ``--rows`` transitions of ``--obs`` float32s.

- source: each runner writes its rollouts with a ``SourceWriter`` (validate, encode, stage in
  its node's shard actor) and returns receipts; the driver commits them (counts only).
- driver: each runner returns its rollouts; the driver ``ray.get``s them and ``buf.add``s each
  (the rows travel runner -> driver -> shard), as experience enters today.
- delivery: ``buf.sample(batch)`` on the filled buffer (uniform replay); every sample touches
  every shard, and each shard's gather is started before any is awaited.

Prints rows/s (ingestion, from a runner's call to the rows being in the buffer) and batches/s
(delivery): the median of ``--reps`` repetitions, and source/driver as a ratio.

    python benchmarks/plane/source_ingest.py --nodes 1 2 3 4 --reps 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def make_rollout(n: int, obs: int, start: int) -> dict:
    o = np.random.default_rng(start).standard_normal((n, obs), dtype=np.float32)
    return {"obs": o, "action": np.zeros(n, np.int64), "reward": np.ones(n, np.float32), "next_obs": o,
            "terminated": np.zeros(n, bool), "truncated": np.zeros(n, bool)}


def runner_class():
    import ray

    @ray.remote(num_cpus=0)
    class Runner:
        def __init__(self, writer, obs: int, rows: int):
            self.writer, self.obs, self.rows, self.k = writer, obs, rows, 0
            self.pool = [make_rollout(rows, obs, i) for i in range(4)]   # made once: time the path, not the RNG

        def receipts(self, m: int):
            out = []
            for _ in range(m):
                out.append(self.writer.write(self.pool[self.k % 4]))
                self.k += 1
            return out

        def rollouts(self, m: int):
            self.k += m
            return [self.pool[(self.k - i) % 4] for i in range(m)]
    return Runner


def build(n_nodes: int, args):
    from conduit_core import ExperienceBuffer, ExperienceSpec, ShardSpec
    spec = ExperienceSpec.transition(obs_shape=(args.obs,))
    shards = [ShardSpec("remote", args.per_shard, node=f"bench_node{k}") for k in range(1, n_nodes + 1)]
    buf = ExperienceBuffer(spec=spec, capacity=args.per_shard * n_nodes, shards=shards, seed=0)
    Runner = runner_class()
    runners = [Runner.options(resources={f"bench_node{k}": 0.001}).remote(
        buf.writer(source=k, shard=k - 1), args.obs, args.rows) for k in range(1, n_nodes + 1)]
    import ray
    ray.get([r.rollouts.remote(0) for r in runners])   # started
    return buf, runners


def pipelined(runners, method: str, rounds: int, per_call: int, store) -> float:
    """Rows/s of ``rounds`` rounds: each runner's next call is in flight while the driver stores
    the last round's results with ``store(runner index, result) -> rows``."""
    import ray
    t0 = time.perf_counter()
    rows = 0
    pending = [getattr(r, method).remote(per_call) for r in runners]
    for i in range(rounds):
        got = ray.get(pending)
        pending = [getattr(r, method).remote(per_call) for r in runners] if i + 1 < rounds else []
        rows += store(got)
    return rows / (time.perf_counter() - t0)


def ingest_source(buf, runners, rounds: int, per_call: int) -> float:
    """Writers at the source: the driver commits the runners' receipts."""
    return pipelined(runners, "receipts", rounds, per_call,
                     lambda got: buf.commit([rec for out in got for rec in out]).rows)


def ingest_driver(buf, runners, rounds: int, per_call: int) -> float:
    """Through the driver: the runners return their rollouts and the driver adds them."""
    def store(got) -> int:
        rows = 0
        for k, out in enumerate(got):
            for batch in out:
                buf.add(batch, source=k + 1)
                rows += batch["obs"].shape[0]
        return rows
    return pipelined(runners, "rollouts", rounds, per_call, store)


def deliver(buf, batches: int, batch: int) -> float:
    buf.sample(batch)
    t0 = time.perf_counter()
    for _ in range(batches):
        buf.sample(batch)
    return batches / (time.perf_counter() - t0)


def run(args) -> list[dict]:
    import ray
    from ray.cluster_utils import Cluster
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": 128 << 20})
    for k in range(1, max(args.nodes) + 1):
        cluster.add_node(num_cpus=1, resources={f"bench_node{k}": 1}, object_store_memory=128 << 20)
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False, configure_logging=False)
    cluster.wait_for_nodes()
    results = []
    try:
        for n in args.nodes:
            buf, runners = build(n, args)
            try:
                src, drv, dlv = [], [], []
                for _ in range(args.reps):
                    drv.append(ingest_driver(buf, runners, args.rounds, args.per_call))
                    src.append(ingest_source(buf, runners, args.rounds, args.per_call))
                    dlv.append(deliver(buf, args.batches, args.batch))
                results.append({"nodes": n, "source_rows_s": statistics.median(src),
                                "driver_rows_s": statistics.median(drv), "deliver_batches_s": statistics.median(dlv),
                                "spread": (min(s / d for s, d in zip(src, drv)), max(s / d for s, d in zip(src, drv)))})
                r = results[-1]
                print(f"nodes={n}  ingest source {r['source_rows_s']:9.0f} rows/s  driver {r['driver_rows_s']:9.0f} "
                      f"rows/s  source/driver {r['source_rows_s'] / r['driver_rows_s']:.2f}x "
                      f"(reps {r['spread'][0]:.2f}-{r['spread'][1]:.2f}x)  "
                      f"deliver {r['deliver_batches_s']:6.1f} batches/s of {args.batch}", flush=True)
            finally:
                for a in runners:
                    ray.kill(a)
                buf.close()
    finally:
        ray.shutdown()
        cluster.shutdown()
    return results


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 3, 4])
    p.add_argument("--obs", type=int, default=1024, help="float32s per observation (obs and next_obs stored)")
    p.add_argument("--rows", type=int, default=64, help="transitions per rollout")
    p.add_argument("--per-call", type=int, default=2, help="rollouts a runner returns per call")
    p.add_argument("--rounds", type=int, default=10, help="calls per runner per repetition")
    p.add_argument("--per-shard", type=int, default=4096, help="slots per node's shard")
    p.add_argument("--batches", type=int, default=30)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args(argv)
    base = base_line(args)
    print(base, flush=True)
    results = run(args)
    base_src = results[0]["source_rows_s"]
    base_dlv = results[0]["deliver_batches_s"]
    print("scaling vs the first node count: " + ", ".join(
        f"{r['nodes']}: ingest {r['source_rows_s'] / base_src:.2f}x deliver {r['deliver_batches_s'] / base_dlv:.2f}x"
        for r in results))


def base_line(args) -> str:
    row = 2 * args.obs * 4 + 8 + 4 + 2
    return (f"rows of {row} B ({args.obs} float32 obs + next_obs), rollouts of {args.rows} rows, "
            f"{args.per_call} per call, {args.rounds} calls per runner, median of {args.reps}")


if __name__ == "__main__":
    main()
