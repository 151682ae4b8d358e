"""Conduit's ``SampleConsumer`` for SRL: SRL's ZMQ (``NAME``, ``IP``) and shared-memory sample streams
into the trainer's buffer at granularity ``g_ing``, every sample received counted.

Used in place of the trainer's ``sample_stream`` in SRL's experiment config (the actors keep SRL's
stream; the consumer wraps the same ``SampleStream``)::

    stream = cfg.SampleStream(type_=cfg.SampleStream.Type.NAME, stream_name="default")
    actors = [cfg.ActorWorker(..., sample_streams=[stream])]
    trainers = [cfg.TrainerWorker(..., sample_stream=conduit_srl.sample_consumer(stream, g_ing=8))]
    conduit_srl.enable()     # in the launching process, before SRL forks its workers

How it plugs in (checked against SRL b3b01ea): ``make_consumer`` passes through an instance of SRL's
``SampleConsumer`` (``system/api/sample_stream.py:136``), so the consumer is one (its class is built
on first use, subclassing SRL's, so that importing this module imports nothing of SRL). SRL's config
and launcher read and set the stream's ``type_``, ``stream_name``, ``stream_index``, ``qsize``,
``reuses``, ``batch_size`` on whatever the trainer's ``sample_stream`` is (``api/config.py:409-428``
for ``buffer_zero_copy``, ``system/api/worker_control.py:112``): the consumer forwards them to the
wrapped ``SampleStream``, which is the very object the actors' configs hold until SRL pickles the
configs, so ``buffer_zero_copy`` reshapes the actors' stream as it does without Conduit. What
``make_consumer`` does not pass to an instance (the worker's names, the shared-memory control) the
trainer worker registered by :func:`conduit_srl.enable` hands over with :meth:`bind`, then :meth:`open`.

The consumer is pickled into the trainer worker (SRL sends configs through a pipe): nothing is open
before :meth:`open` (or the first ``consume_to``) in that process, after the fork. Pickling carries
the configuration only: an unpickled (or copied) consumer is unbound and unopened, with zero counts.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from conduit_core.errors import ClosedError, ConfigError

from .ingest import StreamIngest, check_granularity
from .sources import SHM_ORDERS, ShmSource, ZmqSource

_STREAM_TYPES = ("NAME", "IP", "SHARED_MEMORY")


class ConsumerBase:
    """The consumer's behaviour; :func:`sample_consumer` builds it as a subclass of SRL's ``SampleConsumer``.

    Args:
        stream: the ``SampleStream`` the actors push to (``NAME``, ``IP`` or ``SHARED_MEMORY``).
        g_ing: samples per buffer operator call (1: SRL's behaviour, one put per sample received).
        max_delay_s: how long a partial group may wait for more samples before it is put anyway
            (0, the default: what a ``consume_to`` call received is put by its end).
        shm_order: shared memory only: ``"fresh"`` (SRL's reader) or ``"old"`` (producer order).
        stats_path: write :meth:`stats` as JSON there (``{pid}`` is replaced) every
            ``stats_interval_s`` and at close, so a run stopped from outside keeps its accounting.
    """

    __conduit_consumer__ = True

    def __init__(self, stream: Any, *, g_ing: int = 1, max_delay_s: float = 0.0, shm_order: str = "fresh",
                 stats_path: str | None = None, stats_interval_s: float = 2.0):
        kind = getattr(getattr(stream, "type_", None), "name", None)
        if kind not in _STREAM_TYPES or not hasattr(stream, "stream_name"):
            raise ConfigError("stream", f"an SRL SampleStream of type {' / '.join(_STREAM_TYPES)}",
                              repr(getattr(stream, "type_", type(stream).__name__)),
                              "wrap the SampleStream the actors push to (the other types have no consumer in SRL)")
        check_granularity(g_ing, max_delay_s)
        if shm_order not in SHM_ORDERS:
            raise ConfigError("shm_order", f"one of {SHM_ORDERS}", repr(shm_order),
                              "use 'fresh' (SRL's reader) or 'old' (each producer's order)")
        self.stream, self.kind = stream, kind
        self.g_ing, self.max_delay_s, self.shm_order = g_ing, max_delay_s, shm_order
        self.stats_path, self.stats_interval_s = stats_path, stats_interval_s
        self._reset()

    def _reset(self) -> None:
        self.worker_info = None
        self._ctrl = self._source = self._buffer = None
        self._ingest = StreamIngest(g_ing=self.g_ing, max_delay_s=self.max_delay_s)
        self._returned = 0
        self._closed = False
        self._last_write = 0.0

    # ------------------------------------------------ the SampleStream fields SRL reads and sets
    @property
    def type_(self):
        return self.stream.type_

    @property
    def stream_name(self) -> str:
        return self.stream.stream_name

    def _field(name):  # noqa: N805 - a property forwarding one field to the wrapped stream
        return property(lambda self: getattr(self.stream, name, None),
                        lambda self, v: setattr(self.stream, name, v))

    stream_index = _field("stream_index")
    qsize = _field("qsize")
    reuses = _field("reuses")
    batch_size = _field("batch_size")
    del _field

    # ------------------------------------------------ bound by Conduit's trainer worker
    def bind(self, *, worker_info: Any, ctrl: Any = None) -> None:
        """The trainer worker's names (and, for shared memory, the stream's control): what SRL's
        ``make_consumer`` gives its own consumers and not an instance. Opens nothing."""
        if self.kind == "SHARED_MEMORY" and ctrl is None:
            raise ConfigError("ctrl", "the stream's OutOfOrderSharedMemoryControl", None,
                              "bind from the trainer worker: worker.ctrl.spl_ctrls[stream.stream_index]")
        self.worker_info, self._ctrl = worker_info, ctrl

    @property
    def bound(self) -> bool:
        return self.worker_info is not None

    def open(self) -> None:
        """Open the stream's receiving end in this process (idempotent; ``consume_to`` opens it too).
        Conduit's trainer worker opens it in its ``_configure``, as SRL's consumers open theirs: SRL
        configures the trainers before the actors, whose ZMQ producers look the address up then."""
        source = self._open()
        if not source.opened:
            source.open()   # shared memory: attaches once a producer has created the dock

    # ------------------------------------------------ SRL's SampleConsumer interface
    def consume_to(self, buffer: Any, max_iter: int = 16) -> int:
        """Receive up to ``max_iter`` samples into ``buffer`` in groups of ``g_ing``; returns the
        samples stored by this call (a partial group is stored once it has waited ``max_delay_s``)."""
        source = self._open()
        self._buffer = buffer
        try:
            return self._ingest.pump(source, buffer, max_iter)
        finally:
            self._maybe_write()

    def consume(self) -> Any:
        """One sample (staged ones first), or SRL's ``NothingToConsume``. Never blocks."""
        from rlsrl.system.api.sample_stream import NothingToConsume
        source = self._open()
        got = self._ingest.take_staged(1)
        if not got:
            got = source.receive(1)
            self._ingest.count_returned(len(got))
        if not got:
            raise NothingToConsume()
        return got[0]

    def flush(self) -> int:
        """Put what is staged (a partial group included) into the last buffer now; the samples stored.
        The trainer worker's ``exit`` calls it before SRL's saves the buffer (save_buffer_on_exit),
        so a snapshot holds every sample the consumer received."""
        if self._closed or self._buffer is None:
            return 0
        try:
            return self._ingest.flush(self._buffer)
        finally:
            self._maybe_write()

    def close(self) -> None:
        """Put what is staged into the last buffer, then release every socket and mapping (idempotent).
        What could not be put (the buffer refused it) stays counted as ``staged`` in :meth:`stats`."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._buffer is not None:
                self._ingest.close(self._buffer)
        finally:
            if self._source is not None:
                self._source.close()
            self._write_stats()

    # ------------------------------------------------ accounting
    def stats(self) -> dict[str, Any]:
        """Counters (``received == put + staged + rejected + returned``), the configuration, and
        whether the stream is open."""
        src = self._source
        counts = self._ingest.counts.as_dict()
        if src is not None:
            counts["undecodable"] = src.undecodable   # also what a pump that raised had counted
        return dict(counts, g_ing=self.g_ing,
                    stream=self.kind, opened=bool(src is not None and src.opened), closed=self._closed,
                    address=getattr(src, "address", None),
                    last_decode_error=getattr(src, "last_decode_error", None))

    # ------------------------------------------------ pickling: nothing open or bound travels
    def __getstate__(self) -> dict:
        """The configuration only, also of an opened consumer (SRL's machinery may copy the trainer's
        config, e.g. for wandb): sockets, mappings, staged samples and counters stay with this one."""
        return dict(stream=self.stream, g_ing=self.g_ing, max_delay_s=self.max_delay_s, shm_order=self.shm_order,
                    stats_path=self.stats_path, stats_interval_s=self.stats_interval_s)

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.kind = state["stream"].type_.name
        self._reset()

    # ------------------------------------------------ internals
    def _open(self):
        if self._closed:
            raise ClosedError("ConduitSampleConsumer: closed. Fix: build a new consumer.")
        if self._source is None:
            if not self.bound:
                raise ConfigError("ConduitSampleConsumer.worker_info", "bound by Conduit's trainer worker", None,
                                  "call conduit_srl.enable() in the launching process before SRL forks its workers "
                                  "(or bind(worker_info=..., ctrl=...) yourself)")
            self._source = self._make_source()
        return self._source

    def _make_source(self):
        wi, s = self.worker_info, self.stream
        if self.kind == "SHARED_MEMORY":
            return ShmSource(experiment_name=wi.experiment_name, trial_name=wi.trial_name, stream_name=s.stream_name,
                             qsize=s.qsize, ctrl=self._ctrl, batch_size=s.batch_size, order=self.shm_order)
        if self.kind == "IP":
            return ZmqSource(address=s.address)
        from rlsrl.base import names
        return ZmqSource(register_as=names.sample_stream(experiment_name=wi.experiment_name,
                                                         trial_name=wi.trial_name, stream_name=s.stream_name))

    def _maybe_write(self) -> None:
        if self.stats_path and time.monotonic() - self._last_write >= self.stats_interval_s:
            self._write_stats()

    def _write_stats(self) -> None:
        if not self.stats_path:
            return
        self._last_write = time.monotonic()
        path = self.stats_path.format(pid=os.getpid())
        with open(path + ".tmp", "w") as fh:
            json.dump(dict(self.stats(), t=time.time(), pid=os.getpid()), fh)
        os.replace(path + ".tmp", path)


_CLASS = None


def consumer_class():
    """``ConduitSampleConsumer``: :class:`ConsumerBase` and SRL's ``SampleConsumer`` (built on first use)."""
    global _CLASS
    if _CLASS is None:
        from rlsrl.system.api.sample_stream import SampleConsumer
        _CLASS = type("ConduitSampleConsumer", (ConsumerBase, SampleConsumer),
                      {"__module__": __name__, "__qualname__": "ConduitSampleConsumer", "__doc__": ConsumerBase.__doc__})
    return _CLASS


def sample_consumer(stream: Any, **options: Any) -> Any:
    """A ``ConduitSampleConsumer`` over ``stream`` (see :class:`ConsumerBase` for the options)."""
    return consumer_class()(stream, **options)


def __getattr__(name: str):
    """``conduit_srl.consumer.ConduitSampleConsumer``, built on first use (pickle finds it here)."""
    if name == "ConduitSampleConsumer":
        return consumer_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
