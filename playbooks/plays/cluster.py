"""§3 The GKE cluster, Standard or Autopilot, and kubectl credentials."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from .. import hosts
from .. import tutorial as T
from ..clients import gcloud
from ..core.connector import Connector
from ..core.errors import ProbeFailed
from ..core.facts import ABSENT, Fact
from ..core.step import Step, Verify, change, drift, fail, ok, wait
from ..gke import clusters_fact, kube_context, location
from ..schema import Environment

PLAY = "cluster"
CREATE_TIMEOUT = 45 * 60


def create_command(env: Environment):
    if env.mode == "autopilot":
        # The tutorial also passes --machine-type=n1-standard-16 here, but
        # gcloud 528 rejects it for create-auto (exit 2, "unrecognized
        # arguments"): Autopilot picks its own machines, so it is left out.
        return gcloud("container", "clusters", "create-auto", env.cluster_name, "--enable-ray-operator",
                      f"--location={env.region}", f"--cluster-version={env.cluster_version}",
                      project=env.project_id)
    return gcloud("container", "clusters", "create", env.cluster_name, f"--addons={T.STANDARD_ADDONS}",
                  f"--machine-type={T.CLUSTER_MACHINE_TYPE}", "--enable-dataplane-v2",
                  f"--workload-pool={env.project_id}.svc.id.goog", f"--location={env.zone}",
                  f"--cluster-version={env.cluster_version}", project=env.project_id)


def shape_diffs(env: Environment, c: Any) -> list[str]:
    diffs = []
    where = c.get("location") or c.get("zone")
    if where != location(env):
        diffs.append(f"it is in {where}, want {location(env)}")
    auto = bool((c.get("autopilot") or {}).get("enabled"))
    if auto != (env.mode == "autopilot"):
        diffs.append(f"it is {'Autopilot' if auto else 'Standard'}, want {env.mode.capitalize()}")
    addons = c.get("addonsConfig") or {}
    if not (addons.get("rayOperatorConfig") or {}).get("enabled"):
        diffs.append("the Ray operator add-on is not enabled")
    if env.mode == "standard":
        pool = (c.get("workloadIdentityConfig") or {}).get("workloadPool")
        if pool != f"{env.project_id}.svc.id.goog":
            diffs.append(f"workload pool is {pool!r}, want '{env.project_id}.svc.id.goog'")
    return diffs


def cluster_step(env: Environment) -> Step:
    probe = clusters_fact(env)

    def decide(look):
        c = look(probe)
        if c is ABSENT:
            return change(create_command(env), reason=f"created ({env.mode})")
        diffs = shape_diffs(env, c)
        if diffs:
            return drift(f"cluster {env.cluster_name}: " + "; ".join(diffs))
        status = c.get("status")
        if status in ("RUNNING", "RECONCILING"):
            version = c.get("currentMasterVersion")
            return ok(f"cluster {env.cluster_name} is {status}" + (f" (GKE {version})" if version else ""))
        if status == "PROVISIONING":
            return wait(f"cluster {env.cluster_name} is being created by another operation")
        if status == "STOPPING":
            return fail(f"cluster {env.cluster_name} is being deleted; wait for it to go, then re-run")
        return fail(f"cluster {env.cluster_name} is {status}: {c.get('statusMessage', 'no message')}; "
                    f"delete it (`invoke teardown`) and re-run")

    def running(c):
        if c is ABSENT:
            return "cluster not found"
        return None if c.get("status") in ("RUNNING", "RECONCILING") else f"status {c.get('status')}"

    return Step(PLAY, f"GKE cluster {env.cluster_name}", decide, id="cluster:cluster", after=("prereqs:apis",),
                verify=Verify(probe, running, timeout=CREATE_TIMEOUT, interval=15))


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
        merged["contexts"] += [c for c in data.get("contexts") or [] if isinstance(c, dict) and c.get("name") not in seen]
        merged["current-context"] = merged["current-context"] or data.get("current-context")
    return merged


def kubeconfig_fact(env: Environment):
    via = hosts.connector(env)
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


def credentials_step(env: Environment, play: str = PLAY) -> Step:
    """get-credentials writes (and selects) the cluster's kubeconfig context.
    Every kubectl command names that context, so another current context can
    never send them to the wrong cluster."""
    probe = kubeconfig_fact(env)
    name = kube_context(env)

    def decide(look):
        cfg = look(probe)
        if cfg is not ABSENT and has_context(cfg, name):
            return ok(f"context {name} exists")
        return change(gcloud("container", "clusters", "get-credentials", env.cluster_name,
                             f"--location={location(env)}", *ENDPOINT_FLAGS[env.control_plane],
                             project=env.project_id),
                      reason=f"wrote context {name}")

    return Step(play, "kubectl credentials", decide, id="kube:credentials", after=("cluster:cluster",),
                verify=Verify(probe, lambda cfg: None if has_context(cfg, name) else f"no context {name}"))


def steps(env: Environment) -> list[Step]:
    return [cluster_step(env), credentials_step(env)]
