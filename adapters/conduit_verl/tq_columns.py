"""TransferQueue's values as Conduit's ragged columns and back (``tq_backend``'s codec).

A TensorDict field becomes one ``Column``: dense and jagged tensors as one byte arena with
per-row lengths, anything else (``NonTensorStack`` values, tensors among them) as objects, as
SimpleStorage keeps it; ``decode`` rebuilds what SimpleStorage returns for the same puts, row
for row and type for type (jagged tensors keep their row-length bounds)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from tensordict import NonTensorStack, TensorDict
from transfer_queue.metadata import extract_field_schema

from conduit_core.errors import ConfigError
from conduit_core.kv.ragged import Column, gather_segments


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _bytes_of(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu().contiguous().reshape(-1)
    return t.view(torch.uint8).numpy() if t.numel() else np.empty(0, np.uint8)


def _jagged_column(value: torch.Tensor) -> Column:
    """A jagged nested tensor's rows, as one Column: its values as they are when they lie back to
    back from offset 0, else gathered from each row's own start (a narrowed or sliced view)."""
    values = value.values()
    offsets = value.offsets().cpu().numpy().astype(np.int64)
    holes = value.lengths()
    lengths = np.diff(offsets) if holes is None else holes.cpu().numpy().astype(np.int64)
    inner = tuple(values.shape[1:])
    per = math.prod(inner) * values.element_size()
    data = _bytes_of(values)
    if holes is not None or offsets[0] != 0 or offsets[-1] != values.shape[0]:
        data = gather_segments(data, offsets[:-1] * per, lengths * per)
    return Column("tensor", data, lengths * per, lengths, _dtype_name(values.dtype), inner)


def encode(name: str, value: Any, rows: int) -> Column:
    """One field of a put, as a Column (rows in batch order). Tensors become byte rows; anything
    else (``NonTensorStack`` values, tensors among them) is kept as objects, as SimpleStorage keeps it."""
    if isinstance(value, torch.Tensor) and value.is_nested:
        # torch names no public accessor for the ragged dimension; rows ragged along their first one
        # (what TQ and verl build) are one Column, any other layout goes row by row below
        if value.layout == torch.jagged and getattr(value, "_ragged_idx", None) == 1:
            col = _jagged_column(value)
            if col.rows != rows:
                raise ConfigError(f"data[{name!r}]", f"a batch of {rows} rows", col.rows, "put one row per global index")
            return col
        items = list(value.unbind())                   # strided nested: rows as tensors
        if len(items) == rows and items and all(v.dim() >= 1 for v in items):
            first = items[0]
            if all(v.dtype == first.dtype and v.shape[1:] == first.shape[1:] for v in items):
                lengths = np.array([v.shape[0] for v in items], np.int64)
                per = math.prod(first.shape[1:]) * first.element_size()
                data = _bytes_of(torch.cat([v.reshape(v.shape[0], *first.shape[1:]) for v in items]))
                return Column("tensor", data, lengths * per, lengths, _dtype_name(first.dtype), tuple(first.shape[1:]))
        value = items
    elif isinstance(value, torch.Tensor):
        if value.dim() == 0 or value.shape[0] != rows:
            raise ConfigError(f"data[{name!r}]", f"a batch of {rows} rows", tuple(value.shape),
                              "put one row per global index")
        if value.dim() == 1:
            return Column("tensor", _bytes_of(value), np.full(rows, value.element_size(), np.int64),
                          np.ones(rows, np.int64), _dtype_name(value.dtype), (), scalar=True)
        if value.dim() == 2:
            per = math.prod(value.shape[1:]) * value.element_size()
            return Column("tensor", _bytes_of(value), np.full(rows, per, np.int64),
                          np.full(rows, value.shape[1], np.int64), _dtype_name(value.dtype), ())
        # rows of 2+ dims ([B, 4, L]: a VLM's M-RoPE position_ids, put one agent-loop output at a time):
        # a unit's tensor field fixes everything after the row's first dim, and these vary from put to
        # put (L), so they are kept row by row as SimpleStorage keeps every field (a review found the
        # second such put refused)
        # (each row its own host copy: a view would pickle the whole batch's storage with every row)
        value = [v.detach().cpu().clone() for v in value.unbind()]
    items = value.tolist() if isinstance(value, NonTensorStack) else list(value)
    if len(items) != rows:
        raise ConfigError(f"data[{name!r}]", f"{rows} values", len(items), "put one value per global index")
    objects = np.empty(rows, dtype=object)
    for i, v in enumerate(items):
        objects[i] = v
    return Column("object", objects)


def field_schema(data: TensorDict, columns: dict[str, Column]) -> dict[str, dict[str, Any]]:
    """TQ's ``extract_field_schema(data)``, equal to it, from the columns already built: TQ's
    version unbinds every nested field row by row to list the rows' shapes."""
    schema = {}
    for name, col in columns.items():
        value = data[name] if col.kind == "tensor" else None
        if col.kind == "object":
            raw = data.get(name)
            if isinstance(raw, torch.Tensor) or (len(col.data) and isinstance(col.data[0], torch.Tensor)):
                # tensor rows ragged in 2+ dims: TQ's own row-by-row walk, as it would do
                schema.update(extract_field_schema(TensorDict({name: raw}, batch_size=data.batch_size)))
                continue
            schema[name] = {"dtype": None, "shape": None, "is_nested": False, "is_non_tensor": True}
        elif not value.is_nested:
            row = value.shape[1:] if value.dim() > 1 else torch.Size([1])
            schema[name] = {"dtype": value.dtype, "shape": row, "is_nested": False, "is_non_tensor": False}
        else:
            lengths = col.lengths.tolist()
            schema[name] = {"dtype": value.dtype, "shape": torch.Size((lengths[0], *col.inner)),
                            "is_nested": True, "is_non_tensor": False,
                            "per_sample_shapes": [(n, *col.inner) for n in lengths]}
    return schema


def _pack_objects(items: list) -> Any:
    """Per-row values as SimpleStorage's get packs them (AsyncSimpleStorageManager._pack_field_values):
    tensors (none missing) stacked when they are scalars, else a jagged nested tensor, else a strided
    one; anything else a NonTensorStack."""
    if items and all(isinstance(v, torch.Tensor) for v in items):
        if all(v.dim() == 0 for v in items):
            return torch.stack(items)
        for layout in (torch.jagged, torch.strided):
            try:
                return torch.nested.as_nested_tensor(items, layout=layout)
            except (RuntimeError, TypeError):
                continue
    return NonTensorStack(*items)


def decode(col: Column) -> Any:
    """A get's field from its Column: what SimpleStorage's re-packing gives for the same rows."""
    if col.kind == "object":
        return _pack_objects(list(col.data))
    data = np.require(col.data, requirements="W")     # Ray hands back read-only views
    flat = torch.from_numpy(data).view(getattr(torch, col.dtype))
    if col.scalar:
        return flat
    values = flat.view(int(col.lengths.sum()), *col.inner)
    offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(col.lengths)]).astype(np.int64))
    # the row-length bounds travel with the tensor, as SimpleStorage's as_nested_tensor sets them:
    # without them TensorDict.to_padded_tensor pads to the total length (verl pads every get)
    return torch.nested.nested_tensor_from_jagged(values, offsets, min_seqlen=int(col.lengths.min()),
                                                  max_seqlen=int(col.lengths.max()))


def _concat(cols: list[Column]) -> Column:
    if len(cols) == 1:
        return cols[0]
    c0 = cols[0]
    if c0.kind == "object":
        return Column("object", np.concatenate([c.data for c in cols]))
    return Column("tensor", np.concatenate([c.data for c in cols]), np.concatenate([c.nbytes for c in cols]),
                  np.concatenate([c.lengths for c in cols]), c0.dtype, c0.inner, c0.scalar)


# ----------------------------------------------------------------------------- manager
