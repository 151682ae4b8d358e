"""The buffer outgrows its tier mid-run, measured: Conduit re-plans and migrates online vs
stop-the-world migration, a greedy placement and a conservative one (issue 5).

    python -m benchmarks.plane.migration            # ~3 min: two-node Ray cluster on this machine

A learner loop runs against a data plane: every step ingests ``--inserts`` transitions and
delivers a uniform batch of ``--batch`` (each delivered row is checked: its obs[0] is its
seq). The buffer starts at ``--capacity`` transitions, which fit this host's budget
(``--host-budget-mb``), and is prefilled. After ``--steps`` steps the wanted capacity grows
``--grow`` times, past the budget; the loop goes on until the grown buffer is full (so every
shard holds live rows and is sampled), then one whole turn of the ring is measured (every
shard takes its share of the inserts). The topology is measured: the
host's copy bandwidth, and the second node (a Ray node of a ``ray.cluster_utils.Cluster``,
reached through a Ray actor as a remote shard is) by ``topology.probe_remote``.

    conduit online     plan() for the grown workload (the host keeps what fits, the rest on the
                       node); ``replan(background=True)``: rows copied chunk by chunk while the
                       loop goes on
    conduit blocking   the same plan, ``replan(background=False)``: the loop waits for the copy
    greedy             the fastest tier only (host); at the growth ``greedy_plan`` raises
                       CapacityError: the buffer cannot grow and keeps evicting at the old size
    conservative       the largest tier (the node), sized for the grown buffer from the start

Reported per strategy (median over ``--reps``): step time before and during the migration
(medians) and after the growth (mean over the ring's turn, and p99), the longest step during the migration (the stall a
learner sees) and the longest a migration chunk held the buffer's lock, the migration's
duration, and whether the buffer holds exactly the live rows, each once, at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from ..common import fmt_table, machine, memcpy_bandwidth, write_json

NODE = "conduit_node1"
STRATEGIES = ("conduit-online", "conduit-blocking", "greedy", "conservative")


def rows(spec_features: int, start: int, n: int) -> dict:
    """``n`` rows whose action column holds each row's own seq, exactly (int64: a float32 id stops
    telling rows apart past 2^24, which a busy run's learner loop reaches during the migration)."""
    seq = np.arange(start, start + n, dtype=np.int64)
    obs = np.zeros((n, spec_features), np.float32)
    obs[:, 0] = seq % 4096
    return {"obs": obs, "action": seq, "reward": np.ones(n, np.float32),
            "next_obs": obs, "terminated": np.zeros(n, bool), "truncated": np.zeros(n, bool)}


def live_rows_exact(buf, inserted: int) -> bool:
    """The buffer holds exactly seqs inserted-len .. inserted-1, once each, each row's own."""
    state = buf.state_dict()
    seq = state["meta"]["seq"]
    keep = seq >= inserted - len(buf)
    seqs = seq[keep]
    own = np.array_equal(state["data"]["action"][keep], seqs)
    return own and np.sort(seqs).tolist() == list(range(inserted - len(buf), inserted))


def topology_for(budget_bytes: int, reps: int):
    from conduit_core.planning.topology import Link, TierInfo, Topology, probe_remote
    host_bw = memcpy_bandwidth(64 << 20, reps)
    node_tier, node_links = probe_remote(NODE, nbytes=16 << 20, reps=reps)
    return Topology("this-host+ray-node", (TierInfo("host", "pageable", budget_bytes), node_tier),
                    (Link("host", "host", host_bw, 1.0), *node_links), cores=os.cpu_count() or 1,
                    source="measured: memcpy and topology.probe_remote")


def run(strategy: str, *, spec, topo, w0, w1, a) -> dict:
    from conduit_core import ExperienceBuffer, ExperienceDataPlane
    from conduit_core.errors import CapacityError
    from conduit_core.planning.placement import (
        conservative_plan,
        greedy_plan,
        plan,
        shard_specs,
    )

    first = {"conservative": lambda: conservative_plan(w1, topo), "greedy": lambda: greedy_plan(w0, topo)}.get(
        strategy, lambda: plan(w0, topo))()
    buf = ExperienceBuffer(spec=spec, capacity=sum(x.slots for x in first.assignments),
                           shards=shard_specs(first, topo), seed=0)
    out = {"strategy": strategy, "start": {x.tier: x.slots for x in first.assignments}}
    if strategy != "greedy":   # what the planner predicts per step for the layout after the growth
        out["predicted_after_ms"] = (first if strategy == "conservative" else plan(w1, topo)).total_s * 1e3
    nid = 0
    with ExperienceDataPlane(buffer=buf) as edp:
        while nid < w0.capacity:
            n = min(8192, w0.capacity - nid)
            edp.ingest(rows(a.features, nid, n))
            nid += n

        def step() -> float:
            nonlocal nid
            t0 = time.perf_counter()
            edp.ingest(rows(a.features, nid, a.inserts))
            nid += a.inserts
            b = edp.deliver(a.batch)
            dt = time.perf_counter() - t0
            if not np.array_equal(b["action"].numpy(), b.seqs):
                raise AssertionError(f"{strategy}: a delivered row is not the row of its seq")
            return dt

        before = [step() for _ in range(a.steps)]
        during: list[float] = []
        t_grow = time.perf_counter()
        if strategy == "conduit-online":
            handle = edp.replan(plan(w1, topo), topo, background=True, max_hold_s=a.max_hold_ms / 1e3,
                                chunk_bytes=int(a.chunk_mb * 2**20) if a.chunk_mb else None,
                                deadline_s=a.deadline_s)
            while handle.thread.is_alive():
                during.append(step())
            handle.wait()
            out["migration_s"] = time.perf_counter() - t_grow
            out["chunks"], out["longest_hold_ms"] = handle.migration.chunks, handle.migration.longest_hold_s * 1e3
            out["finished_at_deadline"] = handle.finished_at_deadline
            out["layout_s"], out["copy_s"] = handle.layout_s, handle.copy_s   # (the deadline bounds the copy)
        elif strategy == "conduit-blocking":
            edp.replan(plan(w1, topo), topo, background=False)
            out["migration_s"] = time.perf_counter() - t_grow
            during.append(out["migration_s"] + step())   # the step that waited for the copy
        elif strategy == "greedy":
            try:
                greedy_plan(w1, topo)
            except CapacityError as exc:
                out["failed"] = str(exc)
        while len(buf) < buf.capacity:   # until the grown ring is full: every shard then holds live rows
            step()
        # One whole turn of the ring: inserts land on each shard in proportion to its size
        # (a shorter window would measure wherever the write head happens to be).
        after = [step() for _ in range(-(-buf.capacity // a.inserts))]
        out["capacity_end"] = buf.capacity
        out["exact"] = live_rows_exact(buf, nid)
    buf.close()
    ms = lambda xs: statistics.median(xs) * 1e3 if xs else None
    out.update(before_ms=ms(before), during_ms=ms(during), after_ms=statistics.fmean(after) * 1e3,
               steps_during=len(during),
               stall_ms=max(during) * 1e3 if during else None, p99_after_ms=float(np.percentile(after, 99)) * 1e3)
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--features", type=int, default=128, help="float32 observation features")
    p.add_argument("--capacity", type=int, default=100_000, help="transitions before the growth")
    p.add_argument("--grow", type=float, default=3.0, help="the wanted capacity grows this many times")
    p.add_argument("--host-budget-mb", type=float, default=None,
                   help="host tier budget (default: 1.5x the buffer before the growth)")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--inserts", type=int, default=64, help="transitions ingested per learner step")
    p.add_argument("--steps", type=int, default=300, help="learner steps before the growth")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--max-hold-ms", type=float, default=2.0,
                   help="online migration: each chunk holds the buffer's lock about this long")
    p.add_argument("--chunk-mb", type=float, default=None,
                   help="online migration: fixed chunks of this size instead (64: the earlier default)")
    p.add_argument("--deadline-s", type=float, default=30.0,
                   help="online migration: past this, the rest is copied at once under the lock")
    p.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=STRATEGIES)
    p.add_argument("--json", default="out/bench_migration.json")
    a = p.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    from ray.cluster_utils import Cluster

    from conduit_core import ExperienceSpec
    from conduit_core.planning.placement import Workload

    spec = ExperienceSpec.transition(obs_shape=(a.features,))
    tb = spec.stored_bytes_per_transition
    budget = int((a.host_budget_mb * 2**20) if a.host_budget_mb else 1.5 * a.capacity * tb)
    w0 = Workload(tb, a.capacity, a.batch, a.inserts)
    w1 = Workload(tb, int(a.capacity * a.grow), a.batch, a.inserts)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": 512 << 20})
    try:
        cluster.add_node(num_cpus=1, resources={NODE: 1}, object_store_memory=512 << 20)
        ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False, configure_logging=False)
        cluster.wait_for_nodes()
        topo = topology_for(budget, a.reps)
        report = {"machine": machine(), "args": vars(a), "transition_bytes": tb, "host_budget_bytes": budget,
                  "topology": topo.to_dict(), "runs": []}
        print(f"transition {tb} B; {a.capacity:,} -> {w1.capacity:,} transitions "
              f"({w0.total_bytes / 2**20:.0f} -> {w1.total_bytes / 2**20:.0f} MiB); host budget {budget / 2**20:.0f} MiB")
        print("links: " + "; ".join(f"{l.src}->{l.dst} {l.bandwidth_GBps:.2f} GB/s {l.latency_us:.0f} us"
                                    for l in topo.links))
        for rep in range(a.reps):
            for s in (a.strategies if rep % 2 == 0 else a.strategies[::-1]):
                report["runs"].append({"rep": rep, **run(s, spec=spec, topo=topo, w0=w0, w1=w1, a=a)})
                write_json(a.json, report)
    finally:   # Ray's connection first: a cluster refuses to remove a node a client is connected to
        ray.shutdown()
        cluster.shutdown()
    report["summary"] = summarize(report["runs"], a.strategies)
    write_json(a.json, report)
    return report


def summarize(runs: list[dict], strategies) -> dict:
    med = lambda xs: statistics.median(xs) if xs else None
    table, summary = [], {}
    for s in strategies:
        rs = [r for r in runs if r["strategy"] == s]
        pick = lambda k: [r[k] for r in rs if r.get(k) is not None]
        row = {k: med(pick(k)) for k in ("before_ms", "during_ms", "after_ms", "p99_after_ms", "stall_ms",
                                         "migration_s", "steps_during", "longest_hold_ms", "predicted_after_ms")}
        row.update(exact=all(r["exact"] for r in rs), capacity_end=rs[0]["capacity_end"],
                   failed=rs[0].get("failed"))
        summary[s] = row
        f = lambda v, spec=".2f": "-" if v is None else format(v, spec)
        table.append([s, f(row["before_ms"]), f(row["during_ms"]), f(row["stall_ms"], ".1f"),
                      f(row["longest_hold_ms"]), f(row["migration_s"]), f(row["steps_during"], ".0f"),
                      f(row["after_ms"]), f(row["p99_after_ms"]), f(row["predicted_after_ms"]),
                      f"{row['capacity_end']:,}",
                      "yes" if row["exact"] else "NO"])
    print(fmt_table(table, ["strategy", "step before ms", "during ms", "longest step during ms",
                            "longest lock hold ms", "migration s", "steps during", "after ms", "after p99 ms",
                            "planner predicted after ms", "capacity at end", "live rows exact"]))
    for s, row in summary.items():
        if row["failed"]:
            print(f"{s}: {row['failed']}")
    return summary


if __name__ == "__main__":
    main()
