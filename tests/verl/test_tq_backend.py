"""Conduit as TransferQueue's storage backend: for the same puts, every get returns what TQ's own
SimpleStorage returns, row for row, type for type (jagged / stacked / non-tensor), in one Ray
session, through TQ's public key-value API (what verl's V1 trainer calls)."""

import contextlib

import numpy as np
import pytest

pytest.importorskip("transfer_queue", reason="needs verl[verl-core] (TransferQueue)")

import ray  # noqa: E402
import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from tensordict import NonTensorStack, TensorDict  # noqa: E402

import transfer_queue as tq  # noqa: E402
from conduit_verl import tq_backend  # noqa: E402  (registers the backend)


# one Ray session for the module: tests/verl/conftest.py's ray_session
pytestmark = pytest.mark.usefixtures("ray_session")


@contextlib.contextmanager
def tq_session(backend: str = "Conduit", units: int = 1, slots: int | None = None, path: str = "shared"):
    """TransferQueue up on ``backend`` with ``units`` storage units, closed (and Conduit's units
    killed, which TQ's close() leaves) however the block ends. ``path``: how this client reaches
    Conduit's units: "shared" (same node: their arenas in shared memory), "ray" (Ray objects, as
    from another node: shared_memory=false), "mixed" (unit 1 by Ray objects, the others shared)."""
    conduit = {"num_storage_units": units, **({"slots": slots} if slots else {}), "shared_memory": path != "ray"}
    tq.init(OmegaConf.create({"backend": {"storage_backend": backend,
                                          "SimpleStorage": {"num_data_storage_units": units}, "Conduit": conduit}}))
    try:
        if backend == "Conduit":
            manager = tq.get_client().storage_manager
            assert manager.shared == [path != "ray"] * units
            if path == "mixed":
                manager.shared[1] = False
        yield
    finally:
        tq.close()
        if backend == "Conduit":
            tq_backend.shutdown_units()


def rollout(rng, keys, width=12):
    n = len(keys)
    lens = rng.integers(1, width, n)
    return TensorDict({
        "responses": torch.nested.nested_tensor([torch.from_numpy(rng.integers(0, 1000, l)) for l in lens],
                                                layout=torch.jagged),
        "hidden": torch.nested.nested_tensor([torch.from_numpy(rng.random((l, 3), dtype=np.float32)) for l in lens],
                                             layout=torch.jagged),
        "input_ids": torch.from_numpy(rng.integers(0, 1000, (n, 8))),
        "attention_mask": torch.from_numpy(rng.random((n, 8)) < 0.8),
        "pixel": torch.from_numpy(rng.random((n, 2, 3), dtype=np.float32)).to(torch.bfloat16),
        "scores": torch.from_numpy(rng.random(n).astype(np.float32)),
        "data_source": NonTensorStack(*[f"src{k}" for k in keys]),
        # a narrowed jagged view (offsets not from 0, row lengths apart from them), found in review
        "narrowed": torch.nested.narrow(torch.arange(n * 9).view(n, 9), 1, torch.from_numpy(rng.integers(0, 4, n)),
                                        torch.from_numpy(rng.integers(1, 6, n)), layout=torch.jagged),
        # tensors as non-tensor values: SimpleStorage hands them back as a nested tensor
        "tensor_objects": NonTensorStack(*[torch.ones(int(l) % 3 + 1) * i for i, l in enumerate(lens)]),
        "extra": NonTensorStack(*[{"k": k, "lens": int(l)} for k, l in zip(keys, lens)]),
    }, batch_size=n)


def script(backend: str, units: int, path: str = "shared") -> list:
    """What a trainer does: a rollout put, stages adding fields to some rows, gets in several
    orders and subsets, a clear. Returns every get's result."""
    with tq_session(backend, units, slots=4, path=path):
        rng = np.random.default_rng(0)
        keys = [f"uid{i}" for i in range(10)]
        got = []
        tq.kv_batch_put(keys=keys, partition_id="train", fields=rollout(rng, keys))
        tq.kv_batch_put(keys=keys[:4], partition_id="train",  # a later stage, some rows
                        fields=TensorDict({"old_log_probs": torch.from_numpy(rng.random((4, 5), dtype=np.float32))},
                                          batch_size=4))
        tq.kv_batch_put(keys=keys[4:], partition_id="train",
                        fields=TensorDict({"old_log_probs": torch.from_numpy(rng.random((6, 5), dtype=np.float32))},
                                          batch_size=6))
        got.append(tq.kv_batch_get(keys=keys, partition_id="train"))
        got.append(tq.kv_batch_get(keys=keys[::-1], partition_id="train", select_fields=["responses", "scores"]))
        got.append(tq.kv_batch_get(keys=[keys[7], keys[2], keys[5]], partition_id="train",
                                   select_fields=["hidden", "extra", "pixel"]))
        for i, key in enumerate(keys[:4]):   # a VLM's M-RoPE position_ids, one agent-loop output per put:
            width = 5 + 3 * i                # rows [4, L], L from put to put (a review found the second refused)
            tq.kv_batch_put(keys=[key], partition_id="train",
                            fields=TensorDict({"mrope": torch.arange(4 * width).view(1, 4, width)}, batch_size=1))
        got.append(tq.kv_batch_get(keys=keys[3::-1], partition_id="train", select_fields=["mrope", "scores"]))
        tq.kv_batch_put(keys=keys[:3], partition_id="train", fields=rollout(rng, keys[:3], width=30))  # overwrite
        got.append(tq.kv_batch_get(keys=keys[:5], partition_id="train", select_fields=["responses", "hidden"]))
        more = [f"uid{i}" for i in range(10, 40)]  # grows the units past their initial slots
        tq.kv_batch_put(keys=more, partition_id="val", fields=rollout(rng, more))
        got.append(tq.kv_batch_get(keys=more[::3], partition_id="val", select_fields=["responses", "data_source"]))
        tq.kv_clear(keys=keys[:5], partition_id="train")
        got.append(tq.kv_batch_get(keys=keys[5:], partition_id="train", select_fields=["input_ids", "old_log_probs"]))
        return got


def assert_same(a: TensorDict, b: TensorDict, where: str) -> None:
    assert sorted(a.keys()) == sorted(b.keys()), where
    for k in a.keys():
        x, y = a[k], b[k]
        assert type(x) is type(y), (where, k, type(x), type(y))
        if isinstance(x, torch.Tensor):
            assert x.is_nested == y.is_nested and x.dtype == y.dtype, (where, k)
            if x.is_nested:
                assert x.layout == y.layout, (where, k)
                rows_x, rows_y = x.unbind(), y.unbind()
                assert len(rows_x) == len(rows_y)
                assert all(p.shape == q.shape and torch.equal(p, q) for p, q in zip(rows_x, rows_y)), (where, k)
                # what consumers do with it: verl pads every get (TensorDict.to_padded_tensor)
                if x.layout == torch.jagged:
                    assert (x._maybe_min_seqlen, x._maybe_max_seqlen) == (y._maybe_min_seqlen, y._maybe_max_seqlen)
                    px = TensorDict({k: x}, batch_size=a.batch_size).to_padded_tensor()[k]
                    py = TensorDict({k: y}, batch_size=b.batch_size).to_padded_tensor()[k]
                    assert px.shape == py.shape and torch.equal(px, py), (where, k, px.shape, py.shape)
            else:
                assert x.shape == y.shape and torch.equal(x, y), (where, k)
        else:
            assert list(x) == list(y), (where, k)


_native: dict[int, list] = {}


@pytest.mark.parametrize("units,path", [(1, "shared"), (3, "shared"), (1, "ray"), (3, "ray"), (3, "mixed")])
def test_every_get_equals_simple_storage_row_for_row(units, path):
    """Both paths (a client on the units' node through shared memory, one elsewhere through Ray
    objects) and a client using both at once."""
    if units not in _native:
        _native[units] = script("SimpleStorage", units)
    native, conduit = _native[units], script("Conduit", units, path)
    assert len(native) == len(conduit)
    for i, (a, b) in enumerate(zip(native, conduit)):
        assert_same(a, b, f"get {i}")


def test_tq_close_shuts_down_the_units_its_init_started(caplog):
    """verl's main_ppo ends with tq.close(): Conduit's units go with it (TQ's own close shuts down
    only its own backends' units)."""
    def units():
        return sorted(n for n in tq_backend._named_units())

    assert units() == []
    tq.init(OmegaConf.create({"backend": {"storage_backend": "Conduit", "Conduit": {"num_storage_units": 2}}}))
    try:
        started = units()
        assert len(started) == 2
        tq.kv_batch_put(keys=["a", "b"], partition_id="train", fields=TensorDict({"x": torch.arange(2)}, batch_size=[2]))
        assert not tq_backend._tq_is_closing()   # a client's close now would leave the units serving
        # what trainer_mode=conduit adds to verl's tracker each step (conduit_verl.v1_trainer)
        got = tq_backend.storage_metrics()
        assert sorted(got) == [f"conduit/storage/{k}" for k in ("fields", "mib", "puts_in_flight", "rows",
                                                                 "shared_segments", "units")]
        assert [got[f"conduit/storage/{k}"] for k in ("units", "rows", "fields", "puts_in_flight")] == [2, 2, 1, 0]
        assert 0 < got["conduit/storage/mib"] < 1
    finally:
        tq.close()
    assert units() == [], "storage units outlived tq.close()"
    assert tq_backend._STARTED_HERE == []
    assert tq_backend.storage_metrics() == {}   # no units of this process's: nothing to report
    with caplog.at_level("WARNING", logger="conduit_verl.tq_backend"):   # a unit gone: a warning, not a crash
        assert tq_backend.storage_metrics(started) == {}
    assert any("gave no stats" in r.getMessage() and started[0] in r.getMessage() for r in caplog.records)


def test_a_missing_row_is_key_not_found_as_on_simple_storage():
    from transfer_queue.storage.simple_storage import StorageKeyNotFoundError

    with tq_session("Conduit", 1):
        client = tq.get_client()
        manager = client.storage_manager
        assert isinstance(manager, tq_backend.ConduitStorageManager)
        unit = manager.units[0]
        rows = tq_backend.encode("x", torch.arange(6).view(3, 2), 3)
        ray.get(unit.put.remote(np.array([5, 6, 7]), {"x": rows}))
        with pytest.raises(Exception) as err:
            ray.get(unit.get.remote(np.array([5, 9]), ["x"]))
        assert "key 9 is not stored" in str(err.value)

        class Meta:  # the parts of BatchMeta the manager reads
            size, global_indexes, field_names, partition_ids = 2, [5, 9], ["x"], ["p"]
        with pytest.raises(StorageKeyNotFoundError, match="key 9"):
            client._run_coroutine(manager.get_data(Meta()))


def test_verl_entry_point_registers_the_backend_in_every_process_that_imports_verl():
    import subprocess
    import sys
    code = ("import verl, transfer_queue\n"
            "from transfer_queue.storage.managers.base import StorageManagerFactory as F\n"
            "from transfer_queue.storage.bootstrap.provider import StorageBootstrapProvider as P\n"
            "print('conduit', 'Conduit' in F._registry, P.get_provider('Conduit') is not None)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "conduit True True" in out.stdout


def test_field_schema_equals_transfer_queues_own():
    from transfer_queue.metadata import extract_field_schema

    rng = np.random.default_rng(3)
    keys = [f"u{i}" for i in range(7)]
    td = rollout(rng, keys)
    td["strided"] = torch.nested.nested_tensor([torch.ones(i + 1, i + 2) for i in range(7)])  # ragged in 2 dims
    columns = {n: tq_backend.encode(n, td[n] if n != "strided" else td.get(n), 7) for n in td.keys()}
    assert tq_backend.field_schema(td, columns) == extract_field_schema(td)


def test_checkpoint_through_tq_restores_every_row(tmp_path):
    """tq.save_checkpoint / tq.load_checkpoint (what verl's trainer calls when it checkpoints)
    with the Conduit backend: what was stored comes back, row for row."""
    with tq_session("Conduit", 2):
        rng = np.random.default_rng(9)
        keys = [f"c{i}" for i in range(9)]
        tq.kv_batch_put(keys=keys, partition_id="train", fields=rollout(rng, keys))
        before = tq.kv_batch_get(keys=keys, partition_id="train")
        tq.save_checkpoint(tmp_path / "ckpt")
        tq.kv_clear(keys=keys[:4], partition_id="train")
        tq.load_checkpoint(tmp_path / "ckpt")
        assert_same(before, tq.kv_batch_get(keys=keys, partition_id="train"), "restored")


def test_a_checkpoint_with_a_bad_unit_file_loads_nothing(tmp_path):
    """Loading is all units or none: a damaged file for unit 1 leaves unit 0 as it was too."""
    with tq_session("Conduit", 2):
        rng = np.random.default_rng(4)
        keys = [f"d{i}" for i in range(6)]
        tq.kv_batch_put(keys=keys, partition_id="train", fields=rollout(rng, keys))
        tq.save_checkpoint(tmp_path / "ckpt")
        more = [f"e{i}" for i in range(6)]
        tq.kv_batch_put(keys=more, partition_id="train", fields=rollout(rng, more))
        live = tq.kv_batch_get(keys=keys + more, partition_id="train")
        manager = tq.get_client().storage_manager
        unit_files = sorted((tmp_path / "ckpt" / tq_backend.UNITS_DIR).glob("unit_1.*.pkl"))
        assert len(unit_files) == 1
        unit_files[0].write_bytes(b"not a checkpoint")
        with pytest.raises(Exception):
            tq.get_client()._run_coroutine(manager.load_checkpoint(str(tmp_path / "ckpt")))
        assert_same(live, tq.kv_batch_get(keys=keys + more, partition_id="train"), "after a refused load")


def test_undoing_a_put_gives_back_exactly_what_it_changed():
    """put_undo/restore_put on one store: new rows, new fields on stored rows and real
    overwrites all return to the state before the put (compared through the store's state)."""
    from conduit_core.kv.ragged import RaggedStore
    from conduit_verl.put_undo import put_undo, restore_put
    store = RaggedStore(slots=4)
    enc = tq_backend.encode
    store.put(np.array([0, 1, 2]), {"a": enc("a", torch.arange(6).view(3, 2), 3),
                                    "o": enc("o", NonTensorStack("x", "y", "z"), 3)})
    store.put(np.array([1]), {"b": enc("b", torch.ones(1, 4), 1)})

    def snapshot():
        return repr(store.state())
    before = snapshot()
    keys = np.array([1, 2, 7, 9])                     # 1, 2 stored (1 holds b), 7 and 9 new (and past the slots)
    cols = {"a": enc("a", torch.arange(100, 108).view(4, 2), 4), "b": enc("b", torch.zeros(4, 4), 4),
            "o": enc("o", NonTensorStack("p", "q", "r", "s"), 4)}
    undo = put_undo(store, keys, cols)
    store.put(keys, cols)
    assert snapshot() != before
    restore_put(store, undo)
    assert snapshot() == before
    assert len(store) == 3 and store.held(np.array([1, 2]), "b").tolist() == [True, False]
    # a field the put created leaves with it: a later put may give it another dtype (found in review)
    undo = put_undo(store, np.array([5]), {"c": enc("c", torch.ones(1, 2), 1)})
    store.put(np.array([5]), {"c": enc("c", torch.ones(1, 2), 1)})
    restore_put(store, undo)
    assert "c" not in store.fields and snapshot() == before
    store.put(np.array([5]), {"c": enc("c", torch.arange(2).view(1, 2), 1)})   # int64 now: accepted
    # a row the failed put created that a concurrent put has written to since keeps that write
    undo = put_undo(store, np.array([8]), {"a": enc("a", torch.arange(2).view(1, 2), 1)})
    store.put(np.array([8]), {"a": enc("a", torch.arange(2).view(1, 2), 1)})
    store.put(np.array([8]), {"o": enc("o", NonTensorStack("other writer"), 1)})
    restore_put(store, undo)
    assert store.held(np.array([8])).tolist() == [True] and store.held(np.array([8]), "a").tolist() == [False]


def test_a_put_over_several_units_is_all_or_nothing():
    """Three units; a put whose rows land on all three, refused by one (its field has another
    dtype there): the two units that took their part give it back, the error reaches the caller,
    and a later get finds exactly the rows there were before."""
    with tq_session("Conduit", 3):
        client = tq.get_client()
        manager = client.storage_manager
        units = manager.units

        class Meta:   # the parts of BatchMeta the manager reads
            def __init__(self, keys, fields=()):
                self.global_indexes, self.size, self.field_names = list(keys), len(keys), list(fields)
                self.partition_ids = ["p"]
        manager.notify_data_update = lambda *a, **k: asyncio_done()
        client._run_coroutine(manager.put_data(TensorDict({"f": torch.ones(2, dtype=torch.float32)}, batch_size=2),
                                               Meta([0, 3])))          # unit 0 holds f as float32
        rows = [ray.get(u.stats.remote())["rows"] for u in units]
        assert rows == [2, 0, 0]
        with pytest.raises(Exception, match="field 'f'"):
            client._run_coroutine(manager.put_data(TensorDict({"f": torch.arange(3)}, batch_size=3),
                                                   Meta([1, 2, 6])))   # units 1, 2 take int64 rows; unit 0 refuses
        assert [ray.get(u.stats.remote())["rows"] for u in units] == rows   # nothing of it is kept
        got = client._run_coroutine(manager.get_data(Meta([0, 3], ["f"])))
        assert got["f"].tolist() == [1.0, 1.0]


def asyncio_done():
    import asyncio
    fut = asyncio.get_event_loop().create_future()
    fut.set_result(None)
    return fut


class _Meta:   # the parts of BatchMeta the manager reads
    def __init__(self, keys, fields=()):
        self.global_indexes, self.size, self.field_names = list(keys), len(keys), list(fields)
        self.partition_ids = ["p"]


class _Call:
    """``unit.<method>`` with something done just before the real call is sent."""
    def __init__(self, method, before):
        self.method, self.before = method, before

    def remote(self, *a, **k):
        self.before()
        return self.method.remote(*a, **k)


class _Unit:
    """A real storage unit whose ``name`` call runs ``before`` first (fault injection)."""
    def __init__(self, unit, name, before):
        self._unit, self._name, self._before = unit, name, before

    def __getattr__(self, attr):
        method = getattr(self._unit, attr)
        return _Call(method, self._before) if attr == self._name else method


def _rows(units):
    return [ray.get(u.stats.remote())["rows"] for u in units]


@pytest.mark.parametrize("path", ["shared", "ray"])
def test_a_put_cancelled_while_the_units_store_it_leaves_nothing(path):
    """The caller's task is cancelled while the units take their parts (a timeout around the put):
    every unit gives its part back before the cancel reaches the caller, and the controller is
    told of none (before: the rows stayed stored and were never announced)."""
    import asyncio
    with tq_session("Conduit", 3, path=path):
        manager = tq.get_client().storage_manager
        units = list(manager.units)
        announced = []

        async def notify(*a, **k):
            announced.append(a)
        manager.notify_data_update = notify
        asyncio.run(manager.put_data(TensorDict({"f": torch.ones(3)}, batch_size=3), _Meta([0, 1, 2])))
        before, announced[:] = _rows(units), []
        name = "commit_put" if path == "shared" else "put"
        manager.units[2] = _Unit(units[2], name, lambda: asyncio.current_task().cancel())

        async def put():
            await manager.put_data(TensorDict({"f": torch.zeros(6), "g": torch.ones(6, 2)}, batch_size=6),
                                   _Meta([0, 1, 2, 3, 4, 5]))
        with pytest.raises(asyncio.CancelledError):
            asyncio.run(put())
        manager.units[2] = units[2]
        assert _rows(units) == before and announced == []
        got = asyncio.run(manager.get_data(_Meta([0, 1, 2], ["f"])))
        assert got["f"].tolist() == [1.0, 1.0, 1.0]
        assert all("g" not in ray.get(u.stats.remote())["fields"] for u in units)


def test_a_put_cancelled_while_it_is_announced_is_announced_whole():
    """A cancel that comes once the rows are stored, while the controller is being told: the
    announcement completes, then the cancel reaches the caller; the rows stay (the controller
    knows of them), so no row is stored unannounced or announced unstored."""
    import asyncio
    with tq_session("Conduit", 2):
        manager = tq.get_client().storage_manager
        announced, tasks = [], []

        async def notify(partition, indexes, schema):
            tasks[0].cancel()                 # the caller's timeout fires while the controller is told
            await asyncio.sleep(0.05)
            announced.append(list(indexes))
        manager.notify_data_update = notify

        async def main():
            tasks.append(asyncio.ensure_future(
                manager.put_data(TensorDict({"f": torch.arange(4.0)}, batch_size=4), _Meta([0, 1, 2, 3]))))
            await asyncio.wait(tasks)
            return tasks[0]
        task = asyncio.run(main())
        assert task.cancelled()
        assert announced == [[0, 1, 2, 3]] and _rows(manager.units) == [2, 2]


def test_a_load_that_fails_on_one_unit_after_another_switched_changes_nothing(tmp_path):
    """Two units; unit 1's commit fails (its staged rows are gone, as after a restart) after unit
    0 has switched to the checkpoint's rows: unit 0 goes back, both hold what they held before the
    load (before: unit 0 kept the checkpoint's rows, unit 1 its own: half a load)."""
    import asyncio
    with tq_session("Conduit", 2):
        rng = np.random.default_rng(5)
        keys = [f"h{i}" for i in range(8)]
        tq.kv_batch_put(keys=keys, partition_id="train", fields=rollout(rng, keys))
        tq.save_checkpoint(tmp_path / "ckpt")
        tq.kv_batch_put(keys=keys, partition_id="train", fields=rollout(rng, keys))    # overwrite every row
        live = tq.kv_batch_get(keys=keys, partition_id="train")
        manager = tq.get_client().storage_manager
        units = list(manager.units)
        manager.units[1] = _Unit(units[1], "commit", lambda: ray.get(units[1].abort.remote()))
        with pytest.raises(Exception, match="staged checkpoint"):
            asyncio.run(manager.load_checkpoint(str(tmp_path / "ckpt")))
        manager.units[1] = units[1]
        assert_same(live, tq.kv_batch_get(keys=keys, partition_id="train"), "after a load failed half way")
        tq.load_checkpoint(tmp_path / "ckpt")                 # the same checkpoint still loads afterwards
        assert not all(torch.equal(live["input_ids"][i], tq.kv_batch_get(keys=keys, partition_id="train")
                                   ["input_ids"][i]) for i in range(len(keys)))


def test_a_cancel_that_meets_a_unit_failure_reaches_the_caller_as_a_cancel():
    """(Found in review.) One unit refuses its part while the caller's task is cancelled: the parts
    taken are given back and the caller sees the cancel (its timeout must fire), not the refusal
    (Ray objects: on the shared path the refusal comes at the reservation, before any unit stores)."""
    import asyncio
    with tq_session("Conduit", 3, path="ray"):
        manager = tq.get_client().storage_manager
        units = list(manager.units)

        async def notify(*a, **k):
            return None
        manager.notify_data_update = notify
        asyncio.run(manager.put_data(TensorDict({"f": torch.ones(2, dtype=torch.float32)}, batch_size=2),
                                     _Meta([0, 3])))                 # unit 0 holds f as float32
        before = _rows(units)
        manager.units[1] = _Unit(units[1], "put", lambda: asyncio.current_task().cancel())
        with pytest.raises(asyncio.CancelledError):                  # units 1, 2 take int64 rows; unit 0 refuses
            asyncio.run(manager.put_data(TensorDict({"f": torch.arange(3)}, batch_size=3), _Meta([1, 2, 6])))
        manager.units[1] = units[1]
        assert _rows(units) == before


def test_a_put_whose_announcement_fails_is_given_back():
    """(Found in review.) TQ's controller cannot be told (no ACK, a closed client): the rows leave
    the units again and the error reaches the caller (before: stored, never announced)."""
    import asyncio
    with tq_session("Conduit", 2):
        manager = tq.get_client().storage_manager

        async def notify(*a, **k):
            raise TimeoutError("no ACK from controller")
        manager.notify_data_update = notify
        with pytest.raises(TimeoutError, match="no ACK"):
            asyncio.run(manager.put_data(TensorDict({"f": torch.ones(4)}, batch_size=4), _Meta([0, 1, 2, 3])))
        assert _rows(manager.units) == [0, 0]


def _sleep_for(seconds):
    import time
    time.sleep(seconds)


class _Stuck:
    """A real storage unit whose ``name`` call never answers in time (a stuck actor)."""
    def __init__(self, unit, name):
        self._unit, self._name = unit, name

    def __getattr__(self, attr):
        if attr != self._name:
            return getattr(self._unit, attr)
        sleeper = ray.remote(num_cpus=0)(_sleep_for)
        return type("StuckCall", (), {"remote": staticmethod(lambda *a, **k: sleeper.remote(8))})()


def test_a_unit_that_does_not_answer_fails_the_call_in_time_and_the_others_give_back(monkeypatch):
    """Found by a review (session 23): calls to the units had no timeout, so one stuck unit hung
    the trainer (TQ's SimpleStorage gives a unit 200 s). Now a put fails in time and the units
    that took their part give it back; a get fails in time. (What a unit stores after its time is
    given back by a revoke queued behind the put: the next test.)"""
    import time
    from conduit_verl import tq_shared_path as sp
    monkeypatch.setattr(sp, "UNIT_CALL_TIMEOUT_S", 1.0)
    with tq_session("Conduit", 2, path="ray"):
        client = tq.get_client()
        manager = client.storage_manager
        manager.notify_data_update = lambda *a, **k: asyncio_done()
        real = list(manager.units)
        put = lambda: client._run_coroutine(manager.put_data(TensorDict({"f": torch.ones(4)}, batch_size=4),
                                                             _Meta([0, 1, 2, 3])))
        manager.units = [real[0], _Stuck(real[1], "put")]
        t0 = time.monotonic()
        with pytest.raises(sp.UnitTimeout, match="did not answer within 1 s"):
            put()
        assert time.monotonic() - t0 < 6 and _rows(real) == [0, 0]
        manager.units = real
        put()
        manager.units = [real[0], _Stuck(real[1], "get")]
        with pytest.raises(sp.UnitTimeout):
            client._run_coroutine(manager.get_data(_Meta([0, 1], ["f"])))
        manager.units = real
        assert client._run_coroutine(manager.get_data(_Meta([0, 1], ["f"])))["f"].tolist() == [1.0, 1.0]


class _SlowPut(tq_backend.StorageUnit):
    """A real storage unit that takes 6 s to store a put (then stores it): it answers too late."""
    def put(self, keys, columns, call=None):
        import time
        time.sleep(6)
        return super().put(keys, columns, call)


def test_a_put_answered_late_is_revoked_behind_it_in_call_order():
    """Left by session 23's review (the unit kept what it stored late, unknown to TQ's controller):
    the client queues a revoke right behind the put it stopped waiting for, and a unit runs one
    caller's calls in order, so what the slow unit stores late is given back; the same client's
    next put of the same keys, queued after the revoke, is kept."""
    from conduit_verl import tq_shared_path as sp
    saved = sp.UNIT_CALL_TIMEOUT_S
    sp.UNIT_CALL_TIMEOUT_S = 1.0
    try:
        with tq_session("Conduit", 2, path="ray"):
            client = tq.get_client()
            manager = client.storage_manager
            manager.notify_data_update = lambda *a, **k: asyncio_done()
            real = list(manager.units)
            slow = ray.remote(num_cpus=0)(_SlowPut).remote()
            put = lambda value: client._run_coroutine(manager.put_data(
                TensorDict({"f": torch.full((4,), value)}, batch_size=4), _Meta([0, 1, 2, 3])))
            manager.units = [real[0], slow]
            with pytest.raises(sp.UnitTimeout, match="A revoke is queued behind the put"):
                put(1.0)
            assert _rows([real[0], slow]) == [0, 0]   # (this stats call runs after the put and the revoke)
            sp.UNIT_CALL_TIMEOUT_S = 30.0
            put(2.0)                                   # slow, in time: stored and kept
            assert _rows([real[0], slow]) == [2, 2]
            got = client._run_coroutine(manager.get_data(_Meta([0, 1, 2, 3], ["f"])))
            assert got["f"].tolist() == [2.0] * 4
            ray.kill(slow)
    finally:
        sp.UNIT_CALL_TIMEOUT_S = saved


def test_a_put_cancelled_while_a_unit_is_stuck_past_the_grace_leaves_nothing():
    """Left by session 28's review: a cancel whose grace ends before a stuck unit answers raised
    with the other units' parts still stored and the stuck unit's stored late. Now the units that
    answered give theirs back and the stuck one gets a revoke queued behind the put."""
    import asyncio
    import time
    from conduit_verl import tq_shared_path as sp
    saved = sp.CANCEL_GRACE_S
    sp.CANCEL_GRACE_S = 0.5
    try:
        with tq_session("Conduit", 2, path="ray"):
            manager = tq.get_client().storage_manager
            manager.notify_data_update = lambda *a, **k: asyncio_done()
            real = list(manager.units)
            slow = ray.remote(num_cpus=0)(_SlowPut).remote()
            manager.units = [real[0], slow]

            async def put():
                task = asyncio.ensure_future(manager.put_data(TensorDict({"f": torch.ones(4)}, batch_size=4),
                                                              _Meta([0, 1, 2, 3])))
                await asyncio.sleep(0.3)
                task.cancel()
                await task
            t0 = time.monotonic()
            with pytest.raises(RuntimeError, match="had not answered"):
                asyncio.run(put())
            assert time.monotonic() - t0 < 4.5   # (it did not wait out the slow unit's 6 s)
            assert _rows([real[0], slow]) == [0, 0]   # (after the slow put, its revoke and unit 0's give-back)
            ray.kill(slow)
    finally:
        sp.CANCEL_GRACE_S = saved


def test_a_revoke_keeps_rows_a_later_write_touched_and_knows_only_stored_puts():
    """``StorageUnit.revoke`` (no Ray): a put whose rows a later put of another client rewrote stays
    (undoing it would undo that write); a revoke of the later put gives the earlier values back; a
    revoke of a put never stored, or of one from before a checkpoint load, changes nothing."""
    from conduit_verl.tq_columns import encode
    from conduit_verl.tq_unit import StorageUnit

    def cols(value, n=3):
        return {"f": encode("f", torch.full((n,), float(value)), n)}
    unit = StorageUnit(slots=8)
    keys = np.arange(3, dtype=np.int64)
    unit.put(keys, cols(1), "a")
    unit.put(keys, cols(2), "b")
    unit.put(np.array([7], dtype=np.int64), cols(5, 1), "c")
    assert unit.revoke("a") == "kept" and unit.revoke("zzz") == "unknown"
    assert unit.revoke("c") == "revoked" and len(unit.store) == 3
    assert unit.revoke("b") == "revoked"
    assert unit.store.get(keys, ["f"])["f"].data.view(np.float32).tolist() == [1.0] * 3
    assert unit.revoke("b") == "unknown"
    # what undoes a stored put is dropped for newer puts: 'forgotten' (rows stay; the client logs an error)
    from conduit_verl import tq_unit
    for i in range(tq_unit.RECENT_PUTS + 1):
        unit.put(np.array([100 + i], dtype=np.int64), cols(i, 1), f"p{i}")
    assert unit.revoke("p0") == "forgotten" and unit.revoke("p1") == "revoked"


def test_waiting_through_a_cancel_is_bounded_and_outlives_the_loop_cancelling_the_wait():
    """``through_cancel``: a cancel does not stop the wait for the units' answers, but a unit that
    never answers ends it after the grace with an error (no hang); where the event loop cancels the
    inner wait itself (it shuts down), the wait starts again and still gets the outcome."""
    import asyncio
    from conduit_verl import tq_shared_path as sp

    async def never():
        await asyncio.Event().wait()

    async def cancel_soon(task):
        await asyncio.sleep(0.01)
        task.cancel()

    async def stuck():
        task = asyncio.current_task()
        asyncio.ensure_future(cancel_soon(task))
        return await sp.through_cancel(never, grace_s=0.2)
    with pytest.raises(RuntimeError, match="had not answered"):
        asyncio.run(stuck())

    starts = []

    async def answer():
        starts.append(1)
        if len(starts) == 1:                       # the first wait is cancelled from outside, as at shutdown
            asyncio.current_task().cancel()
        await asyncio.sleep(0.01)
        return "stored"

    async def restarted():
        return await sp.through_cancel(answer)
    assert asyncio.run(restarted()) == ("stored", True) and len(starts) == 2
