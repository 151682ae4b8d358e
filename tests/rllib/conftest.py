import os

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("OMP_NUM_THREADS", "1")

ray = pytest.importorskip("ray", reason="needs ray[rllib] (pip install '.[rllib]')")


@pytest.fixture(scope="module")
def ray_session():
    """One Ray session per test module (starting Ray costs seconds)."""
    from conduit_core.remote.ray_local import init_local
    init_local(num_cpus=3, object_store_memory=256 << 20, log_to_driver=False, configure_logging=False,
               ignore_reinit_error=True)
    yield
    ray.shutdown()
