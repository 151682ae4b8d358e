"""Tests that run inside SRL's venv (scripts/srl/setup-srl-venv.sh), against real SRL.

The main suite runs them through ``tests/srl/test_srl_venv.py`` when ``CONDUIT_SRL_PYTHON``
names that venv's python; run them directly with ``$CONDUIT_SRL_PYTHON -m pytest tests/srl_venv``."""

import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "adapters"))
sys.path.insert(0, os.path.join(here, "..", ".."))

try:
    import rlsrl.base.buffer  # noqa: F401
except ImportError:  # pragma: no cover - the main venv: tests/srl/test_srl_venv.py runs these in SRL's venv
    collect_ignore_glob = ["test_*.py"]
