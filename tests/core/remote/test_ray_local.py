"""``init_local`` starts a local Ray instance of its own even where a cluster runs on the machine
(CI found a test module joining a ``ray.cluster_utils.Cluster`` another run had up, then
``ray.init`` refusing its ``num_cpus`` there)."""

import pytest

ray = pytest.importorskip("ray")


def test_init_local_starts_its_own_instance_unless_told_to_join(monkeypatch):
    from conduit_core.remote.ray_local import init_local
    calls = []
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append(kw))
    init_local(num_cpus=2)
    init_local(address="ray://head:10001")
    assert calls[0]["address"] == "local" and calls[0]["num_cpus"] == 2
    assert calls[0]["_node_ip_address"] == "127.0.0.1" and calls[0]["include_dashboard"] is False
    assert calls[1]["address"] == "ray://head:10001"


def test_beside_another_ray_instance_the_project_starts_its_own():
    """With another Ray instance running on the machine (another user's run), ``init_local``, which
    the project's tools, helpers and test fixtures start Ray with, starts an instance of its own: it
    neither joins 'the latest cluster' nor warns about finding several."""
    import os
    import subprocess
    import sys
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    foreign = subprocess.Popen(
        [sys.executable, "-c", "import ray, sys\n"
                               "ray.init(address='local', num_cpus=1, include_dashboard=False, "
                               "_node_ip_address='127.0.0.1', log_to_driver=False)\n"
                               "print(ray.get_runtime_context().gcs_address, flush=True)\n"
                               "sys.stdin.read()\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        foreign_gcs = foreign.stdout.readline().strip()
        assert foreign_gcs, foreign.stderr.read() if foreign.poll() is not None else "no address"
        ours = subprocess.run(
            [sys.executable, "-c", "import ray\n"
                                   "from conduit_core.remote.ray_local import init_local\n"
                                   "init_local(num_cpus=1, log_to_driver=False)\n"
                                   "print(ray.get_runtime_context().gcs_address)\n"
                                   "ray.shutdown()\n"],
            capture_output=True, text=True, env=env, timeout=180)
        assert ours.returncode == 0, ours.stderr[-2000:]
        assert ours.stdout.strip() and ours.stdout.strip() != foreign_gcs
        assert "multiple active Ray instances" not in ours.stderr and "latest cluster" not in ours.stderr
    finally:
        foreign.stdin.close()
        foreign.wait(timeout=60)
