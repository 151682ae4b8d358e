"""The auto-tuner: profile the live run briefly, predict every configuration, switch to the best.

Used when an adapter is asked for ``schedule="auto"``. It is driven by the caller's own
deliveries (one ``observe()`` per learner step), so it measures the real workload:

    calibrate   sequential (g_del 1), sequential (g_del 2), thread, process: N steps each
    predict     every Config of placement x overlap x granularity (>= 32) with the cost model
    apply       reschedule the data plane (and migrate it if the placement changed)

Every candidate keeps the data plane's semantic guards (the same staleness bound), so
switching changes speed, never what the learner may receive.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

from .costmodel import Config, Profile, enumerate_configs, fit_operator, predict
from .schedule import Schedule

PHASES = (("sequential", 1), ("sequential", 2), ("thread", 1), ("process", 1))


@dataclass
class _Phase:
    schedule: str
    g_del: int
    steps: list[float] = field(default_factory=list)
    snap0: object = None
    snap1: object = None


class AutoTuner:
    def __init__(self, edp, *, steps_per_phase: int = 40, cores: int | None = None, placements=("host",)):
        import os
        self.edp = edp
        self.steps_per_phase = steps_per_phase
        self.cores = cores or os.cpu_count() or 1
        self.placements = placements
        self.phases = [_Phase(s, g) for s, g in PHASES]
        self.i = 0
        self.last_t: float | None = None
        self.done = False
        self.choice: Config | None = None
        self.predictions: list = []
        self._enter(self.phases[0])

    def _enter(self, ph: _Phase) -> None:
        base = self.edp.schedule
        sched = Schedule(mode="sequential" if ph.schedule == "sequential" else "overlapped",
                         worker="thread" if ph.schedule != "process" else "process", staleness=base.staleness,
                         delivery_granularity=ph.g_del, depth=base.depth, queue_size=base.queue_size,
                         timeout=base.timeout)
        self.edp.reschedule(sched)
        self.last_t = None
        ph.snap0 = self.edp.metrics()

    def observe(self) -> None:
        """Call once per learner step (e.g. after each delivery)."""
        if self.done:
            return
        now = time.perf_counter()
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

    def _delta(self, ph: _Phase):
        a, b = ph.snap0, ph.snap1
        n = len(ph.steps) + 1
        d = lambda point, attr: (getattr(getattr(b, point), attr) - getattr(getattr(a, point), attr)) / n
        return d, statistics.median(ph.steps)

    def profile(self) -> Profile:
        spec = self.edp.buffer.spec
        tb = spec.stored_bytes_per_transition
        ing_samples, del_samples = [], []
        base = prio = rows = calls = 0.0
        for ph in self.phases[:2]:
            d, step = self._delta(ph)
            rows, calls = d("ingest", "items_in"), d("ingest", "calls")
            batch = d("deliver", "items_out") * ph.g_del / max(1, ph.g_del)
            ing_samples.append((calls, rows, rows * tb, d("ingest", "busy_s")))
            del_samples.append((1.0 / ph.g_del, batch, batch * tb, d("deliver", "busy_s")))
            prio = d("priorities", "blocked_s")
            exposed = d("ingest", "blocked_s") + d("deliver", "blocked_s") + prio
            base = step - exposed
        bsz = int(max(1, self.phases[0].snap1.deliver.items_out - self.phases[0].snap0.deliver.items_out)
                  / (len(self.phases[0].steps) + 1))
        p0 = Profile(base_s=max(base, 0.0), priorities_s=prio, ingest=fit_operator(ing_samples),
                     deliver=fit_operator(del_samples), rows_per_step=max(rows, 1e-9), rollouts_per_step=max(calls, 1e-9),
                     batch_size=bsz, transition_bytes=tb, staleness=self.edp.schedule.staleness)
        calib = {}
        from .costmodel import operator_times
        for ph in self.phases[2:]:
            d, step = self._delta(ph)
            cfg = Config("host", ph.schedule, 1, 1)
            i_s, d_s = operator_times(cfg, p0)
            handoff = max(0.0, d("ingest", "blocked_s") + d("deliver", "blocked_s"))
            work = i_s + d_s
            interference = (step - p0.base_s - handoff - p0.priorities_s) / work if work > 0 else 1.0
            calib[ph.schedule] = (handoff, min(max(interference, 0.0), 3.0))
        return Profile(**{**p0.to_dict(), "ingest": p0.ingest, "deliver": p0.deliver,
                          "thread_handoff_s": calib["thread"][0], "thread_interference": calib["thread"][1],
                          "process_handoff_s": calib["process"][0], "process_interference": calib["process"][1]})

    def _decide(self) -> None:
        prof = self.profile()
        configs = enumerate_configs(placements=self.placements)
        self.predictions = sorted((predict(c, prof, cores=self.cores) for c in configs), key=lambda x: x.step_s)
        self.choice = self.predictions[0].config
        base = self.edp.schedule
        c = self.choice
        self.edp.reschedule(Schedule(mode="sequential" if c.schedule == "sequential" else "overlapped",
                                     worker="process" if c.schedule == "process" else "thread",
                                     staleness=base.staleness, delivery_granularity=c.g_del,
                                     ingest_granularity=c.g_ing, depth=base.depth, queue_size=base.queue_size,
                                     timeout=base.timeout))
        self.done = True

    def report(self) -> str:
        if not self.done:
            return f"auto-tuner: calibrating ({self.phases[self.i].schedule}, step {len(self.phases[self.i].steps)})"
        lines = [f"auto-tuner picked {self.choice.label} (of {len(self.predictions)} configurations)"]
        for pr in self.predictions[:8]:
            lines.append(f"  {pr.config.label:28s} predicted {pr.step_s * 1e3:8.3f} ms/step")
        return "\n".join(lines)
