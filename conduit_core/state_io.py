"""Saving state without pickle: a JSON header plus raw array bytes, in one file.

    b"CONDUIT\\x02" | u64 header length | u32 CRC-32 of the header | JSON header | array bytes ...

The header is the state's tree with every numpy array replaced by a reference
(dtype, shape, offset, nbytes, CRC-32 of its bytes, and where it sits in the tree), and every
tuple and numpy scalar by a tagged form (``{"__conduit_tuple__": [...]}``, ``{"__conduit_scalar__":
dtype, "value": v}``), so they load as what was saved (an env's infos come back as the env returned
them: a tuple as a tuple, an ``np.float32`` as an ``np.float32``). Files written before the tags
load their tuples as lists and their scalars as Python numbers, as they were saved.
Loading never executes code from the file, so a checkpoint from an untrusted place
cannot run anything (unlike pickle), and it checks every section: a truncated file or a
flipped bit raises ``StateError`` naming the section, never loads wrong data. Files of
format 1 (no checksums, Conduit 0.1's first releases) load only when asked for
(``allow_unchecked=True``): nothing can tell a flipped bit in them from data.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from typing import Any

import numpy as np
import torch

from .errors import StateError

MAGIC_V1 = b"CONDUIT\x01"
MAGIC = b"CONDUIT\x02"
_ARRAY = "__conduit_array__"
_TUPLE = "__conduit_tuple__"
_SCALAR = "__conduit_scalar__"
_TAGS = (_ARRAY, _TUPLE, _SCALAR)   # names the format reserves: a state's own dict may not use them


def _flatten(obj: Any, arrays: list[np.ndarray], paths: list[str], path: str = "") -> Any:
    """The JSON tree of ``obj``, its arrays moved to ``arrays``, its tuples and numpy scalars tagged
    (JSON has neither: untagged they would load as lists and Python numbers)."""
    if isinstance(obj, torch.Tensor):
        obj = obj.detach().cpu().numpy()
    if isinstance(obj, np.ndarray):
        arrays.append(np.ascontiguousarray(obj))
        paths.append(path or "<root>")
        return {_ARRAY: len(arrays) - 1, "dtype": obj.dtype.str, "shape": list(obj.shape)}
    if isinstance(obj, dict):
        for k in obj:
            if not isinstance(k, str):
                raise StateError(f"state key {k!r} at {path or '<root>'}: expected str keys, got {type(k).__name__}. "
                                 "Fix: convert keys to strings in state_dict().")
            if k in _TAGS:
                raise StateError(f"state key {k!r} at {path or '<root>'}: expected any other name, got the name "
                                 "this format reserves for its array references. Fix: rename that key.")
        return {k: _flatten(v, arrays, paths, f"{path}.{k}" if path else k) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_flatten(v, arrays, paths, f"{path}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return {_TUPLE: [_flatten(v, arrays, paths, f"{path}[{i}]") for i, v in enumerate(obj)]}
    if isinstance(obj, (np.bool_, np.integer, np.floating)):   # the value exactly, as a Python number
        return {_SCALAR: obj.dtype.str, "value": obj.item()}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise StateError(f"state value at {path or '<root>'}: expected arrays, numbers, strings, lists or dicts, got "
                     f"{type(obj).__module__}.{type(obj).__qualname__}. Fix: convert it in state_dict() (for an "
                     "env info: return plain values from the env).")


def dumps(state: dict) -> bytes:
    arrays: list[np.ndarray] = []
    paths: list[str] = []
    tree = _flatten(state, arrays, paths)
    offset = 0
    refs = []
    for a, path in zip(arrays, paths):
        raw = memoryview(a).cast("B") if a.nbytes else b""
        refs.append({"offset": offset, "nbytes": a.nbytes, "crc32": zlib.crc32(raw), "path": path})
        offset += a.nbytes
    header = json.dumps({"tree": tree, "arrays": refs}).encode()
    parts = [MAGIC, struct.pack("<QI", len(header), zlib.crc32(header)), header] + [a.tobytes() for a in arrays]
    return b"".join(parts)


def _damaged(section: str, how: str) -> StateError:
    return StateError(f"state file, {section}: {how}. Fix: the file is damaged or truncated; restore it from "
                      "another copy (nothing was loaded)")


def loads(blob: bytes | memoryview, *, allow_unchecked: bool = False) -> dict:
    """The state in ``blob``, every section checked first (format 2: checksums). A format-1 file
    (no checksums) only with ``allow_unchecked=True``."""
    mv = memoryview(blob)
    magic = bytes(mv[:8])
    if magic[:7] == MAGIC[:7] and len(magic) == 8 and magic[7] > MAGIC[7]:
        raise StateError(f"state file: expected format 1 or 2, got format {magic[7]}: written by a newer version of "
                         "Conduit. Fix: load it with that version, or upgrade conduit-edp (nothing was loaded)")
    if magic not in (MAGIC, MAGIC_V1):
        raise StateError("state file: expected a Conduit state (magic CONDUIT\\x01 or \\x02), got other bytes. "
                         "Fix: pass a file written by conduit_core.state_io.save().")
    if magic == MAGIC_V1 and not allow_unchecked:
        raise StateError("state file: expected format 2 (every section checksummed), got format 1, which has no "
                         "checksums: a damaged byte in it would load as wrong data. Fix: if you trust the file, "
                         "load it once with state_io.load(path, allow_unchecked=True) and save it again (format 2); "
                         "nothing was loaded")
    checked = magic == MAGIC
    prefix = 20 if checked else 16
    if len(mv) < prefix:
        raise _damaged("prefix", f"{len(mv)} bytes, shorter than the {prefix}-byte prefix")
    if checked:
        hlen, hcrc = struct.unpack("<QI", mv[8:20])
    else:
        (hlen,) = struct.unpack("<Q", mv[8:16])
    if prefix + hlen > len(mv):
        raise _damaged("header", f"{hlen} bytes announced, {len(mv) - prefix} present")
    raw_header = bytes(mv[prefix:prefix + hlen])
    if checked and zlib.crc32(raw_header) != hcrc:
        raise _damaged("header", "its checksum does not match")
    try:
        header = json.loads(raw_header)
        refs = header["arrays"]
        tree = header["tree"]
    except (ValueError, UnicodeDecodeError, KeyError, TypeError) as exc:
        raise _damaged("header", f"not a readable header ({type(exc).__name__}: {exc})") from None
    base = prefix + hlen
    for i, ref in enumerate(refs):
        where = ref.get("path", f"array {i}") if isinstance(ref, dict) else f"array {i}"
        try:
            lo, n = base + int(ref["offset"]), int(ref["nbytes"])
        except (KeyError, TypeError, ValueError):
            raise _damaged(f"array {where}", "its reference is unreadable") from None
        if lo + n > len(mv) or n < 0:
            raise _damaged(f"array {where}", f"{n} bytes at offset {lo}, the file has {len(mv)}")
        if checked and zlib.crc32(mv[lo:lo + n]) != ref.get("crc32"):
            raise _damaged(f"array {where}", "its checksum does not match (a flipped bit or a partial write)")

    def build(node: Any) -> Any:
        if isinstance(node, dict) and _ARRAY in node:
            try:
                ref = refs[node[_ARRAY]]
                raw = mv[base + ref["offset"]: base + ref["offset"] + ref["nbytes"]]
            except (IndexError, KeyError, TypeError) as exc:
                raise _damaged(f"array reference {node[_ARRAY]!r}", f"it names no array of the file ({exc!r})") from None
            try:
                return np.frombuffer(raw, dtype=np.dtype(node["dtype"])).reshape(node["shape"]).copy()
            except (KeyError, ValueError, TypeError) as exc:
                raise _damaged(f"array {ref.get('path', node[_ARRAY])}", f"dtype/shape do not fit its bytes ({exc})")
        if isinstance(node, dict) and _TUPLE in node:
            if not isinstance(node[_TUPLE], list):
                raise _damaged("header", f"a tuple's items are {type(node[_TUPLE]).__name__}, not a list")
            return tuple(build(v) for v in node[_TUPLE])
        if isinstance(node, dict) and _SCALAR in node:
            try:
                dtype = np.dtype(node[_SCALAR])
                if dtype.kind not in "biuf":
                    raise TypeError(f"dtype {dtype} is no number's")
                return dtype.type(node["value"])
            except (KeyError, TypeError, ValueError, OverflowError) as exc:
                raise _damaged("header", f"a numpy scalar is unreadable ({exc})") from None
        if isinstance(node, dict):
            return {k: build(v) for k, v in node.items()}
        if isinstance(node, list):
            return [build(v) for v in node]
        return node

    return build(tree)


def save(state: dict, path: str | os.PathLike) -> None:
    """Write ``state`` to ``path`` atomically and durably: a temporary file, flushed to disk,
    renamed over ``path``, and the rename itself flushed (its directory), so a crash leaves the
    old file or the new one, never a torn or empty one."""
    blob = dumps(state)   # (a state that cannot be written fails here, before any file is touched)
    tmp = f"{os.fspath(path)}.tmp"
    try:
        with open(tmp, "wb") as fh:
            fh.write(blob)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:   # a full disk, a file-size limit: the old file stays, and no partial copy beside it
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:
        fd = os.open(os.path.dirname(os.path.abspath(path)) or ".", os.O_RDONLY)
    except OSError:   # a directory that cannot be opened (some platforms): the file itself is on disk
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def load(path: str | os.PathLike, *, allow_unchecked: bool = False) -> dict:
    with open(path, "rb") as fh:
        return loads(fh.read(), allow_unchecked=allow_unchecked)
