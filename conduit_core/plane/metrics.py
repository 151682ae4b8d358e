"""Metrics as data: what each control point cost, and who waited for it.

``blocked_s`` is the time the *caller* spent inside the control point's API (the
exposed experience-path latency); ``busy_s`` is the time its operator worked,
wherever it ran (inline or in a background worker). Overlap shows up as
``busy_s > blocked_s``.
"""

from __future__ import annotations

from typing import Any

import functools
import threading
import time
from dataclasses import asdict, dataclass, field


@dataclass
class ControlPointMetrics:
    calls: int = 0
    items_in: int = 0
    items_out: int = 0
    blocked_s: float = 0.0
    busy_s: float = 0.0
    queue_depth: int = 0
    max_queue_depth: int = 0

    def copy(self) -> "ControlPointMetrics":
        return ControlPointMetrics(**asdict(self))


@dataclass(frozen=True)
class MetricsSnapshot:
    """A consistent copy of every counter at one instant."""

    ingest: ControlPointMetrics
    deliver: ControlPointMetrics
    priorities: ControlPointMetrics
    prefetch_hits: int = 0
    prefetch_discards: int = 0
    dropped_stale: int = 0
    buffer_size: int = 0
    inserted: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def exposed_s(self) -> float:
        """Total caller-visible experience-path time: ingestion + delivery + priority updates."""
        return self.ingest.blocked_s + self.deliver.blocked_s + self.priorities.blocked_s

    def to_dict(self) -> dict:
        return asdict(self) | {"exposed_s": self.exposed_s}

    def scalars(self) -> dict[str, float]:
        """One flat name -> number per counter, for a framework's tracker (RLlib's result dict,
        SB3's logger): the buffer's size and rows inserted, the exposed time,
        and per control point its calls and the time the caller was blocked in it and its
        operator busy (milliseconds, cumulative); the prepared-batch and stale-drop counters."""
        out: dict[str, float] = {"buffer_size": self.buffer_size, "inserted": self.inserted,
                                 "exposed_ms": self.exposed_s * 1e3}
        for name in ("ingest", "deliver", "priorities"):
            point = getattr(self, name)
            out[f"{name}_calls"] = point.calls
            out[f"{name}_blocked_ms"] = point.blocked_s * 1e3
            out[f"{name}_busy_ms"] = point.busy_s * 1e3
        out.update(prefetch_hits=self.prefetch_hits, prefetch_discards=self.prefetch_discards,
                   dropped_stale=self.dropped_stale)
        return out


class MetricsRecorder:
    """Thread-safe counters behind ``ExperienceDataPlane.metrics()``."""

    POINTS = ("ingest", "deliver", "priorities")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._points: dict[str, ControlPointMetrics] = {}   # (one dict for good: blocked() holds it)
        # blocked(point): a context that adds the time spent inside it to point's blocked time (a
        # C-level partial of a plain object, not a generator: every data-plane call enters one)
        self.blocked = functools.partial(_Blocked, self._lock, self._points)
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self._points.update({p: ControlPointMetrics() for p in self.POINTS})
            self.prefetch_hits = 0
            self.prefetch_discards = 0

    def add_blocked(self, point: str, seconds: float) -> None:
        with self._lock:
            m = self._points[point]
            m.blocked_s += seconds
            m.calls += 1

    def add_call(self, point: str, blocked_s: float, busy_s: float | None = None, *, items_in: int = 0,
                 items_out: int = 0) -> None:
        """A call's ``add_blocked`` and ``add_busy`` in one step (a hot path's one metrics call in
        place of ``blocked()`` and ``add_busy``); ``busy_s`` None: the same as ``blocked_s`` (the
        calling thread did the work the whole time, a rate limit's wait included, as ``add_busy``
        counts it on the other routes)."""
        with self._lock:
            m = self._points[point]
            m.blocked_s += blocked_s
            m.busy_s += blocked_s if busy_s is None else busy_s
            m.calls += 1
            m.items_in += items_in
            m.items_out += items_out

    def add_busy(self, point: str, seconds: float, *, items_in: int = 0, items_out: int = 0) -> None:
        with self._lock:
            m = self._points[point]
            m.busy_s += seconds
            m.items_in += items_in
            m.items_out += items_out

    def set_queue(self, point: str, depth: int) -> None:
        with self._lock:
            m = self._points[point]
            m.queue_depth = depth
            m.max_queue_depth = max(m.max_queue_depth, depth)

    def count(self, name: str, k: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + k)

    def snapshot(self, **kw: Any) -> MetricsSnapshot:
        with self._lock:
            return MetricsSnapshot(ingest=self._points["ingest"].copy(), deliver=self._points["deliver"].copy(),
                                   priorities=self._points["priorities"].copy(), prefetch_hits=self.prefetch_hits,
                                   prefetch_discards=self.prefetch_discards, **kw)


class _Blocked:
    """``MetricsRecorder.add_blocked`` for the time inside the context, with the recorder's
    lock and counters handed over (every data-plane call ends here: no further call)."""
    __slots__ = ("lock", "points", "point", "t0")

    def __init__(self, lock, points: dict, point: str):
        self.lock, self.points, self.point = lock, points, point

    def __enter__(self) -> None:
        self.t0 = time.perf_counter()

    def __exit__(self, *exc) -> None:
        seconds = time.perf_counter() - self.t0
        with self.lock:
            m = self.points[self.point]
            m.blocked_s += seconds
            m.calls += 1
