"""What the fully-async trainer trained on, step by step: for comparing the queue between its rollouter
and trainer (verl's ``MessageQueue`` or Conduit's) on the same run.

Installed in every process of a run by ``plugin.py`` when ``VERL_CPU_TRAINED_TRACE`` names a file:
``fully_async_trainer.assemble_batch_from_rollout_samples`` (the trainer builds each training batch
from the samples it took from the queue with it) then appends one JSON line per training step: for each
sample in the order taken, its feed index (the rollouter's ``sample_id``), the weight versions of its
responses (``min_global_steps``, ``max_global_steps``), their lengths and their digests (as the
generation trace names them), row by row.
"""

from __future__ import annotations

import json
import os

from .hf_rollout import token_digest

TRACE_ENV = "VERL_CPU_TRAINED_TRACE"
TRAINER_MODULE = "verl.experimental.fully_async_policy.fully_async_trainer"


def _sample_row(rs) -> dict:
    batch = rs.full_batch
    ntb = batch.non_tensor_batch
    mask = batch.batch["response_mask"] if "response_mask" in batch.batch.keys() else None
    responses = []
    if mask is not None and "responses" in batch.batch.keys():   # each row's tokens, in the sample's row order
        responses = [token_digest(row[m.bool()].tolist()) for row, m in zip(batch.batch["responses"], mask)]
    return {"id": int(str(rs.sample_id).rsplit("_", 1)[-1]),
            "min_version": [int(v) for v in ntb["min_global_steps"]],
            "max_version": [int(v) for v in ntb["max_global_steps"]],
            "length": [] if mask is None else [int(x) for x in mask.sum(-1).tolist()],
            "responses": responses}


def _wrap(module, path: str) -> None:
    inner = module.assemble_batch_from_rollout_samples
    if getattr(inner, "_conduit_traced", False):
        return

    def traced(rollout_samples, *args, **kwargs):
        rows = [_sample_row(rs) for rs in rollout_samples]     # before assembly consumes them
        batch = inner(rollout_samples, *args, **kwargs)
        with open(path, "a") as f:
            f.write(json.dumps({"pid": os.getpid(), "samples": rows}) + "\n")
        return batch
    traced._conduit_traced = True
    module.assemble_batch_from_rollout_samples = traced


def install() -> None:
    path = os.environ.get(TRACE_ENV)
    if not path:
        return
    from conduit_verl.plugin import after_import
    after_import(TRAINER_MODULE, lambda module: _wrap(module, path))


def read(path: str) -> list[list[dict]]:
    """The samples of each training step, in the order trained."""
    return [json.loads(line)["samples"] for line in open(path) if line.strip()]
