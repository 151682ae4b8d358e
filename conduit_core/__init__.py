"""Conduit core: the framework-agnostic Experience Data Plane.

Imports no RL framework; needs torch and numpy only.
"""

from .batch import Batch
from .buffer import ExperienceBuffer, ShardLoss, prioritized_replay, queue, replay
from .codecs import AffineCodec, Codec, IdentityCodec
from .edp import ExperienceDataPlane
from .errors import (CapacityError, ClosedError, CodecError, ConduitError, ConfigError, ExperienceTimeout,
                     RateLimitError, RateLimitTimeout, RowsNotStored, SemanticError, ShardLost, SpecError, StateError,
                     WorkerError)
from .hooks import Rollout
from .metrics import ControlPointMetrics, MetricsSnapshot
from .rate_limiter import RateLimiter
from .schedule import Schedule
from .selectors import Fifo, Prioritized, Selector, Uniform
from .spec import ExperienceSpec, FieldSpec
from .shards import Shard, ShardSpec, even_shards, register_shard_kind
from .tiers import Tier, cuda_available
from . import state_io

__version__ = "0.1.0"

__all__ = [
    "AffineCodec", "Batch", "CapacityError", "ClosedError", "Codec", "CodecError", "ConduitError", "ConfigError",
    "ControlPointMetrics", "ExperienceBuffer", "ExperienceDataPlane", "ExperienceSpec",
    "ExperienceTimeout", "FieldSpec", "Fifo", "IdentityCodec", "MetricsSnapshot", "Prioritized", "RateLimitError",
    "RateLimitTimeout", "RateLimiter", "Rollout", "RowsNotStored", "Schedule", "SemanticError", "Selector", "ShardLoss", "ShardLost",
    "Shard", "ShardSpec",
    "SpecError", "StateError", "Tier", "Uniform", "WorkerError", "cuda_available", "even_shards",
    "prioritized_replay", "queue", "register_shard_kind", "replay", "__version__",
]
