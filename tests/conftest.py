import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import atexit  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

# Stable-Baselines3 makes an empty log folder in the temp dir on every learn() with no folder given
# (its logger's configure()): the tests' runs, and the processes they start, share one, removed at exit
_SB3_LOGS = tempfile.mkdtemp(prefix="conduit-tests-sb3-logs-")
os.environ.setdefault("SB3_LOGDIR", _SB3_LOGS)
atexit.register(shutil.rmtree, _SB3_LOGS, ignore_errors=True)
