"""The README's quickstarts run as written: the core's (``## Using it``), RLlib's (``## With
RLlib``: the config is built into an algorithm that trains one iteration through Conduit) and
Stable-Baselines3's (its DQN learns through Conduit's buffer). Each runs in a fresh interpreter, as
a user pasting it would."""

import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def first_python_block(section: str) -> str:
    text = README.read_text()
    start = text.index(f"\n## {section}\n")
    end = text.find("\n## ", start + 1)
    m = re.search(r"```python\n(.*?)```", text[start:end if end > 0 else None], re.S)
    assert m, f"no python block under '## {section}'"
    return m.group(1)


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          cwd=README.parent)


def test_the_core_quickstart_runs():
    code = first_python_block("Using it") + "\nassert batch['obs'].shape == (32, 4)\nprint('ok')\n"
    r = run(code)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


def test_the_rllib_quickstart_runs_and_trains_through_conduit():
    pytest.importorskip("ray.rllib", reason="needs the RLlib adapter: pip install -e adapters/conduit_rllib")
    block = first_python_block("With RLlib")
    code = textwrap.dedent("""
        import os
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        from conduit_core.remote.ray_local import init_local
        init_local(num_cpus=2, object_store_memory=128 << 20, log_to_driver=False)   # (a session of its own)
    """) + block + textwrap.dedent("""
        result = algo.train()
        assert type(algo.local_replay_buffer).__module__.startswith("conduit_rllib"), type(algo.local_replay_buffer)
        algo.stop()
        print("ok")
    """)
    r = run(code)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


def test_the_sb3_quickstart_runs_and_trains_through_conduit():
    pytest.importorskip("conduit_sb3", reason="needs the SB3 example: pip install -e examples/conduit_sb3")
    code = first_python_block("With Stable-Baselines3 (a worked example)") + textwrap.dedent("""
        assert isinstance(model.replay_buffer, ConduitReplayBuffer) and model.replay_buffer.size() == 2_000
        assert model._n_updates > 0   # the learner trained on what Conduit delivered
        model.replay_buffer.close()
        print("ok")
    """)
    r = run(code)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]
