"""Queues between producers and a trainer: entry queues (batched entries served a set number of
times, freshest or oldest first, for on-policy and reuse-based training: SRL's and IMPALA's queues) and
the version window (asynchronous LLM RL: staleness bounded by admission, oldest first, nothing dropped)."""

from .entry_queue import Entry, EntryQueue
from .version_window import Admission, TakenSample, VersionWindowQueue, admissible, in_window

__all__ = ["Admission", "TakenSample", "Entry", "EntryQueue", "VersionWindowQueue", "admissible", "in_window"]
