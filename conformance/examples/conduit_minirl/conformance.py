"""The adapter's conformance harness: the suite drives ConduitReplayMemory and
ConduitRolloutStore with synthetic rollouts, and minirl's own classes as the oracle."""

from __future__ import annotations

import numpy as np

from conduit_conformance import ConvergenceResult, Delivered, Harness, Session, SyntheticRollout
from conduit_conformance.edp_session import VersionWindowAsync, delivered, stored_ids
from conduit_core.queues import VersionWindowQueue

# STAGE MAP: your framework and its version.
from conduit_conformance.examples import minirl as fw

from .memory import ConduitReplayMemory, ConduitRolloutStore

OBS_SHAPE = (4,)


def to_transitions(r: SyntheticRollout) -> list:
    """STAGE MAP: a synthetic rollout in your framework's own format."""
    c = r.columns()
    return [fw.Transition(c["obs"][i], int(c["action"][i]), float(c["reward"][i]), c["next_obs"][i],
                                 bool(c["terminated"][i]), bool(c["truncated"][i])) for i in range(len(r.ids))]


class AdapterSession(Session):
    def __init__(self, store):
        self.store = store

    def ingest(self, rollout: SyntheticRollout) -> None:
        if isinstance(self.store, ConduitRolloutStore):
            self.store.push(to_transitions(rollout), policy_version=rollout.policy_version, source=rollout.source)
        else:
            self.store.push(to_transitions(rollout), source=rollout.source)

    def ingest_raw(self, columns, *, source: int = 0) -> None:
        if isinstance(self.store, ConduitRolloutStore):
            self.store.push_columns(columns, policy_version=0, source=source)
        else:
            self.store.push_columns(columns, source=source)

    def flush(self) -> None:
        self.store.edp.flush()

    def deliver(self, batch_size, *, policy_version=None) -> Delivered:
        # STAGE MAP: Delivered.rows are the columns your learner gets, under the suite's names
        # (minirl's learner gets the Batch as is; else delivered(batch, names={"reward": "rewards", ...}))
        if isinstance(self.store, ConduitRolloutStore):
            return delivered(self.store.drain(policy_version or 0))
        return delivered(self.store.sample(batch_size))

    def update_priorities(self, d: Delivered, priorities) -> None:
        self.store.update_priorities(d.handle, priorities)

    def stored_ids(self):
        return stored_ids(self.store.edp)

    def state(self):
        return self.store.edp.state_dict()

    def load_state(self, state) -> None:
        self.store.edp.load_state_dict(state)

    def close(self) -> None:
        self.store.close()


class NativeSession(Session):
    """The framework's own ReplayMemory: the oracle for equivalence checks. STAGE MAP: your
    framework's own buffer, pushed and sampled as its training loop does."""

    def __init__(self, capacity: int, seed: int):
        self.mem = fw.ReplayMemory(capacity, seed=seed)

    def ingest(self, rollout: SyntheticRollout) -> None:
        self.mem.push(to_transitions(rollout))

    def deliver(self, batch_size, *, policy_version=None) -> Delivered:
        cols = fw.collate(self.mem.sample(batch_size))
        return Delivered(ids=cols["obs"][:, 0].astype(np.int64))

    def stored_ids(self):
        return np.array([int(t.obs[0]) for t in self.mem.items], dtype=np.int64)


class AdapterHarness(Harness):
    name = "conduit_minirl"
    version = "0.1"
    framework = "minirl"   # STAGE MAP: your framework's name (the report's header)
    framework_version = fw.__version__
    capabilities = frozenset({"replay", "prioritized", "onpolicy", "state", "native", "overlap", "convergence",
                              "shared_rng", "async"})

    def session(self, *, seed, capacity=10_000, prioritized=False, alpha=None, onpolicy=False,
                mode="sequential", staleness=0) -> Session:
        if onpolicy:
            return AdapterSession(ConduitRolloutStore(capacity, obs_shape=OBS_SHAPE, mode=mode))
        kw = {} if alpha is None else {"alpha": alpha}   # None: the memory's own default (the suite compares it)
        return AdapterSession(ConduitReplayMemory(capacity, obs_shape=OBS_SHAPE, seed=seed, prioritized=prioritized,
                                                  mode=mode, staleness=staleness, **kw))

    def native_session(self, *, seed, capacity=10_000, prioritized=False, alpha=None, onpolicy=False):
        return None if (prioritized or onpolicy) else NativeSession(capacity, seed)

    def shared_rng_sessions(self, *, seed, capacity=10_000):
        """STAGE MAP: both sides draw from ``random.Random(seed)`` as minirl's sampler does."""
        import random
        mem = ConduitReplayMemory(capacity, obs_shape=OBS_SHAPE, shared_rng=random.Random(seed))
        return AdapterSession(mem), NativeSession(capacity, seed)


    def convergence_workloads(self):
        return {"bandit": run_bandit}

    def async_queue(self, *, per_version, staleness):
        """STAGE MAP: the queue between your framework's asynchronous rollout producer and its trainer.
        Here conduit_core's VersionWindowQueue, as the suite's checks_async drives it; an adapter that
        puts its framework's own sample objects through it maps them in its own AsyncQueue."""
        return VersionWindowAsync(VersionWindowQueue(per_version=per_version, staleness=staleness))


def run_bandit(path: str, seed: int) -> ConvergenceResult:
    """minirl's reference workload, natively or with its memory replaced by Conduit's. STAGE MAP:
    a workload of your framework whose learning speed depends on what is delivered
    (docs/writing-an-adapter.md)."""
    if path == "native":
        reached, steps, returns = fw.train_bandit(fw.ReplayMemory(10_000, seed=seed), seed=seed)
        return ConvergenceResult(reached, steps, returns)
    mem = ConduitReplayMemory(10_000, obs_shape=OBS_SHAPE, seed=seed)
    try:
        sample = lambda b: {k: v.numpy() for k, v in mem.sample(b).items()}
        reached, steps, returns = fw.train_bandit(mem, seed=seed, sample=sample)
    finally:
        mem.close()
    return ConvergenceResult(reached, steps, returns)


def harness() -> AdapterHarness:
    return AdapterHarness()
