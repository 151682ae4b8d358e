"""Hooks: the framework-specific transforms adapters register at the control points.

    ingest hook    list[Rollout] -> list[Rollout]   runs once per rollout, before the write
                                                    (n-step pre-processing, GAE, GRPO log-prob/
                                                    reward/KL/advantage, dtype casts ...)
    delivery hook  Batch -> Batch                   runs on every delivered batch, after the
                                                    gather (framework collation, extra columns)

An ingest hook receives up to ``g_ing`` rollouts at once so it can vectorize across
them; it must return rollouts in the same order, with the same ``source`` and
``policy_version`` (the guards rely on them). Hooks used with the process worker must
be picklable (module-level functions or objects of importable classes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ..errors import SpecError


@dataclass
class Rollout:
    """One push from an actor: a time-ordered batch of transitions from one source."""

    data: Mapping[str, Any]
    source: int = 0
    policy_version: int = 0
    ticket: int = -1                 # acceptance order, assigned by the data plane
    rows: int = 0                    # input rows, counted at acceptance (for staleness)
    info: dict = field(default_factory=dict)


def run_ingest_hooks(hooks: list[Callable], rollouts: list[Rollout]) -> list[Rollout]:
    for hook in hooks:
        out = hook(rollouts)
        if not isinstance(out, list) or len(out) != len(rollouts):
            raise SpecError(f"ingest hook {getattr(hook, '__name__', type(hook).__name__)}",
                            f"a list of {len(rollouts)} rollouts (one per input, same order)",
                            type(out).__name__ if not isinstance(out, list) else f"{len(out)} rollouts",
                            "return the transformed rollouts; drop rows inside a rollout, not whole rollouts")
        for a, b in zip(rollouts, out):
            if (a.source, a.policy_version, a.ticket) != (b.source, b.policy_version, b.ticket):
                raise SpecError(f"ingest hook {getattr(hook, '__name__', type(hook).__name__)}",
                                "rollouts with unchanged source, policy_version and ticket",
                                f"rollout {a.ticket} changed", "copy them with dataclasses.replace(r, data=...)")
        rollouts = out
    return rollouts
