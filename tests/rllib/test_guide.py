"""The RLlib guide's Python blocks run as written, one after the other in a fresh interpreter,
as a reader pasting them would (each block's algorithm stopped before the next)."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

GUIDE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "guides" / "rllib.md"


def test_the_guides_python_blocks_run():
    pytest.importorskip("metaworld", reason="the guide's SAC block runs Meta-World: "
                                     "pip install 'conduit-rllib[metaworld]'")
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)
    assert len(blocks) >= 3, f"expected the DQN, SAC and multi-agent PPO blocks, found {len(blocks)}"
    stop = "\ntry:\n    algo.stop()\nexcept NameError:\n    pass\n"
    code = "".join(block + stop for block in blocks) + "import ray\nray.shutdown()\nprint('ok')\n"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]
