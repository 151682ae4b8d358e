"""verl's own per-step metrics, reduced to what the CPU run reports.

verl's `FileLogger` (utils/tracking.py:529) writes `{"step": n, "data": {...}}` per step to
`VERL_FILE_LOGGER_PATH` when `trainer.logger` includes "file". `summarize` keeps the training steps and
picks the reward mean, the actor's loss and grad norm, the per-stage timings and what Conduit reports to
verl's tracker (its queue in the fully-async trainer, its storage units in the V1 trainer), under stable names.
"""

from __future__ import annotations

import json
from typing import Iterable

# our name -> verl's metric keys, first one present wins
PICK = {
    "reward_mean": ("critic/rewards/mean", "critic/score/mean"),
    "score_mean": ("critic/score/mean",),
    "pg_loss": ("actor/pg_loss",),
    "actor_loss": ("actor/loss", "actor/pg_loss"),
    "grad_norm": ("actor/grad_norm",),
    "advantage_abs_max": ("critic/advantages/max",),
    "response_length_mean": ("response_length/mean",),
}


def read_steps(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def summarize(records: Iterable[dict]) -> list[dict]:
    rows = []
    for record in records:
        data = record.get("data", {})
        if not any(key.startswith("actor/") for key in data):
            continue  # validation-only records
        row = {"step": record["step"]}
        for name, keys in PICK.items():
            row[name] = next((data[key] for key in keys if key in data), None)
        row["timing_s"] = {key[len("timing_s/") :]: value for key, value in data.items() if key.startswith("timing_s/")}
        # Conduit's queue in the fully-async trainer (conduit_verl.async_queue: fully_async/conduit/*) and
        # its TransferQueue storage units under trainer_mode=conduit (conduit_verl.tq_backend: conduit/storage/*)
        row["conduit"] = {key.split("conduit/", 1)[1]: value for key, value in data.items()
                          if key.startswith(("fully_async/conduit/", "conduit/"))}
        rows.append(row)
    return rows


def write_jsonl(rows: list[dict], path: str) -> None:
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row, sort_keys=True) + "\n")
