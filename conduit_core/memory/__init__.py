"""Memory: the tiers a shard can live on (GPU, pinned, pageable, shared host memory, another node),
how each allocates and commits its memory, what a capacity needs against what is free, host-to-device
staging, and the output arrays deliveries reuse. Nothing here knows what a transition is."""

from .budget import available_bytes, needed_bytes
from .output_pool import OutputPool
from .tiers import Tier, allocate, cuda_available

__all__ = ["OutputPool", "Tier", "allocate", "available_bytes", "cuda_available", "needed_bytes"]
