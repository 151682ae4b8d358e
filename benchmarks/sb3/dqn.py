"""SB3's DQN on CartPole with its own ReplayBuffer and with Conduit's, in turns: the
end-to-end time of a fixed number of env steps and the experience path inside it (time in
the buffer's ``add`` and ``sample``), as paired ratios Conduit / SB3 per round, medians.

    conduit bench sb3-dqn --steps 10000 --rounds 5 --out report.json    (python -m benchmarks.sb3.dqn ...)

Needs the example adapter (``pip install -e examples/conduit_sb3``), imported when a run starts.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from ..common import machine, write_json


def _timed(cls):
    """``cls`` with its add() and sample() timed (seconds, summed on the instance as ``add_s``, ``sample_s``)."""
    def timed(name: str):
        inner = getattr(cls, name)

        def call(self, *a, **kw):
            t = time.perf_counter()
            try:
                return inner(self, *a, **kw)
            finally:
                setattr(self, f"{name}_s", getattr(self, f"{name}_s") + time.perf_counter() - t)
        return call

    return type(f"Timed{cls.__name__}", (cls,), {"add_s": 0.0, "sample_s": 0.0,
                                                  "add": timed("add"), "sample": timed("sample")})


def run_once(arm: str, steps: int, seed: int) -> dict:
    import torch
    from stable_baselines3 import DQN
    from stable_baselines3.common.buffers import ReplayBuffer

    from conduit_sb3 import ConduitReplayBuffer
    from conduit_sb3.workloads import ZOO

    torch.set_num_threads(1)
    cls = _timed(ReplayBuffer if arm == "sb3" else ConduitReplayBuffer)
    model = DQN("MlpPolicy", "CartPole-v1", seed=seed, device="cpu", replay_buffer_class=cls, **ZOO)
    t = time.perf_counter()
    model.learn(steps)
    total = time.perf_counter() - t
    buf = model.replay_buffer
    if arm == "conduit":
        buf.close()
    model.env.close()
    return {"total_s": total, "path_s": buf.add_s + buf.sample_s, "add_s": buf.add_s, "sample_s": buf.sample_s}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20_000, help="env steps per run (default 20000)")
    p.add_argument("--rounds", type=int, default=5, help="rounds, each running both arms in turns (default 5)")
    p.add_argument("--out", help="write the report as JSON here")
    a = p.parse_args(argv)
    rounds = []
    for r in range(a.rounds):
        order = ("sb3", "conduit") if r % 2 == 0 else ("conduit", "sb3")   # neither arm always goes first
        res = {arm: run_once(arm, a.steps, seed=r) for arm in order}
        rounds.append(res)
        print(f"round {r}: " + ", ".join(f"{arm} {res[arm]['total_s']:.2f} s (add {res[arm]['add_s']:.2f} s, sample "
                                         f"{res[arm]['sample_s']:.2f} s)" for arm in ("sb3", "conduit")), flush=True)
    def ratio(k):   # (nan where SB3's arm spent no time there: a run too short to sample)
        return float(np.median([x["conduit"][k] / x["sb3"][k] if x["sb3"][k] > 0 else np.nan for x in rounds]))
    report = {"workload": "sb3-dqn-cartpole", "steps": a.steps, "rounds": rounds,
              "iteration_ratio": ratio("total_s"), "path_ratio": ratio("path_s"),
              "add_ratio": ratio("add_s"), "sample_ratio": ratio("sample_s"),
              "per_arm_median_total_s": {arm: float(np.median([x[arm]["total_s"] for x in rounds]))
                                         for arm in ("sb3", "conduit")},
              "per_arm_median_path_s": {arm: float(np.median([x[arm]["path_s"] for x in rounds]))
                                        for arm in ("sb3", "conduit")},
              "machine": machine(), "date": time.strftime("%Y-%m-%d")}
    print(f"median of paired ratios, Conduit / SB3: end to end {report['iteration_ratio']:.3f}x, "
          f"experience path (add + sample) {report['path_ratio']:.3f}x (add {report['add_ratio']:.3f}x, sample "
          f"{report['sample_ratio']:.3f}x); each arm's medians are per-arm figures, not paired")
    if a.out:
        write_json(a.out, report)
    return report


if __name__ == "__main__":
    main()
