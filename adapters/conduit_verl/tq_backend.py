"""Conduit as a TransferQueue storage backend: ``transfer_queue.backend.storage_backend=Conduit``.

verl's V1 trainer moves every stage's columns through TransferQueue (TQ): a stage puts a
TensorDict for some rows (TQ's global indexes), a later stage gets some fields of some rows.
TQ's default backend, SimpleStorage, keeps each row's value of each field as its own object in
storage-unit actors, sends them per row over ZMQ and re-packs them per row into nested tensors
on every get. Here the storage units are Ray actors holding a ``conduit_core.ragged.RaggedStore``:
each field one flat arena, a batch written with one copy per field and read with one gather per
field; rows travel as one byte array per field plus per-row lengths, and a get rebuilds jagged
tensors from offsets, with no per-row Python on tensor fields.

What a get returns is what SimpleStorage returns for the same puts (checked row for row in
``tests/verl/test_tq_backend.py``): a field whose rows are single elements comes back stacked
(``[B]``); any other tensor field as a jagged nested tensor (ragged along each row's first
dimension), with its row-length bounds; other values as SimpleStorage packs them (a
``NonTensorStack``, or a nested tensor when every value is a tensor). A missing (row, field)
raises TQ's ``StorageKeyNotFoundError``, as SimpleStorage's does. A put is checked and its schema
built before any unit is written; a put spread over several units is not atomic if one unit then
refuses its part (the others keep theirs, and the controller is not told of any).

Registered with TQ's two registries (``StorageBootstrapProvider`` makes the units at
``tq.init``; ``StorageManagerFactory`` makes each process's client-side manager) when this
module is imported; ``conduit_verl.plugin`` imports it right after ``transfer_queue`` is
imported, in every process where verl is imported. Config (``transfer_queue.backend.Conduit``):
``num_storage_units`` (default 1), ``slots`` (initial rows per unit, grows), and
``unit_names``, written by the bootstrap for the clients to find the units (fresh ones per
``tq.init``; ``shutdown_units()`` kills them, as TQ's ``close()`` does not).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import pickle
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch
from tensordict import NonTensorStack, TensorDict
from transfer_queue.metadata import BatchMeta, extract_field_schema
from transfer_queue.storage.bootstrap.provider import StorageBootstrapProvider
from transfer_queue.storage.managers.base import StorageManager, StorageManagerFactory

from conduit_core.errors import ConfigError
from conduit_core.ragged import Column, KeyNotStored, RaggedStore, gather_segments

BACKEND = "Conduit"
NAMESPACE = "conduit_tq"
UNITS_DIR, MANIFEST = "conduit_units", "manifest.json"
STATE_VERSION = 1   # of a unit's checkpoint file


# ----------------------------------------------------------------------------- storage unit
@ray.remote(num_cpus=0)
class ConduitStorageUnit:
    """One shard of the store: a RaggedStore behind a Ray actor (one call per batch, any node)."""

    def __init__(self, slots: int = 1024):
        self.store = RaggedStore(slots=slots)
        self._staged: RaggedStore | None = None   # a checkpoint read aside, until every unit has one

    def put(self, keys: np.ndarray, columns: dict[str, Column]) -> int:
        self.store.put(keys, columns)
        return len(self.store)

    def get(self, keys: np.ndarray, fields: list[str]) -> dict[str, Column]:
        return self.store.get(keys, fields)

    def clear(self, keys: np.ndarray) -> int:
        return self.store.clear(keys)

    def stats(self) -> dict:
        return {"rows": len(self.store), "nbytes": self.store.nbytes(), "fields": self.store.fields}

    def save(self, path: str) -> int:
        """Write every stored row to ``path`` (written aside, then renamed: never half a file)."""
        tmp = f"{path}.tmp"
        with open(tmp, "wb") as f:
            pickle.dump({"schema_version": STATE_VERSION, "store": self.store.state()}, f,
                        protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)
        return len(self.store)

    def stage(self, path: str) -> int:
        """Read what ``save`` wrote into a store held aside (the live one untouched): the first half
        of a load that every unit must pass before any unit commits."""
        with open(path, "rb") as f:
            saved = pickle.load(f)
        if not isinstance(saved, dict) or saved.get("schema_version") != STATE_VERSION:
            raise ConfigError(f"{path}", f"a Conduit unit file of schema version {STATE_VERSION}",
                              repr(saved.get("schema_version") if isinstance(saved, dict) else type(saved).__name__),
                              "load a checkpoint saved by this version of conduit_verl")
        self._staged = RaggedStore.from_state(saved["store"])
        return len(self._staged)

    def commit(self) -> int:
        self.store, self._staged = self._staged, None
        return len(self.store)

    def abort(self) -> None:
        self._staged = None


@StorageBootstrapProvider.register_provider(BACKEND)
def initialize_conduit_storage(conf) -> dict[str, Any]:
    """Called by ``tq.init`` in the process that starts TQ: makes the units and records their
    names in the config the controller hands to every client."""
    cfg = conf.backend.get(BACKEND) or {}
    units = int(cfg.get("num_storage_units", 1))
    if units < 1:
        raise ConfigError("transfer_queue.backend.Conduit.num_storage_units", ">= 1", units,
                          "use at least one storage unit")
    slots = int(cfg.get("slots", 1024))
    run = uuid.uuid4().hex[:8]   # fresh units per tq.init: never another run's rows
    handles, names = {}, []
    for rank in range(units):
        name = f"ConduitStorageUnit#{rank}-{run}"
        handles[name] = ConduitStorageUnit.options(name=name, namespace=NAMESPACE).remote(slots)
        names.append(name)
    ray.get([h.stats.remote() for h in handles.values()])  # up before the first client needs them
    if BACKEND not in conf.backend:
        conf.backend[BACKEND] = {}
    conf.backend[BACKEND].unit_names = names
    return handles


def shutdown_units(names: list[str] | None = None) -> None:
    """Kill the storage units (TQ's ``close()`` shuts down SimpleStorage's units only)."""
    names = names if names is not None else [n for n in _named_units()]
    for name in names:
        try:
            ray.kill(ray.get_actor(name, namespace=NAMESPACE))
        except ValueError:
            pass


def _named_units() -> list[str]:
    from ray.util import list_named_actors
    return [a["name"] for a in list_named_actors(all_namespaces=True)
            if a.get("namespace") == NAMESPACE and a["name"].startswith("ConduitStorageUnit#")]


# ----------------------------------------------------------------------------- columns <-> values
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
        per = math.prod(value.shape[1:]) * value.element_size()
        return Column("tensor", _bytes_of(value), np.full(rows, per, np.int64),
                      np.full(rows, value.shape[1], np.int64), _dtype_name(value.dtype), tuple(value.shape[2:]))
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
@StorageManagerFactory.register(BACKEND)
class ConduitStorageManager(StorageManager):
    """The client side (one per process that holds a TQ client): routes rows to units by
    ``global_index % units``, one actor call per unit per operation."""

    def __init__(self, controller_info, config, zmq_context=None):
        super().__init__(controller_info, config, zmq_context=zmq_context)
        names = list((config or {}).get("unit_names") or [])
        if not names:
            raise ConfigError("transfer_queue.backend.Conduit.unit_names", "the units' names (set by tq.init)",
                              "none", "initialise TransferQueue with storage_backend=Conduit before making clients")
        self.units = [ray.get_actor(n, namespace=NAMESPACE) for n in names]

    def _route(self, global_indexes) -> list[tuple[int, np.ndarray, np.ndarray]]:
        keys = np.asarray(global_indexes, dtype=np.int64)
        if len(self.units) == 1:
            return [(0, np.arange(keys.size), keys)]
        unit = keys % len(self.units)
        return [(u, pos, keys[pos]) for u in range(len(self.units)) if (pos := np.nonzero(unit == u)[0]).size]

    async def put_data(self, data: TensorDict, metadata: BatchMeta, data_parser=None) -> None:
        if data_parser is not None:
            raise ConfigError("data_parser", "None", type(data_parser).__name__,
                              "parse before the put: TQ supports data_parser on SimpleStorage only")
        rows = metadata.size
        if rows == 0:
            return
        columns = {name: encode(name, data.get(name), rows) for name in data.keys()}
        schema = field_schema(data, columns)       # before anything is stored: a failure stores nothing
        routes = self._route(metadata.global_indexes)
        refs = []
        for u, pos, keys in routes:
            part = columns if len(routes) == 1 else {n: c.select(pos) for n, c in columns.items()}
            refs.append(self.units[u].put.remote(keys, part))
        await asyncio.gather(*[asyncio.wrap_future(r.future()) for r in refs])
        await self.notify_data_update(metadata.partition_ids[0], list(metadata.global_indexes), schema)

    async def get_data(self, metadata: BatchMeta) -> TensorDict:
        if metadata.size == 0:
            return TensorDict({}, batch_size=0)
        fields = list(metadata.field_names)
        routes = self._route(metadata.global_indexes)
        refs = [self.units[u].get.remote(keys, fields) for u, _, keys in routes]
        try:
            parts = await asyncio.gather(*[asyncio.wrap_future(r.future()) for r in refs])
        except Exception as exc:
            cause = getattr(exc, "cause", exc)
            if isinstance(cause, KeyNotStored) or isinstance(exc, KeyNotStored):
                from transfer_queue.storage.simple_storage import StorageKeyNotFoundError
                raise StorageKeyNotFoundError(str(cause)) from exc
            raise
        order = None
        if len(routes) > 1:  # units' rows back into the batch's order
            order = np.argsort(np.concatenate([pos for _, pos, _ in routes]), kind="stable")
        out = {}
        for name in fields:
            col = _concat([p[name] for p in parts])
            out[name] = decode(col if order is None else col.select(order))
        return TensorDict(out, batch_size=metadata.size)

    async def clear_data(self, metadata: BatchMeta) -> None:
        if metadata.size == 0:
            return
        refs = [self.units[u].clear.remote(keys) for u, _, keys in self._route(metadata.global_indexes)]
        await asyncio.gather(*[asyncio.wrap_future(r.future()) for r in refs])

    async def save_checkpoint(self, checkpoint_dir: str) -> None:
        """Each unit writes its rows to ``<checkpoint_dir>/conduit_units/unit_<i>.<generation>.pkl``;
        the manifest, renamed into place last, names the generation, so a save that fails half way
        leaves the previous checkpoint whole (TQ's controller checkpoint holds the keys and fields)."""
        folder = Path(checkpoint_dir) / UNITS_DIR
        folder.mkdir(parents=True, exist_ok=True)
        generation = uuid.uuid4().hex[:12]
        paths = [str(folder / f"unit_{i}.{generation}.pkl") for i in range(len(self.units))]
        refs = [u.save.remote(p) for u, p in zip(self.units, paths)]
        rows = await asyncio.gather(*[asyncio.wrap_future(r.future()) for r in refs])
        tmp = folder / f"{MANIFEST}.tmp"
        tmp.write_text(json.dumps({"units": len(self.units), "generation": generation, "rows": list(rows)}))
        os.replace(tmp, folder / MANIFEST)
        for old in folder.glob("unit_*.pkl"):       # earlier generations, no longer named
            if f".{generation}." not in old.name:
                old.unlink(missing_ok=True)

    async def load_checkpoint(self, checkpoint_dir: str) -> None:
        """Every unit reads its file aside first; only when all have, all switch (a bad file changes nothing)."""
        folder = Path(checkpoint_dir) / UNITS_DIR
        manifest = folder / MANIFEST
        if not manifest.exists():
            raise FileNotFoundError(f"{manifest}: no Conduit storage checkpoint there. Fix: load a checkpoint "
                                    "saved with transfer_queue.backend.storage_backend=Conduit")
        saved = json.loads(manifest.read_text())
        if saved["units"] != len(self.units):
            raise ConfigError("transfer_queue.backend.Conduit.num_storage_units", saved["units"], len(self.units),
                              "restore with as many storage units as the checkpoint was saved with")
        refs = [u.stage.remote(str(folder / f"unit_{i}.{saved['generation']}.pkl")) for i, u in enumerate(self.units)]
        try:
            rows = await asyncio.gather(*[asyncio.wrap_future(r.future()) for r in refs])
            if list(rows) != list(saved["rows"]):
                raise ConfigError(f"{manifest}: rows per unit", saved["rows"], list(rows),
                                  "the unit files do not belong to this manifest; save the checkpoint again")
        except BaseException:
            await asyncio.gather(*[asyncio.wrap_future(u.abort.remote().future()) for u in self.units],
                                 return_exceptions=True)
            raise
        await asyncio.gather(*[asyncio.wrap_future(u.commit.remote().future()) for u in self.units])
