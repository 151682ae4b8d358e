"""Entry queues: batched entries served a set number of times, freshest or oldest first, for
on-policy and reuse-based training (SRL's and IMPALA's queues)."""

from .entry_queue import Entry, EntryQueue

__all__ = ["Entry", "EntryQueue"]
