"""Stable-Baselines3's replay buffers with Conduit's data plane as their storage.

``ConduitReplayBuffer`` and ``ConduitDictReplayBuffer`` subclass SB3's ``ReplayBuffer`` and
``DictReplayBuffer`` and keep their calls: ``add(obs, next_obs, action, reward, done, infos)``
once per vectorised env step, ``sample(batch_size, env)`` returning SB3's sample tuples of
tensors. SB3's off-policy algorithms (DQN, SAC, TD3) take them through
``replay_buffer_class=``. Each ``add`` stages one step (its ``n_envs`` rows, env order), a block of
steps is one ingestion, flushed before any read, and each ``sample`` is one delivery; the rows live
in Conduit's ring, not in SB3's arrays.

What a learner receives is SB3's, value for value: the same fields, dtypes and shapes, ``dones``
as SB3 computes them (``done`` without the time-limit cut when ``handle_timeout_termination``),
VecNormalize applied at sampling as SB3 applies it. SB3 draws a position uniformly among the
stored steps, then an env uniformly, so every stored transition is equally likely; Conduit's
uniform selector draws over the same stored transitions (the same ring, oldest overwritten
first). With ``sb3_stream=True`` the draw consumes numpy's global stream call for call as
SB3's does, so both deliver the same rows in the same order and training is bit-identical
under one seed: the differential tests' mode, and the exact check of the conformance suite.
"""

from __future__ import annotations

import math
import weakref
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import DictReplayBuffer, ReplayBuffer
from stable_baselines3.common.type_aliases import DictReplayBufferSamples, ReplayBufferSamples

from conduit_core import (ConfigError, ExperienceBuffer, ExperienceDataPlane, ExperienceSpec, FieldSpec, Schedule,
                          SpecError, Uniform)

# steps staged before one ingestion (flushed earlier by any read): see _ConduitStorage._store
STAGED_STEPS = 64
# keyword arguments of SB3's n-step buffer, refused with a reason rather than a TypeError
_NSTEP_KWARGS = ("n_steps", "gamma")


def _space_dtype(space: spaces.Space) -> np.dtype:
    return np.dtype(space.dtype)


def _column(name: str, value: Any, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """``value`` as one env step's column of ``shape`` (n_envs first): SB3 reshapes what broadcasts
    into its arrays; anything of another size is refused here, naming the field."""
    arr = np.asarray(value, dtype)
    if arr.size != math.prod(shape):
        raise SpecError(name, f"{math.prod(shape)} values, shape {shape} (n_envs first)", f"shape {arr.shape}",
                        f"pass the vectorised env's {name} for one step (the space's shape, one row per env)")
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():   # (checked here: staged rows are stored later)
        bad = np.flatnonzero(~np.isfinite(arr.ravel()))
        raise SpecError(name, "finite values (SB3 would store NaN and inf; Conduit refuses them)",
                        f"{bad.size} non-finite of {arr.size}, the first at flat index {bad[0]}: {arr.ravel()[bad[0]]}",
                        "find where the env or the policy produces NaN or inf (a VecCheckNan wrapper names the step)")
    return arr.reshape(shape)


def _refuse_unsupported(optimize_memory_usage: bool, extra: dict[str, Any]) -> None:
    if optimize_memory_usage:
        raise ConfigError("optimize_memory_usage", "False", True,
                          "drop optimize_memory_usage: Conduit stores next_obs beside obs (the ring never "
                          "shares a row between two transitions), so SB3's memory-saving variant has no meaning here")
    nstep = sorted(set(extra) & set(_NSTEP_KWARGS))
    if nstep:
        raise ConfigError(f"replay_buffer_kwargs[{nstep[0]!r}]", "no n-step arguments (this adapter serves "
                          "one-step transitions)", {k: extra[k] for k in nstep},
                          "use SB3's own NStepReplayBuffer for n-step returns: it shortens a window at the newest "
                          "stored step, a rule this adapter does not certify")
    if extra:
        raise ConfigError("replay_buffer_kwargs", "the arguments of SB3's ReplayBuffer plus sb3_stream and "
                          "schedule", sorted(extra), "remove them")


class _ConduitStorage:
    """The part both buffers share: SB3's position bookkeeping over a Conduit data plane."""

    edp: ExperienceDataPlane

    def _open(self, spec: ExperienceSpec, *, sb3_stream: bool, schedule: Schedule | None,
              seed: int | None = None) -> None:
        """A fresh data plane. ``seed``: its selector's; None draws one from numpy's global stream,
        as SB3's ``set_random_seed`` seeds it (at construction only: a reset or a load draws from
        the buffer's own seed stream, so SB3's exploration stream moves as it does with SB3's buffer)."""
        self.sb3_stream = bool(sb3_stream)
        self._spec = spec
        self._schedule = schedule or Schedule.sequential()
        if self.sb3_stream and not self._schedule.draws_at_once:
            raise ConfigError("schedule", "Schedule.sequential() with delivery_granularity=1 when sb3_stream=True",
                              self._schedule, "drop sb3_stream, or the schedule: a schedule that draws batches "
                              "ahead would consume numpy's global stream out of SB3's order (and on a worker "
                              "thread), so training would no longer be SB3's bit for bit")
        self.last_sampled = None   # the Conduit batch behind the latest sample(): its provenance (seqs, staleness)
        self._staged: dict[str, np.ndarray] | None = None
        self._staged_rows = 0
        self._stage_steps = min(STAGED_STEPS, self.buffer_size)   # (a block never exceeds the ring)
        # the ring holds what SB3's arrays hold: buffer_size steps of n_envs transitions
        self.capacity = self.buffer_size * self.n_envs
        if self.sb3_stream:   # (weakly: the data plane keeps no buffer alive, and closes when it is collected)
            draw = weakref.WeakMethod(self._draw_as_sb3)
            selector = Uniform(draw=lambda count, batch_size: draw()(count, batch_size))
        else:
            selector = Uniform()
        if seed is None:   # the selector's own stream follows SB3's seed (set_random_seed seeds numpy's first)
            seed = int(np.random.randint(0, 2**31 - 1)) if not self.sb3_stream else 0
        self._seeds = np.random.default_rng(seed)   # seeds of later planes (reset), SB3's stream untouched
        buf = ExperienceBuffer(spec=spec, capacity=self.capacity, selector=selector, seed=seed)
        self.edp = ExperienceDataPlane(buffer=buf, schedule=self._schedule)
        # SB3 never closes a replay buffer: the data plane is closed when the buffer is collected
        self._release = weakref.finalize(self, self.edp.close)

    def _draw_as_sb3(self, count: int, batch_size: int) -> np.ndarray:
        """SB3's draw, call for call on numpy's global stream (``BaseBuffer.sample``, then the env
        index in ``_get_samples``), as positions among the ``count`` stored rows, oldest first."""
        upper = self.buffer_size if self.full else self.pos
        if count != upper * self.n_envs:
            raise ConfigError("sb3_stream", f"the ring holding the {upper * self.n_envs} rows SB3's bookkeeping "
                              "counts", f"{count} rows", "report it: rows reached the ring other than by add() "
                              "and flush() (a bug in this adapter)")
        step = np.random.randint(0, upper, size=batch_size)
        env = np.random.randint(0, high=self.n_envs, size=(batch_size,))
        slot = step * self.n_envs + env
        oldest = self.pos * self.n_envs if self.full else 0
        return (slot - oldest) % self.capacity

    def _advance(self) -> None:
        self.pos += 1
        if self.pos == self.buffer_size:
            self.full = True
            self.pos = 0

    def _timeouts(self, done: np.ndarray, infos: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
        """(terminated, truncated) per env, as SB3's sampled ``dones`` read them: a time limit
        is a truncation only when ``handle_timeout_termination`` (else SB3 trains on it as terminal)."""
        done = _column("done", done, np.dtype(bool), (self.n_envs,))
        if not self.handle_timeout_termination:   # (SB3 then reads no infos)
            return done, np.zeros(self.n_envs, bool)
        if len(infos) != self.n_envs:
            raise ConfigError("infos", f"one dict per env ({self.n_envs})", len(infos),
                              "pass the infos of the vectorised step as SB3's collect_rollouts does")
        if not done.any():
            return done, np.zeros(self.n_envs, bool)
        cut = np.array([bool(info.get("TimeLimit.truncated", False)) for info in infos])
        return done & ~cut, done & cut

    def _store(self, columns: dict[str, np.ndarray]) -> None:
        """Stage one step's rows; they are ingested as one rollout of up to ``STAGED_STEPS`` steps (at
        most the ring's) when the block fills or before anything reads the buffer (a sample, a save,
        ``flush``).
        SB3 adds one step at a time, and one ingestion per step costs the data plane's per-call
        work each time: the block gives it once per block (ingestion granularity), with the same rows
        in the same order stored before any read, so no sample can tell. The columns were validated
        by ``add`` (shape, dtype, finite), so a block's ingestion has nothing left to refuse."""
        rows = self.n_envs
        if self._staged_rows == 0:
            self._staged_from = (self.pos, self.full)   # SB3's bookkeeping, to undo a block never stored
        if self._staged is None:
            cap = self._stage_steps * rows
            self._staged = {k: np.empty((cap, *v.shape[1:]), v.dtype) for k, v in columns.items()}
        at = self._staged_rows
        for k, v in columns.items():
            self._staged[k][at:at + rows] = v
        self._staged_rows = at + rows
        self._advance()
        if self._staged_rows == self._stage_steps * rows:
            self.flush()

    def flush(self) -> None:
        """Ingest the staged steps now (every read of the buffer does this first)."""
        n = self._staged_rows
        if n:
            try:
                self.edp.ingest({k: v[:n] for k, v in self._staged.items()})
            except BaseException:   # nothing of the block was stored: SB3's count goes back with it
                self.pos, self.full = self._staged_from
                self._staged_rows = 0
                raise
            if self._schedule.is_overlapped:   # queued for the worker, which reads it later: not reused
                self._staged = None            # (sequential: stored before ingest returns, reused)
            self._staged_rows = 0

    def _delivered(self, batch_size: int) -> Any:
        self.flush()
        if self.size() == 0:
            raise ConfigError("replay buffer", "at least one transition to sample", "an empty buffer",
                              "add() transitions before sampling (SB3's learning_starts)")
        self.last_sampled = self.edp.deliver(int(batch_size))
        return self.last_sampled

    def _tensor(self, col: th.Tensor) -> th.Tensor:
        return col if col.device == self.device else col.to(self.device)

    def reset(self) -> None:
        """Empty the buffer (SB3's reset): a fresh data plane in place of the old one."""
        super().reset()   # type: ignore[misc]
        self._release()   # (what was staged goes with it)
        self._open(self._spec, sb3_stream=self.sb3_stream, schedule=self._schedule,
                   seed=int(self._seeds.integers(2**31 - 1)))

    def close(self) -> None:
        """Store what is staged, then release the data plane (its worker thread, if the schedule
        has one). Idempotent."""
        if self._release.alive:
            self.flush()
        self._release()

    # SB3 saves a replay buffer by pickling it (save_replay_buffer): the data plane's state
    # travels in its own format, never its threads or locks
    def __getstate__(self) -> dict:
        self.flush()
        state = {k: v for k, v in self.__dict__.items() if k not in ("edp", "_release", "_staged")}
        state["edp_state"] = self.edp.state_dict()
        return state

    def __setstate__(self, state: dict) -> None:
        saved = state.pop("edp_state")
        self.__dict__.update(state)
        self._staged = None
        seeds = self._seeds
        self._open(self._spec, sb3_stream=self.sb3_stream, schedule=self._schedule, seed=0)   # (the load sets it)
        self._seeds = seeds
        self.edp.load_state_dict(saved)


class ConduitReplayBuffer(_ConduitStorage, ReplayBuffer):
    """SB3's ``ReplayBuffer`` served by Conduit. Extra arguments: ``sb3_stream`` (draw from numpy's
    global stream exactly as SB3 does, for bit-identical training), ``schedule`` (Conduit's
    schedule; sequential by default)."""

    def __init__(self, buffer_size: int, observation_space: spaces.Space, action_space: spaces.Space,
                 device: th.device | str = "auto", n_envs: int = 1, optimize_memory_usage: bool = False,
                 handle_timeout_termination: bool = True, *, sb3_stream: bool = False,
                 schedule: Schedule | None = None, **extra: Any):
        _refuse_unsupported(optimize_memory_usage, extra)
        if isinstance(observation_space, spaces.Dict):
            raise ConfigError("observation_space", "a non-Dict space", "Dict",
                              "use ConduitDictReplayBuffer for dict observations")
        super(ReplayBuffer, self).__init__(buffer_size, observation_space, action_space, device, n_envs=n_envs)
        self.buffer_size = max(buffer_size // n_envs, 1)
        self.optimize_memory_usage = False
        self.handle_timeout_termination = handle_timeout_termination
        self._obs_dtype = _space_dtype(observation_space)
        self._action_dtype = np.dtype(self._maybe_cast_dtype(action_space.dtype))
        spec = ExperienceSpec([
            FieldSpec("obs", self.obs_shape, self._obs_dtype),
            FieldSpec("action", (self.action_dim,), self._action_dtype),
            FieldSpec("reward", (), np.float32),
            FieldSpec("next_obs", self.obs_shape, self._obs_dtype),
            FieldSpec("terminated", (), bool), FieldSpec("truncated", (), bool)])
        self._open(spec, sb3_stream=sb3_stream, schedule=schedule)

    def add(self, obs: np.ndarray, next_obs: np.ndarray, action: np.ndarray, reward: np.ndarray,
            done: np.ndarray, infos: list[dict[str, Any]]) -> None:
        shape = (self.n_envs, *self.obs_shape)
        terminated, truncated = self._timeouts(done, infos)
        self._store({"obs": _column("obs", obs, self._obs_dtype, shape),
                     "action": _column("action", action, self._action_dtype, (self.n_envs, self.action_dim)),
                     "reward": _column("reward", reward, np.float32, (self.n_envs,)),
                     "next_obs": _column("next_obs", next_obs, self._obs_dtype, shape),
                     "terminated": terminated, "truncated": truncated})

    def sample(self, batch_size: int, env=None) -> ReplayBufferSamples:
        b = self._delivered(batch_size)
        obs, next_obs, reward = b["obs"], b["next_obs"], b["reward"].reshape(-1, 1)
        if env is not None:   # VecNormalize: SB3 normalises the sampled numpy arrays
            obs = th.as_tensor(self._normalize_obs(obs.numpy(), env))
            next_obs = th.as_tensor(self._normalize_obs(next_obs.numpy(), env))
            reward = th.as_tensor(self._normalize_reward(reward.numpy(), env))
        return ReplayBufferSamples(self._tensor(obs), self._tensor(b["action"]), self._tensor(next_obs),
                                   self._tensor(b["terminated"].to(th.float32).reshape(-1, 1)), self._tensor(reward))

    def _get_samples(self, batch_inds: np.ndarray, env=None) -> ReplayBufferSamples:
        raise NotImplementedError("ConduitReplayBuffer.sample draws and gathers in Conduit; there are no SB3 "
                                  "positions to gather from")


class ConduitDictReplayBuffer(_ConduitStorage, DictReplayBuffer):
    """SB3's ``DictReplayBuffer`` served by Conduit: each observation key is a field of its own
    (``obs.KEY``, ``next_obs.KEY``; the latter declared as looking one step ahead)."""

    def __init__(self, buffer_size: int, observation_space: spaces.Dict, action_space: spaces.Space,
                 device: th.device | str = "auto", n_envs: int = 1, optimize_memory_usage: bool = False,
                 handle_timeout_termination: bool = True, *, sb3_stream: bool = False,
                 schedule: Schedule | None = None, **extra: Any):
        _refuse_unsupported(optimize_memory_usage, extra)
        if not isinstance(observation_space, spaces.Dict):
            raise ConfigError("observation_space", "a gymnasium.spaces.Dict", type(observation_space).__name__,
                              "use ConduitReplayBuffer for array observations")
        super(ReplayBuffer, self).__init__(buffer_size, observation_space, action_space, device, n_envs=n_envs)
        self.buffer_size = max(buffer_size // n_envs, 1)
        self.optimize_memory_usage = False
        self.handle_timeout_termination = handle_timeout_termination
        self._keys = list(self.obs_shape)
        self._obs_dtypes = {k: _space_dtype(observation_space[k]) for k in self._keys}
        self._action_dtype = np.dtype(self._maybe_cast_dtype(action_space.dtype))
        fields = [FieldSpec(f"obs.{k}", self.obs_shape[k], self._obs_dtypes[k]) for k in self._keys]
        fields += [FieldSpec(f"next_obs.{k}", self.obs_shape[k], self._obs_dtypes[k], window_step="last")
                   for k in self._keys]
        fields += [FieldSpec("action", (self.action_dim,), self._action_dtype), FieldSpec("reward", (), np.float32),
                   FieldSpec("terminated", (), bool), FieldSpec("truncated", (), bool)]
        self._open(ExperienceSpec(fields), sb3_stream=sb3_stream, schedule=schedule)

    def add(self, obs: dict[str, np.ndarray], next_obs: dict[str, np.ndarray], action: np.ndarray,
            reward: np.ndarray, done: np.ndarray, infos: list[dict[str, Any]]) -> None:
        for name, value in (("obs", obs), ("next_obs", next_obs)):
            if not isinstance(value, dict) or set(value) != set(self._keys):
                got = sorted(value) if isinstance(value, dict) else type(value).__name__
                raise ConfigError(name, f"a dict with the observation space's keys {self._keys}", got,
                                  "pass the vectorised env's dict observation")
        terminated, truncated = self._timeouts(done, infos)
        cols = {}
        for k in self._keys:
            shape = (self.n_envs, *self.obs_shape[k])
            cols[f"obs.{k}"] = _column(f"obs[{k!r}]", obs[k], self._obs_dtypes[k], shape)
            cols[f"next_obs.{k}"] = _column(f"next_obs[{k!r}]", next_obs[k], self._obs_dtypes[k], shape)
        cols.update({"action": _column("action", action, self._action_dtype, (self.n_envs, self.action_dim)),
                     "reward": _column("reward", reward, np.float32, (self.n_envs,)),
                     "terminated": terminated, "truncated": truncated})
        self._store(cols)

    def sample(self, batch_size: int, env=None) -> DictReplayBufferSamples:
        b = self._delivered(batch_size)
        obs = {k: b[f"obs.{k}"] for k in self._keys}
        next_obs = {k: b[f"next_obs.{k}"] for k in self._keys}
        reward = b["reward"].reshape(-1, 1)
        if env is not None:
            obs = {k: th.as_tensor(v) for k, v in self._normalize_obs({k: v.numpy() for k, v in obs.items()}, env).items()}
            next_obs = {k: th.as_tensor(v)
                        for k, v in self._normalize_obs({k: v.numpy() for k, v in next_obs.items()}, env).items()}
            reward = th.as_tensor(self._normalize_reward(reward.numpy(), env))
        return DictReplayBufferSamples(
            observations={k: self._tensor(v) for k, v in obs.items()}, actions=self._tensor(b["action"]),
            next_observations={k: self._tensor(v) for k, v in next_obs.items()},
            dones=self._tensor(b["terminated"].to(th.float32).reshape(-1, 1)), rewards=self._tensor(reward))

    def _get_samples(self, batch_inds: np.ndarray, env=None) -> DictReplayBufferSamples:
        raise NotImplementedError("ConduitDictReplayBuffer.sample draws and gathers in Conduit; there are no SB3 "
                                  "positions to gather from")
