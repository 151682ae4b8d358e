"""Which queued entry is served next, and which one an overflow drops: the decisions of an
:class:`~conduit_core.queues.entry_queue.EntryQueue` (an index of keys, no data, no threads), kept apart
from its storage and its lock.

An entry is known by its ``order`` (a strictly increasing insertion number, so larger = fresher)
and its ``reuses_left``. Two serve rules:

- ``"freshest"``: the entry with the most reuses left, freshest first among those (SRL's
  ``PriorityQueueBuffer``, IMPALA-style reuse: a new batch is trained on before an older one is
  trained on again);
- ``"oldest"``: the entry with the most reuses left, oldest first (a FIFO queue when every entry is
  served once: SRL's ``SimpleQueueBuffer``).

Overflow rules, applied when more than ``max_entries`` entries are queued:

- ``"drop_lowest"``: the entry with the fewest reuses left, the oldest among those (SRL's priority queue);
- ``"drop_oldest"``: the oldest entry (SRL's simple queue);
- ``"reject"``: nothing is dropped; the queue refuses the put that would overflow (lossless).
"""

from __future__ import annotations

import bisect

from ..errors import ConfigError

SERVE_RULES = ("freshest", "oldest")
OVERFLOW_RULES = ("drop_lowest", "drop_oldest", "reject")


def check_rules(serve: str, overflow: str) -> None:
    if serve not in SERVE_RULES:
        raise ConfigError("serve", f"one of {SERVE_RULES}", repr(serve),
                          "use 'freshest' (reuse queue) or 'oldest' (FIFO)")
    if overflow not in OVERFLOW_RULES:
        raise ConfigError("overflow", f"one of {OVERFLOW_RULES}", repr(overflow),
                          "use 'drop_lowest', 'drop_oldest', or 'reject' to refuse puts instead of dropping")


class ReuseOrder:
    """The queued entries' keys in serve order. No data, no threads: the owner holds the lock."""

    def __init__(self, serve: str = "freshest", overflow: str = "drop_lowest"):
        check_rules(serve, overflow)
        self.serve, self.overflow = serve, overflow
        self._sign = 1 if serve == "freshest" else -1
        self._keys: list[tuple[int, int]] = []      # ascending; the last one is served next
        self._reuses: dict[int, int] = {}           # order -> reuses_left

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, order: int) -> bool:
        return order in self._reuses

    def _key(self, order: int, reuses_left: int) -> tuple[int, int]:
        return (reuses_left, self._sign * order)

    def add(self, order: int, reuses_left: int) -> None:
        if order in self._reuses:
            raise ValueError(f"entry {order} is already queued")
        bisect.insort(self._keys, self._key(order, reuses_left))
        self._reuses[order] = reuses_left

    def peek(self) -> tuple[int, int] | None:
        """``(order, reuses_left)`` of the entry served next, or None when empty."""
        if not self._keys:
            return None
        reuses_left, signed = self._keys[-1]
        return self._sign * signed, reuses_left

    def remove(self, order: int) -> None:
        reuses_left = self._reuses.pop(order)
        i = bisect.bisect_left(self._keys, self._key(order, reuses_left))
        del self._keys[i]

    def victim(self) -> int:
        """The entry an overflow drops (``overflow`` must not be 'reject')."""
        if self.overflow == "drop_oldest":  # orders grow with insertion: the smallest is the oldest
            return min(self._reuses)
        if self.serve == "freshest":      # ascending (reuses_left, order): the first is the lowest
            reuses_left, signed = self._keys[0]
            return signed
        return min(self._reuses, key=lambda o: (self._reuses[o], o))

    def orders(self) -> list[tuple[int, int]]:
        """Every queued ``(order, reuses_left)``, served-next last."""
        return [(self._sign * s, r) for r, s in self._keys]
