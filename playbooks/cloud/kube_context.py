"""The kubeconfig where kubectl runs (this machine or the controller): its
contexts, read from its files, and the command that writes this cluster's
(``gcloud container clusters get-credentials``). Every kubectl command names
that context, so another current context never sends it to another cluster."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from playbooks.access import connectors
from playbooks.access.cli_clients import gcloud
from playbooks.cloud.gke import location
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
    """What `kubectl config view` shows of the contexts, read from its files
    (no kubectl: Cloud SDK's kubectl asks the cluster for its version, and so
    the auth plugin and gcloud for a token, even for `config view`)."""
    merged: dict = {"contexts": [], "current-context": None}
    for path in kubeconfig_files(via):
        try:
            raw = via.read(path)
            data = yaml.safe_load(raw) if raw is not None else None
        except (OSError, yaml.YAMLError) as e:
            raise ProbeFailed("kubeconfig", f"kubectl config view  # {path}", None, "", str(e),
                              why=f"could not read {path}: {type(e).__name__}") from None
        if not isinstance(data, dict):
            continue
        seen = {c.get("name") for c in merged["contexts"]}
        merged["contexts"] += [c for c in data.get("contexts") or []
                               if isinstance(c, dict) and c.get("name") not in seen]
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
