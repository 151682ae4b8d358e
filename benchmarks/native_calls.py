"""Time spent inside the core's native (C) entry points on the hot path, in the run.

``rllib_conduit_path --sections`` wraps these with a timer each: the n-step window draw
(``sample_windows``), the row gathers, the delivered batch's priority update
(``set_delivered``), the ring insert and the sum tree's run update, and the draw counts the
metrics need. What a call costs beyond them is the Python around them (session 35: about 70 of
some 440 us per training step on DQN CartPole were inside these calls; docs/benchmarks.md §2).
"""

from __future__ import annotations

import time


def _timed(fn, key: str, totals: dict, counts: dict):
    def wrapper(*a):
        t0 = time.perf_counter()
        try:
            return fn(*a)
        finally:
            totals[key] += time.perf_counter() - t0
            counts[key] += 1
    return wrapper


class _TimedModule:
    """Attribute access to a C module, each function timed under ``C <module>.<name>``."""

    def __init__(self, module, totals: dict, counts: dict):
        self._module, self._totals, self._counts = module, totals, counts

    def __getattr__(self, name):
        fn = getattr(self._module, name)
        return _timed(fn, f"C {self._module.__name__.rsplit('.', 1)[-1]}.{name}", self._totals, self._counts) \
            if callable(fn) else fn


def time_native_calls(totals: dict, counts: dict) -> None:
    """Wrap the hot path's native entry points where the core's modules hold them."""
    from conduit_core.schema import batch, episodes, ring, row_draw, selectors, sumtree, window_draw
    for module, name in ((episodes, "_c_sample_windows"), (window_draw, "_c_gather_rows"),
                         (window_draw, "_c_gather_batch"), (row_draw, "_c_gather_batch"),
                         (selectors, "_c_set_delivered"), (ring, "_c_insert_rows"), (batch, "_c_draw_counts")):
        fn = getattr(module, name, None)
        if fn is not None:
            setattr(module, name, _timed(fn, f"C {module.__name__.rsplit('.', 1)[-1]}.{name[3:]}", totals, counts))
    if getattr(sumtree, "_c", None) is not None:
        sumtree._c = _TimedModule(sumtree._c, totals, counts)
