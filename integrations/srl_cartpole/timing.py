"""A thin timing proxy around the trainer worker's buffer, installed the same way for both arms.

:func:`install` wraps ``rlsrl.base.buffer.make_buffer`` (after ``conduit_srl.enable()`` if that is
used, so it wraps whatever that factory builds); SRL's trainer worker calls the factory through the
module after the workers fork (``rlsrl/system/impl/trainer_worker.py``, ``_configure``), so its buffer
is a :class:`TimedBuffer`. Recorded there:

- training thread (``GPUThread._run_step``): ``get()`` calls and the time in them, the samples each
  get hands to the trainer (``T * B``, as SRL's GPU thread counts them), and every ``empty()`` that
  returned True (SRL's thread then sleeps 5 ms): the time from that answer to the thread's next
  ``empty()`` call is the trainer's exposed wait for data (the thread also calls ``empty()`` once per
  100 loop iterations for its log line: at most 1% of the polls counted are not followed by a sleep),
  and so is the time spent inside every ``empty()`` call (a buffer that waits there for a batch to
  form, Conduit's with ``empty_wait_s``, waits inside the call instead of in SRL's sleep);
- trainer main thread (``consume_to``): ``put()`` calls (a ``put_batch`` of n samples counts n), the time in
  them, the steps put.

Cumulative counters are snapshotted every ``interval`` seconds by a daemon thread of the trainer
process into ``<stats_dir>/buffer_stats_<pid>.json`` (write to a temporary file, then rename), so
the history survives the run being killed.
"""

from __future__ import annotations

import json
import os
import threading
import time

_COUNTERS = ("gets", "get_s", "trained", "empty_true", "wait_s", "empty_calls", "puts", "put_s", "put_steps")


class TimedBuffer:
    """Delegates SRL's buffer interface to ``inner``, timing it (see the module docstring)."""

    def __init__(self, inner, *, stats_path: str | None = None, interval: float = 2.0, label: str = ""):
        self._inner = inner
        self._stats_path = stats_path
        self._interval = interval
        self._label = label
        self._t0 = time.time()
        self._c = dict.fromkeys(_COUNTERS, 0)
        self._c["get_s"] = self._c["wait_s"] = self._c["put_s"] = 0.0
        self._first_get = None
        self._waiting_since = None       # perf_counter of the last empty() that returned True
        self._history: list = []
        self._lock = threading.Lock()
        if stats_path:
            threading.Thread(target=self._writer, daemon=True, name="conduit-srl-timing").start()

    # ------------------------------------------------------------ SRL's buffer interface
    def put(self, x):
        t = time.perf_counter()
        r = self._inner.put(x)
        dt = time.perf_counter() - t
        c = self._c
        c["puts"] += 1
        c["put_s"] += dt
        try:
            c["put_steps"] += int(x.length(0))
        except Exception:  # a sample without a time axis
            pass
        return r

    @property
    def put_batch(self):
        """The inner buffer's ``put_batch`` (a consumer's group in one call), timed and counted as that many
        puts; AttributeError when it has none (SRL's buffers), so the consumer puts per sample as without
        the proxy."""
        inner = self._inner.put_batch

        def put_batch(xs):
            xs = list(xs)
            t = time.perf_counter()
            r = inner(xs)
            c = self._c
            c["put_s"] += time.perf_counter() - t
            c["puts"] += len(xs)
            try:
                c["put_steps"] += sum(int(x.length(0)) for x in xs)
            except Exception:  # samples without a time axis
                pass
            return r
        return put_batch

    def get(self):
        t = time.perf_counter()
        r = self._inner.get()
        dt = time.perf_counter() - t
        c = self._c
        c["gets"] += 1
        c["get_s"] += dt
        if self._first_get is None:
            self._first_get = time.time()
        try:
            c["trained"] += int(r.sample.length(0) * r.sample.length(1))
        except Exception:
            pass
        return r

    def empty(self):
        now = time.perf_counter()
        if self._waiting_since is not None:
            self._c["wait_s"] += now - self._waiting_since
            self._waiting_since = None
        e = self._inner.empty()
        self._c["wait_s"] += time.perf_counter() - now   # waiting inside the call is waiting too
        self._c["empty_calls"] += 1
        if e:
            self._c["empty_true"] += 1
            self._waiting_since = time.perf_counter()
        return e

    def qsize(self):
        return self._inner.qsize()

    def full(self):
        return self._inner.full()

    def update_priorities(self, *args, **kwargs):
        return self._inner.update_priorities(*args, **kwargs)

    def __getattr__(self, name):
        if name == "_inner":  # not set yet (e.g. while unpickling)
            raise AttributeError(name)
        return getattr(self._inner, name)

    # ------------------------------------------------------------ stats
    def snapshot(self) -> dict:
        return dict(t=time.time(), **self._c)

    def _writer(self):
        while True:
            time.sleep(self._interval)
            self.write()

    def write(self) -> None:
        with self._lock:
            self._history.append(self.snapshot())
            stats = getattr(self._inner, "stats", None)  # Conduit's buffers account for every sample put
            payload = dict(pid=os.getpid(), label=self._label, buffer=type(self._inner).__module__ + "." +
                           type(self._inner).__qualname__, t0=self._t0, first_get=self._first_get,
                           history=self._history, buffer_accounting=stats() if callable(stats) else None)
            tmp = f"{self._stats_path}.tmp"
            with open(tmp, "w") as fh:
                json.dump(payload, fh)
            os.replace(tmp, self._stats_path)


def _timed_class(inner):
    """SRL's GPU thread sends priorities only to ``isinstance(buffer, PrioritizedReplayBuffer)``:
    keep that true through the proxy."""
    from rlsrl.base.buffer import PrioritizedReplayBuffer
    if isinstance(inner, PrioritizedReplayBuffer):
        return type("TimedPrioritizedBuffer", (TimedBuffer, PrioritizedReplayBuffer), {"__module__": __name__})
    return TimedBuffer


def install(stats_dir: str, *, interval: float = 2.0, label: str = "") -> None:
    """Wrap ``rlsrl.base.buffer.make_buffer`` (whatever it is now) so every buffer it builds is timed."""
    from rlsrl.base import buffer as srl_buffer
    inner_factory = srl_buffer.make_buffer

    def timed_make_buffer(name, **buffer_args):
        inner = inner_factory(name, **buffer_args)
        path = os.path.join(stats_dir, f"buffer_stats_{os.getpid()}.json")
        return _timed_class(inner)(inner, stats_path=path, interval=interval, label=label)

    timed_make_buffer.__wrapped__ = inner_factory
    srl_buffer.make_buffer = timed_make_buffer
