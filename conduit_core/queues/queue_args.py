"""The checks on an :class:`~conduit_core.queues.entry_queue.EntryQueue`'s arguments, before anything is
built or stored: each error names the argument, what was expected, what came, and the fix."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import ConfigError, SpecError
from .reuse_order import check_rules


def check_queue_args(*, serve: str, overflow: str, max_entries: Any, batch_size: Any, reuses: Any,
                     max_version_lag: Any, lease_depth: Any, adopt: bool, prepare: Any) -> None:
    check_rules(serve, overflow)
    if prepare is not None and not callable(prepare):
        raise ConfigError("prepare", "a callable (Entry -> object) or None", repr(prepare)[:80],
                          "pass a function that builds the object each serve of an entry hands back")
    if adopt and batch_size is not None:
        raise ConfigError("adopt", "False when batch_size is set", True,
                          "adopt=True keeps each put's own arrays as its entry: only for batch_size=None")
    if isinstance(max_entries, bool) or not isinstance(max_entries, (int, float)) or not (
            max_entries == math.inf or (max_entries >= 1 and float(max_entries).is_integer())):
        raise ConfigError("max_entries", "an integer >= 1 or math.inf", repr(max_entries),
                          "pass how many formed entries the queue may hold")
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int)
                                   or batch_size < 1):
        raise ConfigError("batch_size", "an integer >= 1 or None", repr(batch_size),
                          "pass the samples per entry (None: one sample, no batch axis)")
    if isinstance(reuses, bool) or not isinstance(reuses, int) or reuses < 1:
        raise ConfigError("reuses", "an integer >= 1", repr(reuses), "pass how often each entry is served")
    if max_version_lag is not None and not (isinstance(max_version_lag, (int, float)) and max_version_lag >= 0):
        raise ConfigError("max_version_lag", "a number >= 0 or None", repr(max_version_lag),
                          "pass the largest policy-version lag to train on (None: no limit)")
    if isinstance(lease_depth, bool) or not isinstance(lease_depth, int) or lease_depth < 0:
        raise ConfigError("lease_depth", "an integer >= 0", repr(lease_depth),
                          "pass 2 for a trainer with a one-step prefetcher, 1 without one")


def check_put_many_args(samples: Any, policy_versions: Any) -> list[int | None] | None:
    """``put_many``'s arguments checked (a sequence of mappings; one policy version per sample, or
    None); returns the versions as ints (or None)."""
    if isinstance(samples, Mapping) or not isinstance(samples, Sequence):
        raise SpecError("samples", "a sequence of samples (mappings of field name -> array)",
                        type(samples).__name__, "pass a list of samples; put() takes a single one")
    n = len(samples)
    if policy_versions is not None and (isinstance(policy_versions, (str, bytes)) or len(policy_versions) != n):
        raise SpecError("policy_versions", f"one per sample ({n}) or None", repr(policy_versions)[:80],
                        "pass a list as long as samples, or None")
    versions = None
    if policy_versions is not None:
        try:
            versions = [None if v is None else int(v) for v in policy_versions]
        except (TypeError, ValueError):
            raise SpecError("policy_versions", "integers or None", repr(list(policy_versions))[:80],
                            "pass each sample's policy version (or None)") from None
    for i, sample in enumerate(samples):
        if not isinstance(sample, Mapping):
            raise SpecError(f"samples[{i}]", "a mapping of field name -> array", type(sample).__name__,
                            "flatten nested samples first (conduit_core.schema.nested.flatten)")
    return versions
