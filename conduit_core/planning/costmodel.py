"""The cost model: predicted step time for each point of placement x overlap x granularity.

Pure functions of a measured ``Profile`` (per-operator costs, fixed + per item + per byte;
the learner's and the rest of the step's time; how much of the ingestion hook holds the
GIL) and the topology (bandwidths, latencies, core count). Overlap is a cost, not a free
lunch: a background operator competes with the learner for cores and, in a thread, for
the GIL.

Per learner step, with I rows ingested in ``rollouts`` rollouts and B rows delivered:

    ingest(g)  = ing.fixed * rollouts / ingest_granularity + ing.item * I + ing.byte * I*b + link(actors -> tier)
    deliver(g) = del.fixed / delivery_granularity + del.item * B + del.byte * B*b + link(tier -> learner)
    sequential: exposed = ingest + deliver + priorities
                step    = base + exposed
    thread:     exposed = handoff + priorities          (the caller only enqueues and pops)
                step    = max(base + exposed + interference * W, W)      W = ingest + deliver
    process:    as thread, W also carries the serialisation to and from the child

``interference`` is the share of the worker's time that still slows the caller (the GIL
for a thread, the missing spare core for either); it and ``handoff`` are calibrated from
one overlapped run per worker kind, the operator costs from two sequential runs at
different granularities (``fit_operator``). Placement enters through the topology's links
(the transfer part of each operator).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import itertools
from dataclasses import asdict, dataclass, field

import numpy as np

from ..errors import ConfigError
from .schedule import MODES, WORKERS

if TYPE_CHECKING:
    from .topology import Topology


@dataclass(frozen=True)
class OperatorCost:
    fixed_s: float = 0.0
    per_item_s: float = 0.0
    per_byte_s: float = 0.0

    def __call__(self, items: float, nbytes: float, calls: float = 1.0) -> float:
        return self.fixed_s * calls + self.per_item_s * items + self.per_byte_s * nbytes


@dataclass(frozen=True)
class Profile:
    """What a short profiling run measured for one workload (seconds per learner step unless
    noted). ``base_s`` is everything outside the experience path (learner, env, syncs);
    the overlap terms are calibrated from one overlapped run per worker kind."""

    base_s: float
    priorities_s: float              # caller time for priority updates (never overlapped)
    ingest: OperatorCost             # per operator call (fixed), per row, per byte
    deliver: OperatorCost
    rows_per_step: float
    rollouts_per_step: float
    batch_size: int
    transition_bytes: int
    thread_handoff_s: float = 30e-6      # caller-blocked per step with the thread worker
    thread_interference: float = 1.0     # share of the worker's time that slows the caller (GIL, cores)
    process_handoff_s: float = 60e-6     # caller-blocked per step with the process worker
    process_interference: float = 0.5
    process_s_per_byte: float = 2e-10    # serialising rollouts to the child and back
    staleness: int = 0                   # inserts a delivery may miss (bounds prepared batches' use)

    def to_dict(self) -> dict:
        return asdict(self)


EXECUTIONS = ("sequential", "thread", "process")  # how the operators run: inline, or a worker of that kind


@dataclass(frozen=True)
class Config:
    """One point of placement x overlap x granularity, in the data plane's own words
    (``Schedule``'s ``mode``, ``worker``, ``ingest_granularity``, ``delivery_granularity``;
    the adapters' options use the same names), so a choice carries over field for field."""

    placement: str = "host"          # a tier name (or a plan's name)
    mode: str = "sequential"         # Schedule.mode: sequential | overlapped
    worker: str = "thread"           # Schedule.worker (overlapped only): thread | process
    ingest_granularity: int = 1      # rollouts per ingestion operator call
    delivery_granularity: int = 1    # batches per delivery operator call

    def __post_init__(self) -> None:
        if self.mode not in MODES or self.worker not in WORKERS:
            raise ConfigError("Config.mode/worker", f"mode in {MODES}, worker in {WORKERS}",
                              (self.mode, self.worker), "use Schedule's values, e.g. mode='overlapped', "
                              "worker='process'")
        if self.mode == "sequential":  # no worker runs: one Config (and label) per point
            object.__setattr__(self, "worker", "thread")

    @classmethod
    def of(cls, placement: str, execution: str, ingest_granularity: int = 1,
           delivery_granularity: int = 1) -> "Config":
        """From an execution kind (one of ``EXECUTIONS``)."""
        if execution not in EXECUTIONS:
            raise ConfigError("execution", f"one of {EXECUTIONS}", repr(execution), "pick how the operators run")
        mode = "sequential" if execution == "sequential" else "overlapped"
        return cls(placement, mode, "thread" if mode == "sequential" else execution, ingest_granularity,
                   delivery_granularity)

    @property
    def execution(self) -> str:
        """'sequential', or the worker kind that runs the operators ahead."""
        return "sequential" if self.mode == "sequential" else self.worker

    @property
    def label(self) -> str:
        return f"{self.placement}/{self.execution}/ing{self.ingest_granularity}/del{self.delivery_granularity}"


@dataclass(frozen=True)
class Prediction:
    config: Config
    step_s: float
    exposed_s: float
    breakdown: dict = field(default_factory=dict)


def operator_times(config: Config, p: Profile, *, topology: Topology | None = None, learner: str = "host",
                   actors: str = "host") -> tuple[float, float]:
    """Ingestion and delivery operator time per step for this placement and granularity."""
    b = p.transition_bytes
    ing = p.ingest(p.rows_per_step, p.rows_per_step * b, calls=p.rollouts_per_step / config.ingest_granularity)
    # batches prepared ahead survive only while the inserts since their selection stay within
    # the staleness bound; the others are discarded and their work is wasted
    useful = max(1, min(config.delivery_granularity, 1 + int(p.staleness // max(p.rows_per_step, 1e-9))))
    g = config.delivery_granularity
    dlv = (p.deliver(p.batch_size * g, p.batch_size * g * b, calls=1.0)) / useful
    if topology is not None and config.placement in [t.name for t in topology.tiers]:
        host = "host" if any(t.name == "host" for t in topology.tiers) else config.placement
        # moving to another tier than the profiled host tier changes only the transfer part
        for src, dst, nb, sign in ((actors, config.placement, p.rows_per_step * b, 1),
                                   (actors, host, p.rows_per_step * b, -1)):
            ing += sign * topology.link(src, dst).seconds(nb) if topology.has_link(src, dst) else 0.0
        for src, dst, nb, sign in ((config.placement, learner, p.batch_size * b, 1),
                                   (host, learner, p.batch_size * b, -1)):
            dlv += sign * topology.link(src, dst).seconds(nb) if topology.has_link(src, dst) else 0.0
    return max(ing, 0.0), max(dlv, 0.0)


def predict(config: Config, p: Profile, *, cores: int, topology: Topology | None = None, learner: str = "host",
            actors: str = "host") -> Prediction:
    ing, dlv = operator_times(config, p, topology=topology, learner=learner, actors=actors)
    base = p.base_s
    if config.mode == "sequential":
        exposed = ing + dlv + p.priorities_s
        step = base + exposed
    else:
        thread = config.worker == "thread"
        extra = 0.0 if thread else p.process_s_per_byte * p.rows_per_step * p.transition_bytes * 2
        work = ing + dlv + extra
        handoff = p.thread_handoff_s if thread else p.process_handoff_s
        interference = p.thread_interference if thread else p.process_interference
        if cores < 2:  # no spare core: the worker's time is the caller's
            interference = 1.0
        exposed = handoff + p.priorities_s
        step = max(base + exposed + interference * work, work)
    return Prediction(config, step, exposed, {"ingest_s": ing, "deliver_s": dlv, "base_s": base})


def enumerate_configs(*, placements: Sequence[str] = ("host", "shm"), executions: Sequence[str] = EXECUTIONS,
                      ingest_granularities: Sequence[int] = (1, 4),
                      delivery_granularities: Sequence[int] = (1, 2, 4, 8)) -> list[Config]:
    """The search space: placement x overlap x ingestion and delivery granularity (>= 32 points)."""
    return [Config.of(pl, ex, gi, gd) for pl, ex, gi, gd in
            itertools.product(placements, executions, ingest_granularities, delivery_granularities)]


def rank(configs: list[Config], p: Profile, **kw: Any) -> list[Prediction]:
    return sorted((predict(c, p, **kw) for c in configs), key=lambda x: x.step_s)


def fit_operator(samples: list[tuple[float, float, float, float]]) -> OperatorCost:
    """Least squares (non-negative by clipping) of seconds ~ fixed*calls + item*items + byte*bytes
    from (calls, items, bytes, seconds) samples of one operator."""
    a = np.array([[c, i, nb] for c, i, nb, _ in samples], dtype=np.float64)
    y = np.array([s for *_, s in samples], dtype=np.float64)
    scale = a.max(axis=0)
    scale[scale == 0] = 1.0
    coef, *_ = np.linalg.lstsq(a / scale, y, rcond=None)
    coef = np.clip(coef / scale, 0.0, None)
    return OperatorCost(float(coef[0]), float(coef[1]), float(coef[2]))
