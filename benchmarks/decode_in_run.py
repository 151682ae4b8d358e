"""Where the Qbert frame decode's time goes inside a real RLlib DQN run (issue 18).

``PooledDecoder.decode`` writes RLlib's float32 [B, 84, 84, 4] stacks (3.6 MB per field at
B=32) from the uint8 frame pool in one native call (``_frames.gather_stacks``). Alone, with
the caches cooled, it runs at the machine's write bandwidth; in the run it follows the
learner's update, which leaves every cache cold. This probe wraps the native call during
real training iterations. A step decodes two fields, obs then next obs (field0, field1); steps
alternate between one thread and the rows split over two threads (a helper thread started
once; the GIL is released inside the call), and each field's first call is timed as the run
makes it: ``cold_one_thread_field{0,1}`` and ``cold_two_threads_field{0,1}`` (fresh output,
inputs and output out of cache; field1 follows field0, whose frames it mostly shares). After a
one-thread step's second field, that call is timed again:

- ``again_same_output``: at once, into the same output (inputs and output now in cache);
- ``again_fresh_output``: into another fresh output (inputs in cache, output not);
- ``again_output_in_cache``: into that output once it was written (both in cache).

Page faults inside the timed first calls are counted per arm (``ru_minflt`` of the process,
the helper thread's included). Nothing here changes what the run delivers: the first call's
output is the one handed on.

    OMP_NUM_THREADS=1 python -m benchmarks.decode_in_run --iters 3 --json docs/results/decode_in_run_s36.json
"""

from __future__ import annotations

import argparse
import collections
import resource
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from benchmarks.common import report


def _split(gather, args: list, helper: ThreadPoolExecutor) -> None:
    """The call with its rows split in two halves, one on ``helper``'s thread (started once)."""
    ids, out = args[1], args[5]
    h = ids.shape[0] // 2
    first, second = list(args), list(args)
    first[1], first[5] = ids[:h], out[:h]
    second[1], second[5] = ids[h:], out[h:]
    other = helper.submit(gather, *first)
    gather(*second)
    other.result()


def probe(iters: int, warmup: int, seed: int) -> dict:
    from benchmarks import rllib_bench
    from benchmarks.rllib_conduit_path import _args
    from conduit_core.schema import framestack

    native = framestack._c_gather_stacks
    if native is None:
        raise SystemExit("conduit_core._native._frames is not built: run `python setup.py build_ext --inplace`")
    from conduit_core.memory.output_pool import aligned_empty

    times: dict[str, list[float]] = collections.defaultdict(list)
    faults: dict[str, list[int]] = collections.defaultdict(list)
    state = {"on": False, "calls": 0}
    helper = ThreadPoolExecutor(1, thread_name_prefix="decode-half")

    def timed(fn) -> float:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    def gather(*args):
        if not state["on"]:
            return native(*args)
        step, field = divmod(state["calls"], 2)   # (a step decodes obs, then next obs)
        state["calls"] += 1
        arm = "two_threads" if step % 2 else "one_thread"
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt   # (the process: the helper's faults too)
        times[f"cold_{arm}_field{field}"].append(
            timed(lambda: _split(native, list(args), helper) if arm == "two_threads" else native(*args)))
        faults[arm].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
        if arm == "one_thread" and field == 1:   # (after the step's measured calls: they stay cold)
            times["again_same_output"].append(timed(lambda: native(*args)))
            other = list(args)
            out = args[5]
            other[5] = aligned_empty(out.shape, out.dtype)
            times["again_fresh_output"].append(timed(lambda: native(*other)))
            times["again_output_in_cache"].append(timed(lambda: native(*other)))
        return None

    framestack._c_gather_stacks = gather
    algo = None
    try:
        algo = rllib_bench._build("dqn-atari", "conduit", _args("dqn-atari", seed))
        for _ in range(warmup):
            algo.train()
        state["on"] = True
        for _ in range(iters):
            algo.train()
    finally:
        if algo is not None:
            algo.stop()
        framestack._c_gather_stacks = native
        helper.shutdown()
    out = {"calls": state["calls"],
           "page_faults_per_call": {arm: statistics.mean(v) for arm, v in faults.items()},
           "ms_per_call_median": {k: statistics.median(v) for k, v in times.items() if v},
           "ms_per_call_quartiles": {k: statistics.quantiles(v, n=4) for k, v in times.items() if len(v) > 1}}
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iters", type=int, default=2)
    p.add_argument("--warmup", type=int, default=6)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json")
    a = p.parse_args(argv)
    report(probe(a.iters, a.warmup, a.seed), "decode_in_run", argv, a.json)


if __name__ == "__main__":
    main()
