"""``get_metrics()`` for Conduit's RLlib replay buffer: the whole-buffer metrics RLlib's episode
buffers report, with their keys and reductions, so DQN's results keep their ``replay_buffer``
entries (steps and episodes stored, added, evicted, sampled; per call and lifetime).

RLlib's buffers log about twenty values into a ``MetricsLogger`` on every ``add()`` and
``sample()`` (~9 us each here) and reduce them in ``get_metrics()``. Here ``add()`` and
``sample()`` only note what the reductions need (the stored counts after each add, the number of
calls); ``get_metrics()`` builds the reduced ``Stats`` RLlib's would return, from the buffer's own
counters, once per call (~1-2 us a value).

Reported as RLlib reports them: a per-call sum over no call is NaN, a lifetime sum is what
was added since the last call (DQN's logger adds them up), the stored counts are the mean over
the adds since the last call. Not reported: the per-agent and per-module copies of these (one
agent, one module here) and the shape of the draws (actual n-step, episodes per sample,
resamples, utilisation).
"""

from __future__ import annotations

import functools


class ReplayMetrics:
    """What a buffer's ``get_metrics()`` needs between two calls. ``counters()`` reads the
    buffer's lifetime counters: (steps added, steps evicted, episodes added, episodes evicted,
    steps sampled)."""

    __slots__ = ("counters", "window", "stored", "adds", "samples", "last", "ever_added", "ever_sampled")

    def __init__(self, counters, *, window: int = 100):
        self.counters, self.window = counters, int(window)
        self.restart()

    def restart(self) -> None:
        """From the counters as they are now (a new buffer, or one just restored: RLlib's
        buffers do not save their metrics either)."""
        self.stored: list[tuple[int, int]] = []   # (steps, episodes) stored after each add since the last call
        self.adds = self.samples = 0
        self.ever_added = self.ever_sampled = False   # RLlib's logger has a key once it was logged
        self.last = tuple(self.counters())

    def after_add(self, steps_stored: int, episodes_stored: int) -> None:
        self.adds += 1
        stored = self.stored
        stored.append((steps_stored, episodes_stored))
        if len(stored) > self.window:   # the mean's window: the oldest leave
            del stored[0]

    def result(self) -> dict:
        m, LifetimeSumStats, MeanStats, SumStats = _rllib_stats()
        now = tuple(self.counters())
        steps_added, steps_evicted, eps_added, eps_evicted, sampled = (a - b for a, b in zip(now, self.last))
        self.ever_added |= self.adds > 0
        self.ever_sampled |= self.samples > 0
        out = {}

        def per_call(key, value, calls):
            s = SumStats()
            if calls:   # as SumStats.reduce sets its result (its push() costs ~6 us: tensor checks)
                s.values = [value]
            out[key] = s

        def lifetime(key, value):
            s = LifetimeSumStats()
            if value:   # a push of 0 leaves its sum 0.0 (and costs ~4 us: NaN checks)
                s.push(value)
            out[key] = s

        def mean(key, values):
            s = MeanStats(window=self.window)
            for v in values:
                s.push(v)
            out[key] = s

        if self.ever_added:
            mean(m.NUM_EPISODES_STORED, [e for _, e in self.stored])
            per_call(m.NUM_EPISODES_ADDED, eps_added, self.adds)
            lifetime(m.NUM_EPISODES_ADDED_LIFETIME, eps_added)
            per_call(m.NUM_EPISODES_EVICTED, eps_evicted, self.adds)
            lifetime(m.NUM_EPISODES_EVICTED_LIFETIME, eps_evicted)
            mean(m.NUM_ENV_STEPS_STORED, [s for s, _ in self.stored])
            per_call(m.NUM_ENV_STEPS_ADDED, steps_added, self.adds)
            lifetime(m.NUM_ENV_STEPS_ADDED_LIFETIME, steps_added)
            per_call(m.NUM_ENV_STEPS_EVICTED, steps_evicted, self.adds)
            lifetime(m.NUM_ENV_STEPS_EVICTED_LIFETIME, steps_evicted)
        if self.ever_sampled:
            per_call(m.NUM_ENV_STEPS_SAMPLED, sampled, self.samples)
            lifetime(m.NUM_ENV_STEPS_SAMPLED_LIFETIME, sampled)
        self.last, self.adds, self.samples = now, 0, 0
        self.stored.clear()
        return out


@functools.cache
def _rllib_stats():
    """RLlib's metric names and the three Stats classes, imported once (RLlib is imported lazily)."""
    from ray.rllib.utils import metrics
    from ray.rllib.utils.metrics.stats.lifetime_sum import LifetimeSumStats
    from ray.rllib.utils.metrics.stats.mean import MeanStats
    from ray.rllib.utils.metrics.stats.sum import SumStats
    return metrics, LifetimeSumStats, MeanStats, SumStats
