"""verl's one-step-off-policy trainer end to end on CPU, with and without Conduit's advantage stage:
`python -m verl.experimental.one_step_off_policy.main_ppo` (verl unmodified; the CPU route of
integrations/verl_cpu), 2 training steps of 2 prompts x 2 responses (one mini-batch: with two, verl's
own runs differ from run to run, the generated batch's row order splitting them), side by side:

- verl's own `OneStepOffRayTrainer`;
- the same with `CONDUIT_VERL_ONE_STEP_OFF=conduit` (the plugin puts `ConduitOneStepOffTrainer` in its
  place) and `+trainer.conduit.groups_per_chunk=1`: the advantage stage over chunks of one prompt group.

What it shows: the trainer has no queue between generation and training (the next batch's generation
is a future it awaits), so Conduit's part is the advantage stage, and the run says it ran it (its log
line). Every step's rewards and response lengths equal verl's (the same prompts, the same generations)
and its loss and grad norm agree to float32 rounding (2026-12-07: step 2's loss -0.07685529 vs
-0.07685542, grad norm 0.9763682 vs 0.9763678): GRPO's group statistics are reduced over a chunk
instead of the whole batch, which can round differently in the last bits (the stage's contract,
conduit_verl/separated.py); a wrong advantage moves the loss by its own scale, not 1e-6.
About 2 minutes on 2 cores.
"""

import json
import math
from pathlib import Path

import pytest

from .cpu_runs import start_run, wait_for_run

pytest.importorskip("verl", reason="needs verl[verl-core] (verl 0.9.1)")
pytest.importorskip("conduit_verl", reason="needs the conduit-verl adapter installed (its verl.plugins entry point)")

STEPS = 2
RUN_TIMEOUT_S = 400
EXACT = ("reward_mean", "score_mean", "response_length_mean")
ROUNDED = ("actor_loss", "pg_loss", "grad_norm")   # float32 reductions over chunks: equal to rounding
ONE_MINI_BATCH = ("data.train_batch_size=2",)


def _start(tmp_path: Path, name: str, *args: str):
    out, log = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.log"
    proc = start_run(log, RUN_TIMEOUT_S, "--trainer", "one_step_off", "--steps", str(STEPS), "--seed", "0",
                     "--metrics-out", str(out), *args, *ONE_MINI_BATCH)
    return name, proc, out, log


def _finish(run) -> tuple[list[dict], str]:
    name, proc, out, log = run
    wait_for_run(name, proc, log, RUN_TIMEOUT_S + 60)
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    assert [row["step"] for row in rows] == list(range(1, STEPS + 1)), rows
    return rows, log.read_text()


def test_conduits_advantage_stage_trains_verls_one_step_off_trainer_as_verls_own_does(tmp_path):
    runs = [_start(tmp_path, "verl"),
            _start(tmp_path, "conduit", "--advantage-stage", "conduit", "+trainer.conduit.groups_per_chunk=1")]
    try:
        (native, native_log), (conduit, conduit_log) = (_finish(r) for r in runs)
    finally:   # a failed run leaves no other behind
        for _, proc, _, _ in runs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    assert "ConduitOneStepOffTrainer's advantage stage over chunks of 1 prompt groups" in conduit_log
    assert "ConduitOneStepOffTrainer" not in native_log and "runs whole-batch" not in conduit_log
    for row in native:
        for key in ("reward_mean", "actor_loss", "grad_norm"):
            assert row[key] is not None and math.isfinite(row[key]), (row["step"], key, row[key])
        assert row["grad_norm"] > 0, f"step {row['step']}: zero gradient, the actor was not updated"
    for a, b in zip(native, conduit, strict=True):
        for key in EXACT:
            assert a[key] == b[key], f"step {a['step']}: {key} differs: verl's {a[key]!r}, Conduit's {b[key]!r}"
        for key in ROUNDED:
            assert math.isclose(a[key], b[key], rel_tol=1e-5, abs_tol=1e-6), \
                f"step {a['step']}: {key} differs beyond float32 rounding: verl's {a[key]!r}, Conduit's {b[key]!r}"
