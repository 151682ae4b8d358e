"""Scheduling: *when* (timing/overlap) and *in what sizes* (granularity) the
experience-path operators run. A Schedule is a frozen value; the data plane carries it out.

    sequential   every operator runs inline in the caller's call (today's semantics)
    overlapped   operators run ahead in a background worker:
                 'thread'  - same process; wins when operators release the GIL (large
                             gathers, torch ops) or when there are idle cores
                 'process' - ingestion transforms in a child process; wins for heavy
                             Python transforms, costs a copy each way

Semantic guards do not depend on the schedule: ``staleness`` bounds how many
accepted inserts an off-policy delivery may miss (0 = exactly sequential semantics).
"""

from __future__ import annotations

from typing import Any

from dataclasses import asdict, dataclass

from ..errors import ConfigError

MODES = ("sequential", "overlapped")
WORKERS = ("thread", "process")


@dataclass(frozen=True)
class Schedule:
    mode: str = "sequential"
    worker: str = "thread"
    ingest_granularity: int = 1     # g_ing: rollouts handled per ingestion operator call
    delivery_granularity: int = 1   # g_del: batches prepared per delivery operator call
    depth: int = 2                  # how many batches delivery may prepare ahead
    staleness: int = 0              # inserts an off-policy delivery may miss
    queue_size: int = 64            # bounded ingestion queue, in rollouts
    timeout: float = 60.0           # every wait ends after this many seconds

    @property
    def max_prepared(self) -> int:
        """Batches drawn but not handed out yet, at most: a delivery call's spares (g_del - 1)
        and, overlapped, what the worker prepares while fewer than ``depth`` wait."""
        spare = self.delivery_granularity - 1
        return self.depth + spare if self.is_overlapped else spare

    @property
    def draws_at_once(self) -> bool:
        """Every replay batch drawn by the call that hands it out, nothing prepared ahead
        (sequential, one batch per operator call): the data plane's delivery then needs no
        request or prepared entry."""
        return self.mode == "sequential" and self.delivery_granularity == 1

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError("Schedule.mode", f"one of {MODES}", repr(self.mode),
                              "use 'sequential' (inline) or 'overlapped' (background worker)")
        if self.worker not in WORKERS:
            raise ConfigError("Schedule.worker", f"one of {WORKERS}", repr(self.worker),
                              "use 'thread' or 'process'")
        for name in ("ingest_granularity", "delivery_granularity", "depth", "queue_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ConfigError(f"Schedule.{name}", "an int >= 1", repr(v), f"set {name} to 1 or more")
        if not isinstance(self.staleness, int) or self.staleness < 0:
            raise ConfigError("Schedule.staleness", "an int >= 0", repr(self.staleness),
                              "use 0 for the framework's exact semantics")
        if not self.timeout > 0:
            raise ConfigError("Schedule.timeout", "> 0 seconds", self.timeout, "every wait needs a timeout")

    @classmethod
    def sequential(cls, **kw: Any) -> "Schedule":
        return cls(mode="sequential", **kw)

    @classmethod
    def overlapped(cls, *, worker: str = "thread", **kw: Any) -> "Schedule":
        return cls(mode="overlapped", worker=worker, **kw)

    @property
    def is_overlapped(self) -> bool:
        return self.mode == "overlapped"

    def to_config(self) -> dict:
        return asdict(self)
