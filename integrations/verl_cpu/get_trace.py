"""What each TransferQueue get returned, as digests: for checking that two runs (one per storage
backend) hand every stage, the actor update included, the same rows in the same order.

Installed in every process of a run by ``plugin.py`` when ``VERL_CPU_GET_TRACE`` names a file:
``TransferQueueClient.async_get_data`` (every get of every backend goes through it) then appends one
JSON line per get: the process id, the fields, and per field a SHA-1 of its rows in the order
returned (tensors padded the way verl pads them; other values by ``repr``).
"""

from __future__ import annotations

import hashlib
import json
import os

TRACE_ENV = "VERL_CPU_GET_TRACE"


def _digest(value) -> str:
    import torch
    h = hashlib.sha1()
    if isinstance(value, torch.Tensor):
        rows = value.unbind() if value.is_nested else value
        for row in rows:
            t = row.detach().cpu().contiguous()
            h.update(str((t.dtype, tuple(t.shape))).encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    else:
        for row in list(value):
            h.update(repr(row).encode())
    return h.hexdigest()


def install() -> None:
    path = os.environ.get(TRACE_ENV)
    if not path:
        return
    from transfer_queue.client import TransferQueueClient
    inner = TransferQueueClient.async_get_data
    if getattr(inner, "_conduit_traced", False):
        return

    async def traced(self, metadata):
        data = await inner(self, metadata)
        entry = {"pid": os.getpid(), "fields": sorted(data.keys()),
                 "digest": {k: _digest(data.get(k)) for k in sorted(data.keys())}}
        with open(path, "a") as f:
            f.write(json.dumps(entry) + "\n")
        return data
    traced._conduit_traced = True
    TransferQueueClient.async_get_data = traced


def actor_update_gets(path: str) -> list[dict]:
    """The gets of the actor update stage (the only stage that reads advantages with the
    old log-probs), in the order they happened."""
    rows = [json.loads(line) for line in open(path) if line.strip()]
    return [r for r in rows if {"advantages", "old_log_probs"} <= set(r["fields"])]
