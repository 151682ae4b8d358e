"""How a remote shard should return a gathered column: whole, or in pieces under Ray's
direct-call limit (100 KB), which Ray carries in the reply instead of the object store.

    python -m benchmarks.plane.remote_reply      # ~1 min; two-node ray.cluster_utils.Cluster

Times a Ray actor on the second node returning N bytes as one value vs as pieces of at most
96 KB (``num_returns`` = the number of pieces), and receiving them as one argument vs as one
argument per piece (what a remote shard's write gets), median of ``--calls`` round trips. The cut
``conduit_core.remote.wire.reply_pieces`` uses (pieces up to 2 MB a column) comes from this table.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from ..common import fmt_table, machine, two_node_cluster, write_json


class _Replier:
    def whole(self, n: int):
        return np.ones(n, np.uint8)

    def pieces(self, n: int, k: int):
        step = -(-n // k)
        return tuple(np.ones(min(step, n - i), np.uint8) for i in range(0, n, step))

    def take(self, *arrays) -> int:
        return sum(len(x) for x in arrays)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kib", type=int, nargs="+", default=[64, 128, 256, 512, 1024, 2048, 4096])
    p.add_argument("--calls", type=int, default=25)
    p.add_argument("--json", default="out/bench_remote_reply.json")
    a = p.parse_args(argv)
    from conduit_core.remote.wire import INLINE_BYTES
    with two_node_cluster() as ray:
        actor = ray.remote(num_cpus=0)(_Replier).options(resources={"node1": 0.001}).remote()

        def median_ms(call) -> float:
            ray.get(call())
            ts = []
            for _ in range(a.calls):
                t0 = time.perf_counter()
                ray.get(call())
                ts.append(time.perf_counter() - t0)
            return statistics.median(ts) * 1e3

        rows = []
        for kib in a.kib:
            n = kib << 10
            k = -(-n // INLINE_BYTES)
            whole = median_ms(lambda: actor.whole.remote(n))
            pieces = median_ms(lambda: actor.pieces.options(num_returns=k).remote(n, k)) if k > 1 else whole
            data = np.ones(n, np.uint8)
            cut = [data[i:i + INLINE_BYTES] for i in range(0, n, INLINE_BYTES)]
            send_whole = median_ms(lambda: actor.take.remote(data))
            send_pieces = median_ms(lambda: actor.take.remote(*cut)) if k > 1 else send_whole
            rows.append({"kib": kib, "pieces": k, "whole_ms": whole, "pieces_ms": pieces,
                         "send_whole_ms": send_whole, "send_pieces_ms": send_pieces})
    print(fmt_table([[r["kib"], r["pieces"], f"{r['whole_ms']:.2f}", f"{r['pieces_ms']:.2f}",
                      f"{r['pieces_ms'] / r['whole_ms']:.2f}x", f"{r['send_whole_ms']:.2f}",
                      f"{r['send_pieces_ms']:.2f}", f"{r['send_pieces_ms'] / r['send_whole_ms']:.2f}x"] for r in rows],
                    ["KiB", "pieces", "return whole ms", "return pieces ms", "ratio", "send whole ms",
                     "send pieces ms", "ratio"]))
    report = {"machine": machine(), "args": vars(a), "rows": rows}
    write_json(a.json, report)
    return report


if __name__ == "__main__":
    main()
