"""Selection: which rows a delivery reads (selectors: uniform, prioritized over a sum tree, FIFO
and your own) and when a delivery or an insert may go ahead (the rate limiter)."""

from .rate_limiter import RateLimiter
from .selectors import Fifo, Prioritized, Selector, Uniform
from .sumtree import PriorityIndex

__all__ = ["Fifo", "Prioritized", "PriorityIndex", "RateLimiter", "Selector", "Uniform"]
