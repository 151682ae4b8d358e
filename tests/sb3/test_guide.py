"""The SB3 guide's snippet runs as written (SAC learns through Conduit's buffer), in a fresh
interpreter as a reader pasting it would."""

import pathlib
import re
import subprocess
import sys

GUIDE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "guides" / "sb3.md"


def test_the_guides_python_block_runs():
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)
    assert len(blocks) == 1, "the guide has one python block; run each if that changes"
    code = blocks[0].replace("model.replay_buffer.close()", "assert model._n_updates > 0 and "
                             "type(model.replay_buffer).__name__ == 'ConduitReplayBuffer'\nmodel.replay_buffer.close()")
    r = subprocess.run([sys.executable, "-c", code + "\nprint('ok')\n"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]
