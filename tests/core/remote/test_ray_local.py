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
