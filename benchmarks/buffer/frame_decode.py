"""What materialising Atari batches costs: a B-row delivery of obs and next obs as float32
84x84x4 stacks (RLlib's layout, q/128 - 1) from Conduit's frame pool, vs stacking the same
float32 arrays the way a framework holding float observations does. Medians.

With ``--device cuda`` the batch must reach a GPU learner, and three routes are timed to a
synchronised float32 batch on the device:

    cpu-decode   Conduit decodes to float32 on the host, then copies 4x the bytes over
    gpu-decode   Conduit gathers uint8 stacks on the host, copies those, decodes on the device
    float-stack  the peer: stack stored float32 arrays on the host, then ``.to(device)``

With ``--ingest``, the other direction: ``add()`` of chunks of RLlib-style float32 stacks (4 rows,
as DQN's Atari step hands over) into a frame-pooled buffer: encode, exactness check, frame links.

With ``--parts``, two parts of that ``add()`` alone: the affine encode (quantise and exactness
check) of a 4-row chunk's 5 distinct float32 stacks, warm; and the first write to each 2 MB page of
a fresh lazily committed mapping (what a frame pool's first pass meets without pages committed
ahead), in ms per page.

With ``--hold K``, what the decode's output memory costs when the learner holds ``K`` batches at a
time: one [B, 84, 84, 4] float32 output allocated and written (a store per 4 KB page) by torch's
allocator vs numpy's (the decode's, ``output_pool.output_empty``). In this process alone they cost
about the same; inside RLlib's run they did not (docs/benchmarks-history.md, section 3b).

    python -m benchmarks.buffer.frame_decode [--batch 32] [--reps 50] [--device cpu|cuda] [--ingest] [--parts] [--hold 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from conduit_core import AffineCodec
from conduit_core.schema.framestack import FramePool, FrameStackCodec, PooledDecoder


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.buffer.frame_decode", description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, nargs="+", default=[32])
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--device", default="cpu", help="where the learner's batch must end up (cpu, cuda)")
    p.add_argument("--ingest", action="store_true", help="time add() of 4-row chunks instead")
    p.add_argument("--parts", action="store_true", help="time the encode of a 4-row chunk and first page writes")
    p.add_argument("--hold", type=int, default=None, help="time the output's memory with this many batches held")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    if a.ingest:
        return ingest(a.reps)
    if a.parts:
        return parts(a.reps)
    if a.hold is not None:
        return output_memory(a.batch, a.reps, a.hold)
    device = torch.device(a.device)
    codec = FrameStackCodec(k=4, axis=-1, inner=AffineCodec.divide(128, offset=-1.0))
    pool = FramePool(name="frames", frames=20_000, frame_shape=(84, 84), dtype=torch.uint8, k=4)
    pool.frames[:] = np.random.default_rng(0).integers(0, 256, pool.frames.shape, dtype=np.uint8)
    pool.cursor = 20_000
    dec = PooledDecoder(pool, codec)
    by_table = PooledDecoder(pool, codec, vectorise=False)   # the lookup per byte, same values
    rng = np.random.default_rng(1)
    floats = [np.random.default_rng(2).random((84, 84, 4), dtype=np.float32) for _ in range(4096)]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def t(fn) -> float:
        fn()
        sync()
        ts = []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            fn()
            sync()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts) * 1e3

    results = {}
    for batch in a.batch:
        ids = lambda: torch.from_numpy(rng.integers(4, 19_000, batch))
        stack = lambda: np.stack([floats[i] for i in rng.integers(0, 4096, batch)])
        mb = 2 * batch * 84 * 84 * 4 * 4 / 1e6
        if device.type == "cpu":
            r = {"gather_ms": t(lambda: (pool.gather(ids().numpy()), pool.gather(ids().numpy()))),
                 "decode_ms": t(lambda: (dec.decode(ids(), torch.float32), dec.decode(ids(), torch.float32))),
                 "table_decode_ms": t(lambda: (by_table.decode(ids(), torch.float32),
                                               by_table.decode(ids(), torch.float32))),
                 "float_stack_ms": t(lambda: (stack(), stack()))}
            print(f"B={batch}, obs + next obs = {mb:.1f} MB of float32, medians of {a.reps}:")
            print(f"  Conduit: uint8 frame gather only        {r['gather_ms']:6.2f} ms")
            print(f"  Conduit: gather + relayout + decode     {r['decode_ms']:6.2f} ms")
            print(f"    the same through the lookup per byte  {r['table_decode_ms']:6.2f} ms")
            print(f"  stacking stored float32 arrays (RLlib)  {r['float_stack_ms']:6.2f} ms")
        else:
            on_device = lambda: ids().to(device)          # stored ids on the device: decode there
            r = {"cpu_decode_ms": t(lambda: (dec.decode(ids(), torch.float32).to(device),
                                             dec.decode(ids(), torch.float32).to(device))),
                 "gpu_decode_ms": t(lambda: (dec.decode(on_device(), torch.float32),
                                             dec.decode(on_device(), torch.float32))),
                 "float_stack_ms": t(lambda: (torch.from_numpy(stack()).to(device),
                                              torch.from_numpy(stack()).to(device)))}
            # the two Conduit routes must agree bit for bit
            probe = ids()
            same = torch.equal(dec.decode(probe, torch.float32).to(device), dec.decode(probe.to(device), torch.float32))
            r["bitwise_equal"] = bool(same)
            print(f"B={batch} to {device}, obs + next obs = {mb:.1f} MB of float32, medians of {a.reps}:")
            print(f"  Conduit: decode on host, copy float32   {r['cpu_decode_ms']:6.2f} ms")
            print(f"  Conduit: copy uint8, decode on device   {r['gpu_decode_ms']:6.2f} ms"
                  f"   ({r['gpu_decode_ms'] / r['float_stack_ms']:.2f}x the peer; bitwise equal: {same})")
            print(f"  peer: stack float32 on host, .to()      {r['float_stack_ms']:6.2f} ms")
        results[batch] = r
    return results


def output_memory(batches: list[int], reps: int, hold: int) -> dict:
    """Median ms to allocate and write one decode output while ``hold`` earlier ones are alive."""
    arms = {"torch": lambda shape: torch.empty(shape, dtype=torch.float32),
            "numpy": lambda shape: torch.from_numpy(np.empty(shape, np.float32))}
    results = {}
    for batch in batches:
        shape = (batch, 84, 84, 4)
        r = {}
        for name, make in arms.items():
            held, ts = [], []
            for _ in range(reps + hold):
                t0 = time.perf_counter()
                out = make(shape)
                out.view(-1)[::1024] = 1.0      # one store per 4 KB page: what a decode's writes fault in
                ts.append(time.perf_counter() - t0)
                held.append(out)
                if len(held) > hold:
                    held.pop(0)
            r[f"{name}_ms"] = statistics.median(ts[hold:]) * 1e3
        print(f"B={batch}, one {batch * 84 * 84 * 4 * 4 / 1e6:.1f} MB float32 output, {hold} held, medians of {reps}: "
              f"torch.empty {r['torch_ms']:.3f} ms, np.empty {r['numpy_ms']:.3f} ms")
        results[batch] = r
    return results


def parts(reps: int, pages: int = 64) -> dict:
    """The affine encode of a 4-row chunk (us, median of ``reps``) and the first write to each
    2 MB page of a fresh lazy mapping (ms per page: median and max over ``pages``)."""
    from conduit_core._native import _affine
    from conduit_core.memory.tiers import lazy_huge_map
    codec = AffineCodec.divide(128, offset=-1.0)
    q = np.random.default_rng(0).integers(0, 256, (5, 84, 84, 4), dtype=np.uint8)
    x = (q.astype(np.float32) / 128 - 1).astype(np.float32)
    codec.encode("obs", x)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        codec.encode("obs", x)
        ts.append(time.perf_counter() - t0)
    encode_us = statistics.median(ts) * 1e6
    mm = lazy_huge_map(pages << 21)
    view = np.frombuffer(mm, dtype=np.uint8)
    first = []
    for off in range(0, pages << 21, 1 << 21):
        t0 = time.perf_counter()
        view[off:off + 7056] = 1        # one Qbert frame at the page's start
        first.append((time.perf_counter() - t0) * 1e3)
    del view
    mm.close()
    out = {"encode_us": encode_us, "avx2": bool(_affine.AVX2), "first_touch_ms_median": statistics.median(first),
           "first_touch_ms_max": max(first)}
    print(f"affine encode of a 4-row chunk (5 x 84x84x4 float32, AVX2 {out['avx2']}): {encode_us:.1f} us, median of {reps}")
    print(f"first write to a fresh 2 MB page: {out['first_touch_ms_median']:.3f} ms median, "
          f"{out['first_touch_ms_max']:.3f} ms max over {pages} pages")
    return out


def ingest(reps: int, rows: int = 4, chunks: int = 250) -> dict:
    """Median ms per add() of ``rows`` consecutive Atari transitions (obs and next obs float32 84x84x4)."""
    from conduit_core import ExperienceBuffer, ExperienceSpec
    k = 4
    codec = FrameStackCodec(k=k, axis=-1, inner=AffineCodec.divide(128, offset=-1.0))
    frames = np.random.default_rng(0).integers(0, 256, (rows * chunks * (reps + 1) + k + 1, 84, 84), dtype=np.uint8)
    idx = np.arange(frames.shape[0] - k + 1)[:, None] + np.arange(k)
    # RLlib's layout and values, C-contiguous as the adapter's np.stack of per-step observations makes them
    stacks = np.ascontiguousarray(np.moveaxis(frames[idx], 1, -1)).astype(np.float32) / 128.0 - 1.0
    buf = ExperienceBuffer(spec=ExperienceSpec.transition(obs_shape=(84, 84, k), obs_codec=codec),
                           capacity=rows * chunks, seed=0)   # the warm-up round fills it: timed adds overwrite
    z = {"action": np.zeros(rows, np.int64), "reward": np.zeros(rows, np.float32),
         "terminated": np.zeros(rows, bool), "truncated": np.zeros(rows, bool)}
    times, s = [], 0
    for rep in range(reps + 1):                    # the first round warms up
        t0 = time.perf_counter()
        for _ in range(chunks):
            buf.add({"obs": stacks[s:s + rows], "next_obs": stacks[s + 1:s + rows + 1], **z})
            s += rows
        if rep:
            times.append((time.perf_counter() - t0) / chunks * 1e3)
    buf.close()
    ms = statistics.median(times)
    print(f"add() of {rows} Atari rows (float32 stacks, frame pool + affine codec): {ms:.3f} ms, median of {reps}")
    return {"add_ms": ms}


if __name__ == "__main__":
    main()
