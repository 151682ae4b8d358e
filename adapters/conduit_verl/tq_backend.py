"""Conduit as a TransferQueue storage backend: ``transfer_queue.backend.storage_backend=Conduit``.

verl's V1 trainer moves every stage's columns through TransferQueue (TQ): a stage puts a
TensorDict for some rows (TQ's global indexes), a later stage gets some fields of some rows.
TQ's default backend, SimpleStorage, keeps each row's value of each field as its own object in
storage-unit actors, sends them per row over ZMQ and re-packs them per row into nested tensors
on every get. Here the storage units are Ray actors holding a ``conduit_core.kv.ragged.RaggedStore``:
each field one flat arena, a batch written with one copy per field and read with one gather per
field; rows travel as one byte array per field plus per-row lengths, and a get rebuilds jagged
tensors from offsets, with no per-row Python on tensor fields.

What a get returns is what SimpleStorage returns for the same puts (checked row for row in
``tests/verl/test_tq_backend.py``): a field whose rows are single elements comes back stacked
(``[B]``); any other tensor field as a jagged nested tensor (ragged along each row's first
dimension), with its row-length bounds; other values as SimpleStorage packs them (a
``NonTensorStack``, or a nested tensor when every value is a tensor). A missing (row, field)
raises TQ's ``StorageKeyNotFoundError``, as SimpleStorage's does. A put is checked and its schema
built before any unit is written; a put spread over several units is all or nothing (a unit that
took its part gives it back when another refused or the put was cancelled, and the controller is
told of none; a cancel that comes while the controller is told lets that finish first; a unit that
does not answer within its time limit gets a revoke queued behind the put, which gives back what it
stores late). A
checkpoint load is too: every unit reads its file aside, then all switch, and a unit that switched
keeps its old rows until every unit has (``commit``/``finish``, else ``rollback``).

A client on a unit's node moves the bytes through the unit's arenas in shared memory
(``tq_shared_path``: one copy on put, one on get, only keys, offsets and lengths through the
actor calls); units on another node, or all with ``shared_memory: false``, take Ray objects.

Registered with TQ's two registries (``StorageBootstrapProvider`` makes the units at
``tq.init``; ``StorageManagerFactory`` makes each process's client-side manager) when this
module is imported; ``conduit_verl.plugin`` imports it right after ``transfer_queue`` is
imported, in every process where verl is imported. Config (``transfer_queue.backend.Conduit``):
``num_storage_units`` (default 1), ``slots`` (initial rows per unit, grows), ``shared_memory``
(default true: arenas in shared memory, memfds, used by clients on the unit's node), and
``unit_names``, written by the bootstrap for the clients to find the units (fresh ones per
``tq.init``; ``shutdown_units()`` kills them, as TQ's ``close()`` does not).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import ray
from tensordict import TensorDict
from transfer_queue.metadata import BatchMeta
from transfer_queue.storage.bootstrap.provider import StorageBootstrapProvider
from transfer_queue.storage.managers.base import StorageManager, StorageManagerFactory

from conduit_core.kv import shared_arena
from conduit_core.errors import ConfigError
from conduit_core.kv.ragged import KeyNotStored

from . import tq_shared_path as shared_path
from .tq_late_puts import give_back_unsettled, revoke_late
from .tq_unit import STATE_VERSION, StorageUnit  # noqa: F401 - STATE_VERSION: the unit file's schema
from .tq_columns import decode, encode, field_schema  # noqa: F401 - encode/field_schema: the codec

BACKEND = "Conduit"
NAMESPACE = "conduit_tq"
UNITS_DIR, MANIFEST = "conduit_units", "manifest.json"


# ----------------------------------------------------------------------------- storage unit
ConduitStorageUnit = ray.remote(num_cpus=0)(StorageUnit)   # one shard (tq_unit), one Ray actor, any node


# units this process started (tq.init ran here): TQ's close() in this process shuts them down
_STARTED_HERE: list[str] = []


def _tq_is_closing() -> bool:
    """True inside ``tq.close()``: it drops its storage registry before it closes its client (TQ
    0.1's ``interface.close``), the one sign a client's close is the system's and not a client's."""
    from transfer_queue import interface
    return getattr(interface, "_TQ_STORAGE", True) is None


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
    shared = _shared_memory_option(cfg)
    run = uuid.uuid4().hex[:8]   # fresh units per tq.init: never another run's rows
    handles, names = {}, []
    for rank in range(units):
        name = f"ConduitStorageUnit#{rank}-{run}"
        handles[name] = ConduitStorageUnit.options(name=name, namespace=NAMESPACE).remote(
            slots, _shm_prefix(name) if shared else None)
        names.append(name)
    ray.get([h.stats.remote() for h in handles.values()])  # up before the first client needs them
    _STARTED_HERE.extend(names)
    logging.getLogger(__name__).info(
        "conduit_verl: TransferQueue storage on Conduit: %d storage unit(s) (%s), %d rows each to start (they grow), "
        "%s", units, ", ".join(names), slots,
        "shared memory for clients on a unit's node" if shared else "Ray objects (no shared memory)")
    if BACKEND not in conf.backend:
        conf.backend[BACKEND] = {}
    conf.backend[BACKEND].unit_names = names
    return handles


def _shared_memory_option(cfg) -> bool:
    shared = cfg.get("shared_memory", True)
    if not isinstance(shared, bool):
        raise ConfigError("transfer_queue.backend.Conduit.shared_memory", "true or false", repr(shared),
                          "true: clients on a unit's node use its arenas in shared memory; false: Ray objects only")
    return shared and shared_arena.available()


def _shm_prefix(unit_name: str) -> str:
    """A unit's segment names: ``cdt<run>u<rank>-<n>`` (unique per tq.init, short for every OS)."""
    rank, run = unit_name.removeprefix("ConduitStorageUnit#").split("-")
    return f"cdt{run}u{rank}"


def shutdown_units(names: list[str] | None = None) -> None:
    """Kill the storage units (TQ's ``close()`` shuts down SimpleStorage's units only). Each unit
    closes its shared segments first; a unit that died or does not answer frees them by dying
    (they are memfds: nothing in /dev/shm outlives their processes)."""
    names = names if names is not None else [n for n in _named_units()]
    for name in names:
        try:
            unit = ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            unit = None
        if unit is not None:
            try:
                ray.get(unit.close.remote(), timeout=30)
            except Exception:  # noqa: BLE001 - a dead or hung unit: killed below, its segments swept
                pass
            ray.kill(unit)


def storage_metrics(names: list[str] | None = None, *, timeout_s: float = 30.0) -> dict[str, float]:
    """What the storage units hold now, for verl's tracker (``conduit/storage/*``): the units, their
    rows, MiB, the most fields a unit holds, puts in flight (reserved, not yet committed) and shared
    segments. ``names``: the units to ask, by default those this process started (``tq.init`` ran
    here, as in verl's TaskRunner); empty when there are none (another storage backend). A unit that
    is gone or does not answer in ``timeout_s`` is logged as a warning naming it, and the step's
    metrics go without these: a metric does not stop training (the step's puts and gets report a
    lost unit themselves)."""
    names = list(_STARTED_HERE) if names is None else list(names)
    if not names:
        return {}
    try:
        units = [ray.get_actor(name, namespace=NAMESPACE) for name in names]
        stats = ray.get([u.stats.remote() for u in units], timeout=timeout_s)
    except (ValueError, ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError) as e:
        logging.getLogger(__name__).warning(
            "conduit_verl: storage units %s gave no stats within %g s (%s: %s); this step's conduit/storage/* "
            "metrics are left out", names, timeout_s, type(e).__name__, e)
        return {}
    return {"conduit/storage/units": float(len(stats)),
            "conduit/storage/rows": float(sum(s["rows"] for s in stats)),
            "conduit/storage/mib": sum(s["nbytes"] for s in stats) / 2 ** 20,
            "conduit/storage/fields": float(max(len(s["fields"]) for s in stats)),
            "conduit/storage/puts_in_flight": float(sum(s["tickets"] for s in stats)),
            "conduit/storage/shared_segments": float(sum(len(s["segments"]) for s in stats))}


def _node_id() -> str:
    return ray.get_runtime_context().get_node_id()


def _named_units() -> list[str]:
    from ray.util import list_named_actors
    return [a["name"] for a in list_named_actors(all_namespaces=True)
            if a.get("namespace") == NAMESPACE and a["name"].startswith("ConduitStorageUnit#")]


# ----------------------------------------------------------------------------- columns <-> values
def _raise_unless_cancelled(error: Exception, cause, cancelled: bool) -> None:
    """``error`` for the caller; logged instead when a cancel must reach it (its timeout must fire)."""
    if not cancelled:
        raise error from cause
    logging.getLogger(__name__).error("conduit_verl: %s", error)


async def _answers(refs, *, limit_s: float | None | str = shared_path.UNIT_LIMIT) -> list:
    """Every unit call's result (a unit that fails or does not answer in time: its error)."""
    outcomes = await shared_path.wait_all(refs, limit_s=limit_s)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return outcomes


async def _undo_then_raise(undo_calls, failed: list, cancelled: bool, what: str, fix: str) -> None:
    """After a failed or cancelled operation over several units: every undo call answered (through
    a cancel), then the cancel if one came (a caller's timeout must see it; the failure, if any, is
    its context), else the first failure; a unit that could not undo is named in a RuntimeError (or,
    with a cancel, logged)."""
    undone, again = await shared_path.settled(undo_calls)
    cancelled = cancelled or again
    lost = [e for e in undone if isinstance(e, BaseException)]
    cause = failed[0] if failed else None
    if lost:
        _raise_unless_cancelled(RuntimeError(f"{what} and could not be undone on {len(lost)} unit(s): {lost[0]!r}. "
                                             f"Fix: {fix}"), cause, cancelled)
    if cancelled:
        raise asyncio.CancelledError() from cause
    raise cause


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
        here = _node_id()
        where = ray.get([u.where.remote() for u in self.units])
        # per unit: its segments' prefix when this client shares its node, else None (Ray objects)
        self.prefixes = [prefix if node == here else None for node, prefix in where]
        self.shared = [p is not None for p in self.prefixes]
        self.maps = shared_arena.SegmentMaps()
        self._client_id, self._puts = uuid.uuid4().hex[:12], 0   # a put's call id: for a revoke

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
        self._puts += 1
        call = f"{self._client_id}-{self._puts}"
        # same-node units: bytes into their segments first (a failure there aborts and stores nothing)
        try:
            tickets = await shared_path.reserve_and_write(self.units, self.maps, self.prefixes, routes, columns,
                                                          self.shared)
        except PermissionError:     # this node forbids opening another process's descriptors
            self._without_shared_memory()
            tickets = {}
        refs = []
        for i, (u, pos, keys) in enumerate(routes):
            if i in tickets:
                refs.append(self.units[u].commit_put.remote(tickets[i], call))
                continue
            part = columns if len(routes) == 1 else {n: c.select(pos) for n, c in columns.items()}
            refs.append(self.units[u].put.remote(keys, part, call))
        try:
            done, cancelled = await shared_path.settled(refs)
        except RuntimeError:   # cancelled, and a unit had not answered within the cancel's grace
            give_back_unsettled(self.units, routes, refs, call, rows)
            raise
        failed = [d for d in done if isinstance(d, BaseException)]
        late = [u for (u, _, _), d in zip(routes, done) if isinstance(d, shared_path.UnitTimeout)]
        if late:   # queued behind the put it did not answer in time: what it stores late is given back
            timeout = revoke_late(self.units, late, call, rows)   # (in each late unit's place: errors in route order)
            failed = [timeout if isinstance(d, shared_path.UnitTimeout) else d for d in failed]
        if failed or cancelled:   # all or nothing: the units that took their part give it back, then the error
            await _undo_then_raise([self.units[u].restore.remote(d) for (u, _, _), d in zip(routes, done)
                                    if not isinstance(d, BaseException)], failed, cancelled,
                                   f"put of {rows} rows {'failed on %d unit(s)' % len(failed) if failed else 'cancelled'}",
                                   "the named units hold part of this put; clear its keys or restart TransferQueue")
        # the rows are stored: announced whole even if a cancel comes meanwhile (it reaches the caller
        # after), so the controller never misses rows the units hold; a failed announcement gives them back
        try:
            _, late = await shared_path.through_cancel(lambda: self.notify_data_update(
                metadata.partition_ids[0], list(metadata.global_indexes), schema), again=False)
        except Exception as exc:   # noqa: BLE001 - given back, then raised
            await _undo_then_raise([self.units[u].restore.remote(d) for (u, _, _), d in zip(routes, done)], [exc],
                                   cancelled, f"put of {rows} rows not announced to TQ's controller ({exc!r})",
                                   "the named units hold rows TQ does not know of; clear its keys or restart TransferQueue")
        if cancelled or late:
            raise asyncio.CancelledError()

    async def get_data(self, metadata: BatchMeta) -> TensorDict:
        if metadata.size == 0:
            return TensorDict({}, batch_size=0)
        fields = list(metadata.field_names)
        routes = self._route(metadata.global_indexes)
        for attempt in range(shared_path.GET_ATTEMPTS + 1):
            # the last try takes Ray objects from every unit: segments replaced faster than this
            # client copies out of them (compactions, reuse under a stream of puts) never fail a get
            shared = self.shared if attempt < shared_path.GET_ATTEMPTS else [False] * len(self.units)
            try:
                parts = await shared_path.locate_parts(self.units, routes, fields, shared)
            except Exception as exc:
                cause = getattr(exc, "cause", exc)
                if isinstance(cause, KeyNotStored) or isinstance(exc, KeyNotStored):
                    from transfer_queue.storage.simple_storage import StorageKeyNotFoundError
                    raise StorageKeyNotFoundError(str(cause)) from exc
                raise
            try:   # one copy, into the arrays returned
                columns = shared_path.assemble(parts, routes, fields, metadata.size, self.maps, self.prefixes,
                                               shared)
                break
            except FileNotFoundError:   # a segment went (compaction) after its unit answered: ask again
                if attempt == shared_path.GET_ATTEMPTS:
                    raise
            except PermissionError:     # this node forbids opening another process's descriptors
                self._without_shared_memory()
                if attempt == shared_path.GET_ATTEMPTS:
                    raise
        return TensorDict({name: decode(columns[name]) for name in fields}, batch_size=metadata.size)

    def _without_shared_memory(self) -> None:
        import logging
        logging.getLogger(__name__).warning("conduit_verl: cannot map the storage units' shared memory here "
                                            "(/proc/<pid>/fd not permitted); using Ray objects")
        self.shared = [False] * len(self.units)

    def close(self) -> None:
        """Drop this client's mappings of the units' segments, then TQ's own close. Inside
        ``tq.close()`` in the process whose ``tq.init`` started the units (verl's trainer, at the end
        of ``fit``), the units are shut down too: TQ's close shuts down its own backends' units only
        ("close ... with key Conduit is not supported"), and they would live until Ray exits."""
        maps = getattr(self, "maps", None)
        if maps is not None:
            maps.close()
        super().close()
        if _STARTED_HERE and _tq_is_closing():
            names = list(_STARTED_HERE)
            _STARTED_HERE.clear()
            shutdown_units(names)
            logging.getLogger(__name__).info("conduit_verl: shut down %d TransferQueue storage unit(s) with tq.close()",
                                             len(names))

    async def clear_data(self, metadata: BatchMeta) -> None:
        if metadata.size == 0:
            return
        refs = [self.units[u].clear.remote(keys) for u, _, keys in self._route(metadata.global_indexes)]
        await _answers(refs)

    async def save_checkpoint(self, checkpoint_dir: str) -> None:
        """Each unit writes its rows to ``<checkpoint_dir>/conduit_units/unit_<i>.<generation>.pkl``;
        the manifest, renamed into place last, names the generation, so a save that fails half way
        leaves the previous checkpoint whole (TQ's controller checkpoint holds the keys and fields)."""
        folder = Path(checkpoint_dir) / UNITS_DIR
        folder.mkdir(parents=True, exist_ok=True)
        generation = uuid.uuid4().hex[:12]
        paths = [str(folder / f"unit_{i}.{generation}.pkl") for i in range(len(self.units))]
        refs = [u.save.remote(p) for u, p in zip(self.units, paths)]
        rows = await _answers(refs, limit_s=None)   # (a checkpoint takes as long as its size)
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
            rows = await _answers(refs, limit_s=None)
            if list(rows) != list(saved["rows"]):
                raise ConfigError(f"{manifest}: rows per unit", saved["rows"], list(rows),
                                  "the unit files do not belong to this manifest; save the checkpoint again")
        except BaseException:
            await shared_path.wait_all([u.abort.remote() for u in self.units])
            raise
        # all switch or none: a unit that switched keeps its old rows until every unit has, and goes
        # back to them if one failed or the load was cancelled meanwhile
        switched, cancelled = await shared_path.settled([u.commit.remote() for u in self.units])
        failed = [d for d in switched if isinstance(d, BaseException)]
        if failed or cancelled:
            await _undo_then_raise([u.rollback.remote() for u in self.units], failed, cancelled,
                                   f"a load of {manifest} {'failed' if failed else 'cancelled'}",
                                   "load the checkpoint again, or restart TransferQueue")
        done, cancelled = await shared_path.settled([u.finish.remote() for u in self.units])
        kept = [d for d in done if isinstance(d, BaseException)]
        if kept:     # the load is whole; only the old rows' memory is still held
            _raise_unless_cancelled(RuntimeError(f"{manifest} is loaded, but {len(kept)} unit(s) could not free the "
                                                 f"rows they held before: {kept[0]!r}. Fix: restart TransferQueue to "
                                                 "return that memory"), kept[0], cancelled)
        if cancelled:
            raise asyncio.CancelledError()
