"""What materialising Atari batches costs: a B-row delivery of obs and next obs as float32
84x84x4 stacks (RLlib's layout, q/128 - 1) from Conduit's frame pool, vs stacking the same
float32 arrays the way a framework holding float observations does. Medians.

With ``--device cuda`` the batch must reach a GPU learner, and three routes are timed to a
synchronised float32 batch on the device:

    cpu-decode   Conduit decodes to float32 on the host, then copies 4x the bytes over
    gpu-decode   Conduit gathers uint8 stacks on the host, copies those, decodes on the device
    float-stack  the peer: stack stored float32 arrays on the host, then ``.to(device)``

    python -m benchmarks.bench_frame_decode [--batch 32] [--reps 50] [--device cpu|cuda]
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
    p.add_argument("--batch", type=int, nargs="+", default=[32])
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--device", default="cpu", help="where the learner's batch must end up (cpu, cuda)")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    device = torch.device(a.device)
    codec = FrameStackCodec(k=4, axis=-1, inner=AffineCodec.divide(128, offset=-1.0))
    pool = FramePool(name="frames", frames=20_000, frame_shape=(84, 84), dtype=torch.uint8, k=4)
    pool.frames[:] = np.random.default_rng(0).integers(0, 256, pool.frames.shape, dtype=np.uint8)
    pool.cursor = 20_000
    dec = PooledDecoder(pool, codec)
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
                 "float_stack_ms": t(lambda: (stack(), stack()))}
            print(f"B={batch}, obs + next obs = {mb:.1f} MB of float32, medians of {a.reps}:")
            print(f"  Conduit: uint8 frame gather only        {r['gather_ms']:6.2f} ms")
            print(f"  Conduit: gather + relayout + decode     {r['decode_ms']:6.2f} ms")
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


if __name__ == "__main__":
    main()
