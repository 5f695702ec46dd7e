"""The kubeconfig where kubectl runs (this machine or the controller): its
contexts and clusters, read from its files, the command that writes this
cluster's (``gcloud container clusters get-credentials``), and whether the
context still points at the cluster GKE has now (its server and CA). Every
kubectl command names that context, so another current context never sends
it to another cluster."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from playbooks.access import connectors
from playbooks.access.cli_clients import gcloud
from playbooks.cloud.gke import kube_context, location
from playbooks.config.schema import Environment
from playbooks.core.command import Command
from playbooks.core.connector import Connector
from playbooks.core.errors import ProbeFailed
from playbooks.core.facts import Fact


def kubeconfig_files(via: Connector) -> list[str]:
    """The files kubectl reads where it runs: $KUBECONFIG's (colon-separated),
    else ~/.kube/config."""
    listed = [p for p in (via.getenv("KUBECONFIG") or "").split(":") if p]
    home = via.getenv("HOME") or "~"
    return [str(Path(home) / p[2:]) if p.startswith("~/") else p for p in listed] or [f"{home}/.kube/config"]


def read_kubeconfig(via: Connector) -> dict:
    """What `kubectl config view` shows of the contexts and clusters (each
    cluster's server and certificate-authority-data), read from its files
    (no kubectl: Cloud SDK's kubectl asks the cluster for its version, and so
    the auth plugin and gcloud for a token, even for `config view`). As
    kubectl merges them, the first file to name a context or a cluster wins."""
    merged: dict = {"contexts": [], "clusters": [], "current-context": None}
    for path in kubeconfig_files(via):
        try:
            raw = via.read(path)
            data = yaml.safe_load(raw) if raw is not None else None
        except (OSError, yaml.YAMLError) as e:
            raise ProbeFailed("kubeconfig", f"kubectl config view  # {path}", None, "", str(e),
                              why=f"could not read {path}: {type(e).__name__}") from None
        if not isinstance(data, dict):
            continue
        for part in ("contexts", "clusters"):
            seen = {c.get("name") for c in merged[part]}
            merged[part] += [c for c in data.get(part) or [] if isinstance(c, dict) and c.get("name") not in seen]
        merged["current-context"] = merged["current-context"] or data.get("current-context")
    return merged


def kubeconfig_fact(env: Environment):
    via = connectors.connector(env)
    return Fact(name="kubeconfig", python=lambda: read_kubeconfig(via),
                display="kubectl config view --output=json  (its files read: $KUBECONFIG, else ~/.kube/config)",
                describe=lambda k: f"current context {k.get('current-context') or 'none'}")


def has_context(cfg: Any, name: str) -> bool:
    return any(c.get("name") == name for c in (cfg or {}).get("contexts") or [])


# Which control-plane endpoint the kubeconfig points at (gcloud 528,
# command_lib/container/flags.py): public is the tutorial's; --dns-endpoint
# is the DNS-based endpoint Google recommends for private clusters ("you
# don't need a bastion host", cloud.google.com/kubernetes-engine/docs/
# concepts/network-isolation); --internal-ip is the private IP endpoint,
# reachable only from inside the VPC: the inventory refuses it without a
# controller host there.
ENDPOINT_FLAGS = {"public": (), "dns": ("--dns-endpoint",), "internal": ("--internal-ip",)}


def credentials_command(env: Environment) -> Command:
    return gcloud("container", "clusters", "get-credentials", env.cluster_name, f"--location={location(env)}",
                  *ENDPOINT_FLAGS[env.control_plane], project=env.project_id)


# Where the cluster's JSON (`clusters list`) has the endpoint get-credentials
# writes with each of ENDPOINT_FLAGS (gcloud 528, _GetClusterEndpoint in
# lib/googlecloudsdk/api_lib/container/util.py of the Cloud SDK).
DNS_ENDPOINT = ("controlPlaneEndpointsConfig", "dnsEndpointConfig", "endpoint")
ENDPOINT_FIELDS = {"public": ("endpoint",), "dns": DNS_ENDPOINT,
                   "internal": ("privateClusterConfig", "privateEndpoint")}


def _field(doc: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        doc = doc.get(key) if isinstance(doc, dict) else None
    return doc


def cluster_endpoint(env: Environment, cluster: Any) -> tuple[str | None, str | None]:
    """The server and the certificate-authority-data gcloud 528's
    get-credentials writes for the cluster as GKE shows it
    (``ClusterConfig.Persist`` and ``_GetClusterEndpoint`` in
    lib/googlecloudsdk/api_lib/container/util.py, ``Cluster`` in
    api_lib/container/kubeconfig.py of the Cloud SDK): ``https://`` and the
    field ``ENDPOINT_FIELDS`` names (the DNS endpoint, whatever the flag,
    when the cluster's IP endpoints are disabled), and
    ``masterAuth.clusterCaCertificate``; no CA data for a DNS endpoint,
    whose certificate is checked against the system's roots. None for what
    the cluster does not show (yet: a cluster still PROVISIONING has no
    endpoint)."""
    path = ENDPOINT_FIELDS[env.control_plane]
    if _field(cluster, ("controlPlaneEndpointsConfig", "ipEndpointsConfig", "enabled")) is False:
        path = DNS_ENDPOINT
    host = _field(cluster, path)
    ca = None if path == DNS_ENDPOINT else _field(cluster, ("masterAuth", "clusterCaCertificate")) or None
    return (f"https://{host}" if host else None), ca


def context_cluster(cfg: Any, name: str) -> dict:
    """The cluster entry (``server``, ``certificate-authority-data``) that
    the context ``name`` names; empty when there is none."""
    ctx = next((c for c in (cfg or {}).get("contexts") or [] if c.get("name") == name), None)
    ref = ((ctx or {}).get("context") or {}).get("cluster")
    entry = next((c for c in (cfg or {}).get("clusters") or [] if c.get("name") == ref), None) if ref else None
    found = (entry or {}).get("cluster")
    return found if isinstance(found, dict) else {}


def stale_context(env: Environment, cfg: Any, cluster: Any) -> str | None:
    """How this cluster's context differs from the cluster GKE has now (one
    deleted and made again under the same name, from the Console or another
    machine, has another endpoint and CA), in words; None when it matches,
    or when the cluster shows no endpoint to compare with."""
    name = kube_context(env)
    server, ca = cluster_endpoint(env, cluster)
    if server is None:
        return None
    have = context_cluster(cfg, name)
    if have.get("server") != server:
        return f"context {name} points at {have.get('server') or 'no server'}, the cluster is at {server}"
    if ca is not None and str(have.get("certificate-authority-data") or "").strip() != ca.strip():
        return f"context {name}'s CA differs from the cluster's (masterAuth.clusterCaCertificate)"
    return None
