"""minirl: a deliberately small RL framework with the usual experience-path shape.

Actors ``push`` lists of transitions; an off-policy learner ``sample``s transition lists
from a ``ReplayMemory``; an on-policy learner ``drain``s a ``RolloutStore`` per policy
version. Storage is a Python list of tuples: per-transition objects on every path, the
pattern Conduit replaces. Its adapter lives in ``minirl_adapter.py``.
"""

from __future__ import annotations

import random
from typing import NamedTuple

import numpy as np

__version__ = "0.1"


class Transition(NamedTuple):
    obs: np.ndarray
    action: int
    reward: float
    next_obs: np.ndarray
    terminated: bool
    truncated: bool = False


class ReplayMemory:
    """Uniform replay over a bounded list (oldest evicted first)."""

    def __init__(self, capacity: int, *, seed: int = 0):
        self.capacity = capacity
        self.items: list[Transition] = []
        self.rng = random.Random(seed)

    def push(self, transitions: list[Transition]) -> None:
        for t in transitions:
            if np.asarray(t.obs).shape != np.asarray(transitions[0].obs).shape:
                raise ValueError("minirl: all observations in a push must have one shape")
        self.items.extend(transitions)
        del self.items[: max(0, len(self.items) - self.capacity)]

    def sample(self, batch_size: int) -> list[Transition]:
        return [self.items[self.rng.randrange(len(self.items))] for _ in range(batch_size)]

    def __len__(self) -> int:
        return len(self.items)


class RolloutStore:
    """On-policy storage: rollouts tagged with the policy version, drained once."""

    def __init__(self):
        self.items: list[tuple[int, Transition]] = []

    def push(self, transitions: list[Transition], *, policy_version: int) -> None:
        self.items.extend((policy_version, t) for t in transitions)

    def drain(self, policy_version: int) -> list[Transition]:
        out = [t for v, t in self.items if v == policy_version]
        self.items = []
        return out


def collate(transitions: list[Transition]) -> dict[str, np.ndarray]:
    """minirl's learner input: columns stacked from transition objects."""
    return {"obs": np.stack([t.obs for t in transitions]).astype(np.float32),
            "action": np.array([t.action for t in transitions], dtype=np.int64),
            "reward": np.array([t.reward for t in transitions], dtype=np.float32),
            "next_obs": np.stack([t.next_obs for t in transitions]).astype(np.float32),
            "terminated": np.array([t.terminated for t in transitions], dtype=bool),
            "truncated": np.array([t.truncated for t in transitions], dtype=bool)}
