"""Names and facts shared by the GKE plays: where things live, how each kind
of resource is listed (one list call answers for every resource of a kind)."""
from __future__ import annotations

import dataclasses
import datetime as dt
import re
from collections.abc import Callable
from typing import Any

from playbooks.access.cli_clients import by_name, fact, gcloud, gcs_describe, json_list, kube_list, kube_object, kubectl
from playbooks.config import tutorial as T
from playbooks.config.schema import Environment
from playbooks.config.tpu import dcn_networks, generation
from playbooks.core.command import Command
from playbooks.core.facts import ABSENT, Fact


def location(env: Environment) -> str:
    """Autopilot clusters are regional, the tutorial's Standard cluster zonal."""
    return env.region if env.cluster_mode.regional else env.zone


def kube_context(env: Environment) -> str:
    """The kubeconfig context ``get-credentials`` writes for this cluster."""
    return f"gke_{env.project_id}_{location(env)}_{env.cluster_name}"


def network_name(env: Environment, i: int) -> str:
    return f"{env.cluster_name}-{T.SUBNETS[i][0]}"


def subnet_name(env: Environment, i: int) -> str:
    """The inventory's subnet_<i+1>_name (the tutorial's tpu-subnet-1/2)."""
    return env[f"subnet_{i + 1}_name"]


def network_id(i: int) -> str:
    """Step ids of the two VPCs and their subnets (the names are the
    inventory's; the ids stay fixed)."""
    return f"network:net-{i + 1}"


def subnet_id(i: int) -> str:
    return f"network:subnet-{i + 1}"


def subnet_range(env: Environment, i: int) -> str:
    return env[f"subnet_{i + 1}_range"]


def nodepool_name(env: Environment, i: int) -> str:
    """<generation>-<chips>-<i>: v6e-16-0, v5p-16-1, tpu7x-8-0."""
    return f"{generation(env).shape(env.topology)}-{i}"


def workload_policy_name(env: Environment) -> str:
    """The HIGH_THROUGHPUT workload policy of a generation that needs one
    for multi-host pools (TPU7x): one per cluster and topology."""
    return f"{env.cluster_name}-wp-{env.topology}"


def needs_workload_policy(env: Environment) -> bool:
    """TPU7x multi-host pools take a workload policy in place of
    --tpu-topology (GKE's TPU7x page; xpk's nodepool.py)."""
    return env.cluster_mode.our_node_pools and generation(env).workload_policy and env.hosts_per_slice > 1


# Another operation on the cluster (GKE's own upgrades and repairs count) is
# waited out for this long, each refused attempt logged (clients.py:
# _OPERATION_RUNNING says which refusals mean "wait").
OPERATION_PATIENCE = 30 * 60


def container_change(env: Environment, *args: str, quiet: bool = False) -> Command:
    """A cluster or node pool change (`gcloud container clusters|node-pools
    create|delete|update ...`): patient for another operation of the
    cluster, bounded by OPERATION_PATIENCE."""
    return dataclasses.replace(gcloud("container", *args, project=env.project_id, quiet=quiet),
                               patience=OPERATION_PATIENCE)


def kube(env: Environment, *args: str) -> Command:
    return kubectl(*args, context=kube_context(env))


# -- facts: one list per kind ----------------------------------------------
def _names(items: Any) -> str:
    return ", ".join(str(i.get("name", "?")).rsplit("/", 1)[-1] for i in items) or "none"


def networks_fact(env: Environment, name: str) -> Fact:
    return fact(f"network {name}",
                gcloud("compute", "networks", "list", "--format=json", project=env.project_id),
                json_list(by_name(name)), describe=_describe_network)


def _describe_network(n: Any) -> str:
    return f"present (mtu {n.get('mtu', '?')}, {'auto' if n.get('autoCreateSubnetworks') else 'custom'} subnets)"


# gcloud's regional (and aggregated) compute lists report a region that
# failed (403, 429, 503) as a WARNING and exit 0 with what they got: "[]".
# With this hidden property false they exit 1, so a denied or throttled list
# is never read as "no subnets" and a transient one is retried.
STRICT_COMPUTE_LISTS = (("CLOUDSDK_COMPUTE_ALLOW_PARTIAL_ERROR", "false"),)


def services_command(env: Environment) -> Command:
    """The project's enabled APIs (prereqs' look, and where storage's
    binding finds the project's number: Service Usage names a project by
    its number, ``parent``: ``projects/123``,
    https://cloud.google.com/service-usage/docs/reference/rest/v1/services#Service)."""
    return gcloud("services", "list", "--enabled", "--format=json", project=env.project_id)


def machine_types_fact(env: Environment) -> Fact:
    """Every zone that offers the machine type (an aggregated list: all of
    them, so the others can be named)."""
    c = gcloud("compute", "machine-types", "list", f"--filter=name={env.machine_type}", "--format=json",
               project=env.project_id)
    c = dataclasses.replace(c, env=STRICT_COMPUTE_LISTS + c.env)

    def zones(items: list) -> list[str]:
        return sorted({str(i.get("zone", "")).rsplit("/", 1)[-1] for i in items if i.get("name") == env.machine_type})

    return fact(f"zones offering {env.machine_type}", c, json_list(zones), assumed=[env.zone],
                describe=lambda zs: ", ".join(zs) or "none")


def subnets_fact(env: Environment, name: str) -> Fact:
    c = gcloud("compute", "networks", "subnets", "list", f"--regions={env.region}", "--format=json",
               project=env.project_id)
    return fact(f"subnet {name}", dataclasses.replace(c, env=STRICT_COMPUTE_LISTS + c.env),
                json_list(by_name(name)),
                describe=lambda s: f"present ({s.get('ipCidrRange') or 'some range'} on "
                                   f"{str(s.get('network', '')).rsplit('/', 1)[-1]})")


def workload_policy_fact(env: Environment) -> Fact:
    name = workload_policy_name(env)
    c = gcloud("compute", "resource-policies", "list", f"--filter=region:{env.region}", "--format=json",
               project=env.project_id)
    return fact(f"workload policy {name}", dataclasses.replace(c, env=STRICT_COMPUTE_LISTS + c.env),
                json_list(by_name(name)),
                describe=lambda p: f"present ({(p.get('workloadPolicy') or {}).get('type', '?')}, "
                                   f"{(p.get('workloadPolicy') or {}).get('acceleratorTopology', '?')})")


def _clusters_list(env: Environment) -> Command:
    return gcloud("container", "clusters", "list", "--format=json", project=env.project_id)


def clusters_fact(env: Environment) -> Fact:
    return fact(f"cluster {env.cluster_name}", _clusters_list(env),
                json_list(by_name(env.cluster_name)),
                describe=lambda c: f"present ({c.get('status')}, {c.get('location')}"
                                   f"{', autopilot' if (c.get('autopilot') or {}).get('enabled') else ''})")


def running_cluster(env: Environment) -> dict:
    """The cluster as `clusters list` shows it once made: what a dry run
    assumes where a step needs it to exist (teardown, a job's hold)."""
    return {"name": env.cluster_name, "status": "RUNNING", "location": location(env)}


def _cluster_pools(env: Environment, then: Callable[[list], Any] | None = None) -> Callable[[list], Any]:
    """The node pools of the environment's cluster, from `clusters list`:
    GKE's Cluster resource holds its node pools (``nodePools``, each the
    NodePool `node-pools list` gives: https://cloud.google.com/kubernetes-engine/docs/reference/rest/v1/projects.locations.clusters#Cluster).
    No cluster of that name and location: no pools."""
    def select(items: list) -> Any:
        c = next((c for c in items if c.get("name") == env.cluster_name and c.get("location") == location(env)), None)
        pools = list((c or {}).get("nodePools") or [])
        return then(pools) if then else pools
    return select


def nodepools_list_fact(env: Environment) -> Fact:
    """Every node pool of the cluster: read from `clusters list` (the
    cluster's fact's call, one process for both where every command is its
    process), as each pool's fact."""
    return fact("node pools", _clusters_list(env), json_list(_cluster_pools(env)), assumed=[], describe=_names)


def nodepools_fact(env: Environment, name: str) -> Fact:
    return fact(f"node pool {name}", _clusters_list(env), json_list(_cluster_pools(env, by_name(name))),
                describe=lambda p: f"present ({p.get('status')}, "
                                   f"{(p.get('placementPolicy') or {}).get('tpuTopology', '?')}, "
                                   f"{p.get('initialNodeCount', '?')} nodes)")


def bucket_fact(env: Environment):
    """The bucket's name, location and storage class as the JSON API gives
    them (``--raw``: `storageClass`, not gcloud's `default_storage_class`),
    which the in-process read (``gcp_api``) answers as gcloud prints them,
    without a gcloud process."""
    return fact(f"bucket {env.gs_bucket}",
                gcloud("storage", "buckets", "describe", f"gs://{env.gs_bucket}", "--raw",
                       "--format=json(name,location,storageClass)"),
                gcs_describe(),
                describe=lambda b: "present" + (f" ({b.get('location')}, "
                                                f"{b.get('storageClass') or b.get('default_storage_class')})"
                                                if b.get("location") else ""))


def objects_command(env: Environment) -> Command:
    """The one `kubectl get` of every Kubernetes object the plays and
    `invoke status` look at: the service accounts, DRANET claim templates
    (where the workers claim NICs) and RayClusters of the environment's
    namespace, its pods and the cluster's nodes, as one List. One process
    and one auth-plugin call for all of them where every command is its
    process (a controller); each fact picks its objects from it (``listed``).
    Lists, not names: kubectl takes names (`KIND/NAME`) or kinds, never both
    in one call, and one label selector for every kind."""
    kinds = ",".join([*(f"{k}s" for k in _namespace_kinds(env)), "pods", "nodes"])
    return kube(env, "get", kinds, "--namespace", env.namespace, "--output=json")


def _namespace_kinds(env: Environment) -> tuple[str, ...]:
    """The kinds of our objects in the namespace that ``objects_command``
    lists (``kube_get`` picks one of these from it)."""
    return ("serviceaccount", *(("resourceclaimtemplate",) if netdev_claim(env) else ()), "raycluster")


def listed(doc: Any, kind: str) -> list[dict]:
    """The objects of ``kind`` (kubectl's ``kind``: Pod, Node) in a List."""
    return [i for i in (doc or {}).get("items") or [] if isinstance(i, dict) and i.get("kind") == kind]


def netdev_claim(env: Environment) -> bool:
    """Whether the TPU workers claim NICs from DRANET: on Autopilot (GKE's
    networks) and on a Standard machine type with the tutorial's two DCN
    networks (tpu.dcn_networks); else they reach the other slices over the
    VM's primary network."""
    return not env.cluster_mode.our_networks or dcn_networks(env)


_KINDS = {"serviceaccount": "ServiceAccount", "resourceclaimtemplate": "ResourceClaimTemplate",
          "raycluster": "RayCluster"}


def kube_get(env: Environment, kind: str, name: str, namespace: str | None = None) -> Fact:
    """One object: of a kind `objects_command` lists in the environment's
    namespace, picked from that read; else its own `kubectl get`."""
    if namespace == env.namespace and kind in _namespace_kinds(env):
        def select(doc: Any) -> Any:
            return next((it for it in listed(doc, _KINDS[kind]) if (it.get("metadata") or {}).get("name") == name),
                        ABSENT)

        return fact(f"{kind} {name}", objects_command(env), kube_list(select), describe=lambda o: "present")
    args = ["get", kind, name]
    if namespace:
        args += ["--namespace", namespace]
    args += ["--ignore-not-found", "--output=json"]
    return fact(f"{kind} {name}", kube(env, *args), kube_object(), describe=lambda o: "present")


def raycluster_fact(env: Environment) -> Fact:
    f = kube_get(env, "raycluster", T.RAYCLUSTER_NAME, env.namespace)
    return Fact(name=f.name, command=f.command, parse=f.parse, describe=_describe_raycluster)


def _describe_raycluster(rc: Any) -> str:
    st = rc.get("status") or {}
    if not st:
        return "present"
    state = f"state {st['state']}, " if st.get("state") else ""  # KubeRay sets it once every pod was ready
    return (f"present ({state}"
            f"{st.get('availableWorkerReplicas', 0)}/{st.get('desiredWorkerReplicas', '?')} workers available)")


# -- times as GKE and Kubernetes write them (RFC 3339) ----------------------------
_FRACTION = re.compile(r"(\.\d{6})\d+")


def when(text: Any) -> dt.datetime | None:
    """An RFC 3339 time as GKE and Kubernetes write it (Z or an offset, up to
    nanoseconds); None for anything else."""
    if not text or not isinstance(text, str):
        return None
    try:
        t = dt.datetime.fromisoformat(_FRACTION.sub(r"\1", text).replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


def seconds(text: Any) -> float | None:
    """The same time as seconds since the epoch."""
    t = when(text)
    return t.timestamp() if t is not None else None
