"""The check registry: stable ids, the capability each check needs, its level."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

LEVELS = ("semantic", "convergence")


class CheckFailed(AssertionError):
    """A check found a violation; the message says what and, where it can, why."""


class CheckSkipped(Exception):
    """A check cannot run for this adapter; the message says why. Where the harness declares the
    capabilities the check needs, the runner reports it as a failure (a piece is missing)."""


class NotApplicable(CheckSkipped):
    """The framework itself has no path of this kind (e.g. no native prioritized buffer): a skip."""


@dataclass(frozen=True)
class Check:
    id: str
    level: str
    needs: frozenset[str]
    doc: str
    fn: Callable = field(compare=False, repr=False)


REGISTRY: dict[str, Check] = {}


def check(check_id: str, *, needs: tuple[str, ...] = (), level: str = "semantic"):
    """Register a check function ``fn(ctx)`` under a stable id."""
    if level not in LEVELS:
        raise ValueError(f"level: expected one of {LEVELS}, got {level!r}")

    def deco(fn):
        if check_id in REGISTRY:
            raise ValueError(f"check id {check_id!r} registered twice")
        REGISTRY[check_id] = Check(check_id, level, frozenset(needs), (fn.__doc__ or "").strip().split("\n")[0], fn)
        return fn
    return deco


def ensure(cond: bool, message: str) -> None:
    if not cond:
        raise CheckFailed(message)
