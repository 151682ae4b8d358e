"""The auto-tuner: profile the live run briefly, predict every configuration, switch to the best.

Used when an adapter is asked for ``mode="auto"``. It is driven by the caller's own
deliveries (one ``observe()`` per learner step), so it measures the real workload:

    settle      wait (within bounds) for the step time to be steady: ``is_steady``
    calibrate   sequential (ing 1, del 1), sequential (ing 4, del 2), thread, process: N steps each
    predict     every Config of placement x overlap x granularity (>= 32) with the cost model
    apply       migrate the buffer if the placement changed (one pageable or shared shard;
                other layouts keep theirs), then reschedule the data plane

Every candidate keeps the data plane's semantic guards (the same staleness bound), so
switching changes speed, never what the learner may receive.

The decision itself is pure: ``profile_from_phases`` turns measured phases into a cost-model
``Profile``; ``conduit tune`` drives the same function from whole framework iterations.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from dataclasses import dataclass, field

import numpy as np

from ..storage.shards import ShardSpec
from .costmodel import Config, Profile, enumerate_configs, fit_operator, operator_times, predict
from .schedule import Schedule

# The cost model's placements as buffer tiers: ``migrate`` carries a choice out.
PLACEMENT_TIER = {"host": "pageable", "shm": "shared"}


def current_placement(buffer) -> str | None:
    """The cost-model placement a buffer is in (one pageable or shared shard), else None (a
    layout the auto-tuner leaves alone: pinned, device, remote or several shards)."""
    shards = buffer.storage.shards
    if len(shards) != 1:
        return None
    return {tier: pl for pl, tier in PLACEMENT_TIER.items()}.get(shards[0].tier.value)


def migrate_to(edp, placement: str) -> None:
    """Move the buffer to ``placement`` (nothing lost or duplicated: see migration.py)."""
    edp.migrate(shards=[ShardSpec(PLACEMENT_TIER[placement], edp.buffer.capacity)], background=False)


PHASES = (Config.of("host", "sequential", 1, 1), Config.of("host", "sequential", 4, 2),
          Config.of("host", "thread", 1, 1), Config.of("host", "process", 1, 1))


def is_steady(times: list[float], *, window: int = 5, tol: float = 0.03) -> bool:
    """True when the run's step time has stopped drifting: the median of the last ``window``
    times is within ``tol`` (relative) of the median of the ``window`` before them. A pure
    test, so a profile can wait for steady state instead of a fixed warm-up (a profile taken
    while the run still speeds up over-predicts every configuration)."""
    if window < 1 or len(times) < 2 * window:
        return False
    last = statistics.median(times[-window:])
    prev = statistics.median(times[-2 * window:-window])
    return abs(last / prev - 1.0) <= tol


@dataclass(frozen=True)
class PhaseResult:
    """One profiling phase: a configuration, its wall time per learner step, and the data
    plane's metrics over the phase divided by its learner steps."""

    config: Config
    step_s: float
    per_step: dict  # ingest_calls, ingest_rows, ingest_busy_s, deliver_items, deliver_busy_s, exposed_s, priorities_s

    @classmethod
    def from_metrics(cls, config: Config, step_s: float, before, after, steps: float) -> "PhaseResult":
        d = lambda point, attr: (getattr(getattr(after, point), attr) - getattr(getattr(before, point), attr)) / steps
        return cls(config, step_s, {
            "ingest_calls": d("ingest", "calls"), "ingest_rows": d("ingest", "items_in"),
            "ingest_busy_s": d("ingest", "busy_s"), "deliver_items": d("deliver", "items_out"),
            "deliver_busy_s": d("deliver", "busy_s"),
            "handoff_s": d("ingest", "blocked_s") + d("deliver", "blocked_s"),
            "priorities_s": d("priorities", "blocked_s")})


def profile_from_phases(phases: list[PhaseResult], *, transition_bytes: int, batch_size: int,
                        staleness: int) -> Profile:
    """The cost model's inputs from measured phases (pure).

    Sequential phases at two or more granularities fit the operators (fixed per call, per row,
    per byte; least squares) and the base step (step minus exposed path, median). Overlapped
    phases calibrate, per worker kind, the caller's hand-off and the interference factor: the
    share of the worker's predicted operator time that still shows up in the caller's step."""
    seq = [p for p in phases if p.config.mode == "sequential"]
    if len({(p.config.ingest_granularity, p.config.delivery_granularity) for p in seq}) < 2:
        raise ValueError("profile_from_phases: needs sequential phases at two granularities to separate "
                         "fixed from per-item cost")
    tb = transition_bytes
    ing, dlv, base, prio = [], [], [], []
    for p in seq:
        s = p.per_step
        # in a sequential phase the operator calls are exactly the caller's: calls per step = 1/g
        ing.append((s["ingest_calls"], s["ingest_rows"], s["ingest_rows"] * tb, s["ingest_busy_s"]))
        dlv.append((1.0 / p.config.delivery_granularity, batch_size, batch_size * tb, s["deliver_busy_s"]))
        prio.append(s["priorities_s"])
        base.append(p.step_s - s["handoff_s"] - s["priorities_s"])
    rows = statistics.median(p.per_step["ingest_rows"] for p in seq)
    # rollouts per step at ingest_granularity 1 (calls scale as 1/ingest_granularity)
    rollouts = statistics.median(p.per_step["ingest_calls"] * p.config.ingest_granularity for p in seq)
    p0 = Profile(base_s=max(statistics.median(base), 0.0), priorities_s=statistics.median(prio),
                 ingest=fit_operator(ing), deliver=fit_operator(dlv), rows_per_step=max(rows, 1e-9),
                 rollouts_per_step=max(rollouts, 1e-9), batch_size=batch_size, transition_bytes=tb,
                 staleness=staleness)
    calib = {}
    for kind in ("thread", "process"):
        hs, its = [], []
        for p in (q for q in phases if q.config.execution == kind):
            i_s, d_s = operator_times(p.config, p0)
            extra = p0.process_s_per_byte * p0.rows_per_step * tb * 2 if kind == "process" else 0.0
            work = i_s + d_s + extra
            handoff = max(0.0, p.per_step["handoff_s"])
            hs.append(handoff)
            its.append((p.step_s - p0.base_s - handoff - p0.priorities_s) / work if work > 0 else 1.0)
        if hs:
            calib[kind] = (statistics.median(hs), float(np.clip(statistics.median(its), 0.0, 3.0)))
    kw = {}
    for kind, (h, i) in calib.items():
        kw[f"{kind}_handoff_s"], kw[f"{kind}_interference"] = h, i
    return Profile(**{**p0.to_dict(), "ingest": p0.ingest, "deliver": p0.deliver, **kw})


def schedule_for(config: Config, base: Schedule) -> Schedule:
    """The data plane's Schedule for a cost-model Config, keeping ``base``'s semantic guards."""
    return dataclasses.replace(base, mode=config.mode, worker=config.worker,  # the same words, field for field
                               ingest_granularity=config.ingest_granularity,
                               delivery_granularity=config.delivery_granularity)


@dataclass
class _Phase:
    config: Config
    steps: list[float] = field(default_factory=list)
    snap0: object = None
    snap1: object = None


class AutoTuner:
    """Drives calibration from the caller's steps (``observe()`` once per learner step).

    ``settle=(least, most)``: before calibrating, wait between ``least`` and ``most`` steps
    for the step time to be steady (``is_steady`` over ``settle_window`` steps): a run still
    warming up (buffer filling, learning starting, caches) would calibrate on times it is
    about to leave behind, and every prediction would carry that drift."""

    def __init__(self, edp, *, steps_per_phase: int = 40, cores: int | None = None, placements=None,
                 settle: tuple[int, int] = (40, 2000), settle_window: int = 20, settle_tol: float = 0.05):
        self.edp = edp
        self.steps_per_phase = steps_per_phase
        self.cores = cores or os.cpu_count() or 1
        here = current_placement(edp.buffer)
        # every placement when the buffer is in one the cost model knows (a pick elsewhere is
        # migrated to); otherwise the layout stays and only overlap and granularity are tuned
        self.placements = placements or (tuple(PLACEMENT_TIER) if here else ("host",))
        self._placement = here
        self.phases = [_Phase(c) for c in PHASES]
        self.i = 0
        self.last_t: float | None = None
        self.done = False
        self.choice: Config | None = None
        self.predictions: list = []
        self._base = edp.schedule
        self.settle, self.settle_window, self.settle_tol = settle, settle_window, settle_tol
        self.settle_steps: list[float] = []
        self.settled = settle[1] <= 0
        if self.settled:
            self._enter(self.phases[0])

    def _settling(self, now: float) -> None:
        if self.last_t is not None:
            self.settle_steps.append(now - self.last_t)
        self.last_t = now
        least, most = self.settle
        n = len(self.settle_steps)
        if n >= most or (n >= least and is_steady(self.settle_steps, window=self.settle_window, tol=self.settle_tol)):
            self.settled = True
            self._enter(self.phases[0])

    def _enter(self, ph: _Phase) -> None:
        self.edp.reschedule(schedule_for(ph.config, self._base))
        self.last_t = None
        ph.snap0 = self.edp.metrics()

    def observe(self) -> None:
        """Call once per learner step (e.g. after each delivery)."""
        if self.done:
            return
        now = time.perf_counter()
        if not self.settled:
            self._settling(now)
            return
        ph = self.phases[self.i]
        if self.last_t is not None:
            ph.steps.append(now - self.last_t)
        self.last_t = now
        if len(ph.steps) >= self.steps_per_phase:
            ph.snap1 = self.edp.metrics()
            self.i += 1
            if self.i < len(self.phases):
                self._enter(self.phases[self.i])
            else:
                self._decide()

    def profile(self) -> Profile:
        results = [PhaseResult.from_metrics(ph.config, statistics.median(ph.steps), ph.snap0, ph.snap1,
                                            len(ph.steps) + 1) for ph in self.phases]
        bsz = max(1, round(results[0].per_step["deliver_items"]))
        return profile_from_phases(results, transition_bytes=self.edp.buffer.spec.stored_bytes_per_transition,
                                   batch_size=bsz, staleness=self._base.staleness)

    def _decide(self) -> None:
        prof = self.profile()
        configs = enumerate_configs(placements=self.placements)
        self.predictions = sorted((predict(c, prof, cores=self.cores) for c in configs), key=lambda x: x.step_s)
        self.choice = self.predictions[0].config
        if self._placement is not None and self.choice.placement != self._placement:
            migrate_to(self.edp, self.choice.placement)
        self.edp.reschedule(schedule_for(self.choice, self._base))
        self.done = True

    def report(self) -> str:
        if not self.settled:
            return f"auto-tuner: waiting for a steady step time ({len(self.settle_steps)} steps)"
        if not self.done:
            return f"auto-tuner: calibrating ({self.phases[self.i].config.label}, step {len(self.phases[self.i].steps)})"
        lines = [f"auto-tuner picked {self.choice.label} (of {len(self.predictions)} configurations)"]
        for pr in self.predictions[:8]:
            lines.append(f"  {pr.config.label:28s} predicted {pr.step_s * 1e3:8.3f} ms/step")
        return "\n".join(lines)
