"""The data plane's own part of a checkpoint: its version and counters, checked before
anything is loaded (a pure function of the state; the buffer checks its own part)."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..errors import StateError

EDP_STATE_VERSION = 1
COUNTERS = ("ticket", "rows", "priority_version")


def checked_counters(state: Mapping[str, Any]) -> dict[str, int]:
    """``state``'s data-plane counters as ints, or a StateError naming the one that is wrong."""
    if not isinstance(state, Mapping) or not isinstance(state.get("buffer"), Mapping):
        got = (f"a dict whose 'buffer' is {type(state.get('buffer')).__name__}" if isinstance(state, Mapping)
               else type(state).__name__)
        raise StateError(f"state: expected a dict from ExperienceDataPlane.state_dict() (the buffer's state under "
                         f"'buffer'), got {got}. Fix: the state is damaged or not a data plane's; nothing was loaded")
    if state.get("edp_version") != EDP_STATE_VERSION:
        raise StateError(f"edp_version: expected {EDP_STATE_VERSION}, got {state.get('edp_version')!r}. "
                         "Fix: load with the Conduit version that wrote the state.")
    counters = {}
    for k in COUNTERS:
        v = state.get(k)
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise StateError(f"{k}: expected an int >= 0, got {v!r}. Fix: the state is damaged; nothing was "
                             "loaded")
        counters[k] = int(v)
    return counters
