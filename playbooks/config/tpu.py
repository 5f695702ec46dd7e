"""TPU arithmetic: v6e topologies, chips, hosts per slice."""
from __future__ import annotations

import re
from collections.abc import Mapping

from playbooks.config import tutorial as T

_TOPOLOGY = re.compile(r"^[1-9][0-9]{0,2}x[1-9][0-9]{0,2}$")
_TOPOLOGY_3D = re.compile(r"^[0-9]+x[0-9]+x[0-9]+$")
# Every topology a v6e slice can have (the machine types' own lists).
V6E_TOPOLOGIES = tuple(dict.fromkeys(t for _, tops in T.V6E_MACHINE_TYPES.values() for t in tops))


def chips(topology: str) -> int:
    """Chips of a 2D topology such as 4x4 (the topology rule ran first)."""
    a, b = topology.split("x")
    return int(a) * int(b)


def topology_problem(v: str) -> str | None:
    """Why ``v`` is not a v6e topology at all (before any machine type)."""
    if _TOPOLOGY_3D.match(v):
        return "is a 3D topology; TPU v6e slices are 2D, like 4x4 (3D topologies are v4/v5p)"
    if not _TOPOLOGY.match(v):
        return "is not a topology like 4x4 (<chips>x<chips>)"
    if v not in V6E_TOPOLOGIES:
        return f"is not a TPU v6e topology (v6e slices are: {', '.join(V6E_TOPOLOGIES)})"
    return None


def default_chips_per_host(env: Mapping) -> int:
    if env.get("kind") == "local":
        # Ray's rule for v6e: single-host topologies (<= 8 chips) are one VM.
        n = chips(env["topology"])
        return n if n <= 8 else 4
    return T.V6E_MACHINE_TYPES[env["machine_type"]][0]


def hosts_per_slice(env: Mapping) -> int:
    return max(1, chips(env["topology"]) // env["chips_per_host"])
