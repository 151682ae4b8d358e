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
import os
import pickle
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import ray
from tensordict import TensorDict
from transfer_queue.metadata import BatchMeta
from transfer_queue.storage.bootstrap.provider import StorageBootstrapProvider
from transfer_queue.storage.managers.base import StorageManager, StorageManagerFactory

from conduit_core.errors import ConfigError
from conduit_core.ragged import Column, KeyNotStored, RaggedStore

from .put_undo import put_undo, restore_put
from .tq_columns import _concat, decode, encode, field_schema  # noqa: F401 - encode/field_schema: the codec

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

    def put(self, keys: np.ndarray, columns: dict[str, Column]) -> dict:
        """Store the rows; returns what undoes it (``restore``): a put spread over several units
        is all or nothing, so the units that took their part give it back when another refused."""
        undo = put_undo(self.store, keys, columns)
        self.store.put(keys, columns)
        return undo

    def restore(self, undo: dict) -> int:
        """Undo a ``put``: its new rows leave, fields it set are unset, values it replaced return."""
        restore_put(self.store, undo)
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
        done = await asyncio.gather(*[asyncio.wrap_future(r.future()) for r in refs], return_exceptions=True)
        failed = [d for d in done if isinstance(d, BaseException)]
        if failed:   # all or nothing: the units that took their part give it back, then the error
            back = [self.units[u].restore.remote(d) for (u, _, _), d in zip(routes, done)
                    if not isinstance(d, BaseException)]
            undone = await asyncio.gather(*[asyncio.wrap_future(r.future()) for r in back], return_exceptions=True)
            lost = [e for e in undone if isinstance(e, BaseException)]
            if lost:
                raise RuntimeError(f"put of {rows} rows failed on {len(failed)} unit(s) and could not be undone on "
                                   f"{len(lost)}: {lost[0]!r}. Fix: the named units hold part of this put; clear "
                                   "its keys or restart TransferQueue") from failed[0]
            raise failed[0]
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
