"""The layout of an :class:`~conduit_core.queues.entry_queue.EntryQueue`'s samples, learned from the first one.

A queue stores whole samples (flat names -> ``[T, ...]`` arrays, ``None`` or other Python objects)
in preallocated slots, so every later sample must fit the slots the first one shaped. This module
is that rule and nothing else: :func:`layout_of` reads a sample's layout (one
:class:`FieldLayout` per name), :func:`widened` learns the arrays of fields that were ``None`` so
far (:func:`layout_for` picks the layout a put stores by), :func:`conform` checks a sample against
a layout and converts what it may, :func:`as_array` is the one array conversion they use, and
:func:`stack_objects` batches the per-sample objects of a non-array field when an entry is served. Pure functions, no state, no lock: the queue calls them
under its own lock.

``None`` is a value every field may take, as in SRL's samples (``info=None`` for steps without
episode info): an array field a sample leaves ``None`` is *missing* from that sample (the storage
serves it as SRL's ``recursive_aggregate`` batches it: ``None`` when every sample of an entry left
it out, zeros for the ones that did otherwise), and a field ``None`` in every sample so far takes
its array layout from the first sample that gives one (:func:`widened`).

Kept apart from the storage (:mod:`conduit_core.queues.slot_arena`) because the rule is about what a
sample may be, the storage about where it goes; both read the same :class:`FieldLayout`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import SpecError


@dataclass(frozen=True)
class FieldLayout:
    """One field of the first sample: how it is stored (frozen: a layout never changes once learned)."""

    kind: str                       # "array" | "none" | "object"
    shape: tuple[int, ...] = ()     # per-sample shape, time first
    dtype: Any = None


def layout_of(sample: Mapping[str, Any]) -> dict[str, FieldLayout]:
    """The layout of ``sample``, in its own field order: numeric arrays (and Python scalars, torch
    tensors) are ``"array"`` fields stored in slots, ``None`` is a ``"none"`` field, anything else
    (strings, object arrays, other objects) is an ``"object"`` field kept per sample as given."""
    layout = {}
    for name, value in sample.items():
        if not isinstance(name, str) or not name:
            raise SpecError("field name", "a non-empty string", repr(name), "name every field")
        if value is None:
            layout[name] = FieldLayout("none")
            continue
        arr = as_array(value)
        if arr is None or arr.dtype.kind in "OUSV":
            layout[name] = FieldLayout("object")
        else:
            layout[name] = FieldLayout("array", tuple(arr.shape), arr.dtype)
    return layout


def check_field_names(names: Sequence[str]) -> list[str]:
    """``names`` as a list of distinct field names, or :class:`SpecError` naming what is wrong."""
    if isinstance(names, str) or not isinstance(names, Sequence):
        raise SpecError("names", "a sequence of field names", repr(names)[:80], "pass a list, e.g. ['info.x']")
    for name in names:
        if not isinstance(name, str) or not name:
            raise SpecError("field name", "a non-empty string", repr(name), "name every field")
    return list(dict.fromkeys(names))


def widened(layout: Mapping[str, FieldLayout], samples: Sequence[Mapping[str, Any]]) -> dict[str, FieldLayout]:
    """``layout`` with every ``"none"`` field that one of ``samples`` gives a value for learned
    from the first such value (:func:`layout_of`'s rule), in the layout's order; ``layout``
    itself (the same object) when nothing is learned, so the caller can tell. Names the samples
    have and the layout lacks are left to :func:`conform` to refuse."""
    learned = {}
    for name, f in layout.items():
        if f.kind != "none":
            continue
        for sample in samples:
            value = sample.get(name) if isinstance(sample, Mapping) else None
            if value is not None:
                learned[name] = layout_of({name: value})[name]
                break
    if not learned:
        return layout
    return {name: learned.get(name, f) for name, f in layout.items()}


def layout_for(layout: dict[str, FieldLayout] | None, none_fields: tuple[str, ...],
               samples: Sequence[Mapping[str, Any]]) -> dict[str, FieldLayout]:
    """The layout to store ``samples`` by: ``layout`` (the first sample's when there is none yet),
    :func:`widened` when one of them gives one of its ``none_fields`` (the layout's ``"none"``
    fields, which the caller keeps so the common put scans nothing else)."""
    if layout is None:
        return widened(layout_of(samples[0]), samples)
    if none_fields and any(s.get(n) is not None for s in samples for n in none_fields):
        return widened(layout, samples)
    return layout


def conform(sample: Mapping[str, Any], layout: Mapping[str, FieldLayout]) -> Mapping[str, Any]:
    """``sample``'s values as the slots take them, or :class:`SpecError` naming the first field that
    does not fit. A sample of exact numpy arrays of the layout's shapes and dtypes (the common case,
    checked first) comes back as it is, so the put path pays no conversion for it. Otherwise:
    the field names must be the layout's; arrays are converted (tensors, scalars) and must keep the
    shape and cast to the dtype safely, or hold values it stores (``stored_exactly``); a missing
    array (``None``) stays ``None`` (the storage fills or serves it, see the module's note); a
    ``"none"`` field must stay ``None`` (:func:`widened` first learns the ones a sample gives)."""
    if sample.keys() == layout.keys():  # the common case: exact arrays of the first sample's shape and dtype
        for name, f in layout.items():
            v = sample[name]
            if f.kind == "array":
                if type(v) is not np.ndarray or v.shape != f.shape or v.dtype != f.dtype:
                    break   # (None too: the slow path marks the sample's missing fields)
            elif f.kind == "none" and v is not None:
                break
        else:
            return sample
    if set(sample) != set(layout):
        missing, extra = sorted(set(layout) - set(sample)), sorted(set(sample) - set(layout))
        raise SpecError("sample fields", sorted(layout), f"missing {missing}, extra {extra}",
                        "put samples with the same fields as the first one")
    cols, missing = {}, False
    for name, f in layout.items():
        value = sample[name]
        if f.kind == "none":
            if value is not None:
                raise SpecError(name, "None (as in every sample so far)", type(value).__name__,
                                "learn the field's layout first (sample_layout.widened)")
            cols[name] = None
        elif f.kind == "object":
            cols[name] = value
        else:
            if value is None:  # missing from this sample: the storage fills or serves it
                cols[name], missing = None, True
                continue
            arr = as_array(value)
            if arr is None or tuple(arr.shape) != f.shape:
                raise SpecError(f"{name}.shape", f.shape, None if arr is None else tuple(arr.shape),
                                "put samples of the same length T and per-step shape as the first one")
            if not np.can_cast(arr.dtype, f.dtype, casting="safe") and not (
                    np.can_cast(arr.dtype, f.dtype, casting="same_kind") and stored_exactly(arr, f.dtype)):
                raise SpecError(f"{name}.dtype", f"{f.dtype} (the first sample's), or values it holds exactly",
                                str(arr.dtype), "put samples with the dtype of the first one (this one's values "
                                "would change in the slot: e.g. int64 2**40 stored as int32 is 0)")
            cols[name] = arr
    return WithMissing(cols) if missing else cols


class WithMissing(dict):
    """:func:`conform`'s result for a sample that leaves an array field ``None``: the storage looks
    for ``None`` per field only in these (the common put, with none, pays nothing for the rule)."""


def stored_exactly(arr: np.ndarray, dtype: np.dtype) -> bool:
    """Whether the first sample's narrower ``dtype`` holds ``arr``'s values: integers exactly (a
    later int64 2**40 in an int32 slot would be 0), floats without overflow (float64 0.1 in a
    float32 slot is rounded, as SRL's replay buffers round it assigning into their arrays; a finite
    value turned inf is refused)."""
    with np.errstate(over="ignore"):   # (an overflow is what is checked for)
        cast = arr.astype(dtype)
    if arr.dtype.kind in "fc":
        return bool(np.array_equal(np.isfinite(cast), np.isfinite(arr)))
    return bool(np.array_equal(cast.astype(arr.dtype), arr))


def as_array(value: Any) -> np.ndarray | None:
    """``value`` as a numpy array (itself, a torch tensor's CPU copy, a 0-d array of a scalar), or
    None when it is no array: the caller then keeps it as a Python object."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor, without importing torch here
        return value.detach().cpu().numpy()
    if isinstance(value, (int, float, bool, np.generic)):
        return np.asarray(value)
    return None


def stack_objects(objs: list, axis: int) -> Any:
    """An entry's per-sample objects of one field, served: stacked on the batch ``axis`` when every
    one converts to an array (0-d ones on axis 0), else the plain list."""
    arrays = [as_array(o) for o in objs]
    if all(a is not None for a in arrays):
        return np.stack(arrays, axis=axis if arrays[0].ndim >= 1 else 0)
    return list(objs)
