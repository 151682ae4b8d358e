"""Host -> device delivery on a real GPU: every placement of the buffer, measured in one run.

For each transition size D (obs and next_obs of D float32, as in the RLlib DQN workload)
and batch size B, a uniform-replay buffer of ``--capacity`` transitions is placed on

    naive          pageable host memory read the way RLlib and TorchRL's CPU storage deliver:
                   ``np.take`` into fresh memory, then a synchronous ``.to("cuda")`` (the peer)
    pageable       Conduit, pageable host: gather into page-locked staging, asynchronous copy
    pinned         Conduit, pinned host (SRL's placement): the same route
    pinned-mapped  Conduit, pinned host read in place by the device (Gear's placement)
    device         Conduit, GPU memory: the gather runs on the device

and timed two ways: latency (one ``sample(B, device="cuda")`` then synchronise) and
throughput (``--burst`` samples back to back, one synchronise; asynchronous copies overlap
the next gather). Insertion of ``--inserts`` rows from host numpy is timed per placement.
Rounds interleave the placements; figures are medians over rounds, ratios are against
``naive`` in the same round. The probed topology and the planner's predicted delivery cost
per placement are written next to the measurements.

    python -m benchmarks.buffer.gpu_tiers [--dims 128 256 512 1000 2000] [--batch 256 4096]
        [--capacity 50000] [--rounds 5] [--reps 20] [--out out/gpu_tiers.json]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from conduit_core import ExperienceBuffer, ExperienceSpec, ShardSpec

from ..common import fmt_table, machine, write_json

PLACEMENTS = ("naive", "pageable", "pinned", "pinned-mapped", "device")


def shards_for(placement: str, capacity: int) -> list[ShardSpec]:
    return {"naive": [ShardSpec("pageable", capacity)], "pageable": [ShardSpec("pageable", capacity)],
            "pinned": [ShardSpec("pinned", capacity)],
            "pinned-mapped": [ShardSpec("pinned", capacity, access="mapped")],
            "device": [ShardSpec("device", capacity, device="cuda")]}[placement]


def rows(n: int, dim: int, rng: np.random.Generator) -> dict:
    obs = rng.standard_normal((n, dim), dtype=np.float32)
    return {"obs": obs, "action": rng.integers(0, 4, n), "reward": rng.standard_normal(n, dtype=np.float32),
            "next_obs": obs, "terminated": np.zeros(n, bool), "truncated": np.zeros(n, bool)}


def naive_sample(buf: ExperienceBuffer, batch: int) -> dict:
    """What a pageable-host buffer without staging does: gather on the host, blocking copy."""
    slots, _ = buf._select(batch, None)
    return {name: torch.from_numpy(np.take(buf.storage.host_view(name), slots, axis=0)).to("cuda")
            for name in buf.spec.names}


def build(placement: str, dim: int, capacity: int, rng) -> ExperienceBuffer:
    spec = ExperienceSpec.transition(obs_shape=(dim,), action_dtype=torch.int64)
    buf = ExperienceBuffer(spec=spec, capacity=capacity, shards=shards_for(placement, capacity), seed=1)
    chunk = rows(min(capacity, 10_000), dim, rng)
    for _ in range(-(-capacity // 10_000)):
        buf.add(chunk)
    return buf


def deliver_fn(placement: str, buf: ExperienceBuffer, batch: int):
    if placement == "naive":
        return lambda: naive_sample(buf, batch)
    return lambda: buf.sample(batch, device="cuda")


def latency_ms(fn, reps: int) -> float:
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def burst_ms(fn, burst: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(burst):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / burst * 1e3


def insert_ms(buf: ExperienceBuffer, chunk: dict, reps: int) -> float:
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        buf.add(chunk)
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def predictions(topology, transition_bytes: int, batch: int, capacity: int, inserts: int) -> dict:
    from conduit_core.planning.placement import Workload, fixed_plan, plan
    w = Workload(transition_bytes=transition_bytes, capacity=capacity, batch_size=batch, inserts_per_step=inserts,
                 learner="gpu0")
    out = {}
    for name, kind in (("pageable", "pageable"), ("pinned", "pinned"), ("pinned-mapped", "gear"),
                       ("device", "single-gpu")):
        p = fixed_plan(kind, w, topology)
        out[name] = {"delivery_ms": p.delivery_s * 1e3, "ingest_ms": p.ingest_s * 1e3}
    best = plan(w, topology)
    out["plan"] = {"assignments": {a.tier: a.slots for a in best.assignments},
                   "delivery_ms": best.delivery_s * 1e3, "ingest_ms": best.ingest_s * 1e3}
    return out


UPDATE_PLACEMENTS = ("naive", "pageable", "pinned", "device")


def update_batch(rows_: int, prompt: int, response: int, rng) -> dict:
    """A GRPO update batch's tensor columns (verl's names and dtypes)."""
    seq = prompt + response
    ids = rng.integers(0, 32_000, (rows_, seq))
    f = lambda: rng.standard_normal((rows_, response), dtype=np.float32)
    return {"input_ids": ids, "attention_mask": np.ones((rows_, seq), np.int64),
            "position_ids": np.tile(np.arange(seq), (rows_, 1)), "responses": ids[:, prompt:],
            "response_mask": np.ones((rows_, response), np.int64), "old_log_probs": f(), "ref_log_prob": f(),
            "advantages": f(), "token_level_rewards": f()}


def update_batch_case(placement: str, batch: dict, reps: int) -> float:
    """ms to write one iteration's update batch (tagged with its version) and take it back on
    the GPU: the hand-off to ``update_actor`` (see conduit_verl.delivery)."""
    from conduit_core import FieldSpec, Fifo
    n = len(next(iter(batch.values())))
    spec = ExperienceSpec([FieldSpec(k, v.shape[1:], torch.from_numpy(v[:1]).dtype) for k, v in batch.items()])
    buf = ExperienceBuffer(spec=spec, capacity=2 * n, selector=Fifo(),
                           shards=shards_for("pageable" if placement == "naive" else placement, 2 * n))
    ts = []
    for v in range(reps + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        buf.add(batch, policy_version=v)
        if placement == "naive":
            out = {k: t.to("cuda") for k, t in buf.take(n, policy_version=v).items()}
        else:
            out = buf.take(n, policy_version=v, device="cuda")
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
        assert out["advantages"].device.type == "cuda"
    buf.close()
    return statistics.median(ts[1:]) * 1e3


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.buffer.gpu_tiers", description=__doc__.split("\n\n")[0])
    p.add_argument("--dims", type=int, nargs="+", default=[128, 256, 512, 1000, 2000])
    p.add_argument("--batch", type=int, nargs="+", default=[256, 4096])
    p.add_argument("--capacity", type=int, default=50_000)
    p.add_argument("--inserts", type=int, default=1000, help="rows per timed insertion")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--burst", type=int, default=20)
    p.add_argument("--update-rows", type=int, default=512, help="GRPO update batch rows")
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--response", type=int, default=1024)
    p.add_argument("--placements", nargs="+", default=list(PLACEMENTS), choices=PLACEMENTS,
                   help="which placements to measure ('naive' is always measured: it is the peer)")
    p.add_argument("--topology", default=None, help="a probed topology JSON (default: probe now)")
    p.add_argument("--out", default="out/gpu_tiers.json")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("buffer.gpu_tiers needs a CUDA GPU (pinned and device tiers, host -> device delivery)")
    from conduit_core.planning.topology import Topology, probe
    placements = ("naive",) + tuple(pl for pl in PLACEMENTS if pl in a.placements and pl != "naive")
    topo = Topology.load(a.topology) if a.topology else probe()
    rng = np.random.default_rng(0)
    results = {"machine": {**machine(), "gpu": torch.cuda.get_device_name(0)}, "args": vars(a),
               "topology": topo.to_dict(), "cases": []}
    for dim in a.dims:
        bufs = {pl: build(pl, dim, a.capacity, rng) for pl in placements}
        chunk = rows(a.inserts, dim, rng)
        for batch in a.batch:
            lat = {pl: [] for pl in placements}
            thr = {pl: [] for pl in placements}
            ins = {pl: [] for pl in placements if pl != "naive"}
            for r in range(a.rounds):
                order = placements[r % len(placements):] + placements[:r % len(placements)]
                for pl in order:
                    fn = deliver_fn(pl, bufs[pl], batch)
                    lat[pl].append(latency_ms(fn, a.reps))
                    thr[pl].append(burst_ms(fn, a.burst))
                    if pl in ins:
                        ins[pl].append(insert_ms(bufs[pl], chunk, 3))
            case = {"dim": dim, "batch": batch,
                    "predicted": predictions(topo, bufs["naive"].spec.stored_bytes_per_transition, batch,
                                             a.capacity, a.inserts),
                    "latency_ms": {pl: statistics.median(v) for pl, v in lat.items()},
                    "burst_ms": {pl: statistics.median(v) for pl, v in thr.items()},
                    "insert_ms": {pl: statistics.median(v) for pl, v in ins.items()},
                    "latency_vs_naive": {pl: statistics.median([x / n for x, n in zip(v, lat["naive"])])
                                         for pl, v in lat.items()},
                    "burst_vs_naive": {pl: statistics.median([x / n for x, n in zip(v, thr["naive"])])
                                       for pl, v in thr.items()},
                    "raw": {"latency_ms": lat, "burst_ms": thr, "insert_ms": ins}}
            results["cases"].append(case)
            print(f"D={dim} B={batch}: latency " + ", ".join(f"{pl} {case['latency_ms'][pl]:.3f}" for pl in placements)
                  + " ms", flush=True)
        for buf in bufs.values():
            buf.close()
    ub = update_batch(a.update_rows, a.prompt, a.response, rng)
    nbytes = sum(v.nbytes for v in ub.values())
    upd = {pl: [] for pl in UPDATE_PLACEMENTS}
    for r in range(a.rounds):
        for pl in UPDATE_PLACEMENTS[r % 4:] + UPDATE_PLACEMENTS[:r % 4]:
            upd[pl].append(update_batch_case(pl, ub, a.reps // 4 or 1))
    results["update_batch"] = {"rows": a.update_rows, "prompt": a.prompt, "response": a.response, "bytes": nbytes,
                               "ms": {pl: statistics.median(v) for pl, v in upd.items()},
                               "vs_naive": {pl: statistics.median([x / n for x, n in zip(v, upd["naive"])])
                                            for pl, v in upd.items()}, "raw_ms": upd}
    write_json(a.out, results)
    header = ["D", "B"] + [f"{pl} ms (x naive)" for pl in placements] + ["plan"]
    table = []
    for c in results["cases"]:
        table.append([c["dim"], c["batch"]] + [f"{c['latency_ms'][pl]:.3f} ({c['latency_vs_naive'][pl]:.2f})"
                                               for pl in placements]
                     + ["+".join(c["predicted"]["plan"]["assignments"])])
    print("\nlatency per delivery (sample + synchronise), median of rounds; ratio vs naive in the same round")
    print(fmt_table(table, header))
    table = [[c["dim"], c["batch"]] + [f"{c['burst_ms'][pl]:.3f} ({c['burst_vs_naive'][pl]:.2f})" for pl in placements]
             for c in results["cases"]]
    print(f"\nthroughput: ms per delivery in bursts of {a.burst} (one synchronise)")
    print(fmt_table(table, header[:-1]))
    u = results["update_batch"]
    print(f"\nGRPO update batch ({u['rows']} rows, prompt {u['prompt']} + response {u['response']} tokens, "
          f"{u['bytes'] / 1e6:.1f} MB): write + take on the GPU, ms (x naive)")
    print(fmt_table([[pl, f"{u['ms'][pl]:.2f}", f"{u['vs_naive'][pl]:.2f}"] for pl in UPDATE_PLACEMENTS],
                    ["placement", "ms", "x naive"]))
    return results


if __name__ == "__main__":
    main()
