"""TorchRL's replay buffers as a peer in ``bench_buffer`` (issue 18: "at least 3x TorchRL's
prioritized buffer").

TorchRL is not a dependency: the arm runs when ``import torchrl`` works and its C++ extension
loads (the prioritized sampler's sum tree is in it), and is reported as skipped, with the reason,
otherwise. The published torchrl 0.14.1 wheel's extension is built against another torch and
fails to load under torch 2.13 (undefined symbol); ``benchmarks/torchrl_peer.sh`` builds a
working copy (docs/benchmarks.md §1 says how it was run).

Configured as TorchRL's DQN examples do: a ``LazyTensorStorage`` of the same capacity (contiguous
torch tensors, allocated at the first ``extend``), ``TensorDictReplayBuffer`` (uniform) or
``TensorDictPrioritizedReplayBuffer(alpha=0.6, beta=0.4)``, one ``extend`` per rollout, and
``sample()`` then ``update_priority(index, priority)`` per step. A sample returns fresh tensors
(TorchRL has no reused-output mode), so it is compared with both of Conduit's arms.
"""

from __future__ import annotations

import time


def torchrl_available() -> tuple[bool, str]:
    """(True, version) when TorchRL and its extension load; (False, why) otherwise."""
    try:
        import torchrl
        from torchrl._torchrl import SumSegmentTreeFp32  # noqa: F401 - the prioritized sampler's tree
    except Exception as exc:   # ImportError, or an OSError/undefined symbol from the extension
        return False, (f"torchrl not usable here ({type(exc).__name__}: {str(exc)[:120]}). Fix: "
                       "bash benchmarks/torchrl_peer.sh <pytorch/rl source> and put its directory on PYTHONPATH")
    return True, torchrl.__version__


def _tensordict(cols: dict):
    import torch
    from tensordict import TensorDict
    n = len(cols["action"])
    return TensorDict({k: torch.from_numpy(v) for k, v in cols.items()}, batch_size=[n])


def torchrl_buffer(capacity: int, prioritized: bool, batch: int):
    from torchrl.data import LazyTensorStorage, TensorDictPrioritizedReplayBuffer, TensorDictReplayBuffer
    storage = LazyTensorStorage(capacity)
    if prioritized:
        return TensorDictPrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=storage, batch_size=batch)
    return TensorDictReplayBuffer(storage=storage, batch_size=batch)


class TorchRLArm:
    """One TorchRL buffer filled with the bench's columns; ``step(B)`` is one DQN sampling step."""

    def __init__(self, cols: list[dict], capacity: int, prioritized: bool):
        import logging
        logging.getLogger("torchrl").setLevel(logging.WARNING)
        self.prioritized = prioritized
        self.tds = [_tensordict(c) for c in cols]
        self.rb = torchrl_buffer(capacity, prioritized, batch=32)
        self.first_fill_per_s = self.insert_rate()

    def insert_rate(self) -> float:
        rows = sum(td.batch_size[0] for td in self.tds)
        t0 = time.perf_counter()
        for td in self.tds:
            self.rb.extend(td)
        return rows / (time.perf_counter() - t0)

    def step(self, batch: int):
        import torch
        s = self.rb.sample(batch)
        if self.prioritized:
            self.rb.update_priority(s["index"], torch.rand(batch))
        return s


def render_torchrl(report: dict) -> str:
    """bench_buffer's TorchRL table (or why the arm was skipped)."""
    from .common import fmt_table
    trl = []
    for kind, w in report["workloads"].items():
        for tag in ("uniform", "prioritized"):
            r = w[tag]
            if "torchrl" not in r["insert_per_s"]:
                continue
            ins = r["insert_per_s"]
            trl.append([kind, tag, "insert/s", f"{ins['conduit']:.3g}", "", f"{ins['torchrl']:.3g}",
                        f"{ins['speedup_vs_torchrl']:.2f}x", ""])
            for B in (32, 256):
                e = r[f"B{B}"]
                trl.append([kind, tag, f"sample{' + update' if tag == 'prioritized' else ''} B={B}",
                            f"{e['conduit_s'] * 1e6:.1f} us", f"{e['conduit_fresh_s'] * 1e6:.1f} us",
                            f"{e['torchrl_s'] * 1e6:.1f} us", f"{e['speedup_vs_torchrl']['median']:.1f}x",
                            f"{e['speedup_vs_torchrl_fresh']['median']:.1f}x"])
    tail = ""
    if trl:
        tail = "\n\nvs TorchRL " + str(report.get("torchrl")) + " (target: prioritized + update B=32 >= 3x)\n" + fmt_table(
            trl, ["workload", "selector", "op", "conduit reused", "conduit fresh", "torchrl", "speedup", "fresh speedup"])
    elif "torchrl" in report:
        tail = f"\n\nTorchRL: {report['torchrl']}"
    return tail
