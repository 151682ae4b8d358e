"""Drop-in replacements for the framework's experience storage, backed by Conduit."""

from __future__ import annotations

import numpy as np
import torch

from conduit_core import (ExperienceBuffer, ExperienceDataPlane, ExperienceSpec, Fifo, Prioritized, Schedule,
                          Uniform)

# STAGE MAP: import your framework's transition type and collate function here.
from conduit_conformance.examples.minirl import Transition, collate


def to_columns(transitions: list[Transition]) -> dict[str, np.ndarray]:
    """Ingestion transform: the framework's per-transition objects -> columns, once.
    STAGE MAP: replace with your framework's rollout format."""
    return collate(transitions)


def spec_for(obs_shape: tuple[int, ...]) -> ExperienceSpec:
    return ExperienceSpec.transition(obs_shape=obs_shape, obs_dtype=torch.float32, action_dtype=torch.int64)


def _plane(obs_shape, capacity, selector, mode, staleness, seed) -> ExperienceDataPlane:
    buf = ExperienceBuffer(spec=spec_for(obs_shape), capacity=capacity, selector=selector, seed=seed)
    sched = Schedule.overlapped(staleness=staleness) if mode == "overlapped" else Schedule.sequential()
    return ExperienceDataPlane(buffer=buf, schedule=sched)


class ConduitReplayMemory:
    """Same calls as minirl's ReplayMemory; sample() returns columns (a Conduit Batch)."""

    def __init__(self, capacity: int, *, obs_shape: tuple[int, ...], seed: int = 0, prioritized: bool = False,
                 alpha: float = 0.6, mode: str = "sequential", staleness: int = 0, shared_rng=None):
        """``shared_rng``: a ``random.Random`` to draw from exactly as minirl's ``ReplayMemory.sample``
        does (one ``randrange(len(items))`` per item, oldest item first), so this memory delivers
        the same rows as minirl's own from the same seed. STAGE MAP: mirror your sampler's calls."""
        if shared_rng is not None and not prioritized:
            selector = Uniform(draw=lambda count, batch: np.array([shared_rng.randrange(count) for _ in range(batch)]))
        else:
            selector = Prioritized(alpha=alpha) if prioritized else Uniform()
        self.edp = _plane(obs_shape, capacity, selector, mode, staleness, seed)

    def push(self, transitions: list[Transition], *, source: int = 0) -> None:
        self.edp.ingest(to_columns(transitions), source=source)

    def push_columns(self, columns: dict, *, source: int = 0) -> None:
        self.edp.ingest(columns, source=source)

    def sample(self, batch_size: int):
        return self.edp.deliver(batch_size)

    def update_priorities(self, batch, priorities) -> None:
        self.edp.update_priorities(batch, priorities)

    def __len__(self) -> int:
        return len(self.edp.buffer)

    def close(self) -> None:
        self.edp.close()


class ConduitRolloutStore:
    """Same calls as minirl's RolloutStore; drain() returns that version's rows once."""

    def __init__(self, capacity: int, *, obs_shape: tuple[int, ...], mode: str = "sequential"):
        self.edp = _plane(obs_shape, capacity, Fifo(), mode, 0, 0)

    def push(self, transitions: list[Transition], *, policy_version: int, source: int = 0) -> None:
        self.edp.ingest(to_columns(transitions), source=source, policy_version=policy_version)

    def push_columns(self, columns: dict, *, policy_version: int, source: int = 0) -> None:
        self.edp.ingest(columns, source=source, policy_version=policy_version)

    def drain(self, policy_version: int):
        return self.edp.deliver(None, policy_version=policy_version)

    def close(self) -> None:
        self.edp.close()
