"""n-step window draws over storage the native walk cannot read: a remote shard, two host shards,
against one host shard (the native walk), on a two-node ``ray.cluster_utils.Cluster``.

    OMP_NUM_THREADS=1 RAY_AUTH_MODE=disabled python -m benchmarks.plane.remote_windows   # ~1.5 min

Each buffer holds the same CartPole-shaped rows (50,000: RLlib DQN's capacity, full), episodes of
10-200 steps from four sources interleaved, prioritized (alpha 0.6). Timed per call, arms in
turns (``common.paired_times``), median of ``--reps``: ``sample(B, n_step=(2, 5))`` by RLlib's
episode-end rule (``redraw``) and by the shortened-window rule (``shorten``), each followed by its
priority update. The ratio is against one host shard in the same repetition. Where the native
walk cannot read the columns, the walk reads the rows a draw may reach in one gather per walk
(``conduit_core.buffer.walk_rows``; before session 32, one gather per row and field: docs §17b).
"""

from __future__ import annotations

import argparse

import numpy as np

from ..common import (
    fmt_table,
    machine,
    median,
    paired_times,
    ratio_stats,
    two_node_cluster,
    write_json,
)


def _episodes(rows: int, seed: int = 0) -> list[tuple[dict, int]]:
    rng = np.random.default_rng(seed)
    out, at, src = [], 0, 0
    while at < rows:
        n = min(int(rng.integers(10, 201)), rows - at)
        obs = rng.standard_normal((n + 1, 4)).astype(np.float32)
        out.append(({"obs": obs[:-1], "next_obs": obs[1:], "action": rng.integers(0, 2, n),
                     "reward": np.ones(n, np.float32), "terminated": np.r_[np.zeros(n - 1, bool), [rng.random() < 0.9]],
                     "truncated": np.zeros(n, bool)}, src))
        at, src = at + n, (src + 1) % 4
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--capacity", type=int, default=50_000)
    p.add_argument("--batch", type=int, nargs="+", default=[32, 256])
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--json", default="out/bench_remote_windows.json")
    a = p.parse_args(argv)
    from conduit_core import ExperienceBuffer, ExperienceSpec, Prioritized, ShardSpec
    cap, half = a.capacity, a.capacity // 2
    layouts = {"one host shard": None,
               "two host shards": [ShardSpec("pageable", half), ShardSpec("pageable", cap - half)],
               "remote shard": [ShardSpec("remote", cap, node="node1")]}
    bufs = {}
    with two_node_cluster():
        try:
            spec = ExperienceSpec.transition(obs_shape=(4,))
            episodes = _episodes(cap)
            for name, shards in layouts.items():
                buf = bufs[name] = ExperienceBuffer(spec=spec, capacity=cap, shards=shards, seed=0,
                                                    selector=Prioritized(alpha=0.6))
                for cols, src in episodes:
                    buf.add(cols, source=src)
            rng = np.random.default_rng(1)
            rows, report = [], {"machine": machine(), "args": vars(a), "results": {}}
            for end in ("redraw", "shorten"):
                for b in a.batch:
                    prios = rng.random(b) + 0.1

                    def step(buf=None, b=b, end=end):
                        got = buf.sample(b, n_step=(2, 5), episode_end=end)
                        buf.update_priorities(got.slots, prios, seqs=got.seqs)
                    t = paired_times({name: (lambda buf=buf: step(buf), a.calls) for name, buf in bufs.items()},
                                     reps=a.reps)
                    base = t["one host shard"]
                    entry = report["results"][f"{end}_B{b}"] = {}
                    for name, ts in t.items():
                        entry[name] = {"ms": median(ts) * 1e3, "reps_ms": [x * 1e3 for x in ts],
                                       "ratio": ratio_stats(ts, base)}
                        rows.append([end, b, name, f"{median(ts) * 1e3:.2f}",
                                     f"{entry[name]['ratio']['median']:.1f}x"])
        finally:
            for buf in bufs.values():
                buf.close()
    print(fmt_table(rows, ["episode end", "B", "layout", "ms per sample + update", "vs one host shard"]))
    write_json(a.json, report)
    return report


if __name__ == "__main__":
    main()
