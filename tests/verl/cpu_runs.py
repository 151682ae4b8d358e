"""Waiting for a run of integrations/verl_cpu/run.py started by a test: a hang ends the test (the run
killed), a failed run fails it with verl's own output."""

import subprocess
from pathlib import Path

import pytest


def wait_for_run(name: str, proc: subprocess.Popen, log: Path, timeout_s: float) -> None:
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        pytest.fail(f"{name}: run.py did not finish in {timeout_s} s\n{stdout}\n{stderr}")
    tail = log.read_text()[-4000:] if log.exists() else ""
    assert proc.returncode == 0, f"{name}: run.py exited {proc.returncode}\n{stdout[-3000:]}\n{stderr[-3000:]}\n{tail}"
