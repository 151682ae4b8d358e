"""The same-node path of Conduit's TransferQueue backend: a client writes a put's bytes into room a
storage unit reserved in its shared arenas and copies a get's rows out of them.

Invariants checked: a get returns exactly the rows stored (against a model, whatever puts, clears,
aborted puts and compactions came before); rows located before later writes read back as they
were, or their segment is gone (``FileNotFoundError``: ask again), never another row's bytes; a
put that fails half way (a failed copy, a unit killed between reserve and commit) leaves nothing
on any unit; shutting down, or a unit killed, leaves no segment in any process."""

import contextlib
import glob
import os
import time

import numpy as np
import pytest

pytest.importorskip("transfer_queue", reason="needs verl[verl-core] (TransferQueue)")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from conduit_core.kv import shared_arena  # noqa: E402
from conduit_core.kv.ragged import Column  # noqa: E402
from conduit_verl.tq_shared_path import sizes_only  # noqa: E402
from conduit_verl.tq_unit import StorageUnit  # noqa: E402

pytestmark = pytest.mark.skipif(not shared_arena.available(), reason="needs Linux memfd and /proc")


@contextlib.contextmanager
def shared_unit(tag: str):
    """A storage unit with shared-memory arenas and a client's segment maps, both closed after."""
    unit = StorageUnit(slots=4, shm_prefix=f"{tag}{os.getpid()}")
    maps = shared_arena.SegmentMaps()
    try:
        yield unit, maps
    finally:
        maps.close()
        unit.close()


def rows_column(values: list[np.ndarray]) -> Column:
    """int32 rows of any length, as the codec makes them."""
    lengths = np.array([v.size for v in values], np.int64)
    data = np.concatenate([v.astype(np.int32) for v in values]).view(np.uint8) if values else np.empty(0, np.uint8)
    return Column("tensor", np.ascontiguousarray(data), lengths * 4, lengths, "int32", ())


def put_shared(unit: StorageUnit, maps, keys, columns, *, write=True):
    """What the client does on the same-node path: reserve, write into the segments, commit."""
    keys = np.asarray(keys, np.int64)
    answer = unit.reserve(keys, {n: sizes_only(c, None) for n, c in columns.items()})
    if not write:
        return answer
    with maps.lock:
        for name, (handle, at) in answer["room"].items():
            seg = maps.arena(handle)
            seg[at:at + columns[name].data.size] = columns[name].data
            del seg
    return unit.commit_put(answer["ticket"])


def read_located(maps, at: dict) -> bytes:
    """A get's copy of located rows, then its check that the segment was not reused meanwhile."""
    with maps.lock:
        seg = maps.arena(at["segment"])
        out = b"".join(bytes(seg[s:s + n]) for s, n in zip(at["starts"], at["nbytes"]))
        del seg
        maps.check(at["segment"], at["generation"])
        return out


def row_bytes(model, keys, field):
    return b"".join(model[int(k)][field] for k in keys)


ops = st.lists(st.one_of(
    st.tuples(st.just("put_shared"), st.lists(st.integers(0, 15), min_size=1, max_size=8, unique=True),
              st.integers(0, 2000)),
    st.tuples(st.just("put_ray"), st.lists(st.integers(0, 15), min_size=1, max_size=8, unique=True),
              st.integers(0, 2000)),
    st.tuples(st.just("abort"), st.lists(st.integers(0, 15), min_size=1, max_size=8, unique=True),
              st.integers(0, 2000)),
    st.tuples(st.just("clear"), st.lists(st.integers(0, 15), max_size=8, unique=True), st.just(0)),
    st.tuples(st.just("locate"), st.lists(st.integers(0, 15), min_size=1, max_size=8, unique=True), st.just(0)),
), max_size=40)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops, seed=st.integers(0, 2**16))
def test_gets_match_a_model_and_located_rows_never_change(ops, seed):
    rng = np.random.default_rng(seed)
    model: dict[int, dict[str, bytes]] = {}
    located = []   # (answer of locate, the bytes then, mapped at once?)
    with shared_unit("cdttest") as (unit, maps):
        for op, keys, width in ops:
            if op in ("put_shared", "put_ray", "abort"):
                values = [rng.integers(-9, 9, int(rng.integers(0, width + 1))) for _ in keys]
                col = rows_column(values)
                tags = np.empty(len(keys), dtype=object)
                tags[:] = [f"t{k}" for k in keys]
                columns = {"x": col, "tag": Column("object", tags)}
                if op == "put_ray":
                    unit.put(np.asarray(keys, np.int64), columns)
                elif op == "put_shared":
                    put_shared(unit, maps, keys, columns)
                else:
                    unit.abort_put(put_shared(unit, maps, keys, columns, write=False)["ticket"])
                    continue
                for k, v in zip(keys, values):
                    model[k] = {"x": v.astype(np.int32).tobytes(), "tag": f"t{k}"}
            elif op == "clear":
                unit.clear(np.asarray(keys, np.int64))
                for k in keys:
                    model.pop(k, None)
            else:
                held = [k for k in keys if k in model]
                if held:
                    at = unit.locate(np.asarray(held, np.int64), ["x", "tag"])["fields"]["x"]
                    mapped_now = bool(rng.integers(2))
                    if mapped_now:
                        assert read_located(maps, at) == row_bytes(model, held, "x")
                    located.append((at, row_bytes(model, held, "x")))
            stored = sorted(model)
            assert unit.stats()["rows"] == len(stored) and unit.stats()["tickets"] == 0
            if stored:
                got = unit.locate(np.asarray(stored, np.int64), ["x", "tag"])
                assert read_located(maps, got["fields"]["x"]) == row_bytes(model, stored, "x")
                assert list(got["fields"]["tag"].data) == [model[k]["tag"] for k in stored]
                maps.keep_only(unit.prefix, got["segments"])
            kept = unit.arenas._pool   # segments kept for reuse: never more bytes than those in use
            assert sum(k.size for k in kept) <= sum(g.size for g in unit.arenas._segments.values())
        for at, then in located:   # rows located long ago: as they were, or their segment is gone/reused
            try:
                assert read_located(maps, at) == then
            except FileNotFoundError:   # SegmentGone among them
                pass
    assert not _memfds(f"cdttest{os.getpid()}")


def test_readers_racing_puts_clears_and_compactions_never_see_another_rows_bytes():
    """A writer thread puts, overwrites and clears rows (compacting and reusing segments all the
    while); a reader thread locates rows and copies them out without any lock (the copy releases
    the GIL), as a client in another process does. The unit's calls are serialised, as a Ray
    actor's are. Each row is its key and version repeated: a copy that passed its generation check
    must be one row's own bytes, whole."""
    import threading

    from conduit_core.kv.ragged import copy_segments
    unit = StorageUnit(slots=4, shm_prefix=f"cdtrace{os.getpid()}")
    calls = threading.Lock()
    writer_maps, reader_maps = shared_arena.SegmentMaps(), shared_arena.SegmentMaps()
    stop, seen, errors = threading.Event(), {"ok": 0, "retried": 0}, []

    def writer():
        rng = np.random.default_rng(1)
        version = 0
        while not stop.is_set():
            version += 1
            keys = rng.choice(12, size=int(rng.integers(1, 7)), replace=False)
            col = rows_column([np.full(int(rng.integers(1, 3000)), k * 100_000 + version) for k in keys])
            with calls:
                answer = unit.reserve(keys.astype(np.int64), {"x": sizes_only(col, None)})
            handle, at = answer["room"]["x"]
            seg = writer_maps.arena(handle)
            seg[at:at + col.data.size] = col.data
            del seg
            with calls:
                unit.commit_put(answer["ticket"])
                if rng.random() < 0.3:
                    unit.clear(rng.choice(12, size=3, replace=False).astype(np.int64))

    def reader():
        rng = np.random.default_rng(2)
        while not stop.is_set():
            keys = rng.choice(12, size=4, replace=False).astype(np.int64)
            with calls:
                held = keys[unit.store.held(keys, "x")] if "x" in unit.store.fields else keys[:0]
                if not held.size:
                    continue
                at = unit.locate(held, ["x"])["fields"]["x"]
            try:
                src = reader_maps.arena(at["segment"])
                out = np.empty(int(at["nbytes"].sum()), np.uint8)
                copy_segments(src, at["starts"], at["nbytes"], out, np.cumsum(at["nbytes"]) - at["nbytes"])
                del src
                reader_maps.check(at["segment"], at["generation"])
            except FileNotFoundError:
                seen["retried"] += 1
                continue
            rows = np.split(out.view(np.int32), np.cumsum(at["lengths"])[:-1])
            for k, row in zip(held, rows):
                if not (row.size and (row == row[0]).all() and row[0] // 100_000 == k):
                    errors.append((int(k), row[:4].tolist()))
            seen["ok"] += 1

    threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
    try:
        for t in threads:
            t.start()
        time.sleep(3.0)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        writer_maps.close()
        reader_maps.close()
        unit.close()
    assert not errors, errors[:3]
    assert seen["ok"] > 20, seen


def test_a_put_whose_field_moved_arena_before_its_commit_is_copied_there():
    """Reserve, then another put compacts the field into a new segment: the first put's room
    stays pinned (its segment open) until its commit copies it into the field's new arena."""
    with shared_unit("cdtpin") as (unit, maps):
        small = rows_column([np.arange(5), np.arange(7)])
        answer = put_shared(unit, maps, [0, 1], {"x": small}, write=False)
        pinned = answer["room"]["x"][0]
        put_shared(unit, maps, [2, 3], {"x": rows_column([np.ones(20000), np.ones(30000)])})   # > 64 KiB: compacts
        assert pinned in unit.stats()["segments"]            # still open: our room lies in it
        with maps.lock:
            seg = maps.arena(pinned)
            at = answer["room"]["x"][1]
            seg[at:at + small.data.size] = small.data
            del seg
        unit.commit_put(answer["ticket"])
        assert pinned not in unit.stats()["segments"]        # released at the commit, rows copied out
        got = unit.get(np.array([1, 0, 3]), ["x"])["x"]
        assert got.data.tobytes() == np.concatenate([np.arange(7), np.arange(5), np.ones(30000)]).astype(np.int32).tobytes()


def test_rows_located_in_a_segment_since_released_read_as_they_were_or_not_at_all():
    """After a compaction the old segment is kept for reuse: rows located there still read as they
    were; once it is reused (generation bumped) or closed, the reader is told to ask again."""
    unit = StorageUnit(slots=4, shm_prefix=f"cdtgone{os.getpid()}")
    mapped, fresh = shared_arena.SegmentMaps(), shared_arena.SegmentMaps()
    try:
        put_shared(unit, mapped, [0], {"x": rows_column([np.arange(10)])})
        at = unit.locate(np.array([0]), ["x"])["fields"]["x"]
        before = read_located(mapped, at)
        unit.clear(np.array([0]))
        put_shared(unit, mapped, [0], {"x": rows_column([np.full(40000, 7)])})   # compacts: another segment
        assert at["segment"] not in unit.stats()["segments"] and at["segment"] in unit.stats()["open_segments"]
        assert read_located(mapped, at) == before == read_located(fresh, at)   # released, not yet reused
        put_shared(unit, mapped, [1], {"y": rows_column([np.full(9, 3)])})   # a new field's arena: reuses it
        assert at["segment"] in unit.stats()["segments"]
        with pytest.raises(shared_arena.SegmentGone):
            read_located(mapped, at)
        unit.close()
        with pytest.raises(FileNotFoundError):                 # closed: a fresh open fails
            read_located(shared_arena.SegmentMaps(), at)
    finally:
        mapped.close()
        fresh.close()
        unit.close()


def test_an_aborted_put_leaves_no_field_and_no_pin():
    with shared_unit("cdtabort") as (unit, maps):
        answer = put_shared(unit, maps, [0, 1], {"x": rows_column([np.arange(3), np.arange(4)])}, write=False)
        assert unit.stats()["fields"] == ["x"] and unit.stats()["tickets"] == 1
        unit.abort_put(answer["ticket"])
        assert unit.stats() | {"nbytes": 0} == {"rows": 0, "nbytes": 0, "fields": [], "tickets": 0, "segments": [],
                                                "open_segments": []}
        with pytest.raises(ValueError, match="ticket"):
            unit.commit_put(answer["ticket"])
        unit.put(np.array([0]), {"x": Column("object", np.array(["now objects"], dtype=object))})   # accepted


def test_a_put_reserved_and_never_committed_expires(monkeypatch):
    """A client that dies between reserve and commit: its room is given back at a later reserve."""
    import conduit_verl.tq_unit as tq_unit
    with shared_unit("cdtexp") as (unit, maps):
        stale = put_shared(unit, maps, [0, 1], {"x": rows_column([np.arange(3), np.arange(4)])}, write=False)
        assert unit.stats()["tickets"] == 1
        monkeypatch.setattr(tq_unit, "TICKET_TTL_S", 0.0)
        fresh = put_shared(unit, maps, [2], {"x": rows_column([np.arange(5)])}, write=False)
        assert unit.stats()["tickets"] == 1   # the stale one was aborted, the new one stands
        with pytest.raises(ValueError, match="ticket"):
            unit.commit_put(stale["ticket"])
        unit.abort_put(fresh["ticket"])


def test_rows_of_two_dims_are_kept_as_their_own_copies():
    """A [B, 4, L] field is kept row by row; each row a copy of its own (a view would pickle the
    whole batch's storage with every row: B times the data, found in the session's last read)."""
    import pickle
    import torch
    from conduit_verl.tq_columns import encode
    value = torch.arange(64 * 4 * 100).view(64, 4, 100)
    col = encode("mrope", value, 64)
    assert col.kind == "object" and torch.equal(torch.stack(list(col.data)), value)
    assert len(pickle.dumps(col.data)) < 2 * value.numel() * value.element_size()


def test_an_expired_reservations_segment_is_never_handed_to_other_rows(monkeypatch):
    """Found by a review (session 23): the segment an expired reservation pinned went back to the
    reuse pool, another field's rows were stored in it, and the stalled client's late write
    overwrote them (the generation check passed). Such a segment is closed once released."""
    import conduit_verl.tq_unit as tq_unit
    with shared_unit("cdtlate") as (unit, maps):
        unit.put(np.array([0]), {"f": rows_column([np.arange(4)])})
        late = put_shared(unit, maps, [1], {"f": rows_column([np.full(256, 7)])}, write=False)
        handle, at = late["room"]["f"]
        unit.put(np.array([2]), {"f": rows_column([np.zeros(20_000)])})   # f compacts away; its old segment pinned
        monkeypatch.setattr(tq_unit, "TICKET_TTL_S", 0.0)
        victim = rows_column([np.arange(1000)])
        put_shared(unit, maps, [3], {"g": victim})                         # expires the stale reservation
        assert unit.locate(np.array([3]), ["g"])["fields"]["g"]["segment"] != handle
        with contextlib.suppress(FileNotFoundError):   # the client's late write, where it was told to
            with maps.lock:
                seg = maps.arena(handle)
                seg[at:at + 1024] = 7
                del seg
        assert np.array_equal(unit.get(np.array([3]), ["g"])["g"].data, victim.data)


def test_a_checkpoint_loads_into_shared_arenas_and_frees_the_old_ones(tmp_path):
    with shared_unit("cdtckpt") as (unit, maps):
        put_shared(unit, maps, [0, 1, 2], {"x": rows_column([np.arange(3), np.arange(9), np.arange(1)])})
        unit.save(str(tmp_path / "u.pkl"))
        put_shared(unit, maps, [5], {"x": rows_column([np.arange(6)])})
        old = set(unit.stats()["segments"])
        unit.stage(str(tmp_path / "u.pkl"))
        unit.abort()                                      # the staged store's segments go at once
        assert set(unit.stats()["segments"]) == old
        unit.stage(str(tmp_path / "u.pkl"))
        assert unit.commit() == 3
        assert old <= set(unit.stats()["segments"])       # kept until every unit has switched
        unit.finish()
        assert not old & set(unit.stats()["segments"]) and len(unit.stats()["segments"]) == 1
        at = unit.locate(np.array([1, 0]), ["x"])["fields"]["x"]
        assert read_located(maps, at) == np.concatenate([np.arange(9), np.arange(3)]).astype(np.int32).tobytes()
        loaded = set(unit.stats()["segments"])           # a load rolled back: the rows before it, and their
        unit.stage(str(tmp_path / "u.pkl"))              # segments, are live again; the loaded ones go
        assert unit.commit() == 3 and unit.rollback() == 3
        assert set(unit.stats()["segments"]) == loaded
        # a load whose client never finished it is final once the next load begins (found in review:
        # a rollback of the next load went back past it, to the rows before it)
        unit.stage(str(tmp_path / "u.pkl"))
        assert unit.commit() == 3
        unit.stage(str(tmp_path / "u.pkl"))
        assert len(unit.stats()["segments"]) == 2         # the live rows and the staged ones: the first load's old rows went
        assert unit.rollback() == 3 and len(unit.stats()["segments"]) == 1
        at = unit.locate(np.array([1, 0]), ["x"])["fields"]["x"]
        assert read_located(maps, at) == np.concatenate([np.arange(9), np.arange(3)]).astype(np.int32).tobytes()
    assert not _memfds(f"cdtckpt{os.getpid()}")


# ----------------------------------------------------------------------------- through Ray and TQ
def _memfds(prefix: str) -> list[str]:
    """Every descriptor or mapping, in any process of this machine, of a segment named ``prefix-*``."""
    found = []
    for fd in glob.glob("/proc/[0-9]*/fd/*"):
        try:
            if os.readlink(fd).startswith(f"/memfd:{prefix}-"):
                found.append(fd)
        except OSError:
            pass
    for maps in glob.glob("/proc/[0-9]*/maps"):
        try:
            with open(maps) as f:
                found += [f"{maps}: {line.strip()}" for line in f if f"/memfd:{prefix}-" in line]
        except OSError:
            pass
    return found


def _wait_gone(prefix: str, timeout: float = 20.0) -> list[str]:
    """What still holds a segment of ``prefix`` after ``timeout`` s, each with its process's
    command line (the driver, a unit, a Ray worker?)."""
    end = time.monotonic() + timeout
    while (left := _memfds(prefix)) and time.monotonic() < end:
        time.sleep(0.2)
    return [f"{x} [{_cmdline(x)}]" for x in left]


def _cmdline(proc_path: str) -> str:
    pid = proc_path.split("/")[2]
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")[:120] + (" (this process)" if int(pid) == os.getpid() else "")
    except OSError:
        return "gone"



def _tq(units: int):
    import transfer_queue as tq
    from omegaconf import OmegaConf
    tq.init(OmegaConf.create({"backend": {"storage_backend": "Conduit", "Conduit": {"num_storage_units": units}}}))
    return tq


class Meta:   # the parts of BatchMeta the manager reads
    def __init__(self, keys, fields=()):
        self.global_indexes, self.size, self.field_names = list(keys), len(keys), list(fields)
        self.partition_ids = ["p"]


def _no_notify(*args, **kwargs):
    import asyncio
    fut = asyncio.get_event_loop().create_future()
    fut.set_result(None)
    return fut


@pytest.mark.parametrize("fault", ["copy", "killed_unit"])
def test_a_put_that_fails_half_way_leaves_nothing(ray_session, monkeypatch, fault):
    """Three units, a put over all three: the copy into the second unit's segment fails, or the
    third unit is killed between its reserve and its commit. The error reaches the caller and the
    units still up hold exactly what they held before, with no put pending."""
    import ray
    import torch
    from tensordict import TensorDict

    from conduit_verl import tq_backend, tq_shared_path
    tq = _tq(3)
    try:
        client = tq.get_client()
        manager = client.storage_manager
        assert manager.shared == [True, True, True]
        manager.notify_data_update = _no_notify
        put = TensorDict({"f": torch.arange(6, dtype=torch.float32).view(3, 2)}, batch_size=3)
        client._run_coroutine(manager.put_data(put, Meta([0, 1, 2])))
        before = [ray.get(u.stats.remote()) for u in manager.units]
        real, calls, killed = tq_shared_path.gather_segments, [], []

        # the put's copies, one per unit and field in route order: unit 0 f, unit 0 g, unit 1 f, ...
        def failing(*args, **kwargs):
            calls.append(1)
            if fault == "copy" and len(calls) == 3:      # unit 1's first field
                raise OSError("injected: the copy into the segment failed")
            if fault == "killed_unit" and len(calls) == 6:   # the last copy: every segment attached, the
                ray.kill(manager.units[2])                   # commits go out next, unit 2's to a dead unit
                killed.append(_wait_dead(manager.units[2]))  # (ray.kill returns before the actor is gone)
            return real(*args, **kwargs)
        monkeypatch.setattr(tq_shared_path, "gather_segments", failing)
        expected = OSError if fault == "copy" else ray.exceptions.RayActorError
        with pytest.raises(expected) as raised:
            client._run_coroutine(manager.put_data(
                TensorDict({"f": torch.ones(6, 2), "g": torch.ones(6, 3)}, batch_size=6), Meta([0, 1, 2, 3, 4, 5])))
        assert killed == ([True] if fault == "killed_unit" else [])
        assert fault != "copy" or "injected" in str(raised.value)
        del raised
        up = 3 if fault == "copy" else 2
        after = [ray.get(u.stats.remote()) for u in manager.units[:up]]
        assert [(a["rows"], a["fields"], a["tickets"]) for a in after] == [
            (b["rows"], b["fields"], 0) for b in before[:up]]
        monkeypatch.setattr(tq_shared_path, "gather_segments", real)
        got = client._run_coroutine(manager.get_data(Meta([0, 1] if fault == "killed_unit" else [0, 1, 2], ["f"])))
        assert got["f"].values().tolist() == put["f"][: got.batch_size[0]].reshape(-1).tolist()
    finally:
        prefixes = list(manager.prefixes)
        tq.close()
        tq_backend.shutdown_units()
    for p in prefixes:
        assert not _wait_gone(p), p


def _wait_dead(actor, timeout: float = 30.0) -> bool:
    """Whether calls to ``actor`` fail within ``timeout`` s: ray.kill only asks for the kill, and
    a call made right after it may still run (a put under test would then commit on the unit it
    meant to lose). Polled from a thread of its own: the errors it catches keep their frames'
    callers alive until a collection, and the caller here holds views of a segment."""
    import threading

    import ray
    dead: list = []

    def poll() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                ray.get(actor.stats.remote(), timeout=5)
            except ray.exceptions.RayActorError:   # gone
                dead.append(True)
                return
            except ray.exceptions.GetTimeoutError:   # busy, or on its way down: ask again
                pass
            time.sleep(0.05)

    waiter = threading.Thread(target=poll, name="wait-dead")
    waiter.start()
    waiter.join()
    return bool(dead)


def test_shutdown_and_a_killed_unit_leave_no_segment_anywhere(ray_session):
    """After puts and gets (the client maps the units' segments), one unit killed outright
    (SIGKILL: no handler runs) and then TQ closed and the units shut down: no process on this
    machine holds a descriptor or mapping of any segment of the run, and /dev/shm holds none."""
    import ray
    import torch
    from tensordict import TensorDict

    from conduit_verl import tq_backend
    tq = _tq(2)
    try:
        manager = tq.get_client().storage_manager
        prefixes = list(manager.prefixes)
        keys = [f"k{i}" for i in range(8)]
        for rep in range(3):   # compactions: segments replaced while mapped
            data = TensorDict({"x": torch.nested.nested_tensor_from_jagged(
                torch.arange(8 * 3000 * (rep + 1)), torch.arange(9) * 3000 * (rep + 1))}, batch_size=8)
            tq.kv_batch_put(keys=keys, partition_id="p", fields=data)
            got = tq.kv_batch_get(keys=keys, partition_id="p")
            assert torch.equal(got["x"].values(), data["x"].values())
        assert manager.maps.mapped() and all(_memfds(p) for p in prefixes)
        ray.kill(manager.units[0])
    finally:
        tq.close()
        tq_backend.shutdown_units()
    for p in prefixes:
        assert not _wait_gone(p), p
        assert not glob.glob(f"/dev/shm/{p}*")


def test_a_client_on_another_node_takes_ray_objects(ray_session, monkeypatch):
    import torch
    from tensordict import TensorDict

    from conduit_verl import tq_backend
    monkeypatch.setattr(tq_backend, "_node_id", lambda: "another-node")
    tq = _tq(2)
    try:
        manager = tq.get_client().storage_manager
        assert manager.shared == [False, False]
        keys = [f"k{i}" for i in range(5)]
        tq.kv_batch_put(keys=keys, partition_id="p", fields=TensorDict({"x": torch.arange(10).view(5, 2)}, batch_size=5))
        assert tq.kv_batch_get(keys=keys[::-1], partition_id="p")["x"].values().tolist() == \
            torch.arange(10).view(5, 2).flip(0).reshape(-1).tolist()
        assert not manager.maps.mapped()
    finally:
        tq.close()
        tq_backend.shutdown_units()
