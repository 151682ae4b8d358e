"""What an adapter provides to the suite: a Harness that builds Sessions.

A Session is the adapter's real data path, driven with synthetic rollouts whose
observations carry a unique id (``obs[:, 0]``), so the suite can tell exactly which
transitions were stored and delivered. The adapter converts a SyntheticRollout into
its framework's own format (episodes, sample batches, ...) and pushes it through its
ingestion path; ``deliver`` returns the ids (and provenance) of what its delivery path
would hand the learner, and the rows' contents as the learner sees them (``Delivered.rows``).

Capabilities a harness declares (checks needing an undeclared one are skipped, with why; a check
whose capabilities are all declared fails where a piece it needs is missing, unless the framework
itself has no such path: ``NotApplicable``, a skip):

    replay       off-policy replay (uniform)          prioritized  prioritized replay
    onpolicy     FIFO, versioned, consume-once        state        state round trip
    native       the framework's own path as oracle   overlap      an overlapped schedule
    convergence  reference workloads to train         nstep        n-step rows (Session.deliver_rows)
    sequences    slices of episodes for stateful      shared_rng   the adapter can draw from the
                 modules (Session.deliver_sequences)               framework's RNG stream
                                                                   (Harness.shared_rng_sessions)
    async        an asynchronous trainer's queue: staleness bounded by admission, oldest first,
                 nothing dropped (Harness.async_queue, checks_async.py)
    time_major   batches of [T, B]: B chunks of T steps, each as its actor sent it, batched along
                 axis 1 (SRL's queues; Harness.time_major_sessions, checks_time_major.py)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

CAPABILITIES = frozenset({"replay", "prioritized", "onpolicy", "state", "native", "overlap", "convergence",
                          "nstep", "sequences", "shared_rng", "async", "continuous", "time_major"})
OBS_DIM = 4
# the columns a SyntheticRollout has, and the keys of Delivered.rows (a harness maps its framework's names to these)
ROW_FIELDS = ("obs", "next_obs", "action", "reward", "terminated", "truncated")


def action_of(ids: np.ndarray, dims: int) -> np.ndarray:
    """A continuous action of ``dims`` float32 components per transition (SAC's, TD3's): varied
    per id and component, and, like ``reward_of``, never a value float16, bfloat16 or an integer
    holds, so an adapter that assumes discrete actions or narrows them shows in every row."""
    ids = np.asarray(ids).astype(np.int64).reshape(-1, 1)
    k = np.arange(dims, dtype=np.int64).reshape(1, -1)
    return ((((ids * 7907 + k * 31) % 17).astype(np.float32) - np.float32(8.3)) / np.float32(4.0))


def reward_of(ids: np.ndarray) -> np.ndarray:
    """The reward of transition ``id``: varied (so a wrong window sums to a wrong return), a
    float32 value, and never one float16 or bfloat16 holds (k - 6.3 has a repeating binary
    fraction), so a lossy cast on the way to the learner shows in every row."""
    ids = np.asarray(ids).astype(np.int64)
    return (((ids * 7919) % 13).astype(np.float32) - np.float32(6.3)) / np.float32(4.0)


@dataclass
class SyntheticRollout:
    """``ids``: one unique integer per transition, in time order; one rollout is one episode
    (or the stored part of one, if neither flag is set). The adapter must keep the id
    readable in what it delivers: it is ``obs[:, 0]``; ``next_obs[:, 0]`` is the next step's
    id inside the rollout and ``ids[-1] + 0.5`` after its last step (the observation an
    episode's step sequence gives). ``reward`` is ``reward_of(ids)``; ``action`` is ``ids % 2``
    (int64), or, with ``action_dims`` > 0, ``action_of(ids, action_dims)`` (float32, continuous)."""

    ids: np.ndarray
    source: int = 0
    policy_version: int = 0
    terminated: bool = False
    truncated: bool = False
    action_dims: int = 0

    def columns(self) -> dict[str, np.ndarray]:
        n = len(self.ids)
        obs = np.zeros((n, OBS_DIM), np.float32)
        obs[:, 0] = self.ids
        obs[:, 1] = self.source
        nxt = obs.copy()
        if n:
            nxt[:-1, 0] = obs[1:, 0]
            nxt[-1, 0] += 0.5
        term = np.zeros(n, bool)
        trunc = np.zeros(n, bool)
        if n and self.terminated:
            term[-1] = True
        elif n and self.truncated:
            trunc[-1] = True
        action = action_of(self.ids, self.action_dims) if self.action_dims else \
            (np.asarray(self.ids) % 2).astype(np.int64)
        return {"obs": obs, "next_obs": nxt, "action": action, "reward": reward_of(self.ids), "terminated": term,
                "truncated": trunc}


@dataclass
class Delivered:
    """What the learner would get: transition ids in row order, plus provenance when known.

    ``rows``: the delivered rows' contents as the learner receives them, row-aligned with ``ids``:
    ``{key: array with one entry per row}``, keys among ``ROW_FIELDS`` (the framework's own names
    mapped to these; a field the learner does not get is left out), converted only in dtype and
    shape, never in value. ``deliver/rows_intact`` and ``onpolicy/rows_intact`` require it and compare
    every row with ``SyntheticRollout.columns()`` of its id, exactly."""

    ids: np.ndarray
    versions: np.ndarray | None = None
    weights: np.ndarray | None = None
    inserted_at_selection: int | None = None   # for the staleness bound
    handle: Any = None                          # the adapter's own batch, for priority updates
    rows: dict[str, np.ndarray] | None = None   # what the learner gets, by ROW_FIELDS key (see above)


@dataclass
class DeliveredRows:
    """n-step rows as the learner would get them, one entry per row: the window's first
    id, ``next_obs[:, 0]`` (of the window's last step), the return the framework computed,
    the window length it reports, the done flags and the importance weights (1 if none)."""

    ids: np.ndarray
    next_ids: np.ndarray
    reward: np.ndarray
    n_step: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    weights: np.ndarray
    handle: Any = None                          # the adapter's own batch, for priority updates


@dataclass
class DeliveredSequence:
    """One slice of an episode as a stateful learner would get it: ``ids`` of its steps in
    order, its lookback steps first (``obs[:, 0]`` of each), how many of them are lookback,
    the id of the observation after its last step (``next_obs[:, 0]``), its rewards and
    the done flags of its end."""

    ids: np.ndarray
    lookback: int
    next_id: float
    rewards: np.ndarray
    terminated: bool
    truncated: bool


@dataclass
class DeliveredTimeMajor:
    """One time-major batch as the learner gets it (capability 'time_major'): ``ids[t, b]`` is
    ``obs[..., 0]`` at step ``t`` of the batch's chunk ``b``; ``rows``: fields by ``ROW_FIELDS`` key,
    each ``[T, B, ...]`` at the same positions (what the learner does not get is left out);
    ``versions``: the policy version at each position, where the framework records one."""

    ids: np.ndarray
    rows: dict[str, np.ndarray]
    versions: np.ndarray | None = None


@dataclass
class ConvergenceResult:
    reached: bool
    env_steps: int
    returns: list[float] = field(default_factory=list)


class Session(ABC):
    """One instance of the adapter's data path (or of the framework's native path)."""

    @abstractmethod
    def ingest(self, rollout: SyntheticRollout) -> None: ...

    def ingest_raw(self, columns: dict[str, Any], *, source: int = 0) -> None:
        """Push arbitrary (possibly malformed) columns through ingestion; used to check
        that bad input is rejected. Adapters whose ingestion cannot receive malformed
        framework data may raise NotImplementedError (the check is then skipped)."""
        raise NotImplementedError

    def flush(self) -> None:
        pass

    @abstractmethod
    def deliver(self, batch_size: int | None, *, policy_version: int | None = None) -> Delivered: ...

    def deliver_rows(self, batch_size: int, *, n_step: int | tuple[int, int], gamma: float,
                     beta: float | None = None) -> DeliveredRows:
        """n-step rows (capability 'nstep'), drawn as the adapter's delivery path draws them
        for a learner that asks for ``n_step`` (an int, or ``(lo, hi)`` drawn from
        ``[lo, hi)``), ``gamma`` and ``beta``."""
        raise NotImplementedError

    def deliver_sequences(self, batch_size: int, *, length: int, lookback: int = 0,
                          min_length: int = 0) -> list[DeliveredSequence]:
        """Sequences (capability 'sequences') as the adapter's delivery path draws them for a
        stateful learner asking for ``batch_size`` (the framework's unit: RLlib counts each
        slice's steps plus one), slices of at most ``length`` steps, ``lookback`` steps
        before each, and only starts with more than ``min_length`` steps left (burn-in)."""
        raise NotImplementedError

    def deliver_time_major(self) -> list[DeliveredTimeMajor]:
        """Capability 'time_major': every batch the framework's trainer could take now, in the order
        it takes them, each copied out of the adapter's memory (a later put may reuse it). Each
        ingested rollout is one chunk of T steps (an actor's ``sample_steps``)."""
        raise NotImplementedError

    def update_priorities(self, delivered: Delivered | DeliveredRows, priorities: np.ndarray) -> None:
        """New priorities for a delivered batch's rows, through the adapter's own update (capability
        'prioritized')."""
        raise NotImplementedError(f"{type(self).__name__} has no update_priorities (capability 'prioritized' "
                                  "needs it). Fix: implement Session.update_priorities(delivered, priorities), or "
                                  "do not declare 'prioritized'")

    @abstractmethod
    def stored_ids(self) -> np.ndarray:
        """Ids of every stored (not yet consumed / not evicted) transition, in insertion order."""

    def state(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} has no state (capability 'state' needs state() and "
                                  "load_state()). Fix: implement both, or do not declare 'state'")

    def load_state(self, state: Any) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no load_state (capability 'state' needs state() and "
                                  "load_state()). Fix: implement both, or do not declare 'state'")

    def close(self) -> None:
        pass


class Harness(ABC):
    """An adapter under test. Subclass it in the adapter's package."""

    name: str = "adapter"
    version: str = "0"
    framework: str = "framework"
    framework_version: str = "unknown"
    capabilities: frozenset[str] = frozenset()
    # check id -> why the adapter departs from the framework there on purpose (e.g. a framework bug
    # not copied): reported as expected failures wherever the suite runs (CLI, check_adapter, pytest)
    known_departures: dict[str, str] = {}

    @abstractmethod
    def session(self, *, seed: int, capacity: int = 10_000, prioritized: bool = False, alpha: float | None = None,
                onpolicy: bool = False, mode: str = "sequential", staleness: int = 0) -> Session:
        """A fresh session of the adapter's path (``alpha`` None: the buffer built with its own
        default, which must be the framework's: ``priority_exponents_match_native`` compares them)."""

    def native_session(self, *, seed: int, capacity: int = 10_000, prioritized: bool = False,
                       alpha: float | None = None, onpolicy: bool = False) -> Session | None:
        """The framework's own path (the oracle), or None."""
        return None

    def shared_rng_sessions(self, *, seed: int, capacity: int = 10_000) -> tuple[Session, Session] | None:
        """Capability 'shared_rng': an adapter session and a native one whose uniform draws
        consume the same RNG stream (each seeded with ``seed``) the way the framework's
        sampler consumes it, e.g. through ``conduit_core.Uniform(draw=...)``. The suite then
        requires the same rows in the same order, not only the same distribution."""
        return None

    def time_major_sessions(self, *, seed: int, batch_size: int,
                            max_batches: int) -> tuple[Session, Session | None] | None:
        """Capability 'time_major': an adapter session and the framework's own (None if it has none),
        each batching ``batch_size`` chunks per batch along axis 1 and holding at most ``max_batches``
        batches (past it, what the framework drops, it drops), built as the framework's trainer builds
        its on-policy buffer. ``Session.deliver_time_major`` hands the batches over."""
        return None

    def convergence_workloads(self) -> dict[str, Callable[[str, int], ConvergenceResult]]:
        """name -> run(path, seed) where path is 'native' or 'conduit'."""
        return {}

    def convergence_spread(self) -> dict[str, float]:
        """name -> the standard deviation of log(env steps to the threshold) over seeds of the
        framework's own path on that workload, as measured (``conduit conformance NAME
        --calibrate-convergence``). The convergence check's bound comes from it (a margin the
        native arm's own spread sets, at a stated false-alarm rate); a workload without one is
        judged by the suite's fixed bound, set from RLlib's spread, and says so."""
        return {}

    def async_queue(self, *, per_version: int, staleness: int) -> "AsyncQueue":
        """Capability 'async': a fresh instance of the adapter's queue between an asynchronous rollout
        producer and its trainer, for a trainer that takes ``per_version`` samples per policy version
        and may train on samples at most ``staleness`` versions old (checks_async.py drives it)."""
        raise NotImplementedError


class AsyncQueue(ABC):
    """The experience path of an asynchronous trainer (capability 'async'), as the suite drives it:
    a producer asks to start a sample (``try_admit``), generates it, hands it over (``put``); the
    trainer takes batches (``try_take``) and publishes each new policy version. Items are the suite's
    own (dicts with an ``id``); the queue hands them back unchanged."""

    @abstractmethod
    def try_admit(self) -> Any | None:
        """A ticket to start one sample now, or None while the queue holds the producer back."""

    @abstractmethod
    def put(self, ticket: Any, item: Any, *, versions: tuple[int, ...]) -> None:
        """The sample generated under ``ticket``; ``versions``: the policy version of each of its
        segments, oldest first (several where a weight sync cut the rollout)."""

    @abstractmethod
    def try_take(self, n: int) -> list[Any] | None:
        """The next batch of ``n`` items for the trainer, or None if it is not ready."""

    @abstractmethod
    def publish_version(self, version: int) -> None:
        """The trainer's weights are now ``version``."""

    @abstractmethod
    def pending(self) -> list[Any]:
        """Every item accepted and not yet delivered."""

    def close(self) -> None:
        pass
