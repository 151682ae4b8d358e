"""The SRL adapter's conformance harness, with SRL's own buffers as the native oracle.

Runs where SRL imports (its venv: ``tests/srl_venv/test_srl_conformance.py``). Replay
(``ReplaySession``): each synthetic transition becomes one SRL sample of one step (a ``SampleBatch``
with a nested ``obs.obs``), put through the replay buffer SRL's trainer worker would use; a delivery
is a sequence of SRL ``get``s of ``GET_SIZE`` chunks (SRL's buffers draw a fixed batch size), the ids
read back from the rebuilt, time-major sample; priority updates go back per get through
``sampling_indices``, as SRL's trainer thread sends them. On-policy and time-major (``QueueSession``):
SRL's PPO queue (``priority_queue``, ``reuses=1``), a put per transition for the flat on-policy
checks, a put per chunk of T steps batched B per get for the time-major ones, against SRL's own
queue. Every schedule of both queue kinds is also compared with SRL's in
``tests/srl_venv/test_buffers_vs_srl.py`` (their semantics are deterministic)."""

from __future__ import annotations

import pickle

import numpy as np

import conduit_core
from conduit_conformance import Delivered, DeliveredTimeMajor, Harness, NotApplicable, Session, SyntheticRollout

GET_SIZE = 8
# SRL's prioritized buffer never draws the chunk in its last filled slot (below, KNOWN_DEPARTURES'
# former entry): its native session puts this chunk last, before the first get, so that the one
# chunk SRL cannot draw is one the suite never asked for, and the suite's chunks compare in full
SENTINEL_ID = (1 << 24) - 1   # exact in float32; never one of the suite's ids


def sample_of(columns: dict, rows: slice, policy_version: int = 0):
    """One SRL ``SampleBatch`` of the suite's ``rows`` (time-major ``[T, ...]``, T = the rows' count), as
    an actor's chunk of ``sample_steps`` steps, every step tagged with ``policy_version``."""
    from rlsrl.api.trainer import SampleBatch
    from rlsrl.base.namedarray import NamedArray

    class Obs(NamedArray):
        def __init__(self, obs):
            super().__init__(obs=obs)

    class Analyzed(NamedArray):   # SRL's prioritized put reads analyzed_result.ret (None: max priority)
        def __init__(self, ret, value):
            super().__init__(ret=ret, value=value)

    n = len(range(*rows.indices(columns["obs"].shape[0])))
    col = lambda key, dtype=None: np.asarray(columns[key][rows], dtype=dtype).reshape(n, 1)  # noqa: E731
    return SampleBatch(obs=Obs(obs=np.asarray(columns["obs"][rows])), action=col("action"),
                       reward=col("reward", np.float32), done=col("terminated"), truncated=col("truncated"),
                       analyzed_result=Analyzed(ret=None, value=np.zeros((n, 1), np.float32)),
                       policy_version_steps=np.full((n, 1), policy_version, np.int64))


def transitions(columns: dict, policy_version: int = 0) -> list:
    """One SRL ``SampleBatch`` of T=1 per row of the suite's columns."""
    return [sample_of(columns, slice(i, i + 1), policy_version) for i in range(columns["obs"].shape[0])]


def rows_of_sample(sample) -> dict[str, np.ndarray]:
    """``Delivered.rows`` of one SRL get, as SRL's trainer reads it: the time-major ``[T=1, B, ...]``
    sample's step, per row (``done`` is the terminal flag ``transitions`` wrote ``terminated`` to)."""
    step = lambda x: np.asarray(x)[0]
    b = step(sample.obs.obs).shape[0]
    return {"obs": step(sample.obs.obs), "action": step(sample.action).reshape(b),
            "reward": step(sample.reward).reshape(b), "terminated": step(sample.done).reshape(b),
            "truncated": step(sample.truncated).reshape(b)}


class ReplaySession(Session):
    """One SRL replay buffer (Conduit's or SRL's own) driven as SRL's trainer worker drives it.
    ``sentinel``: put ``SENTINEL_ID``'s chunk after the suite's chunks, before the first get (SRL's
    prioritized buffer: the one chunk it cannot draw is then not one of the suite's)."""

    def __init__(self, buffer, *, stored_ids, sentinel: bool = False):
        self.buffer = buffer
        self._stored_ids = stored_ids
        self._sentinel = "due" if sentinel else None   # None, "due" (before the next get) or "put"

    def ingest(self, rollout: SyntheticRollout) -> None:
        self.ingest_raw(rollout.columns(), source=rollout.source)

    def ingest_raw(self, columns, *, source: int = 0) -> None:
        if self._sentinel == "put":
            raise RuntimeError("the SRL harness's native prioritized session puts its sentinel chunk before the "
                               "first get: a chunk put after it would make the sentinel drawable. Fix: ingest "
                               "everything before delivering from this session (the suite's checks do)")
        for s in transitions(columns):
            self.buffer.put(s)

    def _put_sentinel(self) -> None:
        """Put the sentinel chunk into SRL's buffer (its last filled slot, never drawn) and take it
        out of SRL's min tree, which normalises the weights (with its initial priority there, every
        suite priority above it would get other weights). Reads SRL's private fields, as
        ``srl_stored_ids`` does: the oracle's own state, not the adapter's."""
        buffer = self.buffer
        if buffer._total_chunks >= buffer._max_size:
            raise RuntimeError(f"the SRL harness's sentinel needs a free slot: {buffer._total_chunks} chunks fill the "
                               f"native buffer's {buffer._max_size}. Fix: build the session with a larger capacity")
        obs = np.zeros((1, 4), np.float32)
        obs[0, 0] = SENTINEL_ID
        cols = {"obs": obs, "next_obs": obs.copy(), "action": np.zeros(1, np.int64),
                "reward": np.zeros(1, np.float32), "terminated": np.zeros(1, bool), "truncated": np.zeros(1, bool)}
        for s in transitions(cols):
            buffer.put(s)
        buffer._min_tree[(buffer._ptr - 1) % buffer._max_size] = float("inf")
        self._sentinel = "put"

    def deliver(self, batch_size, *, policy_version=None) -> Delivered:
        if self._sentinel == "due":
            self._put_sentinel()
        ids, weights, gets, rows = [], [], [], []
        for _ in range(-(-(batch_size or GET_SIZE) // GET_SIZE)):
            entry = self.buffer.get()
            ids.append(np.asarray(entry.sample.obs.obs)[0, :, 0])
            w = entry.sample.metadata.get("sampling_weight")
            weights.append(np.ones(len(ids[-1]), np.float32) if w is None else np.asarray(w))
            gets.append(entry.sampling_indices)
            rows.append(rows_of_sample(entry.sample))
        return Delivered(ids=np.concatenate(ids).astype(np.int64)[:batch_size],
                         weights=np.concatenate(weights)[:batch_size], handle=gets,
                         rows={k: np.concatenate([r[k] for r in rows])[:batch_size] for k in rows[0]})

    def update_priorities(self, delivered, priorities) -> None:
        pr = np.asarray(priorities, dtype=np.float64)
        if pr.size % GET_SIZE:
            raise ValueError(f"the SRL harness delivers in gets of {GET_SIZE}: ask for a multiple of it, "
                             f"got priorities for {pr.size} rows")
        for k, idx in enumerate(delivered.handle):
            self.buffer.update_priorities(idx, pr[k * GET_SIZE:(k + 1) * GET_SIZE])

    def stored_ids(self):
        ids = self._stored_ids(self.buffer)
        return ids[ids != SENTINEL_ID] if self._sentinel == "put" else ids

    def state(self):
        return pickle.dumps(self.buffer)

    def load_state(self, state) -> None:
        self.buffer = pickle.loads(state)


class QueueSession(Session):
    """One of SRL's on-policy queues (Conduit's or SRL's own ``priority_queue``, the kind and defaults
    SRL's PPO trainer worker uses: each batch served once, the freshest first, the oldest dropped past
    ``max_size``), driven as that worker drives it: a put per actor chunk, a get per batch.

    ``per_step``: the suite's flat on-policy checks put one T=1 sample per transition, batched one
    per get (SRL's default ``batch_size=1``), so every row can be delivered; the time-major checks put
    each rollout as one chunk of T steps, batched B per get along axis 1."""

    def __init__(self, buffer, *, per_step: bool):
        self.buffer = buffer
        self._per_step = per_step
        self._undelivered_versions: set[int] = set()

    def ingest(self, rollout: SyntheticRollout) -> None:
        columns, version = rollout.columns(), int(rollout.policy_version)
        samples = transitions(columns, version) if self._per_step else [sample_of(columns, slice(None), version)]
        for sample in samples:
            self.buffer.put(sample)
        self._undelivered_versions.add(version)

    def take_all(self) -> list[DeliveredTimeMajor]:
        """Every batch queued now, each copied out (a served entry's memory is reused ``lease_depth``
        gets later), in the order SRL's trainer would get them."""
        out = []
        while not self.buffer.empty():
            sample = self.buffer.get().sample
            ids = np.array(np.asarray(sample.obs.obs)[..., 0]).astype(np.int64)
            t, b = ids.shape
            flat = lambda x: np.array(np.asarray(x)).reshape(t, b)  # noqa: E731 - [T, B, 1] -> [T, B]
            rows = {"obs": np.array(np.asarray(sample.obs.obs)), "action": flat(sample.action),
                    "reward": flat(sample.reward), "terminated": flat(sample.done),
                    "truncated": flat(sample.truncated)}
            out.append(DeliveredTimeMajor(ids=ids, rows=rows, versions=flat(sample.policy_version_steps)))
        self._undelivered_versions.clear()
        return out

    def deliver_time_major(self) -> list[DeliveredTimeMajor]:
        return self.take_all()

    def deliver(self, batch_size, *, policy_version=None) -> Delivered:
        """Every queued row, batch after batch (``batch_size`` must be None: a queue hands out what it
        holds). Where rows of another policy version are queued than the one asked for, SRL has no
        path that tells them apart: its trainer takes every sample its queue holds (its PPO records
        each step's version in ``policy_version_steps``)."""
        if batch_size is not None:
            raise ValueError(f"batch_size: expected None (the SRL harness's queue sessions deliver whole queues, as "
                             f"SRL's trainer takes what its queue holds), got {batch_size}. Fix: deliver(None)")
        others = self._undelivered_versions - {policy_version} if policy_version is not None else set()
        if others:
            raise NotApplicable(f"SRL's trainer takes every sample its queue holds, whatever policy version produced "
                                f"it (versions {sorted(self._undelivered_versions)} queued, version {policy_version} "
                                "asked for); the version of each step travels in policy_version_steps")
        batches = self.take_all()
        if not batches:
            return Delivered(ids=np.zeros(0, np.int64), versions=np.zeros(0, np.int64), rows={})
        by_row = lambda a: np.concatenate([np.swapaxes(x, 0, 1).reshape(-1, *x.shape[2:]) for x in a])  # noqa: E731
        return Delivered(ids=by_row([x.ids for x in batches]), versions=by_row([x.versions for x in batches]),
                         rows={k: by_row([x.rows[k] for x in batches]) for k in batches[0].rows})

    def stored_ids(self) -> np.ndarray:
        """The ids of the queued batches, read from a copy of the queue drained in serving order."""
        copy = QueueSession(pickle.loads(pickle.dumps(self.buffer)), per_step=self._per_step)
        batches = copy.take_all()
        return np.concatenate([np.swapaxes(x.ids, 0, 1).reshape(-1) for x in batches]) if batches else \
            np.zeros(0, np.int64)


def conduit_stored_ids(buffer) -> np.ndarray:
    core = buffer.experience_buffer
    if core is None:
        return np.zeros(0, np.int64)
    from conduit_conformance.edp_session import stored_ids_of_buffer
    return stored_ids_of_buffer(core, "obs.obs")


def srl_stored_ids(buffer) -> np.ndarray:
    """SRL's ring in insertion order (read from its arrays: SRL has no listing)."""
    total = buffer._total_chunks
    if buffer._buffer is None or total == 0:
        return np.zeros(0, np.int64)
    ids = np.asarray(buffer._buffer.obs.obs)[0, :, 0]
    order = np.arange(total) if total < buffer._max_size else (np.arange(total) + buffer._ptr) % total
    return ids[order].astype(np.int64)


# Where the SRL adapter departs from SRL on purpose, with the reason (the suite's xfails). SRL's
# PrioritizedReplayBuffer never draws the chunk at the highest stored index (rlsrl/base/buffer.py
# _sample_proportional sums the tree with sum(0, total_chunks - 1), whose end is exclusive: until the
# ring is full, the chunk put last); Conduit's adapter draws every stored chunk (an SRL bug, not copied,
# docs §13; tests/srl_venv/test_buffers_vs_srl.py shows it). The native prioritized session puts a
# sentinel chunk last (SENTINEL_ID), so equivalence/prioritized_matches_native compares the rest.
KNOWN_DEPARTURES: dict[str, str] = {}


class SRLHarness(Harness):
    name = "conduit_srl"
    version = conduit_core.__version__   # adapters are released at the core's version
    framework = "srl"
    # onpolicy and time_major: SRL's PPO queue (priority_queue); replay, prioritized: its replay buffers
    capabilities = frozenset({"replay", "prioritized", "native", "state", "onpolicy", "time_major"})
    known_departures = KNOWN_DEPARTURES

    def __init__(self):
        import rlsrl
        self.framework_version = getattr(rlsrl, "__version__", "b3b01ea")

    @staticmethod
    def _args(kind: str, capacity: int, seed: int, alpha: float | None) -> dict:
        args = dict(max_size=capacity, batch_size=GET_SIZE, warmup_transitions=0, seed=seed, sample_length=1)
        if kind == "prioritized_replay_buffer":
            args.update(beta=0.4, **({} if alpha is None else {"alpha": alpha}))   # None: each buffer's default
        else:
            args.update(batch_length=1)
        return args

    def session(self, *, seed, capacity=10_000, prioritized=False, alpha=None, onpolicy=False,
                mode="sequential", staleness=0) -> Session:
        from .buffers import make_buffer
        if onpolicy:
            return QueueSession(make_buffer("priority_queue", max_size=capacity, reuses=1, batch_size=1),
                                per_step=True)
        kind = "prioritized_replay_buffer" if prioritized else "simple_replay_buffer"
        return ReplaySession(make_buffer(kind, **self._args(kind, capacity, seed, alpha)),
                             stored_ids=conduit_stored_ids)

    def native_session(self, *, seed, capacity=10_000, prioritized=False, alpha=None, onpolicy=False):
        import random

        from rlsrl.base.buffer import PrioritizedReplayBuffer, PriorityQueueBuffer, SimpleReplayBuffer
        if onpolicy:
            return QueueSession(PriorityQueueBuffer(max_size=capacity, reuses=1, batch_size=1), per_step=True)
        _cpu_pinning()
        random.seed(seed)   # SRL's prioritized buffer draws from Python's global random, which SRL never seeds
        kind = "prioritized_replay_buffer" if prioritized else "simple_replay_buffer"
        cls = PrioritizedReplayBuffer if prioritized else SimpleReplayBuffer  # SRL's own, even while enabled
        return ReplaySession(cls(**self._args(kind, capacity, seed, alpha)), stored_ids=srl_stored_ids,
                             sentinel=prioritized)

    def time_major_sessions(self, *, seed, batch_size, max_batches):
        """SRL's PPO queue as its trainer worker builds it (``priority_queue``, ``reuses=1``; SRL's Atari
        PPO passes ``max_size``, ``reuses=1``, ``batch_size=32``), Conduit's and SRL's own."""
        from rlsrl.base.buffer import PriorityQueueBuffer

        from .buffers import make_buffer
        args = dict(max_size=max_batches, reuses=1, batch_size=batch_size)
        return (QueueSession(make_buffer("priority_queue", **args), per_step=False),
                QueueSession(PriorityQueueBuffer(**args), per_step=False))


def _cpu_pinning() -> None:
    """SRL's replay buffers pin their storage, which raises without CUDA: pinning is the identity
    on a CPU-only machine (the oracle's data path is otherwise unchanged)."""
    import torch
    if not torch.cuda.is_available() and not getattr(torch.Tensor.pin_memory, "__conduit_cpu__", False):
        def pin_memory(self, *a, **k):
            return self
        pin_memory.__conduit_cpu__ = True
        torch.Tensor.pin_memory = pin_memory


def harness() -> SRLHarness:
    return SRLHarness()
