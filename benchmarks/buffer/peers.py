"""What Conduit's buffer is measured against besides RLlib's own buffers: the floors a user could
write in numpy and TorchRL's replay buffers.

- **The np.take-into-output limit** (issue 18's "at least 75% of the np.take-into-output limit"):
  the least an Atari gather can cost on a Conduit ring's own columns (``take_call``, ``take_limit``).
- **A plain numpy ring** (``PlainRing``): preallocated columns, slice-copy inserts, uniform draws,
  the floor Conduit's uniform ring is compared against (docs/benchmarks.md §1).
- **TorchRL's buffers** (issue 18: "at least 3x TorchRL's prioritized buffer"). TorchRL is not a
  dependency: the arm runs when ``import torchrl`` works and its C++ extension loads (the
  prioritized sampler's sum tree is in it), and is reported as skipped, with the reason, otherwise.
  The published torchrl 0.14.1 wheel's extension is built against another torch and fails to load
  under torch 2.13 (undefined symbol); ``benchmarks/buffer/torchrl_peer.sh`` builds a working copy.
  Configured as TorchRL's DQN examples do: a ``LazyTensorStorage`` of the same capacity,
  ``TensorDictReplayBuffer`` (uniform) or ``TensorDictPrioritizedReplayBuffer(alpha=0.6, beta=0.4)``,
  one ``extend`` per rollout, and ``sample()`` then ``update_priority(index, priority)`` per step. A
  sample returns fresh tensors (TorchRL has no reused-output mode), so it is compared with both of
  Conduit's arms.
"""

from __future__ import annotations

import time

import numpy as np

from conduit_core import ExperienceBuffer

from ..common import fmt_table, median, paired_times, ratio_stats, time_per_call
from .workload import conduit_buffer


# ----------------------------------------------------------------------------- the np.take limit
def sets_for(reuse_outputs: int) -> int:
    """Output sets a gather must cycle to give ``ExperienceBuffer(reuse_outputs=k)``'s guarantee
    (a batch valid through k more deliveries: k + 1 batches alive, the pool's steady state); 0:
    fresh outputs (the caller owns each batch)."""
    return reuse_outputs + 1 if reuse_outputs > 0 else 0


def take_call(cb: ExperienceBuffer, B: int, fill: int, depth: int = 5):
    """(one call, bytes it delivers) of the least a gather of obs and next obs can cost on this
    ring: one ``np.take`` per column, of uniform random rows, nothing else (no selection, no other
    fields, no batch): the issue's "np.take-into-output limit". ``depth`` output sets are used in
    turn (``sets_for(k)`` gives a pool of ``reuse_outputs=k`` the same guarantee); with
    ``depth=1`` the one output stays in cache; ``depth=0``: a fresh output per call, as
    ``reuse_outputs=0`` hands out."""
    rng = np.random.default_rng(1)
    cols = [cb.storage.host_view(name) for name in ("obs", "next_obs")]
    outs = [[np.empty((B, *c.shape[1:]), c.dtype) for c in cols] for _ in range(max(depth, 1))]
    draws = [rng.integers(0, fill, B) for _ in range(64)]   # drawn beforehand: the gather alone
    turn = [0]

    def take():
        idx, out = draws[turn[0] % 64], outs[turn[0] % depth]
        turn[0] += 1
        for c, o in zip(cols, out):
            np.take(c, idx, axis=0, out=o, mode="clip")   # numpy buffers out= under mode='raise'

    def take_fresh():
        idx = draws[turn[0] % 64]
        turn[0] += 1
        return [np.take(c, idx, axis=0) for c in cols]
    return (take if depth > 0 else take_fresh), sum(o.nbytes for o in outs[0])


def take_limit(cb: ExperienceBuffer, B: int, fill: int, *, calls: int, reps: int, depth: int = 5) -> float:
    """GB/s of ``take_call``'s gather on this ring (medians of ``reps``)."""
    take, nbytes = take_call(cb, B, fill, depth)
    return nbytes / median(time_per_call(take, calls=calls, reps=reps)) / 1e9


# ----------------------------------------------------------------------------- a plain numpy ring
class PlainRing:
    """The floor a user could write in numpy: preallocated columns, slice-copy inserts, uniform
    draws with ``Generator.integers`` and one ``take`` per column into reused outputs. No
    validation, no metadata, no priorities: what Conduit's uniform ring is compared against.

    ``outputs``: output sets used in turn, so a batch stays valid through ``outputs - 1`` more
    samples: ``ExperienceBuffer(reuse_outputs=outputs - 1)``'s guarantee (its pool cycles k + 1
    sets); compared at equal guarantees (at B=256 Atari, 5 sets of 14 MB do not fit the cache
    that one set fits)."""

    def __init__(self, capacity: int, example: dict, outputs: int = 1):
        self.capacity, self.size, self.pos = capacity, 0, 0
        self.cols = {k: np.empty((capacity, *v.shape[1:]), v.dtype) for k, v in example.items()}
        self.rng = np.random.default_rng(0)
        self.outputs = outputs
        self.outs: dict[int, list[dict]] = {}
        self.turn = 0

    def add(self, cols: dict) -> None:
        n = len(cols["action"])
        head = min(n, self.capacity - self.pos)
        for k, v in cols.items():
            self.cols[k][self.pos:self.pos + head] = v[:head]
            if head < n:
                self.cols[k][:n - head] = v[head:]
        self.pos = (self.pos + n) % self.capacity
        self.size = min(self.capacity, self.size + n)

    def sample(self, batch: int) -> dict:
        idx = self.rng.integers(0, self.size, batch)
        sets = self.outs.get(batch)
        if sets is None:
            sets = self.outs[batch] = [{k: np.empty((batch, *v.shape[1:]), v.dtype) for k, v in self.cols.items()}
                                       for _ in range(self.outputs)]
        self.turn = (self.turn + 1) % self.outputs
        out = sets[self.turn]
        for k, v in self.cols.items():
            np.take(v, idx, axis=0, out=out[k], mode="clip")
        return out


def plain_ring_entry(kind: str, cols: list[dict], fill: int, batch_sizes, *, calls: int, reps: int,
                     depths: tuple[int, ...] = (1, 4)) -> dict:
    """Insert rate and uniform sample time of PlainRing and of a Conduit ring with reused outputs,
    both of ``fill`` slots, filled once (so inserts overwrite resident pages), timed in turns.
    Samples are compared at equal guarantees: for each of ``depths``, Conduit's
    ``reuse_outputs=depth`` (a batch valid through ``depth`` more samples) against the ring's
    ``depth + 1`` output sets in turn (``B{B}``: the first depth; ``B{B}_reuse{depth}``: the
    others). One pair in memory at a time."""
    entry: dict = {"depths": list(depths)}
    for d in depths:
        ring, cb = PlainRing(fill, cols[0], outputs=sets_for(d)), conduit_buffer(kind, fill, False, reuse=d)
        for c in cols:
            ring.add(c)
            cb.add(c)
        if d == depths[0]:
            def rate(add) -> float:
                t0 = time.perf_counter()
                for c in cols:
                    add(c)
                return fill / (time.perf_counter() - t0)
            ins_p, ins_c = [], []
            for _ in range(reps):   # alternated: both see the same machine state
                ins_p.append(rate(ring.add))
                ins_c.append(rate(cb.add))
            entry |= {"insert_per_s": median(ins_p), "conduit_insert_per_s": median(ins_c),
                      "insert_ratio": median(ins_c) / median(ins_p)}
        for B in batch_sizes:
            t = paired_times({"ring": (lambda: ring.sample(B), calls), "conduit": (lambda: cb.sample(B), calls)},
                             reps=reps)   # (repetitions in turns: the ratios are paired)
            t_p, t_c = t["ring"], t["conduit"]
            key = f"B{B}" if d == depths[0] else f"B{B}_reuse{d}"
            entry[key] = {"plain_s": median(t_p), "conduit_s": median(t_c), "ratio": ratio_stats(t_c, t_p),
                          "outputs": sets_for(d), "reuse_outputs": d}
        cb.close()
        del ring, cb
    return entry


# ----------------------------------------------------------------------------- TorchRL
def torchrl_available() -> tuple[bool, str]:
    """(True, version) when TorchRL and its extension load; (False, why) otherwise."""
    try:
        import torchrl
        from torchrl._torchrl import SumSegmentTreeFp32  # noqa: F401 - the prioritized sampler's tree
    except Exception as exc:   # ImportError, or an OSError/undefined symbol from the extension
        return False, (f"torchrl not usable here ({type(exc).__name__}: {str(exc)[:120]}). Fix: "
                       "bash benchmarks/buffer/torchrl_peer.sh <pytorch/rl source> and put its directory on PYTHONPATH")
    return True, torchrl.__version__


def _tensordict(cols: dict):
    import torch
    from tensordict import TensorDict
    n = len(cols["action"])
    return TensorDict({k: torch.from_numpy(v) for k, v in cols.items()}, batch_size=[n])


def torchrl_buffer(capacity: int, prioritized: bool, batch: int):
    from torchrl.data import (
        LazyTensorStorage,
        TensorDictPrioritizedReplayBuffer,
        TensorDictReplayBuffer,
    )
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
    """The buffer bench's TorchRL table (or why the arm was skipped)."""
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
