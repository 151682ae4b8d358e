"""Ingestion at granularity ``g_ing``: samples received from a stream go into a buffer in groups of
``g_ing``, each sample exactly once, every one counted. Nothing of SRL is imported here: the stream
readers are in :mod:`~conduit_srl.sources`, SRL's ``SampleConsumer`` interface in
:mod:`~conduit_srl.consumer`.

::

    source.receive(n) --samples--> [ staged (< g_ing, FIFO) ] --group of g_ing--> buffer.put_batch(group)
                                                                                  (or put() per sample)

- A group is one operator call on the buffer: ``put_batch(group)`` when the buffer has one (it must
  store all of the group or none of it and raise), else ``put`` per sample (SRL's own buffers).
  ``g_ing=1`` is SRL's behaviour: every sample is put when it is received.
- Order: samples go into the buffer in the order they were received (per producer, the stream's
  order); a group never reorders.
- Liveness: a partial group (fewer than ``g_ing`` staged) is put once its oldest sample has waited
  ``max_delay_s`` (checked at the end of each ``pump``), and by :meth:`StreamIngest.flush` (close),
  so a producer that stops (or dies) never strands what was received. The default, 0, puts what a
  pump received at its end: a group is what arrived together (a burst, up to ``g_ing``), and no
  sample waits for later ones (a trainer waiting for its next batch would wait for them too).
- Exactly once: ``received == put + staged + rejected + returned`` at all times (:class:`IngestCounts`). A
  sample the buffer refuses (its ``put`` raises) is counted ``rejected`` and the error re-raised,
  as SRL's own path raises on a bad put; the samples after it in its group stay staged, in order,
  for the next call. ``undecodable`` counts messages a source could not decode (not samples: they
  never reach ``received``).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Protocol

from conduit_core.errors import ClosedError, ConfigError

# What a buffer raises for a sample it refuses (Conduit's SpecError, ConfigError, CodecError are
# ValueErrors; SRL's own buffers raise ValueError or TypeError): that sample leaves the stage.
REFUSED_INPUT = (ValueError, TypeError)


class Source(Protocol):
    """What :class:`StreamIngest` pulls from (opened lazily by the caller, in the process that reads)."""

    undecodable: int

    def receive(self, max_n: int) -> list[Any]:
        """Up to ``max_n`` samples available now, in stream order; never blocks (``[]``: none)."""

    def close(self) -> None:
        """Release every socket, mapping and thread the source holds."""


@dataclass
class IngestCounts:
    """Counters of one :class:`StreamIngest` (data, not logic):
    ``received == put + staged + rejected + returned``."""

    received: int = 0        # samples handed over by the source
    put: int = 0             # samples stored in the buffer
    staged: int = 0          # samples received, waiting for their group
    rejected: int = 0        # samples the buffer refused (its put raised)
    returned: int = 0        # samples handed to a caller of SRL's consume() instead of a buffer
    undecodable: int = 0     # messages the source could not decode (never received as samples)
    groups: int = 0          # buffer operator calls that stored samples
    partial_groups: int = 0  # of those, groups put with fewer than g_ing samples (delay or flush)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def check_granularity(g_ing: Any, max_delay_s: Any) -> None:
    if isinstance(g_ing, bool) or not isinstance(g_ing, int) or g_ing < 1:
        raise ConfigError("g_ing", "an integer >= 1 (samples per buffer operator call)", repr(g_ing),
                          "pass g_ing=1 for SRL's behaviour (one put per sample received)")
    if isinstance(max_delay_s, bool) or not isinstance(max_delay_s, (int, float)) or not max_delay_s >= 0:
        raise ConfigError("max_delay_s", "a number of seconds >= 0", repr(max_delay_s),
                          "pass how long a partial group may wait for more samples, e.g. 0.05")


class StreamIngest:
    """Stages received samples and puts them into a buffer in groups of ``g_ing`` (see module doc).

    Not thread-safe: SRL calls ``consume_to`` from its trainer worker's main thread only."""

    def __init__(self, *, g_ing: int = 1, max_delay_s: float = 0.0, clock: Callable[[], float] = time.monotonic):
        check_granularity(g_ing, max_delay_s)
        self.g_ing, self.max_delay_s = g_ing, float(max_delay_s)
        self._clock = clock
        self._staged: list[Any] = []
        self._times: list[float] = []       # when each staged sample was received
        self._closed = False
        self.counts = IngestCounts()

    @property
    def staged(self) -> int:
        return len(self._staged)

    def pump(self, source: Source, buffer: Any, max_samples: int) -> int:
        """Receive up to ``max_samples`` from ``source`` and put every full group into ``buffer``;
        then put a partial group that has waited ``max_delay_s``. Returns the samples stored."""
        if self._closed:
            raise ClosedError("StreamIngest.pump: closed. Fix: build a new consumer.")
        stored = self._put_ready(buffer)   # a group left staged by a put that raised last time
        received = 0
        while received < max_samples:
            want = min(max_samples - received, max(self.g_ing - len(self._staged), 1))
            got = source.receive(want)
            if not got:
                break
            received += len(got)
            self._stage(got)
            stored += self._put_ready(buffer)
        self.counts.undecodable = source.undecodable
        if self._staged and self._clock() - self._times[0] >= self.max_delay_s:
            stored += self._put_group(buffer, len(self._staged))
        return stored

    def take_staged(self, n: int) -> list[Any]:
        """The oldest ``n`` staged samples, removed from the stage (SRL's ``consume()``: the caller takes
        them instead of a buffer)."""
        got = self._staged[:n]
        del self._staged[:n]
        del self._times[:n]
        self.counts.staged = len(self._staged)
        self.counts.returned += len(got)
        return got

    def count_returned(self, n: int) -> None:
        """``n`` samples received from the source and handed straight to a ``consume()`` caller."""
        self.counts.received += n
        self.counts.returned += n

    def flush(self, buffer: Any) -> int:
        """Put everything staged (a partial group included). Returns the samples stored."""
        stored = 0
        while self._staged:
            stored += self._put_group(buffer, min(self.g_ing, len(self._staged)))
        return stored

    def close(self, buffer: Any | None) -> int:
        """Flush into ``buffer`` (when given) and refuse further pumps. Returns the samples stored."""
        stored = self.flush(buffer) if buffer is not None else 0
        self._closed = True
        return stored

    # ---------------------------------------------------------------- internals
    def _stage(self, samples: list[Any]) -> None:
        now = self._clock()
        self._staged.extend(samples)
        self._times.extend([now] * len(samples))
        self.counts.received += len(samples)
        self.counts.staged = len(self._staged)

    def _put_ready(self, buffer: Any) -> int:
        stored = 0
        while len(self._staged) >= self.g_ing:
            stored += self._put_group(buffer, self.g_ing)
        return stored

    def _put_group(self, buffer: Any, n: int) -> int:
        """One operator call: the first ``n`` staged samples into ``buffer``."""
        group = self._staged[:n]
        put_batch = getattr(buffer, "put_batch", None)
        stored = 0
        if put_batch is not None and n > 1:
            try:
                put_batch(group)   # all of the group or none of it
                stored = n
            except REFUSED_INPUT:  # a sample refused: find which, one put at a time (else it propagates)
                stored = 0
        if stored == 0:
            for x in group:
                try:
                    buffer.put(x)
                except BaseException as exc:
                    # a refused sample leaves the stage, counted; one the buffer could not take for another
                    # reason (closed, failing) stays, as do those after it, in order
                    refused = isinstance(exc, REFUSED_INPUT)
                    self._take(stored + refused, stored)
                    self.counts.rejected += refused
                    self.counts.groups += stored > 0
                    raise
                stored += 1
        self._take(n, stored)
        self.counts.groups += 1
        self.counts.partial_groups += n < self.g_ing
        return stored

    def _take(self, n: int, stored: int) -> None:
        del self._staged[:n]
        del self._times[:n]
        self.counts.put += stored
        self.counts.staged = len(self._staged)
