"""minirl: a deliberately small RL framework with the usual experience-path shape.

Actors ``push`` lists of transitions; an off-policy learner ``sample``s transition lists
from a ``ReplayMemory``; an on-policy learner ``drain``s a ``RolloutStore`` per policy
version. Storage is a Python list of tuples: per-transition objects on every path, the
pattern Conduit replaces. Its adapter is the package ``conduit_minirl`` next to this file.
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


def train_bandit(memory, *, steps: int = 4000, seed: int = 0, batch_size: int = 32, threshold: float = 0.7,
                 swap: int = 500, push=None, sample=None) -> tuple[bool, int, list[float]]:
    """minirl's reference workload: epsilon-greedy on a 2-armed Bernoulli bandit whose arms swap
    at step ``swap`` (p = 0.8, 0.2, then 0.2, 0.8), Q-values learned from replayed transitions.
    'Return' is the mean reward of the last 50 steps (looked at every 10); the result is the env
    steps from the swap until it exceeds ``threshold`` (relearning the better arm).

    How fast the learner relearns depends on what replay delivers, in both directions: uniform
    replay holds the transitions from before the swap in every batch's mix, so a delivery that
    favours newer rows relearns faster and one that favours older rows slower (the newest or oldest
    of three uniform draws per row: 0.23x and 5.1x native's steps on seeds 0, 1;
    ``python -m pytest tests/conformance/test_suite.py -k of_three``). A workload that learns
    whatever is delivered at one speed could not tell them apart.
    ``push(transitions)`` / ``sample(B) -> columns`` default to the memory's own calls."""
    rng = np.random.default_rng(seed)
    push = push or memory.push
    sample = sample or (lambda b: collate(memory.sample(b)))
    q = np.zeros(2)
    rewards: list[float] = []
    returns: list[float] = []
    obs = np.zeros(4, np.float32)
    for step in range(steps):
        eps = max(0.05, 1.0 - step / 200)
        a = int(rng.integers(2)) if rng.random() < eps else int(np.argmax(q))
        r = float(rng.random() < ((0.8, 0.2) if step < swap else (0.2, 0.8))[a])
        o = obs.copy()
        o[0] = step
        push([Transition(o, a, r, o, True)])
        rewards.append(r)
        if step >= batch_size:
            cols = sample(batch_size)
            for arm in (0, 1):
                m = cols["action"] == arm
                if m.any():
                    q[arm] += 0.1 * (float(np.mean(cols["reward"][m])) - q[arm])
        if step >= swap + 50 and step % 10 == 0:
            returns.append(float(np.mean(rewards[-50:])))
            if returns[-1] > threshold:
                return True, step + 1 - swap, returns
    return False, steps - swap, returns
