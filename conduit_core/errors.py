"""One error hierarchy for Conduit.

Every error raised on bad input says which field (or argument) is wrong, what was
expected, what was received, and how to fix it. Callers can catch ``ConduitError``
for everything, or a precise subclass. Subclasses also derive from the matching
builtin (``ValueError``, ``TimeoutError``, ...) so generic handlers keep working.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class ConduitError(Exception):
    """Base class of every error Conduit raises on purpose."""


def describe(field: str, expected: object, actual: object, fix: str) -> str:
    """The one message format for input errors: field, expected, actual, fix."""
    return f"{field}: expected {expected}, got {actual}. Fix: {fix}"


class SpecError(ConduitError, ValueError):
    """Data or configuration does not match the experience spec (shape, dtype, names)."""

    def __init__(self, field: str, expected: object, actual: object, fix: str):
        self.field = field
        self.expected = expected
        self.actual = actual
        self.fix = fix
        super().__init__(describe(field, expected, actual, fix))

    def __reduce__(self):   # (pickled across processes and Ray actors: rebuilt from its four parts)
        return type(self), (self.field, self.expected, self.actual, self.fix), self.__dict__


class ConfigError(ConduitError, ValueError):
    """A constructor or option argument is invalid."""

    def __init__(self, argument: str, expected: object, actual: object, fix: str):
        self.argument = argument
        self.expected, self.actual, self.fix = expected, actual, fix
        super().__init__(describe(argument, expected, actual, fix))

    def __reduce__(self):   # (its four-part constructor: the default pickling called it with one)
        return type(self), (self.argument, self.expected, self.actual, self.fix), self.__dict__


class CapacityError(ConduitError, ValueError):
    """A batch or a placement does not fit the capacity it was given."""


class CodecError(ConduitError, ValueError):
    """A lossless codec could not represent a value exactly; the value was rejected."""


class RateLimitError(ConduitError):
    """The samples-per-insert ratio (or minimum size) forbids the call right now."""


class RateLimitTimeout(RateLimitError, TimeoutError):
    """A rate-limited call waited for its whole timeout without being allowed to run."""


class ExperienceTimeout(ConduitError, TimeoutError):
    """A wait (flush, delivery, queue space) exceeded its timeout."""


class WorkerError(ConduitError, RuntimeError):
    """A background operator raised; the original exception is chained as ``__cause__``."""


class ClosedError(ConduitError, RuntimeError):
    """The data plane was closed; no further calls are accepted."""


class StateError(ConduitError, ValueError):
    """A state dict does not match this buffer (schema version, spec, capacity)."""


class SemanticError(ConduitError, RuntimeError):
    """A call would break an RL semantic guard (policy-version isolation, consume-once)."""


class RowsNotStored(SemanticError):
    """``read`` asked for rows the buffer does not hold (evicted, overwritten, on a lost shard)."""


class ShardLost(ConduitError, RuntimeError):
    """A remote shard's actor is gone (it died, or its node left the cluster). The buffer
    handles it (its rows leave, a new empty shard takes its place, the loss is recorded in
    ``ExperienceBuffer.losses``); it reaches a caller only where that is not possible."""

    def __init__(self, shard: int, node: str | None, cause: BaseException, *, part: int | None = None) -> None:
        # part: the shard object that found the loss; a handle kept from before the shard was
        # replaced reports a loss the buffer already recovered from (ShardLossRecovery checks)
        self.shard, self.node, self.cause, self.part = shard, node, cause, part
        super().__init__(f"remote shard {shard} (node resource {node!r}) is lost: {type(cause).__name__}: {cause}")

    def __reduce__(self):   # (the shard object stays behind: it holds actor handles and locks)
        return type(self), (self.shard, self.node, self.cause), {k: v for k, v in self.__dict__.items() if k != "part"}


class StagedRowsLost(ConduitError, RuntimeError):
    """Rows a ``SourceWriter`` staged are gone before the buffer took them (their staging
    shard's actor died, or its node left): they were never accepted, so nothing counts them.
    The writer's caller sends them again (a new writer from ``ExperienceBuffer.writer``)."""


INT64_MAX = (1 << 63) - 1


def require_int(name: str, value: Any, *, low: int = 0, high: int = INT64_MAX, fix: str | None = None) -> int:
    """``value`` as an int in ``[low, high]``, else a ConfigError naming ``name``: an id, a
    version, a seq or a slot is never a float (``int(2.7)`` would silently be 2), a bool, a
    string, or outside what the buffer's int64 metadata holds."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ConfigError(name, f"an int in [{low}, {high}]", repr(value), fix or f"pass {name} as an int")
    v = int(value)
    if not low <= v <= high:
        raise ConfigError(name, f"an int in [{low}, {high}]", v, fix or f"pass {name} in that range")
    return v


def require_ids(source: Any, policy_version: Any) -> tuple[int, int]:
    """A rollout's producer id and policy version, as ints in ``[0, 2^63)``: the one check every
    ingest route makes before a ticket is taken or a row stored (plain ints pass in two comparisons)."""
    if type(source) is int and type(policy_version) is int and 0 <= source <= INT64_MAX \
            and 0 <= policy_version <= INT64_MAX:
        return source, policy_version
    return (require_int("source", source, fix="pass the producer's id (e.g. the env runner's index), an int >= 0"),
            require_int("policy_version", policy_version,
                        fix="pass the version of the policy that produced the rows, an int >= 0"))


def require_int_array(name: str, values: Any, *, fix: str) -> np.ndarray:
    """``values`` as a 1-D int64 array: ints only (a float 3.7 is not slot 3), named otherwise."""
    arr = values if isinstance(values, np.ndarray) else np.asarray(values)
    if arr.dtype.kind not in "iu" and not (arr.size == 0 and arr.dtype.kind == "f"):
        raise ConfigError(name, "integers", f"dtype {arr.dtype}" + (f" (e.g. {arr.reshape(-1)[0]!r})" if arr.size else ""),
                          fix)
    return arr.astype(np.int64, copy=False).reshape(-1)
