"""State files: an unchecked format-1 file loads only when asked for, a newer format is named as
such, and a save that fails leaves the old file and nothing beside it."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conduit_core import StateError, state_io


def format_1(state: dict) -> bytes:
    """The same state as Conduit 0.1's first releases wrote it: no checksums (magic 1, 16-byte prefix)."""
    blob = state_io.dumps(state)
    import struct
    hlen, _ = struct.unpack("<QI", blob[8:20])
    return state_io.MAGIC_V1 + struct.pack("<Q", hlen) + blob[20:]


def test_a_format_1_file_loads_only_when_asked_for():
    old = format_1({"a": np.arange(4)})
    with pytest.raises(StateError, match="format 1"):
        state_io.loads(old)
    assert state_io.loads(old, allow_unchecked=True)["a"].tolist() == [0, 1, 2, 3]


def test_a_newer_format_is_named_as_such():
    blob = bytearray(state_io.dumps({"a": 1}))
    blob[7] = 3
    with pytest.raises(StateError, match="newer version"):
        state_io.loads(bytes(blob))


def test_a_save_that_fails_keeps_the_old_file_and_leaves_no_partial_copy(tmp_path):
    path = tmp_path / "state.bin"
    state_io.save({"a": np.zeros(10)}, path)
    before = path.read_bytes()
    # a file-size limit below the new state's size: the write fails part-way (EFBIG)
    script = textwrap.dedent(f"""
        import resource, signal, numpy as np
        from conduit_core import state_io
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))
        try:
            state_io.save({{"a": np.zeros(1 << 20)}}, {str(path)!r})
        except OSError as exc:
            print("refused", exc.errno)
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert "refused" in r.stdout, r.stdout + r.stderr
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["state.bin"]
