"""Facts read from a Ray dashboard's REST API (version, nodes, jobs), shown
in transcripts as the equivalent curl line."""
from __future__ import annotations

from typing import Any

from .core.command import quote
from .core.connector import Connector
from .core.facts import ABSENT, Fact


def _get(via: Connector | None, url: str, timeout: float) -> Any:
    """Read where the dashboard's port is: this machine, or the controller
    host that runs the port-forward."""
    if via is None:
        from .hosts import local
        via = local()
    return via.get_json(url, timeout=timeout)


def version_fact(address: str, via: Connector | None = None) -> Fact:
    url = f"{address}/api/version"
    return Fact(name="ray dashboard", python=lambda: _get(via, url, 5), display=f"curl -fsS {url}",
                describe=lambda v: f"Ray {v.get('ray_version')} answering" if isinstance(v, dict) else str(v))


def nodes_url(address: str) -> str:
    return f"{address}/api/v0/nodes?limit=10000&detail=true"


def list_nodes(address: str, via: Connector | None = None) -> Any:
    d = _get(via, nodes_url(address), 10)
    if d is ABSENT:
        return ABSENT
    return ((d or {}).get("data") or {}).get("result", {}).get("result", [])


def nodes_fact(address: str, via: Connector | None = None) -> Fact:
    return Fact(name="ray nodes", python=lambda: list_nodes(address, via), assumed=[],
                display=f"curl -fsS {quote(nodes_url(address))}  # what `ray list nodes --address {address}` reads",
                describe=lambda ns: f"{len(alive(ns))} alive node(s)" if isinstance(ns, list) else "no cluster")


def alive(nodes: Any) -> list[dict]:
    return [n for n in nodes or [] if n.get("state") == "ALIVE"]


def tpu_hosts(nodes: Any) -> list[dict]:
    return [n for n in alive(nodes) if (n.get("resources_total") or {}).get("TPU")]


def labels(n: dict) -> dict:
    return n.get("labels") or {}


def jobs_fact(address: str, via: Connector | None = None) -> Fact:
    url = f"{address}/api/jobs/"
    return Fact(name="ray jobs", python=lambda: _get(via, url, 10), display=f"curl -fsS {url}",
                assumed=[], describe=lambda js: f"{len(js)} job(s)" if isinstance(js, list) else "no cluster")


def job_fact(address: str, submission_id: str, via: Connector | None = None) -> Fact:
    url = f"{address}/api/jobs/{submission_id}"
    return Fact(name=f"ray job {submission_id}", python=lambda: _get(via, url, 10),
                display=f"curl -fsS {url}", assumed=None,
                describe=lambda j: j.get("status", "?") if isinstance(j, dict) else "its final status")
