import os

import pytest


@pytest.fixture(scope="module")
def ray_session():
    """One local Ray session per test module (starting Ray costs seconds), on loopback."""
    import ray

    from conduit_core.remote.ray_local import init_local
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    init_local(num_cpus=4, address="local", log_to_driver=False)
    yield
    ray.shutdown()
