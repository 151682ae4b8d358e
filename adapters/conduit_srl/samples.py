"""SRL samples <-> Conduit's flat columns.

An SRL sample is a (nested) ``NamedArray`` of time-major ``[T, ...]`` arrays (``obs.obs``,
``analyzed_result.ret``, ``policy_state.hx``...), with ``None`` for fields an algorithm leaves out.
It is flattened once on ``put`` with SRL's own ``namedarray.flatten`` (dotted names, in the
sample's order) and rebuilt on ``get`` with SRL's own ``namedarray.from_flattened``: the nesting,
the names and every ``None`` come back as SRL's own buffers build them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

VERSION_FIELD = "policy_version_steps"


def flatten(sample: Any) -> dict[str, Any]:
    from rlsrl.base import namedarray
    return dict(namedarray.flatten(sample))


def rebuild(columns: dict[str, Any]) -> Any:
    from rlsrl.base import namedarray
    return namedarray.from_flattened(list(columns.items()))


def min_version(flat: dict[str, Any]) -> int | None:
    """The oldest policy version in a sample, ignoring negative (unset) entries: the quantity
    SRL's trainer thread compares with ``preemption_steps`` (``min_of(..., ignore_negative=True)``)."""
    v = flat.get(VERSION_FIELD)
    if v is None:
        return None
    v = np.asarray(v)
    v = v[v >= 0]
    return int(v.min()) if v.size else None
