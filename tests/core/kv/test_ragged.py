"""RaggedStore: keyed rows of variable length, by column; checked against a dict of rows."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit_core import ConfigError
from conduit_core.kv.ragged import Column, KeyNotStored, RaggedStore, gather_segments


def tensor_column(rows: list[np.ndarray], scalar=False) -> Column:
    data = np.concatenate([r.reshape(-1).view(np.uint8) for r in rows]) if rows else np.empty(0, np.uint8)
    return Column("tensor", data, np.array([r.nbytes for r in rows], np.int64),
                  np.array([1 if scalar else r.shape[0] for r in rows], np.int64),
                  str(rows[0].dtype), tuple(rows[0].shape[1:]) if not scalar else (), scalar)


def rows_of(col: Column, inner=(3,), dtype=np.float32) -> list[np.ndarray]:
    starts = np.cumsum(col.nbytes) - col.nbytes
    return [col.data[s:s + n].view(dtype).reshape(-1, *inner) for s, n in zip(starts, col.nbytes)]


def test_segments_native_and_numpy_agree(monkeypatch):
    from conduit_core.kv import byte_segments as ragged   # where the C helper is bound
    src = np.random.default_rng(0).integers(0, 256, 1000, dtype=np.uint8)
    starts, lengths = np.array([5, 900, 0, 300]), np.array([10, 100, 0, 1])
    want = np.concatenate([src[s:s + n] for s, n in zip(starts, lengths)])
    assert ragged._c_gather_segments is not None  # the C helper is what runs here
    assert np.array_equal(gather_segments(src, starts, lengths), want)
    with monkeypatch.context() as m:
        m.setattr(ragged, "_c_gather_segments", None)
        assert np.array_equal(gather_segments(src, starts, lengths), want)
    with pytest.raises(ValueError, match="outside src"):
        gather_segments(src, np.array([995]), np.array([10]))


def test_copy_segments_native_and_numpy_agree(monkeypatch):
    """Rows of one source put at their places in an output (a get over several storage units)."""
    from conduit_core.kv import byte_segments
    from conduit_core.kv.ragged import copy_segments
    src = np.random.default_rng(1).integers(0, 256, 1000, dtype=np.uint8)
    src_starts, lengths, dst_starts = np.array([5, 900, 0, 300]), np.array([10, 100, 0, 1]), np.array([100, 0, 7, 110])
    want = np.zeros(200, np.uint8)
    for a, n, b in zip(src_starts, lengths, dst_starts):
        want[b:b + n] = src[a:a + n]
    assert byte_segments._c_copy_segments is not None
    for native in (True, False):
        with monkeypatch.context() as m:
            if not native:
                m.setattr(byte_segments, "_c_copy_segments", None)
            dst = np.zeros(200, np.uint8)
            copy_segments(src, src_starts, lengths, dst, dst_starts)
            assert np.array_equal(dst, want), native
            with pytest.raises(ValueError, match="outside"):
                copy_segments(src, np.array([0]), np.array([10]), dst, np.array([195]))


ops = st.lists(st.tuples(st.sampled_from(["put", "put", "put", "clear", "get"]),
                         st.lists(st.integers(0, 60), min_size=1, max_size=12, unique=True),
                         st.integers(0, 2**31)), min_size=1, max_size=40)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_store_matches_a_dict_of_rows_through_puts_overwrites_clears_and_compaction(script):
    store, model = RaggedStore(slots=4), {}
    for op, keys, seed in script:
        rng = np.random.default_rng(seed)
        if op == "put":
            fields = ["tokens"] if seed % 3 else ["tokens", "score", "tag"]
            rows = [rng.random((int(rng.integers(0, 9)), 3), dtype=np.float32) for _ in keys]
            cols = {"tokens": tensor_column(rows)}
            if "score" in fields:
                cols["score"] = tensor_column([rng.random((1,), dtype=np.float32) for _ in keys], scalar=True)
                cols["tag"] = Column("object", np.array([f"k{k}-{seed}" for k in keys], dtype=object))
            store.put(keys, cols)
            for i, k in enumerate(keys):
                model.setdefault(k, {})["tokens"] = rows[i]
                if "score" in fields:
                    model[k]["score"] = cols["score"].data[4 * i:4 * i + 4].view(np.float32).copy()
                    model[k]["tag"] = f"k{k}-{seed}"
        elif op == "clear":
            assert store.clear(keys) == sum(k in model for k in keys)
            for k in keys:
                model.pop(k, None)
        held = [k for k in keys if k in model]
        if held:
            got = rows_of(store.get(held, ["tokens"])["tokens"])
            for k, r in zip(held, got):
                assert np.array_equal(r, model[k]["tokens"])
            with_score = [k for k in held if "score" in model[k]]
            if with_score:
                g = store.get(with_score, ["score", "tag"])
                assert np.array_equal(g["score"].data.view(np.float32), np.concatenate([model[k]["score"] for k in with_score]))
                assert list(g["tag"].data) == [model[k]["tag"] for k in with_score]
        missing = [k for k in keys if k not in model]
        if missing:
            with pytest.raises(KeyNotStored, match=str(missing[0])):
                store.get(missing, ["tokens"])
        assert len(store) == len(model)
        for f in store._tensors.values():  # memory stays within a bound of what is live
            assert f.live == int(f.nbytes[f.start >= 0].sum()) and f.end <= f.arena.size


def test_a_refused_put_changes_nothing_and_names_the_field():
    store = RaggedStore()
    rows = [np.ones((2, 3), np.float32)]
    store.put([7], {"tokens": tensor_column(rows)})
    bad = {"tokens": tensor_column([np.ones((2, 3), np.float64)]), "new": tensor_column(rows)}
    with pytest.raises(ConfigError, match="field 'tokens'.*float32.*float64"):
        store.put([8], bad)
    assert len(store) == 1 and store.fields == ["tokens"]
    with pytest.raises(ConfigError, match="one row per key"):
        store.put([1, 2], {"tokens": tensor_column(rows)})
    with pytest.raises(ConfigError, match="distinct keys"):
        store.put([3, 3], {"tokens": tensor_column(rows * 2)})


def test_select_picks_rows_in_the_order_given():
    rows = [np.full((n, 3), n, np.float32) for n in (1, 4, 0, 2)]
    col = tensor_column(rows).select(np.array([3, 0, 1]))
    assert [r.shape[0] for r in rows_of(col)] == [2, 1, 4] and list(col.lengths) == [2, 1, 4]


def test_state_round_trip_keeps_every_row_and_field():
    rng = np.random.default_rng(5)
    store = RaggedStore(slots=4)
    rows = {k: rng.random((int(rng.integers(0, 6)), 3), dtype=np.float32) for k in range(20)}
    store.put(list(rows), {"tokens": tensor_column(list(rows.values()))})
    store.put([3, 8, 11], {"tag": Column("object", np.array(["a", {"b": 1}, None], dtype=object))})
    store.clear([4, 5])
    restored = RaggedStore.from_state(store.state())
    keys = [k for k in rows if k not in (4, 5)]
    assert len(restored) == len(keys)
    for k, r in zip(keys, rows_of(restored.get(keys, ["tokens"])["tokens"])):
        assert np.array_equal(r, rows[k])
    assert list(restored.get([3, 8, 11], ["tag"])["tag"].data) == ["a", {"b": 1}, None]
    with pytest.raises(KeyNotStored):
        restored.get([4], ["tokens"])
    restored.put([100], {"tokens": tensor_column([rows[0]])})  # a restored store takes writes
    bad = store.state()
    bad["tensors"]["tokens"]["nbytes"] = bad["tensors"]["tokens"]["nbytes"][:-1]
    with pytest.raises(ConfigError, match=r"state\['tensors'\]\['tokens'\].nbytes"):
        RaggedStore.from_state(bad)


def test_review_cases_clear_twice_negative_keys_and_malformed_columns_change_nothing():
    """Found in review: a key cleared twice freed its slot twice (two keys then shared a slot); a
    negative key read another row; malformed columns were half written before being refused."""
    store = RaggedStore(slots=4)
    store.put([1, 2], {"a": tensor_column([np.array([1.0], np.float32), np.array([2.0], np.float32)])})
    assert store.clear([1, 1]) == 1 and len(store) == 1
    store.put([10, 11, 12], {"a": tensor_column([np.array([v], np.float32) for v in (10.0, 11.0, 12.0)])})
    got = rows_of(store.get([2, 10, 11, 12], ["a"])["a"], inner=())
    assert [float(r[0]) for r in got] == [2.0, 10.0, 11.0, 12.0]
    with pytest.raises(ConfigError, match="non-negative"):
        store.get([-1], ["a"])
    before = store.state()
    good = tensor_column([np.array([9.0, 9.0], np.float32)])
    for broken in (Column("tensor", good.data, good.nbytes, np.array([2, 0, 0]), good.dtype, good.inner),
                   Column("tensor", good.data.reshape(2, 4), good.nbytes, good.lengths, good.dtype, good.inner),
                   Column("tensor", good.data, np.array([4]), np.array([2]), good.dtype, good.inner),
                   Column("tensor", good.data, good.nbytes, good.lengths, "no_such_dtype", good.inner)):
        with pytest.raises(ConfigError):
            store.put([2, 13], {"a": tensor_column([np.array([5.0], np.float32)] * 2), "b": broken})
        with pytest.raises(ConfigError):
            store.put([2], {"b": broken})
    after = store.state()
    assert before["keys"].tolist() == after["keys"].tolist()
    assert np.array_equal(before["tensors"]["a"]["data"], after["tensors"]["a"]["data"]) and "b" not in after["tensors"]
