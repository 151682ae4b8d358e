"""TransferQueue put + get at verl's shapes: SimpleStorage (TQ's default) vs Conduit's backend.

Each case is one GRPO batch as verl's V1 trainer writes it: B rows (prompts x n), a 512-token
prompt, responses of up to L tokens (lengths drawn uniformly in [L/2, L], stored jagged as verl's
agent loop stores them), and F fields in all (token ids, masks, log-probs, advantages, scores,
a data-source string). Timed through TQ's public key-value API (``kv_batch_put`` of every field,
then ``kv_batch_get`` of every field, then ``kv_clear``), so both backends pay the same controller
round trips; medians of ``--reps``. One process, one Ray session, backends one after the other
(TQ holds one controller per session), with the same data.

    python -m benchmarks.verl.tq_backends [--batch 256 1024] [--response 512 4096] [--fields 3 8]
        [--reps 3] [--units 2] [--backends SimpleStorage Conduit] [--out out/tq_backends.json]

The table also gives, per other backend, its time outside the storage manager (its kv time minus
its storage time: TQ's own controller and metadata work) and the ceiling that sets: the base's kv
time over that, the most any storage could gain through TQ's API at that shape.

The ``RayStore`` backend needs Ray's RDT tensor transport (GPU collectives); it is tried and
reported as not runnable where it fails.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from ..common import fmt_table, machine, write_json

PROMPT = 512
FIELD_ORDER = ["input_ids", "responses", "response_mask", "old_log_probs", "ref_log_probs", "advantages",
               "token_level_scores", "data_source"]


def grpo_batch(rows: int, response: int, fields: int, seed: int = 0):
    import torch
    from tensordict import NonTensorStack, TensorDict

    rng = np.random.default_rng(seed)
    lens = rng.integers(response // 2, response + 1, rows)
    offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lens)]).astype(np.int64))
    total = int(lens.sum())

    def jagged(values):
        return torch.nested.nested_tensor_from_jagged(values, offsets)

    make = {
        "input_ids": lambda: torch.from_numpy(rng.integers(0, 150_000, (rows, PROMPT))),
        "responses": lambda: jagged(torch.from_numpy(rng.integers(0, 150_000, total))),
        "response_mask": lambda: jagged(torch.ones(total, dtype=torch.int64)),
        "old_log_probs": lambda: jagged(torch.from_numpy(-rng.random(total, dtype=np.float32))),
        "ref_log_probs": lambda: jagged(torch.from_numpy(-rng.random(total, dtype=np.float32))),
        "advantages": lambda: jagged(torch.from_numpy(rng.standard_normal(total, dtype=np.float32))),
        "token_level_scores": lambda: jagged(torch.zeros(total, dtype=torch.float32)),
        "data_source": lambda: NonTensorStack(*(["gsm8k"] * rows)),
    }
    names = FIELD_ORDER[:fields]
    td = TensorDict({n: make[n]() for n in names}, batch_size=rows)
    nbytes = sum(v.values().nbytes if getattr(v, "is_nested", False) else getattr(v, "nbytes", 0)
                 for v in (td[n] for n in names if n != "data_source"))
    return td, names, nbytes


class StorageClock:
    """Time spent inside the storage manager's ``put_data``/``get_data`` (the backend's share of a
    ``kv_batch_put``/``kv_batch_get``; the rest is TQ's controller, common to every backend)."""

    def __init__(self):
        self.spent = {"put_data": 0.0, "get_data": 0.0}

    def install(self, manager_cls) -> None:
        for name in self.spent:
            inner = getattr(manager_cls, name)

            async def timed(*args, _inner=inner, _name=name, **kwargs):
                t0 = time.perf_counter()
                try:
                    return await _inner(*args, **kwargs)
                finally:
                    self.spent[_name] += time.perf_counter() - t0
            setattr(manager_cls, name, timed)

    def take(self) -> tuple[float, float]:
        put, get = self.spent["put_data"], self.spent["get_data"]
        self.spent = {"put_data": 0.0, "get_data": 0.0}
        return put, get


def run_backend(backend: str, cases, reps: int, units: int) -> dict:
    import transfer_queue as tq
    from conduit_verl import tq_backend
    from omegaconf import OmegaConf
    from transfer_queue.storage.managers.base import StorageManagerFactory

    clock = StorageClock()
    clock.install(StorageManagerFactory._registry[backend])

    conf = OmegaConf.create({"backend": {"storage_backend": backend,
                                         "SimpleStorage": {"num_data_storage_units": units},
                                         "Conduit": {"num_storage_units": units}}})
    t0 = time.perf_counter()
    tq.init(conf)
    print(f"  {backend}: tq.init {time.perf_counter() - t0:.1f} s", flush=True)
    out = {}
    try:
        for case in cases:
            rows, response, fields = case
            td, names, nbytes = grpo_batch(rows, response, fields)
            puts, gets, layer = [], [], []
            for rep in range(reps + 1):                     # the first round warms up
                keys = [f"r{rep}-{i}" for i in range(rows)]
                t0 = time.perf_counter()
                tq.kv_batch_put(keys=keys, partition_id="bench", fields=td)
                t1 = time.perf_counter()
                got = tq.kv_batch_get(keys=keys, partition_id="bench", select_fields=names)
                t2 = time.perf_counter()
                in_storage = sum(clock.take())
                tq.kv_clear(keys=keys, partition_id="bench")
                if rep:
                    puts.append(t1 - t0)
                    gets.append(t2 - t1)
                    layer.append(in_storage)
                del got
            put, get = statistics.median(puts), statistics.median(gets)
            out[case] = {"put_s": put, "get_s": get, "storage_s": statistics.median(layer), "mb": nbytes / 1e6}
            print(f"  {backend:13s} B={rows:5d} L={response:5d} F={fields}: put {put * 1e3:8.1f} ms  "
                  f"get {get * 1e3:8.1f} ms  ({nbytes / 1e6:.0f} MB, {2 * nbytes / 1e6 / (put + get):.0f} MB/s); "
                  f"inside the storage manager {out[case]['storage_s'] * 1e3:.1f} ms", flush=True)
    finally:
        tq.close()
        if backend == "Conduit":
            tq_backend.shutdown_units()
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.verl.tq_backends", description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, nargs="+", default=[256, 1024])
    p.add_argument("--response", type=int, nargs="+", default=[512, 4096])
    p.add_argument("--fields", type=int, nargs="+", default=[3, 8])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--units", type=int, default=2, help="storage units per backend (SimpleStorage's default: 2)")
    p.add_argument("--backends", nargs="+", default=["SimpleStorage", "Conduit"])
    p.add_argument("--out", default="out/tq_backends.json")
    a = p.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    ray.init(num_cpus=4, include_dashboard=False, address="local", _node_ip_address="127.0.0.1", log_to_driver=False)
    cases = [(b, r, f) for b in a.batch for r in a.response for f in a.fields]
    results = {}
    try:
        for backend in a.backends:
            try:
                results[backend] = run_backend(backend, cases, a.reps, a.units)
            except Exception as exc:  # noqa: BLE001 - a backend that cannot run here is reported, not fatal
                print(f"  {backend}: not runnable here: {type(exc).__name__}: {exc}"[:400], flush=True)
    finally:
        ray.shutdown()
    base = a.backends[0]
    rows = []
    for case in cases:
        if base not in results:
            break
        b = results[base][case]
        total_b = b["put_s"] + b["get_s"]
        row = [*case, f"{b['mb']:.0f}", f"{total_b * 1e3:.1f}", f"{b['storage_s'] * 1e3:.1f}"]
        for other in a.backends[1:]:
            o = results.get(other, {}).get(case)
            if o is None:
                row += ["-", "-", "-", "-"]
                continue
            total_o = o["put_s"] + o["get_s"]
            outside = total_o - o["storage_s"]   # TQ's own share (controller, metadata): no backend avoids it
            row += [f"{total_o * 1e3:.1f} ({total_b / total_o:.1f}x)",
                    f"{o['storage_s'] * 1e3:.1f} ({b['storage_s'] / o['storage_s']:.1f}x)",
                    f"{outside * 1e3:.1f}", f"{total_b / outside:.1f}x"]
        rows.append(row)
    print(f"\nput + get per batch through TQ's kv API, and the part inside the storage manager; medians of "
          f"{a.reps}; (Nx) = {base}'s time / this backend's time; outside = this backend's kv time minus its "
          f"storage time (TQ's own work); ceiling = {base}'s kv time / outside: the most any storage could gain "
          f"through TQ's API")
    header = ["B", "L", "F", "MB", f"{base} kv ms", f"{base} storage ms"]
    for o in a.backends[1:]:
        header += [f"{o} kv ms", f"{o} storage ms", f"{o} outside ms", "ceiling"]
    print(fmt_table(rows, header))
    write_json(a.out, {"machine": machine(), "args": vars(a),
                       "results": {be: {f"B{c[0]}_L{c[1]}_F{c[2]}": v for c, v in r.items()} for be, r in results.items()}})
    return results


if __name__ == "__main__":
    main()
