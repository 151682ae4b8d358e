"""verl's own trainer end to end on CPU: `python -m verl.trainer.main_ppo` (GRPO, V1 trainer), 2 iterations,
runs with the same seed through integrations/verl_cpu/run.py: one on TransferQueue's SimpleStorage, one on
Conduit's storage backend with Conduit's trainer mode (`transfer_queue.backend.storage_backend=Conduit
trainer.v1.trainer_mode=conduit`), and with CONDUIT_VERL_E2E_CONTROL=1 a second SimpleStorage run.

What it shows: the unmodified trainer runs here; each iteration's reward and loss are finite; the actor is
updated (non-zero grad norm at a non-zero learning rate); the Conduit run agrees with SimpleStorage's bit for
bit, iteration by iteration; and every get of the actor update stage returned the same rows, in the same order,
on both backends (digests of each get, integrations/verl_cpu/get_trace.py), but for the fields that hold
per-run values (PER_RUN_FIELDS). The control run shows verl deterministic here (two same-seed SimpleStorage
runs agree bit for bit, and differ only in PER_RUN_FIELDS), so a difference would be Conduit's; it is opt-in
because each run takes about 60 s on 2 cores (Ray and TransferQueue start-up is most of it) and a Conduit
run that agrees bit for bit already implies it. Run it when this test fails. The runs go side by side.
"""

import json
import math
import os
from pathlib import Path

import pytest

from .cpu_runs import start_run, wait_for_run

pytest.importorskip("verl", reason="needs verl[verl-core] (verl 0.9.1 with transferqueue)")

STEPS = 2
RUN_TIMEOUT_S = 300  # one run; a hang must not eat the CI budget
PER_RUN_FIELDS = {"uid", "session_id", "metrics"}  # uuid4 ids and timings: new values in every run
COMPARED = ("reward_mean", "score_mean", "actor_loss", "pg_loss", "grad_norm", "response_length_mean")


def _start(tmp_path: Path, name: str, seed: int, *overrides: str):
    """A run of run.py started beside the others (``cpu_runs.start_run``); ``_finish`` waits for it."""
    out = tmp_path / f"{name}.jsonl"
    log = tmp_path / f"{name}.log"
    proc = start_run(log, RUN_TIMEOUT_S, "--steps", str(STEPS), "--seed", str(seed), "--metrics-out", str(out),
                     *overrides, VERL_CPU_GET_TRACE=str(tmp_path / f"{name}.gets.jsonl"))
    return name, proc, out, log


def _finish(run) -> list[dict]:
    name, proc, out, log = run
    wait_for_run(name, proc, log, RUN_TIMEOUT_S + 60)
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    assert [row["step"] for row in rows] == list(range(1, STEPS + 1)), rows
    print(f"{name}: " + json.dumps([{k: row[k] for k in ("step", *COMPARED)} for row in rows]))
    return rows


def test_grpo_same_seed_runs_match_iteration_by_iteration_on_both_backends(tmp_path):
    from integrations.verl_cpu.get_trace import actor_update_gets

    control = os.environ.get("CONDUIT_VERL_E2E_CONTROL", "") not in ("", "0")
    runs = [_start(tmp_path, "run_a", 0),
            _start(tmp_path, "run_conduit", 0, "transfer_queue.backend.storage_backend=Conduit",
                   "trainer.v1.trainer_mode=conduit")]
    if control:
        runs.append(_start(tmp_path, "run_b", 0))
    try:
        first, conduit, *rest = [_finish(r) for r in runs]
    finally:   # a failed run leaves no other behind
        for _, proc, _, _ in runs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    second = rest[0] if control else None
    hint = "" if control else " (CONDUIT_VERL_E2E_CONTROL=1 runs SimpleStorage twice: is verl deterministic here?)"

    for row in first:
        for key in ("reward_mean", "actor_loss", "pg_loss", "grad_norm"):
            assert row[key] is not None and math.isfinite(row[key]), (row["step"], key, row[key])
        assert row["grad_norm"] > 0, f"step {row['step']}: zero gradient, the actor was not updated"
        assert set(row["timing_s"]) >= {"gen", "old_log_prob", "adv", "update_actor", "step"}, row["timing_s"]

    # Conduit's storage units reach verl's own tracker (the file logger here) every step, and only its run
    for row in first:
        assert not any(k.startswith("storage/") for k in row["conduit"]), row["conduit"]
    for row in conduit:
        got = row["conduit"]
        assert got.get("storage/units", 0) >= 1 and got["storage/rows"] > 0 and got["storage/mib"] > 0, got
        assert got["storage/fields"] >= 4 and got["storage/puts_in_flight"] == 0, got

    pairs = ((second, "same-seed SimpleStorage runs"),) if control else ()
    for other, what in (*pairs, (conduit, "SimpleStorage and the Conduit backend")):
        for a, b in zip(first, other, strict=True):
            for key in COMPARED:
                assert a[key] == b[key], \
                    f"step {a['step']}: {key} differs between {what}: {a[key]!r} != {b[key]!r}{hint}"

    # what the actor update received, get by get: the same rows in the same order on both backends. A few
    # fields hold per-run values (uuid4 row ids and session ids, wall-clock metrics): they differ between the
    # two SimpleStorage runs too, so they are left out, and only they may be.
    native = actor_update_gets(tmp_path / "run_a.gets.jsonl")
    ours = actor_update_gets(tmp_path / "run_conduit.gets.jsonl")
    assert len(native) == len(ours) >= STEPS
    per_run = PER_RUN_FIELDS
    if control:
        again = actor_update_gets(tmp_path / "run_b.gets.jsonl")
        assert len(again) == len(native)
        differ = {k for a, b in zip(native, again) for k in a["digest"] if a["digest"][k] != b["digest"][k]}
        assert differ <= PER_RUN_FIELDS, f"two same-seed SimpleStorage runs differ in {differ - PER_RUN_FIELDS}"
    for i, (a, b) in enumerate(zip(native, ours)):
        assert a["fields"] == b["fields"], i
        differ = [k for k in a["digest"] if k not in per_run and a["digest"][k] != b["digest"][k]]
        assert not differ, f"actor update get {i}: these fields differ between the backends: {differ}{hint}"
        assert {"advantages", "old_log_probs", "responses", "response_mask"} <= set(a["digest"]) - per_run
