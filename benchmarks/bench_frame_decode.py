"""What materialising Atari batches costs on this CPU: a B-row delivery of obs and next obs as
float32 84x84x4 stacks (RLlib's layout, q/128 - 1) from Conduit's frame pool, vs stacking the
same float32 arrays the way a framework holding float observations does. Medians.

    python -m benchmarks.bench_frame_decode [--batch 32] [--reps 50]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from conduit_core import AffineCodec
from conduit_core.framestack import FramePool, FrameStackCodec, PooledDecoder


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_frame_decode", description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--reps", type=int, default=50)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    codec = FrameStackCodec(k=4, axis=-1, inner=AffineCodec.divide(128, offset=-1.0))
    pool = FramePool(name="frames", frames=20_000, frame_shape=(84, 84), dtype=torch.uint8, k=4)
    pool.frames[:] = np.random.default_rng(0).integers(0, 256, pool.frames.shape, dtype=np.uint8)
    pool.cursor = 20_000
    dec = PooledDecoder(pool, codec)
    rng = np.random.default_rng(1)
    floats = [np.random.default_rng(2).random((84, 84, 4), dtype=np.float32) for _ in range(4096)]

    def t(fn) -> float:
        fn()
        ts = []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts) * 1e3

    ids = lambda: torch.from_numpy(rng.integers(4, 19_000, a.batch))
    conduit = t(lambda: (dec.decode(ids(), torch.float32), dec.decode(ids(), torch.float32)))
    gather = t(lambda: (pool.gather(ids().numpy()), pool.gather(ids().numpy())))
    stack = t(lambda: (np.stack([floats[i] for i in rng.integers(0, 4096, a.batch)]),
                       np.stack([floats[i] for i in rng.integers(0, 4096, a.batch)])))
    mb = 2 * a.batch * 84 * 84 * 4 * 4 / 1e6
    print(f"B={a.batch}, obs + next obs = {mb:.1f} MB of float32, medians of {a.reps}:")
    print(f"  Conduit: uint8 frame gather only        {gather:6.2f} ms")
    print(f"  Conduit: gather + relayout + decode     {conduit:6.2f} ms")
    print(f"  stacking stored float32 arrays (RLlib)  {stack:6.2f} ms")
    return {"gather_ms": gather, "decode_ms": conduit, "float_stack_ms": stack}


if __name__ == "__main__":
    main()
