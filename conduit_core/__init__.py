"""Conduit core: the framework-agnostic Experience Data Plane.

Imports no RL framework; needs torch and numpy only. Subpackages by concern, each importing only
those before it (tests/core/test_import_boundaries.py holds the code to this order)::

    errors, state_io      one error hierarchy; state files without pickle
    memory                tiers, allocation, budgets, staging, reused outputs
    schema                the spec, codecs, frame stacks, Batch
    storage               shards and columnar storage (rows, not meaning)
    remote                shards held by Ray actors; how columns travel to them
    planning              placement, topology, schedule, cost model, tuner (pure decisions)
    selection             selectors, sum tree, rate limiter
    source                writers at the actor, receipts committed once
    buffer                the experience buffer: ring, insert, draws, episodes, migration
    plane                 the data plane: ingestion, delivery, placement calls, metrics
    queues, kv            SRL's entry queues; verl's keyed variable-length rows
    cli                   the ``conduit`` command

What a user calls is exported here; the parts for those who compose their own are exported by
each subpackage's ``__init__``; everything else is the subpackages' own business.
"""

import importlib
from pathlib import Path as _Path
from typing import TYPE_CHECKING

from ._moved import install as _install_moved
from .errors import (CapacityError, ClosedError, CodecError, ConduitError, ConfigError, ExperienceTimeout,
                     RateLimitError, RateLimitTimeout, RowsNotStored, SemanticError, ShardLost, SpecError, StateError,
                     WorkerError)

_install_moved(__name__)

# the project's one version: every distribution (the core, each adapter, the lab) is built at it and
# each adapter pins the core to it (their setup.py files read this file)
__version__ = _Path(__file__).with_name("VERSION").read_text(encoding="utf-8").strip()

# name -> the module (under conduit_core) it is loaded from on first use
_EXPORTS = {
    "ExperienceBuffer": "buffer.experience_buffer", "ShardLoss": "buffer.experience_buffer",
    "prioritized_replay": "buffer.experience_buffer", "queue": "buffer.experience_buffer",
    "replay": "buffer.experience_buffer",
    "Tier": "memory.tiers", "cuda_available": "memory.tiers",
    "ExperienceDataPlane": "plane.edp", "Rollout": "plane.hooks",
    "ControlPointMetrics": "plane.metrics", "MetricsSnapshot": "plane.metrics",
    "Schedule": "planning.schedule",
    "Batch": "schema.batch", "AffineCodec": "schema.codecs", "Codec": "schema.codecs",
    "IdentityCodec": "schema.codecs", "register_codec": "schema.codecs",
    "ExperienceSpec": "schema.spec", "FieldSpec": "schema.spec",
    "RateLimiter": "selection.rate_limiter",
    "Fifo": "selection.selectors", "Prioritized": "selection.selectors", "Selector": "selection.selectors",
    "Uniform": "selection.selectors",
    "Shard": "storage.shards", "ShardSpec": "storage.shards", "even_shards": "storage.shards",
    "register_shard_kind": "storage.shards",
}


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    elif name == "state_io":
        value = importlib.import_module(".state_io", __name__)
    else:
        raise AttributeError(f"module 'conduit_core' has no attribute {name!r}")
    globals()[name] = value   # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS) | {"state_io"})


if TYPE_CHECKING:  # what the names are, for type checkers and editors (never run)
    from . import state_io
    from .buffer.experience_buffer import ExperienceBuffer, ShardLoss, prioritized_replay, queue, replay
    from .memory.tiers import Tier, cuda_available
    from .plane.edp import ExperienceDataPlane
    from .plane.hooks import Rollout
    from .plane.metrics import ControlPointMetrics, MetricsSnapshot
    from .planning.schedule import Schedule
    from .schema.batch import Batch
    from .schema.codecs import AffineCodec, Codec, IdentityCodec, register_codec
    from .schema.spec import ExperienceSpec, FieldSpec
    from .selection.rate_limiter import RateLimiter
    from .selection.selectors import Fifo, Prioritized, Selector, Uniform
    from .storage.shards import Shard, ShardSpec, even_shards, register_shard_kind

__all__ = [
    "AffineCodec", "Batch", "CapacityError", "ClosedError", "Codec", "CodecError", "ConduitError", "ConfigError",
    "ControlPointMetrics", "ExperienceBuffer", "ExperienceDataPlane", "ExperienceSpec",
    "ExperienceTimeout", "FieldSpec", "Fifo", "IdentityCodec", "MetricsSnapshot", "Prioritized", "RateLimitError",
    "RateLimitTimeout", "RateLimiter", "Rollout", "RowsNotStored", "Schedule", "SemanticError", "Selector", "ShardLoss", "ShardLost",
    "Shard", "ShardSpec",
    "SpecError", "StateError", "Tier", "Uniform", "WorkerError", "cuda_available", "even_shards",
    "prioritized_replay", "queue", "register_codec", "register_shard_kind", "replay", "__version__",
]
