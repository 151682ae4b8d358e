"""``get_metrics()`` for Conduit's RLlib replay buffer: the replay metrics RLlib's episode
buffers report, every key with its reduction, so DQN's results keep their ``replay_buffer``
entries: steps and episodes stored, added, evicted and sampled (per call and lifetime), the
shape of the draws (episodes and distinct steps per sample, step utilisation, the mean n-step
drawn, items redrawn), and each of these again per agent and per module.

RLlib's buffers log about fifty values into a ``MetricsLogger`` on every ``add()`` and
``sample()`` (~9 us each here) and reduce them in ``get_metrics()``. Here ``add()`` and
``sample()`` only note what the reductions need (the stored counts after each add; per
sample its size, distinct steps and episodes, mean n-step and redraws); ``get_metrics()`` builds the
reduced ``Stats`` RLlib's would return, from these notes and the buffer's lifetime counters,
once per call.

Reported as RLlib's ``MetricsLogger.reduce`` leaves them: a per-call sum holds one value (NaN
over no call), a lifetime sum what was added since the last call (DQN's logger adds them up), a
mean one value, the mean of what was logged since the last call (NaN of nothing: the logger
above averages these per-call means). A buffer holds one agent's and one module's data
(RLlib's single-agent buffers report ``DEFAULT_AGENT_ID`` and ``DEFAULT_MODULE_ID``), so each
per-agent and per-module entry holds the whole-buffer value: it is the whole-buffer entry's
``Stats`` object itself (built once, not three times: this runs on every training step).
RLlib's ``MetricsLogger.aggregate`` only reads them; reduce a ``copy.deepcopy`` of one if you
reduce entries yourself (a Stats' ``clone()`` carries no values).
"""

from __future__ import annotations

import functools
import time
from types import SimpleNamespace

from .constructed import constructed_fields

NAN = float("nan")


class ReplayMetrics:
    """What a buffer's ``get_metrics()`` needs between two calls. ``counters()`` reads the
    buffer's lifetime counters: (steps added, steps evicted, episodes added, episodes evicted,
    steps sampled)."""

    __slots__ = ("counters", "window", "stored", "adds", "samples", "episodes", "distinct", "redraws", "utilization",
                 "n_steps", "last", "ever_added", "ever_sampled", "ever_n_step")

    def __init__(self, counters, *, window: int = 100):
        self.counters, self.window = counters, int(window)
        self.restart()

    def restart(self) -> None:
        """From the counters as they are now (a new buffer, or one just restored: RLlib's
        buffers do not save their metrics either)."""
        self.stored: list[tuple[int, int]] = []   # (steps, episodes) stored after each add since the last call
        self.adds = 0
        self._clear_samples()
        self.ever_added = self.ever_sampled = self.ever_n_step = False   # RLlib's logger has a key once it was logged
        self.last = tuple(self.counters())

    def after_add(self, steps_stored: int, episodes_stored: int) -> None:
        self.adds += 1
        stored = self.stored
        stored.append((steps_stored, episodes_stored))
        if len(stored) > self.window:   # the mean's window: the oldest leave
            del stored[0]

    def _clear_samples(self) -> None:
        self.samples = self.episodes = self.distinct = self.redraws = 0   # since the last call: samples, sums
        self.utilization: list[float] = []   # per sample: distinct steps / steps drawn (the mean's window)
        self.n_steps: list[float] = []       # per sample: the mean n-step RLlib logs (the mean's window)

    def after_sample(self, drawn: int, steps: int, episodes: int, n_step: float | None, redraws: int) -> None:
        """One ``sample()``: ``drawn`` env steps, ``steps`` of them distinct (RLlib hashes each
        item's episode and start step), from ``episodes`` distinct stored episodes, with the
        mean n-step RLlib logs for it (None where it logs none: the ``[B, T]`` batch form) and
        the items its draw redrew (RLlib's resamples)."""
        self.samples += 1
        self.redraws += redraws
        self.episodes += episodes
        self.distinct += steps
        util = self.utilization
        util.append(steps / drawn)
        if len(util) > self.window:
            del util[0]
        if n_step:   # (RLlib logs it where it is truthy)
            ns = self.n_steps
            ns.append(n_step)
            if len(ns) > self.window:
                del ns[0]

    def result(self) -> dict:
        keys, made, agent, module = _rllib_stats()
        SUM, LIFETIME, MEAN = made.SUM, made.LIFETIME, made.mean_kind(self.window)
        now = tuple(self.counters())
        last = self.last   # (no generators: each is a Python frame resumed per item)
        steps_added, steps_evicted = now[0] - last[0], now[1] - last[1]
        eps_added, eps_evicted, sampled = now[2] - last[2], now[3] - last[3], now[4] - last[4]
        self.ever_added |= self.adds > 0
        self.ever_sampled |= self.samples > 0
        # Each entry as RLlib's reduce leaves it: a per-call sum holds the sum (NaN over no call), a
        # lifetime sum what was added since the last call, a mean the mean of what was logged (NaN of
        # none). The per-agent and per-module entries hold the same object, nested as RLlib's logger
        # returns them. Straight-line code: this runs on every training step with cold caches.
        out = {}
        if self.ever_added:
            adds, stored = self.adds, self.stored
            n = len(stored)
            steps_stored = eps_stored = 0
            for s, e in stored:
                steps_stored += s
                eps_stored += e
            entries = made.build((
                (MEAN, eps_stored / n if n else NAN),   # episodes stored
                (SUM, eps_added if adds else NAN), (LIFETIME, eps_added),
                (SUM, eps_evicted if adds else NAN), (LIFETIME, eps_evicted),
                (MEAN, steps_stored / n if n else NAN),   # env steps stored
                (SUM, steps_added if adds else NAN), (LIFETIME, steps_added),
                (SUM, steps_evicted if adds else NAN), (LIFETIME, steps_evicted)))
            _put(out, keys.added, entries, keys.added_layout, agent, module)
        if self.ever_sampled:
            calls, distinct, util = self.samples, self.distinct, self.utilization
            self.ever_n_step |= bool(self.n_steps)
            entries = [
                (SUM, self.episodes if calls else NAN), (SUM, distinct if calls else NAN), (LIFETIME, distinct),
                (SUM, sampled if calls else NAN), (LIFETIME, sampled),
                (MEAN, sum(util) / len(util) if util else NAN)]
            triples, layout = keys.sampled, keys.sampled_layout
            if self.ever_n_step:   # (after the utilisation, as RLlib's buffers log it)
                n_steps = self.n_steps
                entries.append((MEAN, sum(n_steps) / len(n_steps) if n_steps else NAN))
                triples, layout = keys.sampled_n_step, keys.sampled_n_step_layout
            entries.append((SUM, self.redraws if calls else NAN))
            _put(out, triples, made.build(entries), layout, agent, module)
        self.last, self.adds = now, 0
        self.stored.clear()
        self._clear_samples()
        return out


def _put(out: dict, triples, entries, layout, agent, module) -> None:
    """The entries into ``out`` in RLlib's order: ``layout`` is (entry, 0 whole-buffer / 1 per-agent
    / 2 per-module key) pairs in the order RLlib's buffers log them (a dict's order only: RLlib's
    logger reads keys, never their order)."""
    for i, level in layout:
        s = entries[i]
        out[triples[i][level]] = s if level == 0 else {agent: s} if level == 1 else {module: s}


def one_step_shape(b, n_step, ledger) -> tuple[int, int, float, int]:
    """(distinct steps, distinct episodes, mean n-step, redraws) of a delivered one-step batch ``b`` (a
    core ``Batch``), as RLlib's buffers log them: a stored row is an (episode, step) pair, the
    rows' sources are their stored episodes (the ledger locates them where the delivery route
    recorded none), and the n-step is the one asked for, or the mean of the drawn ones for a
    range. (RLlib's uniform buffer logs the n it drew where the window was cut short by its
    episode's end; this one logs the window's true n, as it delivers it.)"""
    steps, episodes, n_sum = b.draw_counts()
    if episodes < 0:
        episodes = len(set(ledger.index().locate(b.seqs)[0].tolist()))
    if type(n_step) is tuple:
        n_mean = n_sum / b.size if n_sum >= 0 and b.size else 0.0   # (a window draw has its n_step column)
    else:
        n_mean = float(n_step or 1)
    return steps, episodes, n_mean, b.redraws


def sequences_shape(episodes: list, steps: int) -> tuple[int, int, float, int]:
    """The same for the uniform buffer's sequence slices (RLlib's episodes): RLlib hashes each
    slice's episode and start, and logs as its n-step the slices' n (1 each) summed over the
    ``steps`` asked for (slices / ``batch_size_B``: its own arithmetic)."""
    return (len({(ep.id_, ep.t_started) for ep in episodes}), len({ep.id_ for ep in episodes}),
            len(episodes) / steps if steps else 0.0, 0)   # (a start too near its end: redrawn, uncounted)


def batch_form_shape(rows: list) -> tuple[int, int, None, int]:
    """The same for the ``[B, T]`` batch form's rows of (episode, first step) pieces: RLlib
    hashes each piece's episode and first step, and logs no n-step."""
    pieces = [p for row in rows for p in row]
    return len(set(pieces)), len({e for e, _ in pieces}), None, 0


class StatsMaker:
    """RLlib's ``SumStats``, ``LifetimeSumStats`` and ``MeanStats`` as their constructors and
    ``reduce`` (or, for a lifetime sum, ``push``) leave them, without running the constructors:
    18 objects are built on every training step, and each constructor is four Python calls
    (``get_metrics()`` went to 0.79-0.81x of its time per step in the run: docs/benchmarks.md
    section 2, session 34).

    Each kind's object is built once by RLlib's own constructor, twice a moment apart; a new
    one takes a copy of its fields, with a new empty container wherever the constructor left
    one (never shared between objects) and the clock read at ``build`` wherever the two
    constructions read different clocks. A test compares every field with an object RLlib
    builds (``tests/rllib/test_replay_metrics.py``)."""

    def __init__(self, SumStats, LifetimeSumStats, MeanStats):
        self.SUM = self._kind(SumStats)
        self.LIFETIME = self._kind(LifetimeSumStats)
        self._means: dict[int, tuple] = {}
        self._mean_cls, self._lifetime_cls = MeanStats, LifetimeSumStats

    @staticmethod
    def _kind(cls, **kwargs) -> tuple:
        """(cls, fields to copy, containers to make anew, clock fields, kwargs), by
        ``constructed.constructed_fields``. A field it cannot copy safely (a lock, a set, a
        tensor: what a later RLlib's constructor might leave) gives fields None: that kind is
        built by its constructor."""
        made = constructed_fields(functools.partial(cls, **kwargs))
        if made is None:
            return cls, None, (), (), kwargs
        return cls, made.fields, made.containers, made.clocks, kwargs

    def mean_kind(self, window: int) -> tuple:
        """The kind of a ``MeanStats(window=window)``."""
        kind = self._means.get(window)
        if kind is None:
            kind = self._means[window] = self._kind(self._mean_cls, window=window)
        return kind

    def build(self, entries) -> list:
        """[(kind, value)] -> the Stats objects, in order: a ``SUM`` holding [value] (as its
        ``reduce`` leaves a per-call sum: NaN over no call), a ``LIFETIME`` as ``push(value)``
        leaves it for a finite host number (push's NaN and tensor checks cost ~4 us a call), a
        ``mean_kind`` holding [value] (the mean, as its ``reduce`` leaves it). One loop, no
        Python call per object."""
        clock, lifetime_cls, new = time.perf_counter(), self._lifetime_cls, object.__new__
        out = []
        for (cls, fields, containers, clocks, kwargs), value in entries:
            if fields is None:   # (a field not understood: RLlib's constructor)
                s = cls(**kwargs)
            else:
                d = fields.copy()
                for k, make in containers:
                    d[k] = make()
                for k in clocks:
                    d[k] = clock
                s = new(cls)
                s.__dict__ = d
            if cls is lifetime_cls:
                s._lifetime_sum += value
            else:
                s.values = [value]
            out.append(s)
        return out


@functools.cache
def _rllib_stats():
    """RLlib's metric names (each entry's key, per-agent key and per-module key), a ``StatsMaker``
    and its single-agent buffers' agent and module ids, imported once (RLlib is imported lazily)."""
    from ray.rllib.core import DEFAULT_AGENT_ID, DEFAULT_MODULE_ID
    from ray.rllib.utils import metrics
    from ray.rllib.utils.metrics.stats.lifetime_sum import LifetimeSumStats
    from ray.rllib.utils.metrics.stats.mean import MeanStats
    from ray.rllib.utils.metrics.stats.sum import SumStats
    m = metrics
    triples = SimpleNamespace(
        added=((m.NUM_EPISODES_STORED, None, None),
               (m.NUM_EPISODES_ADDED, m.NUM_AGENT_EPISODES_ADDED, m.NUM_MODULE_EPISODES_ADDED),
               (m.NUM_EPISODES_ADDED_LIFETIME, m.NUM_AGENT_EPISODES_ADDED_LIFETIME, m.NUM_MODULE_EPISODES_ADDED_LIFETIME),
               (m.NUM_EPISODES_EVICTED, m.NUM_AGENT_EPISODES_EVICTED, m.NUM_MODULE_EPISODES_EVICTED),
               (m.NUM_EPISODES_EVICTED_LIFETIME, m.NUM_AGENT_EPISODES_EVICTED_LIFETIME,
                m.NUM_MODULE_EPISODES_EVICTED_LIFETIME),
               (m.NUM_ENV_STEPS_STORED, None, None),
               (m.NUM_ENV_STEPS_ADDED, m.NUM_AGENT_STEPS_ADDED, m.NUM_MODULE_STEPS_ADDED),
               (m.NUM_ENV_STEPS_ADDED_LIFETIME, m.NUM_AGENT_STEPS_ADDED_LIFETIME, m.NUM_MODULE_STEPS_ADDED_LIFETIME),
               (m.NUM_ENV_STEPS_EVICTED, m.NUM_AGENT_STEPS_EVICTED, m.NUM_MODULE_STEPS_EVICTED),
               (m.NUM_ENV_STEPS_EVICTED_LIFETIME, m.NUM_AGENT_STEPS_EVICTED_LIFETIME,
                m.NUM_MODULE_STEPS_EVICTED_LIFETIME)),
        sampled=((m.NUM_EPISODES_PER_SAMPLE, m.NUM_AGENT_EPISODES_PER_SAMPLE, m.NUM_MODULE_EPISODES_PER_SAMPLE),
                 (m.NUM_ENV_STEPS_PER_SAMPLE, m.NUM_AGENT_STEPS_PER_SAMPLE, m.NUM_MODULE_STEPS_PER_SAMPLE),
                 (m.NUM_ENV_STEPS_PER_SAMPLE_LIFETIME, m.NUM_AGENT_STEPS_PER_SAMPLE_LIFETIME,
                  m.NUM_MODULE_STEPS_PER_SAMPLE_LIFETIME),
                 (m.NUM_ENV_STEPS_SAMPLED, m.NUM_AGENT_STEPS_SAMPLED, m.NUM_MODULE_STEPS_SAMPLED),
                 (m.NUM_ENV_STEPS_SAMPLED_LIFETIME, m.NUM_AGENT_STEPS_SAMPLED_LIFETIME,
                  m.NUM_MODULE_STEPS_SAMPLED_LIFETIME),
                 (m.ENV_STEP_UTILIZATION, m.AGENT_STEP_UTILIZATION, m.MODULE_STEP_UTILIZATION),
                 (m.NUM_RESAMPLES, m.NUM_AGENT_RESAMPLES, m.NUM_MODULE_RESAMPLES)))
    # the mean n-step, where one was logged, comes after the utilisation, as RLlib's buffers log it
    triples.sampled_n_step = triples.sampled[:6] + ((m.ACTUAL_N_STEP, m.AGENT_ACTUAL_N_STEP, m.MODULE_ACTUAL_N_STEP),
                                                    triples.sampled[6])
    # the order RLlib's buffers log the entries in (tests/rllib/test_replay_metrics.py compares it)
    per_added = (1, 2, 6, 7, 3, 4, 8, 9)   # episodes added, steps added, episodes evicted, steps evicted
    triples.added_layout = tuple((i, 0) for i in range(10)) + tuple((i, 1) for i in per_added) + tuple(
        (i, 2) for i in per_added)
    per_sampled = (3, 4, 0, 1, 2, 5, 6)     # steps sampled, then the draws' shape, then redraws
    triples.sampled_layout = tuple((i, 0) for i in range(7)) + tuple((i, 1) for i in per_sampled) + tuple(
        (i, 2) for i in per_sampled)
    per_sampled = (3, 4, 0, 1, 2, 5, 7)     # (with the mean n-step, entry 6: its three keys together)
    triples.sampled_n_step_layout = tuple((i, 0) for i in range(7)) + ((6, 1), (6, 2), (7, 0)) + tuple(
        (i, 1) for i in per_sampled) + tuple((i, 2) for i in per_sampled)
    return triples, StatsMaker(SumStats, LifetimeSumStats, MeanStats), DEFAULT_AGENT_ID, DEFAULT_MODULE_ID
