"""Measuring the experience path the same way for unmodified RLlib and RLlib with Conduit.

The same instance-level wrappers go around both algorithms' replay buffer methods and
learner connector, so 'exposed experience-path latency' means one thing for both:
the caller-blocked time of

    ingestion   buffer.add(episodes)
    delivery    buffer.sample(...) + the learner's whole batch building: ``Learner._create_iterator_if_necessary``
                (the learner connector, episodes/batch -> tensors on device, then RLlib's
                ``MultiAgentBatch``/``SampleBatch`` wrapping, slicing flags and the minibatch iterator)
    priorities  buffer.update_priorities(td_errors)
    metrics     buffer.get_metrics()

per training step (a step = one ``sample()`` call). Instance attributes shadow the
class methods, so ``isinstance`` checks inside RLlib see the same objects as before.
"""

from __future__ import annotations

import time
from collections import defaultdict

CATEGORIES = {"add": "ingestion", "sample": "delivery", "learner_batch": "delivery",
              "update_priorities": "priorities", "get_metrics": "metrics",
              # PPO: the learner connector (GAE...) is ingestion; minibatching is delivery
              "ppo_connector": "ingestion", "minibatching": "delivery"}


class PathTimer:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()

    def timed(self, name: str, fn):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - t0
                self.calls[name] += 1
        wrapper.__wrapped__ = fn
        return wrapper

    def instrument(self, algo) -> None:
        from ray.rllib.algorithms.ppo import PPO
        if isinstance(algo, PPO):
            return self._instrument_ppo(algo)
        buf = getattr(algo, "local_replay_buffer", None)
        if buf is not None:
            for name in ("add", "sample", "update_priorities", "get_metrics"):
                setattr(buf, name, self.timed(name, getattr(buf, name)))
        learner = algo.learner_group._learner
        if learner is None:
            raise RuntimeError("PathTimer needs a local learner (num_learners=0)")
        # the whole learner-side batch building, connector included (issue 18: RLlib's batch wrapping counted)
        learner._create_iterator_if_necessary = self.timed("learner_batch", learner._create_iterator_if_necessary)

    def _instrument_ppo(self, algo) -> None:
        """PPO: one step = one learner update. Ingestion = the learner connector pipeline;
        delivery = building the minibatch iterator (minus the connector) plus every
        minibatch it yields."""
        learner = algo.learner_group._learner
        inner_conn = learner._learner_connector
        timed_conn = self.timed("ppo_connector", inner_conn)
        learner._learner_connector = _TimedConnector(inner_conn, timed_conn)
        create = learner._create_iterator_if_necessary
        timer = self

        def create_timed(*args, **kwargs):
            t0 = time.perf_counter()
            before = timer.seconds["ppo_connector"]
            it = create(*args, **kwargs)
            spent = time.perf_counter() - t0 - (timer.seconds["ppo_connector"] - before)
            timer.seconds["minibatching"] += spent
            timer.calls["update"] += 1
            return _TimedIterable(it, timer)
        learner._create_iterator_if_necessary = create_timed

    @property
    def steps(self) -> int:
        return self.calls.get("sample", 0) or self.calls.get("update", 0)

    def per_step_ms(self) -> dict[str, float]:
        """Milliseconds per training step, per category, plus 'exposed' (their sum)."""
        n = max(1, self.steps)
        out: dict[str, float] = defaultdict(float)
        for name, s in self.seconds.items():
            out[CATEGORIES[name]] += s / n * 1e3
        out["exposed"] = sum(v for k, v in out.items())
        return dict(out)


class _TimedConnector:
    """Calls go through the timer; every other attribute is the wrapped pipeline's."""

    def __init__(self, inner, timed_call):
        self._inner = inner
        self._timed_call = timed_call

    def __call__(self, *args, **kwargs):
        return self._timed_call(*args, **kwargs)

    def __getattr__(self, item):
        return getattr(self._inner, item)


class _TimedIterable:
    def __init__(self, inner, timer: PathTimer):
        self._inner, self._timer = inner, timer

    def __iter__(self):
        it = iter(self._inner)
        while True:
            t0 = time.perf_counter()
            try:
                item = next(it)
            except StopIteration:
                self._timer.seconds["minibatching"] += time.perf_counter() - t0
                return
            self._timer.seconds["minibatching"] += time.perf_counter() - t0
            yield item

    def __getattr__(self, item):
        return getattr(self._inner, item)
