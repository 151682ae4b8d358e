"""gym's CartPole-v1 as an SRL environment, registered through SRL's own registry.

Every finished episode (terminated or truncated) is appended as one JSON line
``{"t": wall_time, "ret": return, "len": length}`` to ``returns_<pid>.jsonl`` in the directory
named by ``$CONDUIT_SRL_RETURNS_DIR`` (or the ``returns_dir`` argument); the file is line-buffered
and flushed per line, so a run whose workers are killed keeps every episode it finished.
"""

from __future__ import annotations

import json
import os
import time
from typing import List, Optional

import gym
import numpy as np

import rlsrl.api.env_utils as env_utils
from rlsrl.api.environment import Environment, StepResult

ENV_NAME = "conduit-cartpole"
RETURNS_DIR_VAR = "CONDUIT_SRL_RETURNS_DIR"


class _ReturnLog:
    """One file per process, opened on the first finished episode (after SRL forked the worker)."""

    def __init__(self, directory: Optional[str]):
        self.directory = directory
        self._fh = None
        self._pid = None

    def write(self, ret: float, length: int) -> None:
        if not self.directory:
            return
        if self._fh is None or self._pid != os.getpid():
            os.makedirs(self.directory, exist_ok=True)
            self._pid = os.getpid()
            self._fh = open(os.path.join(self.directory, f"returns_{self._pid}.jsonl"), "a", buffering=1)
        self._fh.write(json.dumps({"t": time.time(), "ret": float(ret), "len": int(length)}) + "\n")
        self._fh.flush()


_LOGS: dict = {}


def _log_for(directory: Optional[str]) -> _ReturnLog:
    # every env of an actor worker shares its process's file
    if directory not in _LOGS:
        _LOGS[directory] = _ReturnLog(directory)
    return _LOGS[directory]


class CartPoleEnvironment(Environment):
    """Single agent; observation ``{"obs": float32[4]}``, one discrete action of 2."""

    def __init__(self, seed: Optional[int] = None, returns_dir: Optional[str] = None,
                 env_id: str = "CartPole-v1"):
        self._env = gym.make(env_id)
        self._seed = seed
        self._seeded = False
        self._log = _log_for(returns_dir or os.environ.get(RETURNS_DIR_VAR))
        self._length = np.zeros(1, dtype=np.int32)
        self._return = np.zeros(1, dtype=np.float32)

    @property
    def agent_count(self) -> int:
        return 1

    @property
    def observation_spaces(self) -> List[dict]:
        return [{"obs": self._env.observation_space.shape}]

    @property
    def action_spaces(self):
        return [env_utils.DiscreteActionSpace(self._env.action_space)]

    def _info(self):
        return dict(episode_length=self._length.copy(), episode_return=self._return.copy())

    def reset(self) -> List[StepResult]:
        if not self._seeded and self._seed is not None:
            obs, _ = self._env.reset(seed=int(self._seed))
            self._env.action_space.seed(int(self._seed))
        else:
            obs, _ = self._env.reset()
        self._seeded = True
        self._length[:] = 0
        self._return[:] = 0
        return [StepResult(obs=dict(obs=np.asarray(obs, dtype=np.float32)),
                           reward=np.zeros(1, dtype=np.float32),
                           done=np.zeros(1, dtype=np.uint8),
                           info=self._info(),
                           truncated=np.zeros(1, dtype=np.uint8))]

    def step(self, actions) -> List[StepResult]:
        assert len(actions) == 1, len(actions)
        obs, reward, terminated, truncated, _ = self._env.step(int(np.asarray(actions[0].x).reshape(-1)[0]))
        self._length += 1
        self._return += reward
        if terminated or truncated:
            self._log.write(float(self._return[0]), int(self._length[0]))
        return [StepResult(obs=dict(obs=np.asarray(obs, dtype=np.float32)),
                           reward=np.array([reward], dtype=np.float32),
                           done=np.array([terminated], dtype=np.uint8),
                           info=self._info(),
                           truncated=np.array([truncated and not terminated], dtype=np.uint8))]

    def seed(self, seed=None):
        self._seed, self._seeded = seed, False
        return seed


def register(name: str = ENV_NAME) -> str:
    """Register the environment in SRL's registry (once per process), as SRL's legacy environments are
    (class name + module, imported where the environment is made); returns its name."""
    from rlsrl.api import environment
    if name not in environment.ALL_ENVIRONMENT_CLASSES:
        environment.register(name, "CartPoleEnvironment", __name__)
    return name
