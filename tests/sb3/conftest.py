import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

pytest.importorskip("stable_baselines3", reason="needs Stable-Baselines3: pip install -e examples/conduit_sb3")
pytest.importorskip("conduit_sb3", reason="needs the example adapter: pip install -e examples/conduit_sb3")
