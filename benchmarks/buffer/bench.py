"""Buffer benchmark: Conduit's buffer vs RLlib's episode replay buffers, in one run.

For CartPole-sized transitions (4 float32 obs) and Atari-sized ones (84x84x4 uint8 obs
with next obs), at capacity 1M (Atari: 200k, what fits in memory when full), measured side by side:

- insert throughput (transitions/s), rollouts of ``--episode-len`` steps
- sample latency for B in {32, 256}: selection plus a columnar batch
  (RLlib: ``sample(..., sample_episodes=True)`` as DQN calls it, then the episodes'
  fields stacked into columns, the least any learner connector must do)
- uniform and prioritized (with a priority update per step, as DQN does)
- the gather bandwidth of Atari-sized batches against the machine's plain memory-copy
  bandwidth (the physical limit)

Every figure is a median over ``--reps`` repetitions; ratios pair repetitions.
Run: ``python -m benchmarks.buffer.bench`` (or ``conduit bench buffer``).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from conduit_core import ExperienceBuffer, ExperienceSpec

from ..common import (
    fmt_table,
    machine,
    median,
    memcpy_bandwidth,
    paired_times,
    ratio_stats,
    write_json,
)
from .peers import (
    TorchRLArm,
    plain_ring_entry,
    render_torchrl,
    sets_for,
    take_limit,
    torchrl_available,
)
from .workload import (
    SHAPES,
    conduit_buffer,
    conduit_columns,
    make_rollouts,
    rllib_buffer,
    rllib_columns,
    rllib_episode,
)

REUSE = 4   # the reused-output arms' reuse_outputs (their np.take peer cycles sets_for(REUSE) sets)
# ----------------------------------------------------------------------------- runs
def _insert_rate(buf: ExperienceBuffer, cols: list[dict], rows: int) -> float:
    t0 = time.perf_counter()
    for c in cols:
        buf.add(c)
    return rows / (time.perf_counter() - t0)


def bench_workload(kind: str, *, capacity: int, fill: int, rllib_fill: int, ep_len: int, batch_sizes: list[int],
                   reps: int, calls: int, rllib: bool, torchrl: bool = False) -> dict:
    """Conduit's ring is filled to ``fill`` (== capacity for CartPole: inserts are measured
    in the steady state of a full ring). RLlib's buffer gets ``rllib_fill`` transitions
    (it does not evict below capacity, which favours RLlib). TorchRL's buffer (``torchrl``) holds
    ``fill`` slots, filled once, then timed overwriting them, as Conduit's steady state."""
    rollouts = make_rollouts(kind, fill, ep_len)
    cols = [conduit_columns(r) for r in rollouts]
    result: dict = {"kind": kind, "fill": fill, "capacity": capacity, "rllib_fill": rllib_fill}
    for prioritized in (False, True):
        tag = "prioritized" if prioritized else "uniform"
        res = result[tag] = {}
        # ---- inserts: the first fill pays first-touch page faults; later passes overwrite
        cb = conduit_buffer(kind, capacity, prioritized, reuse=REUSE)
        first = _insert_rate(cb, cols, fill)
        if fill >= capacity:
            steady = [_insert_rate(cb, cols, fill) for _ in range(reps)]
        else:  # a ring of `fill` slots, wrapped once: the steady state without page faults
            ring = conduit_buffer(kind, fill, prioritized, reuse=0)
            _insert_rate(ring, cols, fill)
            steady = [_insert_rate(ring, cols, fill) for _ in range(reps)]
            ring.close()
        res["insert_per_s"] = {"conduit": median(steady), "conduit_first_fill": first, "conduit_reps": steady}
        rb = None
        if rllib:
            # RLlib's buffer is filled to its capacity first (untimed), then timed while it
            # evicts: the steady state of a full buffer, as for Conduit's ring.
            rcap = rllib_fill
            chunk = max(ep_len, rcap // 20)
            episodes = [rllib_episode(r) for r in make_rollouts(kind, rcap + reps * chunk, ep_len, seed=1)]
            rb = rllib_buffer(rcap, prioritized)
            per_chunk = max(1, chunk // ep_len)
            first = rcap // ep_len
            rb.add(episodes[:first])
            ins_r = []
            for i in range(reps):
                part = episodes[first + i * per_chunk: first + (i + 1) * per_chunk]
                steps = sum(len(e) for e in part)
                t0 = time.perf_counter()
                rb.add(part)
                ins_r.append(steps / (time.perf_counter() - t0))
            res["insert_per_s"] |= {"rllib": median(ins_r), "rllib_reps": ins_r, "rllib_capacity": rcap,
                                    "speedup": median(steady) / median(ins_r)}
        # ---- samples: selection + columnar batch (+ a priority update, as DQN does)
        cf = conduit_buffer(kind, capacity, prioritized, reuse=0)  # fresh output memory per batch
        for c in cols:
            cf.add(c)
        trl = None
        if torchrl:
            trl = TorchRLArm(cols, fill, prioritized)
            ins_t = [trl.insert_rate() for _ in range(reps)]
            res["insert_per_s"] |= {"torchrl": median(ins_t), "torchrl_reps": ins_t,
                                    "torchrl_first_fill": trl.first_fill_per_s,
                                    "speedup_vs_torchrl": median(steady) / median(ins_t)}
        for B in batch_sizes:
            def c_step(buf=cb):
                b = buf.sample(B)
                if prioritized:
                    buf.update_priorities(b.slots, np.random.random(B), seqs=b.seqs)
                return b
            arms = {"conduit": (c_step, calls), "fresh": (lambda: c_step(cf), calls)}
            if rb is not None:
                def r_step():
                    eps = rb.sample(num_items=B, n_step=1, gamma=0.99, beta=0.4 if prioritized else None,
                                    sample_episodes=True)
                    cols_ = rllib_columns(eps)
                    if prioritized:
                        rb.update_priorities(np.random.random(B))
                    return cols_
                arms["rllib"] = (r_step, max(3, calls // 50))
            if trl is not None:   # TorchRL returns fresh tensors: compared with both Conduit arms
                arms["torchrl"] = (lambda: trl.step(B), calls)
            t = paired_times(arms, reps=reps)   # (repetitions in turns: the ratios are paired)
            t_c, t_cf = t["conduit"], t["fresh"]
            entry = {"conduit_s": median(t_c), "conduit_fresh_s": median(t_cf)}
            if rb is not None:
                t_r = t["rllib"]
                entry |= {"rllib_s": median(t_r), "speedup": ratio_stats(t_r, t_c),
                          "speedup_fresh": ratio_stats(t_r, t_cf)}
            if trl is not None:
                t_t = t["torchrl"]
                entry |= {"torchrl_s": median(t_t), "speedup_vs_torchrl": ratio_stats(t_t, t_c),
                          "speedup_vs_torchrl_fresh": ratio_stats(t_t, t_cf)}
            if kind == "atari":
                nbytes = B * 2 * int(np.prod(SHAPES[kind][0]))
                entry["gather_GBps"] = nbytes / median(t_c) / 1e9
                entry["take_limit_GBps"] = take_limit(cb, B, fill, calls=calls, reps=reps, depth=sets_for(REUSE))
                entry["take_limit_hot_GBps"] = take_limit(cb, B, fill, calls=calls, reps=reps, depth=1)
                entry["gather_fresh_GBps"] = nbytes / median(t_cf) / 1e9
            res[f"B{B}"] = entry
            if kind == "cartpole":  # the tuned DQN config's sampling: n_step=(2, 5), RLlib's episode-end rule
                res[f"B{B}_nstep"] = nstep_entry(cb, rb, B, prioritized, calls=calls, reps=reps)
        if not prioritized:  # the floor: a plain numpy ring, same columns, same capacity
            res["plain_ring"] = plain_ring_entry(kind, cols, fill, batch_sizes, calls=calls, reps=reps)
        trl = None   # its storage goes before the next arm fills
        cf.close()
        cb.close()
    return result


def nstep_entry(cb, rb, B: int, prioritized: bool, *, calls: int, reps: int) -> dict:
    """sample(+update) with n_step=(2, 5) as RLlib's DQN asks: Conduit with RLlib's rule for the
    buffer kind (prioritized: redraw windows cut by an episode's end; uniform: shorten them)
    and, for prioritized, with the shortened rule too, to show what the redraw costs."""
    rule = "redraw" if prioritized else "shorten"

    def c_step(episode_end=rule):
        b = cb.sample(B, n_step=(2, 5), gamma=0.99, episode_end=episode_end)
        if prioritized:
            cb.update_priorities(b.slots, np.random.random(B), seqs=b.seqs)
        return b
    arms = {"conduit": (c_step, calls)}
    if prioritized:
        arms["shorten"] = (lambda: c_step("shorten"), calls)
    if rb is not None:
        def r_step():
            eps = rb.sample(num_items=B, n_step=(2, 5), gamma=0.99, beta=0.4 if prioritized else None,
                            sample_episodes=True)
            cols_ = rllib_columns(eps)
            if prioritized:
                rb.update_priorities(np.random.random(len(eps)))
            return cols_
        arms["rllib"] = (r_step, max(3, calls // 50))
    t = paired_times(arms, reps=reps)
    t_c = t["conduit"]
    entry = {"rule": rule, "conduit_s": median(t_c)}
    if prioritized:
        entry |= {"conduit_shorten_s": median(t["shorten"]), "redraw_over_shorten": ratio_stats(t_c, t["shorten"])}
    if rb is not None:
        entry |= {"rllib_s": median(t["rllib"]), "speedup": ratio_stats(t["rllib"], t_c)}
    return entry


def capacity_report(*, capacity: int = 20_000, episode_len: int = 400, seed: int = 0) -> dict:
    """Bytes per stored transition for RLlib-style Atari observations (float32 84x84x4 stacks
    normalised as q/128 - 1, obs and next obs) with the lossless codecs, and a bit-exactness
    check of delivered batches. RLlib's episodes hold one such float32 stack per step."""
    from conduit_core import AffineCodec
    from conduit_core.schema.framestack import FrameStackCodec
    rng = np.random.default_rng(seed)
    codec = FrameStackCodec(k=4, axis=-1, inner=AffineCodec.divide(128, offset=-1.0))
    spec = ExperienceSpec.transition(obs_shape=(84, 84, 4), obs_codec=codec)
    buf = ExperienceBuffer(spec=spec, capacity=capacity, seed=seed)
    episodes: list[tuple[int, np.ndarray]] = []  # (first id, uint8 frames): ground truth, 7 KB per step

    def stacks_of(frames: np.ndarray, t: np.ndarray) -> np.ndarray:
        idx = np.maximum(t[:, None] - 3 + np.arange(4)[None, :], 0)  # reset repeats frame 0, as RLlib's FrameStack
        return (np.moveaxis(frames[idx], 1, -1).astype(np.float32) / 128.0) - 1.0

    gid = 0
    while gid < capacity:
        T = min(episode_len, capacity - gid)
        frames = rng.integers(0, 256, (T + 1, 84, 84), dtype=np.uint8)
        episodes.append((gid, frames))
        stacks = stacks_of(frames, np.arange(T + 1))
        for s0 in range(0, T, 50):
            n = min(50, T - s0)
            term = np.zeros(n, bool)
            term[-1] = s0 + n == T
            ids = np.arange(gid, gid + n)
            buf.add({"obs": stacks[s0:s0 + n], "next_obs": stacks[s0 + 1:s0 + n + 1], "action": ids,
                     "reward": np.zeros(n, np.float32), "terminated": term, "truncated": np.zeros(n, bool)})
            gid += n
    b = buf.sample(512)
    starts = np.array([e[0] for e in episodes])
    checked = exact = 0
    for i in range(b.size):
        key = int(b["action"][i])
        e = int(np.searchsorted(starts, key, side="right") - 1)
        t = key - starts[e]
        want = stacks_of(episodes[e][1], np.array([t, t + 1]))
        checked += 1
        exact += np.array_equal(b["obs"][i].numpy(), want[0]) and np.array_equal(b["next_obs"][i].numpy(), want[1])
    per = (buf.storage.pool_bytes() + capacity * spec.stored_bytes_per_transition) / capacity
    rllib_obs = 84 * 84 * 4 * 4
    buf.close()
    return {"bytes_per_transition": per, "rllib_obs_bytes": rllib_obs, "ratio_vs_rllib": per / rllib_obs,
            "bytes_at_1M_GB": per * 1e6 / 1e9, "checked": checked, "bit_exact": checked == exact}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="conduit bench buffer", description=__doc__.split("\n")[0])
    p.add_argument("--capacity", type=int, default=1_000_000)
    p.add_argument("--fill-cartpole", type=int, default=None, help="default: capacity (a full ring)")
    p.add_argument("--fill-atari", type=int, default=20_000)
    p.add_argument("--atari-capacity", type=int, default=200_000, help="Atari ring slots (56 KB each)")
    p.add_argument("--rllib-fill", type=int, default=None,
                   help="RLlib's buffer capacity, filled before timing (default: --capacity for CartPole, "
                        "--fill-atari for Atari)")
    p.add_argument("--episode-len", type=int, default=200)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--no-rllib", action="store_true", help="skip RLlib (when ray[rllib] is not installed)")
    p.add_argument("--no-torchrl", action="store_true", help="skip TorchRL even where it loads")
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run for tests")
    p.add_argument("--json", default="out/bench_buffer.json")
    a = p.parse_args(argv)
    if a.quick:
        a.capacity, a.fill_cartpole, a.fill_atari, a.rllib_fill, a.reps, a.calls = 20_000, 2_000, 400, 2_000, 2, 5
    if a.fill_cartpole is None:
        a.fill_cartpole = a.capacity
    rllib = not a.no_rllib
    if rllib:
        try:
            import ray.rllib  # noqa: F401
        except ImportError:
            print("ray[rllib] not installed: measuring Conduit only (pip install '.[rllib]')", file=sys.stderr)
            rllib = False
    torchrl, torchrl_note = (False, "--no-torchrl") if a.no_torchrl else torchrl_available()
    if not torchrl:
        print(f"TorchRL arm skipped: {torchrl_note}", file=sys.stderr)
    bw = memcpy_bandwidth(64 << 20 if a.quick else 256 << 20)
    report = {"machine": machine(), "memcpy_GBps": bw, "args": vars(a), "workloads": {},
              "torchrl": torchrl_note if torchrl else f"skipped: {torchrl_note}"}
    for kind, fill in (("cartpole", a.fill_cartpole), ("atari", a.fill_atari)):
        rfill = a.rllib_fill or (fill if kind == "atari" else a.capacity)
        # Atari's raw rows are 56 KB: its ring is sized to what this machine can hold when full
        # (Conduit refuses a capacity larger than the free memory); 20k of it are filled.
        cap_k = a.capacity if kind == "cartpole" else min(a.capacity, a.atari_capacity)
        report["workloads"][kind] = bench_workload(kind, capacity=cap_k, fill=fill, rllib_fill=rfill,
                                                   ep_len=a.episode_len,
                                                   batch_sizes=[32, 256], reps=a.reps, calls=a.calls, rllib=rllib,
                                                   torchrl=torchrl)
    report["capacity"] = cap = capacity_report(capacity=2_000 if a.quick else 20_000)
    print(render(report))
    print(f"\nAtari capacity with lossless codecs: {cap['bytes_per_transition'] / 1e3:.1f} KB per transition "
          f"(obs + next obs, pool reserve included) = {cap['ratio_vs_rllib']:.3f}x RLlib's "
          f"{cap['rllib_obs_bytes'] / 1e3:.0f} KB float32 stack; 1M transitions = {cap['bytes_at_1M_GB']:.1f} GB; "
          f"delivered batches bit-exact: {cap['bit_exact']} ({cap['checked']} rows checked)")
    write_json(a.json, report)
    print(f"\nJSON: {a.json}")
    return report


def render(report: dict) -> str:
    rows = []
    for kind, w in report["workloads"].items():
        for tag in ("uniform", "prioritized"):
            r = w[tag]
            ins = r["insert_per_s"]
            rows.append([kind, tag, "insert/s", f"{ins['conduit']:.3g}", f"{ins.get('rllib', float('nan')):.3g}",
                         f"{ins.get('speedup', float('nan')):.0f}x", ""])
            for B in (32, 256):
                e = r[f"B{B}"]
                sp = e.get("speedup", {}).get("median", float("nan"))
                extra = f"{e['gather_GBps']:.1f} GB/s ({e['gather_GBps'] / report['memcpy_GBps']:.0%} of memcpy" \
                    if "gather_GBps" in e else ""
                if "take_limit_GBps" in e:   # target: >= 75% of the np.take-into-output limit
                    extra += (f", {e['gather_GBps'] / e['take_limit_GBps']:.0%} of np.take into {sets_for(REUSE)} outs in turn, "
                              f"{e['gather_GBps'] / e['take_limit_hot_GBps']:.0%} of into 1 hot out)")
                elif extra:
                    extra += ")"
                rows.append([kind, tag, f"sample B={B}", f"{e['conduit_s'] * 1e6:.1f} us",
                             f"{e.get('rllib_s', float('nan')) * 1e6:.0f} us", f"{sp:.0f}x", extra])
                n = r.get(f"B{B}_nstep")
                if n is not None:
                    sp = n.get("speedup", {}).get("median", float("nan"))
                    extra = (f"{n['rule']}: {n['redraw_over_shorten']['median']:.2f}x of shorten "
                             f"({n['conduit_shorten_s'] * 1e6:.1f} us)" if "conduit_shorten_s" in n else n["rule"])
                    rows.append([kind, tag, f"sample n=(2,5) B={B}", f"{n['conduit_s'] * 1e6:.1f} us",
                                 f"{n.get('rllib_s', float('nan')) * 1e6:.0f} us", f"{sp:.0f}x", extra])
    for kind, w in report["workloads"].items():
        pr = w["uniform"].get("plain_ring")
        if pr is None:
            continue
        rows.append([kind, "uniform", "insert/s vs plain ring", f"{pr['conduit_insert_per_s']:.3g}",
                     f"{pr['insert_per_s']:.3g} (ring)", f"{pr['insert_ratio']:.2f}x",
                     "target >= 0.8x" if kind == "cartpole" else ""])
        for B in (32, 256):
            for key in [f"B{B}"] + [f"B{B}_reuse{d}" for d in pr.get("depths", [])[1:]]:
                e = pr[key]
                d, k = e.get("outputs", 1), e.get("reuse_outputs", "?")
                rows.append([kind, "uniform", f"sample B={B} reuse {k} vs ring, {d} outs", f"{e['conduit_s'] * 1e6:.1f} us",
                             f"{e['plain_s'] * 1e6:.1f} us (ring)", f"{e['ratio']['median']:.2f}x",
                             "target <= 1.3x" if kind == "cartpole" else ""])
    tail = render_torchrl(report)
    head = f"memcpy bandwidth (256 MiB copy): {report['memcpy_GBps']:.1f} GB/s; medians over {report['args']['reps']} reps\n"
    return head + fmt_table(rows, ["workload", "selector", "op", "conduit", "rllib", "speedup", "gather / rule"]) + tail


if __name__ == "__main__":
    main()
