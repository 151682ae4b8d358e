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
        m, LifetimeSumStats, MeanStats, SumStats, agent, module = _rllib_stats()
        now = tuple(self.counters())
        steps_added, steps_evicted, eps_added, eps_evicted, sampled = (a - b for a, b in zip(now, self.last))
        self.ever_added |= self.adds > 0
        self.ever_sampled |= self.samples > 0
        out = {}

        def per_call(key, value, calls):
            s = SumStats()   # as SumStats.reduce leaves it: the sum, NaN over no call (push() costs
            s.values = [value if calls else NAN]   # ~6 us: tensor checks)
            out[key] = s
            return s

        def lifetime(key, value):
            s = LifetimeSumStats()
            s._lifetime_sum += value   # what push() leaves for a finite host number (its NaN and
            out[key] = s               # tensor checks cost ~4 us a call; the tests compare with RLlib's)
            return s

        def mean(key, values):   # as MeanStats.reduce leaves it: one value, the mean (NaN of none), so
            s = MeanStats(window=self.window)   # the logger above averages per-call means, as RLlib's
            s.values = [sum(values) / len(values) if values else NAN]   # (numpy's mean of a list: ~5 us)
            out[key] = s
            return s

        def copies(pairs):   # the per-agent, then the per-module entries: the same objects
            for who, keys in ((agent, 0), (module, 1)):
                for names, s in pairs:
                    out[names[keys]] = {who: s}   # (nested, as RLlib's logger returns them)

        if self.ever_added:
            adds = self.adds
            mean(m.NUM_EPISODES_STORED, [e for _, e in self.stored])
            added = [
                ((m.NUM_AGENT_EPISODES_ADDED, m.NUM_MODULE_EPISODES_ADDED),
                 per_call(m.NUM_EPISODES_ADDED, eps_added, adds)),
                ((m.NUM_AGENT_EPISODES_ADDED_LIFETIME, m.NUM_MODULE_EPISODES_ADDED_LIFETIME),
                 lifetime(m.NUM_EPISODES_ADDED_LIFETIME, eps_added)),
                ((m.NUM_AGENT_EPISODES_EVICTED, m.NUM_MODULE_EPISODES_EVICTED),
                 per_call(m.NUM_EPISODES_EVICTED, eps_evicted, adds)),
                ((m.NUM_AGENT_EPISODES_EVICTED_LIFETIME, m.NUM_MODULE_EPISODES_EVICTED_LIFETIME),
                 lifetime(m.NUM_EPISODES_EVICTED_LIFETIME, eps_evicted)),
            ]
            mean(m.NUM_ENV_STEPS_STORED, [s for s, _ in self.stored])
            added += [
                ((m.NUM_AGENT_STEPS_ADDED, m.NUM_MODULE_STEPS_ADDED),
                 per_call(m.NUM_ENV_STEPS_ADDED, steps_added, adds)),
                ((m.NUM_AGENT_STEPS_ADDED_LIFETIME, m.NUM_MODULE_STEPS_ADDED_LIFETIME),
                 lifetime(m.NUM_ENV_STEPS_ADDED_LIFETIME, steps_added)),
                ((m.NUM_AGENT_STEPS_EVICTED, m.NUM_MODULE_STEPS_EVICTED),
                 per_call(m.NUM_ENV_STEPS_EVICTED, steps_evicted, adds)),
                ((m.NUM_AGENT_STEPS_EVICTED_LIFETIME, m.NUM_MODULE_STEPS_EVICTED_LIFETIME),
                 lifetime(m.NUM_ENV_STEPS_EVICTED_LIFETIME, steps_evicted)),
            ]
            copies(added)
        if self.ever_sampled:
            calls, distinct = self.samples, self.distinct
            self.ever_n_step |= bool(self.n_steps)
            sampled_pairs = [
                ((m.NUM_AGENT_EPISODES_PER_SAMPLE, m.NUM_MODULE_EPISODES_PER_SAMPLE),
                 per_call(m.NUM_EPISODES_PER_SAMPLE, self.episodes, calls)),
                ((m.NUM_AGENT_STEPS_PER_SAMPLE, m.NUM_MODULE_STEPS_PER_SAMPLE),
                 per_call(m.NUM_ENV_STEPS_PER_SAMPLE, distinct, calls)),
                ((m.NUM_AGENT_STEPS_PER_SAMPLE_LIFETIME, m.NUM_MODULE_STEPS_PER_SAMPLE_LIFETIME),
                 lifetime(m.NUM_ENV_STEPS_PER_SAMPLE_LIFETIME, distinct)),
                ((m.NUM_AGENT_STEPS_SAMPLED, m.NUM_MODULE_STEPS_SAMPLED),
                 per_call(m.NUM_ENV_STEPS_SAMPLED, sampled, calls)),
                ((m.NUM_AGENT_STEPS_SAMPLED_LIFETIME, m.NUM_MODULE_STEPS_SAMPLED_LIFETIME),
                 lifetime(m.NUM_ENV_STEPS_SAMPLED_LIFETIME, sampled)),
                ((m.AGENT_STEP_UTILIZATION, m.MODULE_STEP_UTILIZATION),
                 mean(m.ENV_STEP_UTILIZATION, self.utilization)),
            ]
            if self.ever_n_step:
                sampled_pairs.append(((m.AGENT_ACTUAL_N_STEP, m.MODULE_ACTUAL_N_STEP),
                                      mean(m.ACTUAL_N_STEP, self.n_steps)))
            sampled_pairs.append(((m.NUM_AGENT_RESAMPLES, m.NUM_MODULE_RESAMPLES),
                                  per_call(m.NUM_RESAMPLES, self.redraws, calls)))
            copies(sampled_pairs)
        self.last, self.adds = now, 0
        self.stored.clear()
        self._clear_samples()
        return out


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


@functools.cache
def _rllib_stats():
    """RLlib's metric names, the three Stats classes and its single-agent buffers' agent and
    module ids, imported once (RLlib is imported lazily)."""
    from ray.rllib.core import DEFAULT_AGENT_ID, DEFAULT_MODULE_ID
    from ray.rllib.utils import metrics
    from ray.rllib.utils.metrics.stats.lifetime_sum import LifetimeSumStats
    from ray.rllib.utils.metrics.stats.mean import MeanStats
    from ray.rllib.utils.metrics.stats.sum import SumStats
    return metrics, LifetimeSumStats, MeanStats, SumStats, DEFAULT_AGENT_ID, DEFAULT_MODULE_ID
