"""Rate limiting: a minimum size before sampling and a samples-per-insert ratio.

One primitive with different parameters (cf. Reverb's ``SampleToInsertRatio``):

    allowed  <=>  min_diff <= inserts * samples_per_insert - samples <= max_diff

where ``min_diff = -tolerance`` and ``max_diff = +tolerance`` around the target.
An insert that would push the difference above ``max_diff`` must wait for samples; a
sample that would push it below ``min_diff`` must wait for inserts. The decisions are
pure functions of the counters; the buffer does the waiting (or raising).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import ConfigError


@dataclass(frozen=True)
class RateLimiter:
    """``min_size``: items needed before the first sample. ``samples_per_insert``: the
    target ratio of sampled to inserted items (None = no ratio). ``tolerance``: how far
    (in sampled items) the run may drift from the ratio. ``on_limit``: 'block' waits up
    to ``timeout`` seconds; 'raise' raises RateLimitError at once."""

    min_size: int = 1
    samples_per_insert: float | None = None
    tolerance: float = math.inf
    on_limit: str = "block"
    timeout: float = 60.0

    def __post_init__(self) -> None:
        if self.min_size < 1:
            raise ConfigError("RateLimiter.min_size", ">= 1", self.min_size, "use min_size=1 to sample at once")
        if self.samples_per_insert is not None and self.samples_per_insert <= 0:
            raise ConfigError("RateLimiter.samples_per_insert", "> 0 or None", self.samples_per_insert,
                              "use e.g. 8.0 (each inserted item sampled ~8 times), or None for no ratio")
        if self.samples_per_insert is not None and self.tolerance < self.samples_per_insert:
            raise ConfigError(
                "RateLimiter.tolerance", f">= samples_per_insert ({self.samples_per_insert})", self.tolerance,
                "raise the tolerance: with less room than one insert's worth of samples, inserts and "
                "samples block each other and the run deadlocks as soon as it starts")
        if self.on_limit not in ("block", "raise"):
            raise ConfigError("RateLimiter.on_limit", "'block' or 'raise'", repr(self.on_limit),
                              "choose 'block' (wait up to timeout) or 'raise' (fail at once)")
        if isinstance(self.timeout, bool) or not isinstance(self.timeout, (int, float)) \
                or not 0 < self.timeout < float("inf"):
            raise ConfigError("RateLimiter.timeout", "a finite number of seconds > 0", repr(self.timeout),
                              "every wait needs a timeout that ends (a blocked run then says why); "
                              "pass a long one, e.g. timeout=3600.0, rather than none")

    # Pure decisions --------------------------------------------------------
    def can_sample(self, *, size: int, inserts: int, samples: int, n: int) -> bool:
        if size < self.min_size:
            return False
        if self.samples_per_insert is None:
            return True
        diff = inserts * self.samples_per_insert - (samples + n)
        return diff >= -self.tolerance

    def can_insert(self, *, inserts: int, samples: int, n: int, size: int) -> bool:
        if self.samples_per_insert is None or size + n <= self.min_size:
            return True
        diff = (inserts + n) * self.samples_per_insert - samples
        return diff <= self.tolerance

    def why_not_sample(self, *, size: int, inserts: int, samples: int, n: int) -> str:
        if size < self.min_size:
            return f"the buffer holds {size} items and min_size is {self.min_size}"
        return (f"sampling {n} more items would exceed samples_per_insert={self.samples_per_insert} "
                f"(inserted {inserts}, sampled {samples}, tolerance {self.tolerance})")

    def why_not_insert(self, *, inserts: int, samples: int, n: int) -> str:
        return (f"inserting {n} more items would exceed the ratio samples_per_insert="
                f"{self.samples_per_insert} from below (inserted {inserts}, sampled {samples}, "
                f"tolerance {self.tolerance}): the learner must sample first")

    def to_config(self) -> dict:
        return {"min_size": self.min_size, "samples_per_insert": self.samples_per_insert,
                "tolerance": None if math.isinf(self.tolerance) else self.tolerance,
                "on_limit": self.on_limit, "timeout": self.timeout}

