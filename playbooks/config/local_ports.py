"""The ports an environment listens on here; a local cluster's port layout."""
from __future__ import annotations

from collections.abc import Mapping

# The ports of a local cluster after gcs_port: the head's first few, then a
# block per node (0: the head) for the agents Ray would put on fixed ports.
LOCAL_PORTS_FIRST_NODE = 10
LOCAL_PORTS_PER_NODE = 4


def local_port_span(slices: int, hosts: int) -> int:
    """How many ports after gcs_port a local cluster of slices x hosts uses."""
    return LOCAL_PORTS_FIRST_NODE + LOCAL_PORTS_PER_NODE * (1 + slices * hosts)


def ports(env: Mapping) -> list[tuple[range, str, str]]:
    """The ports an environment listens on here: (ports, address or "" for
    every address, its key)."""
    if env["kind"] == "local":
        lo = env["gcs_port"]
        # Ray's GCS and node agents listen on every address, whatever ray_ip says.
        return [(range(lo, lo + local_port_span(env["slices"], env["hosts_per_slice"]) + 1), "", "gcs_port"),
                (range(env["dashboard_port"], env["dashboard_port"] + 1), env["ray_ip"], "dashboard_port")]
    # The port-forward to the Ray dashboard listens on localhost.
    return [(range(env["dashboard_port"], env["dashboard_port"] + 1), "127.0.0.1", "dashboard_port")]
