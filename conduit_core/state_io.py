"""Saving state without pickle: a JSON header plus raw array bytes, in one file.

    b"CONDUIT\\x01" | u64 header length | JSON header | array bytes ...

The header is the state's tree with every numpy array replaced by a reference
(dtype, shape, offset, nbytes). Loading never executes code from the file, so a
checkpoint from an untrusted place cannot run anything (unlike pickle).
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any

import numpy as np
import torch

from .errors import StateError

MAGIC = b"CONDUIT\x01"
_ARRAY = "__conduit_array__"


def _flatten(obj: Any, arrays: list[np.ndarray]) -> Any:
    if isinstance(obj, torch.Tensor):
        obj = obj.detach().cpu().numpy()
    if isinstance(obj, np.ndarray):
        arrays.append(np.ascontiguousarray(obj))
        return {_ARRAY: len(arrays) - 1, "dtype": obj.dtype.str, "shape": list(obj.shape)}
    if isinstance(obj, dict):
        for k in obj:
            if not isinstance(k, str):
                raise StateError(f"state key {k!r}: expected str keys, got {type(k).__name__}. "
                                 "Fix: convert keys to strings in state_dict().")
        return {k: _flatten(v, arrays) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_flatten(v, arrays) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise StateError(f"state value of type {type(obj).__name__}: expected arrays, numbers, strings, lists, dicts. "
                     "Fix: convert it in state_dict().")


def dumps(state: dict) -> bytes:
    arrays: list[np.ndarray] = []
    tree = _flatten(state, arrays)
    offset = 0
    refs = []
    for a in arrays:
        refs.append({"offset": offset, "nbytes": a.nbytes})
        offset += a.nbytes
    header = json.dumps({"tree": tree, "arrays": refs}).encode()
    parts = [MAGIC, struct.pack("<Q", len(header)), header] + [a.tobytes() for a in arrays]
    return b"".join(parts)


def loads(blob: bytes | memoryview) -> dict:
    mv = memoryview(blob)
    if bytes(mv[:8]) != MAGIC:
        raise StateError("state file: expected a Conduit state (magic CONDUIT\\x01), got other bytes. "
                         "Fix: pass a file written by conduit_core.state_io.save().")
    (hlen,) = struct.unpack("<Q", mv[8:16])
    header = json.loads(bytes(mv[16:16 + hlen]))
    base = 16 + hlen
    refs = header["arrays"]

    def build(node: Any) -> Any:
        if isinstance(node, dict) and _ARRAY in node:
            ref = refs[node[_ARRAY]]
            raw = mv[base + ref["offset"]: base + ref["offset"] + ref["nbytes"]]
            return np.frombuffer(raw, dtype=np.dtype(node["dtype"])).reshape(node["shape"]).copy()
        if isinstance(node, dict):
            return {k: build(v) for k, v in node.items()}
        if isinstance(node, list):
            return [build(v) for v in node]
        return node

    return build(header["tree"])


def save(state: dict, path: str | os.PathLike) -> None:
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "wb") as fh:
        fh.write(dumps(state))
    os.replace(tmp, path)


def load(path: str | os.PathLike) -> dict:
    with open(path, "rb") as fh:
        return loads(fh.read())
