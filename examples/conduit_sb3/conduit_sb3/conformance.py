"""The adapter's conformance harness: the suite drives ConduitReplayBuffer through SB3's own
calls (``add`` per env step, ``sample``), with SB3's ReplayBuffer as the oracle, and runs SB3's
DQN on CartPole both ways for the convergence level."""

from __future__ import annotations

import contextlib
import pickle

import numpy as np
import stable_baselines3
from gymnasium import spaces
from stable_baselines3.common.buffers import ReplayBuffer

from conduit_conformance import Delivered, Harness, Session, SyntheticRollout
from conduit_conformance.edp_session import stored_ids as plane_ids
from conduit_conformance.harness import OBS_DIM

from . import __version__
from .buffers import ConduitReplayBuffer
from .workloads import run_dqn_cartpole

# the suite's ids reach past 2**22; float32 holds them exactly (checks_rows.FIRST_ID)
OBS_SPACE = spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32)
ACTION_SPACE = spaces.Discrete(2)


def action_space_of(rollout: SyntheticRollout | None) -> spaces.Space:
    """The action space an env producing ``rollout`` would declare: ``Discrete(2)``, or a float32
    ``Box`` for the suite's continuous actions (``SyntheticRollout.action_dims``, SAC's and TD3's)."""
    dims = getattr(rollout, "action_dims", 0)
    return spaces.Box(-np.inf, np.inf, (dims,), np.float32) if dims else ACTION_SPACE


def add_rollout(buffer: ReplayBuffer, rollout: SyntheticRollout) -> None:
    """A synthetic rollout as SB3's collect_rollouts stores it: one add() per step (one env), the
    last step's done set by either flag, a time limit reported as ``TimeLimit.truncated``."""
    c = rollout.columns()
    for i in range(len(rollout.ids)):
        done = bool(c["terminated"][i] or c["truncated"][i])
        infos = [{"TimeLimit.truncated": True}] if c["truncated"][i] else [{}]
        buffer.add(c["obs"][i:i + 1], c["next_obs"][i:i + 1], np.array([c["action"][i]]),
                   np.array([c["reward"][i]]), np.array([done]), infos)


def delivered(samples, batch=None, *, discrete: bool = True) -> Delivered:
    """What SB3's DQN (SAC's, for continuous actions) reads from a sample, under the suite's names
    (``dones`` are SB3's: terminated); ``batch``: the Conduit batch behind it (its staleness stamp)."""
    obs = samples.observations.numpy().copy()
    actions = samples.actions.numpy()
    return Delivered(ids=obs[:, 0].astype(np.int64), handle=batch,
                     inserted_at_selection=None if batch is None else batch.inserted_at_selection,
                     rows={"obs": obs, "next_obs": samples.next_observations.numpy().copy(),
                           "action": (actions[:, 0] if discrete else actions).copy(),
                           "reward": samples.rewards.numpy()[:, 0].copy(),
                           "terminated": samples.dones.numpy()[:, 0] > 0})


class _OwnStream:
    """SB3's buffers draw from numpy's global stream; a session that must draw as if it were alone
    (the shared-stream pair, two sessions in one check) keeps its own copy of that stream."""

    def __init__(self, seed: int):
        saved = np.random.get_state()
        np.random.seed(seed)
        self.state = np.random.get_state()
        np.random.set_state(saved)

    @contextlib.contextmanager
    def active(self):
        saved = np.random.get_state()
        np.random.set_state(self.state)
        try:
            yield
        finally:
            self.state = np.random.get_state()
            np.random.set_state(saved)


class _LazyBuffer:
    """A session's buffer, built at its first rollout for that rollout's action space (an SB3
    buffer is built for one), or for ``Discrete(2)`` where something else comes first."""

    _buffer = None

    def __init__(self, make):
        self._make = make   # action space -> buffer

    @property
    def buffer(self):
        if self._buffer is None:
            self._buffer = self._make(ACTION_SPACE)
        return self._buffer

    @buffer.setter
    def buffer(self, value) -> None:
        self._buffer = value

    def _first(self, rollout) -> None:
        if self._buffer is None:
            self._buffer = self._make(action_space_of(rollout))

    @property
    def _discrete(self) -> bool:
        return isinstance(self.buffer.action_space, spaces.Discrete)


class AdapterSession(_LazyBuffer, Session):
    def __init__(self, make, seed: int):
        super().__init__(make)
        self.stream = _OwnStream(seed)

    def ingest(self, rollout: SyntheticRollout) -> None:
        self._first(rollout)
        add_rollout(self.buffer, rollout)

    def ingest_raw(self, columns, *, source: int = 0) -> None:
        n = len(np.asarray(columns.get("reward", [])))
        for i in range(n):
            self.buffer.add(*(np.asarray(columns[k])[i:i + 1] for k in ("obs", "next_obs", "action", "reward")),
                            np.asarray(columns["terminated"])[i:i + 1] | np.asarray(columns["truncated"])[i:i + 1],
                            [{"TimeLimit.truncated": bool(np.asarray(columns["truncated"])[i])}])

    def flush(self) -> None:
        # the data plane's flush only: SB3 never calls the buffer's own flush(), so neither does the
        # suite; sample() and a save must flush what add() staged by themselves
        self.buffer.edp.flush()

    def deliver(self, batch_size, *, policy_version=None) -> Delivered:
        with self.stream.active():
            samples = self.buffer.sample(batch_size)
        return delivered(samples, self.buffer.last_sampled, discrete=self._discrete)

    def stored_ids(self):
        self.buffer.flush()   # (what the buffer holds: the staged steps are SB3's stored ones)
        return plane_ids(self.buffer.edp)

    def state(self):
        return pickle.dumps(self.buffer)   # SB3's save_replay_buffer pickles the buffer

    def load_state(self, state) -> None:
        old, self.buffer = self.buffer, pickle.loads(state)
        old.close()

    def close(self) -> None:
        if self._buffer is not None:
            self._buffer.close()


class NativeSession(_LazyBuffer, Session):
    """SB3's own ReplayBuffer, added to and sampled as DQN does: the oracle."""

    def __init__(self, capacity: int, seed: int):
        super().__init__(lambda space: ReplayBuffer(capacity, OBS_SPACE, space, device="cpu"))
        self.stream = _OwnStream(seed)

    def ingest(self, rollout: SyntheticRollout) -> None:
        self._first(rollout)
        add_rollout(self.buffer, rollout)

    def deliver(self, batch_size, *, policy_version=None) -> Delivered:
        with self.stream.active():
            return delivered(self.buffer.sample(batch_size), discrete=self._discrete)

    def stored_ids(self):
        b = self.buffer
        order = np.r_[b.pos:b.buffer_size, 0:b.pos] if b.full else np.arange(b.pos)
        return b.observations[order, 0, 0].astype(np.int64)


class SB3Harness(Harness):
    name = "conduit_sb3"
    version = __version__
    framework = "stable-baselines3"
    framework_version = stable_baselines3.__version__
    capabilities = frozenset({"replay", "native", "shared_rng", "state", "overlap", "convergence", "continuous"})
    buffer_class = ConduitReplayBuffer   # a subclass under test (the mutation table's mutants) goes here

    def session(self, *, seed, capacity=10_000, prioritized=False, alpha=None, onpolicy=False,
                mode="sequential", staleness=0) -> Session:
        from conduit_core import Schedule
        schedule = Schedule.overlapped(staleness=staleness) if mode == "overlapped" else Schedule.sequential()
        stream = _OwnStream(seed)

        def make(action_space):
            with stream.active():   # the selector's seed drawn from numpy's stream, as under SB3's set_random_seed
                return self.buffer_class(capacity, OBS_SPACE, action_space, device="cpu", schedule=schedule)
        session = AdapterSession(make, seed)
        session.stream = stream
        return session

    def native_session(self, *, seed, capacity=10_000, prioritized=False, alpha=None, onpolicy=False):
        return None if (prioritized or onpolicy) else NativeSession(capacity, seed)

    def shared_rng_sessions(self, *, seed, capacity=10_000):
        """Both draw from numpy's global stream seeded with ``seed``, each from its own copy of it."""
        make = lambda action_space: self.buffer_class(capacity, OBS_SPACE, action_space, device="cpu", sb3_stream=True)
        return AdapterSession(make, seed), NativeSession(capacity, seed)

    def convergence_workloads(self):
        return {"dqn_cartpole": run_dqn_cartpole}

    def convergence_spread(self):
        """The native arm's spread, measured over 20 seeds (0-19) with
        ``CONDUIT_CONVERGENCE_SEEDS=0,...,19 conduit conformance sb3 --calibrate-convergence``
        (docs/results/convergence-power/2026-12-07-sb3-calibration.json)."""
        return {"dqn_cartpole": 0.55}


def harness() -> SB3Harness:
    return SB3Harness()


__all__ = ["SB3Harness", "harness", "add_rollout", "delivered"]
