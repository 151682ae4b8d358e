"""A local Ray session the way Conduit's tools start one: loopback, no dashboard.

Ray's defaults advertise the machine's network address and, when included, serve the
dashboard. A single-machine run needs neither, so the CLI's benchmarks, the integrations
and the tests start Ray through ``init_local``: the node is announced as 127.0.0.1 (its
workers and actors talk over loopback) and the dashboard is off. What Ray 2.60 does not
offer is a bind address for its gRPC servers (GCS, raylet, object manager): measured with
``ss -ltn``, they still listen on all interfaces. Isolate the machine (a firewall or a
network namespace) where that matters. Joining a real cluster is ``ray.init(address=...)``.
"""

from __future__ import annotations

from typing import Any

LOOPBACK = "127.0.0.1"


def init_local(**kwargs: Any) -> Any:
    """``ray.init(**kwargs)`` announced on loopback, without the dashboard (both overridable),
    always a new local instance (``address="local"``): without it ``ray.init`` joins a cluster
    it finds running on the machine (another run's, a test's ``ray.cluster_utils.Cluster``) and
    refuses ``num_cpus`` there. Pass ``address=`` to join one on purpose."""
    import ray
    kwargs.setdefault("address", "local")
    kwargs.setdefault("include_dashboard", False)
    kwargs.setdefault("_node_ip_address", LOOPBACK)
    return ray.init(**kwargs)
