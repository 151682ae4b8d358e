"""What an RLlib constructor leaves in an object's fields, so that objects built on every
training step can be copies of one it built instead of another run of its Python.

``constructed_fields(make)`` runs ``make()`` twice, a moment apart, and sorts the first
object's fields into three kinds:

- copied: ``None``, a bool, int, str or float the same in both (NaN in both too);
- made anew for each copy: an empty container of one of ``containers``' types (never shared
  between two copies: each gets its own);
- clocks: a float that differs between the two and is a ``time.perf_counter()`` reading taken
  while the first ran (the copy reads the clock when it is built).

Any other field (a lock, a tensor, a non-empty container, a scalar that differs between two
constructions) means the object cannot be copied safely: the answer is None and the caller
keeps RLlib's constructor. Used by ``replay_metrics.StatsMaker`` (18 ``Stats`` per training
step) and ``learner_batch.SampleBatchMaker`` (the learner's ``SampleBatch`` per update).
"""

from __future__ import annotations

import collections
import functools
import time
from typing import Any, Callable, NamedTuple

PLAIN_CONTAINERS = (dict, list, collections.deque)


class Fields(NamedTuple):
    fields: dict[str, Any]                        # the first object's fields (copy before use)
    containers: tuple[tuple[str, Callable], ...]   # (field, maker of a fresh empty container)
    clocks: tuple[str, ...]                       # fields holding the constructor's perf_counter reading


def constructed_fields(make: Callable[[], Any], *, containers: tuple[type, ...] = PLAIN_CONTAINERS) -> Fields | None:
    t0 = time.perf_counter()
    first = vars(make())
    t1 = time.perf_counter()
    time.sleep(0.001)
    second = vars(make())
    fresh, clocks = [], []
    for k, v in first.items():
        other = second.get(k, fresh)   # (a field the second lacks: unlike any value)
        if type(v) in containers and not v:
            fresh.append((k, functools.partial(collections.deque, maxlen=v.maxlen)
                          if type(v) is collections.deque else type(v)))
        elif (v is None or type(v) in (bool, int, str, float)) and (v == other or (v != v and other != other)):
            pass   # (the same in both: copied; NaN in both too)
        elif type(v) is float and t0 <= v <= t1:
            clocks.append(k)
        else:
            return None
    return Fields(first, tuple(fresh), tuple(clocks))
