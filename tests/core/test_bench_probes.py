"""The helpers of two issue-18 probes: the decode split over two threads writes what one call
writes, and the warm-core worker returns results, raises the caller's errors and joins on close."""

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from benchmarks.decode_in_run import _split
from benchmarks.warm_core_handoff import Worker

_frames = pytest.importorskip("conduit_core._native._frames", reason="C helpers not built (python setup.py build_ext --inplace)")


@pytest.mark.parametrize("affine", [None, (128.0, True, -1.0)])
@pytest.mark.parametrize("rows", [2, 7, 32])
def test_split_decode_writes_what_one_call_writes(rows, affine):
    rng = np.random.default_rng(rows)
    frames = rng.integers(0, 256, size=(50, 84 * 84), dtype=np.uint8)
    ids = rng.integers(0, 50, size=rows).astype(np.int64)
    lut = (np.arange(256, dtype=np.float32) / np.float32(128) - np.float32(1)).astype(np.float32)
    one = np.full((rows, 84 * 84 * 4), np.nan, dtype=np.float32)
    two = np.full_like(one, np.nan)
    extra = [] if affine is None else [affine]
    _frames.gather_stacks(frames, ids, 4, True, lut, one, *extra)
    with ThreadPoolExecutor(1) as helper:
        _split(_frames.gather_stacks, [frames, ids, 4, True, lut, two, *extra], helper)
    assert not np.isnan(one).any()
    np.testing.assert_array_equal(one, two)


def test_worker_returns_raises_and_joins():
    w = Worker(None)
    assert w.call(lambda a, b=0: a + b, 2, b=3) == 5
    with pytest.raises(ZeroDivisionError):
        w.call(lambda: 1 / 0)
    assert w.call(len, [1, 2]) == 2   # (still serving after an error)
    w.close()
    assert not any(t.name == "warm-core-worker" for t in threading.enumerate())


def test_worker_runs_a_nested_call_itself():
    w = Worker(None)
    try:
        assert w.call(lambda: w.call(lambda: 7)) == 7   # (RLlib's add calls add: no deadlock)
    finally:
        w.close()


def test_worker_that_cannot_pin_raises_instead_of_hanging():
    import os
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no os.sched_setaffinity here")
    w = Worker(10_000)   # (no such core)
    try:
        with pytest.raises(OSError):
            w.call(lambda: 1)
    finally:
        w.close()


def test_report_prints_and_writes_the_command(tmp_path, capsys):
    import json

    from benchmarks.common import report
    path = tmp_path / "sub" / "r.json"
    report({"x": 1.5}, "decode_in_run", ["--iters", "3"], str(path))
    written = json.loads(path.read_text())
    assert written == {"x": 1.5, "command": "python -m benchmarks.decode_in_run --iters 3"}
    assert json.loads(capsys.readouterr().out) == written
