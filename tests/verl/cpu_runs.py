"""Runs of integrations/verl_cpu/run.py started by a test, and waiting for them: a hang ends the test
(the run killed), a failed run fails it with verl's own output."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "integrations" / "verl_cpu" / "run.py"


def start_run(log: Path, timeout_s: float, *args: str, **env: str) -> subprocess.Popen:
    """run.py with ``args``, verl's output to ``log``, started beside any other: each run is its own
    seeded process tree, so running them at once changes nothing they compute, and on 2 cores it saves
    most of a run's Ray and TransferQueue start-up. ``env``: variables added to the CPU route's."""
    env = dict(os.environ, OMP_NUM_THREADS="1", RAY_AUTH_MODE="disabled", HF_HUB_OFFLINE="1", **env)
    cmd = [sys.executable, str(RUN), "--log", str(log), "--timeout", str(timeout_s), *args]
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_run(name: str, proc: subprocess.Popen, log: Path, timeout_s: float) -> None:
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        pytest.fail(f"{name}: run.py did not finish in {timeout_s} s\n{stdout}\n{stderr}")
    tail = log.read_text()[-4000:] if log.exists() else ""
    assert proc.returncode == 0, f"{name}: run.py exited {proc.returncode}\n{stdout[-3000:]}\n{stderr[-3000:]}\n{tail}"
