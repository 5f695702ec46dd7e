"""The RayCluster's pods as Kubernetes reports them, read in one place:
whose a pod is (head or worker, its worker group), the replica (TPU slice)
a worker belongs to, whether a pod or a node is Ready, a pod's restarts and
whether it is going away, a node's node pool, and the commands that list
the RayCluster's pods and read one node.
The times Kubernetes writes (RFC 3339) are read by ``gke.seconds``."""
from __future__ import annotations

from typing import Any

from playbooks.cloud.gke import kube, listed
from playbooks.config import tutorial as T
from playbooks.config.schema import Environment
from playbooks.core.command import Command

# Pod labels that say which replica (slice) of a worker group a pod is:
# KubeRay >= 1.5's index (with its RayMultiHostIndexing feature gate), GKE's
# TPU webhook's ``replicaIndex: <group>-<index>`` (what Ray's own KubeRay
# autoscaler reads), KubeRay's replica name. The first one set is taken.
KUBERAY_REPLICA_INDEX = "ray.io/worker-group-replica-index"
GKE_REPLICA_INDEX = "replicaIndex"
KUBERAY_REPLICA_NAME = "ray.io/worker-group-replica-name"
REPLICA_LABELS = (KUBERAY_REPLICA_INDEX, GKE_REPLICA_INDEX, KUBERAY_REPLICA_NAME)
# GKE's label of a node: the node pool it belongs to.
NODEPOOL_LABEL = "cloud.google.com/gke-nodepool"


def labels(obj: dict) -> dict:
    return (obj.get("metadata") or {}).get("labels") or {}


def name(obj: dict) -> str:
    return (obj.get("metadata") or {}).get("name") or "?"


def role(pod: dict) -> str | None:
    """``head`` or ``worker`` (KubeRay's ``ray.io/node-type``)."""
    return labels(pod).get("ray.io/node-type")


def is_worker(pod: dict) -> bool:
    return role(pod) == "worker"


def is_tpu_worker(pod: dict) -> bool:
    """A worker of the TPU worker group (the manifest's only worker group)."""
    return is_worker(pod) and labels(pod).get("ray.io/group", T.TPU_WORKER_GROUP) == T.TPU_WORKER_GROUP


def replica(pod: dict) -> str | None:
    """The replica (TPU slice) of a worker pod, as its labels give it."""
    lb = labels(pod)
    return next((str(lb[k]) for k in REPLICA_LABELS if lb.get(k) not in (None, "")), None)


def node_pool(node: dict) -> str | None:
    """The node pool of a node, as GKE labels it (None: not labelled)."""
    return str(labels(node).get(NODEPOOL_LABEL) or "") or None


def conditions(obj: dict) -> dict[str, dict]:
    """A pod's or a node's conditions, by type."""
    return {c.get("type"): c for c in (obj.get("status") or {}).get("conditions") or []}


def ready(obj: dict) -> bool:
    """A pod or a node whose Ready condition is True."""
    return (conditions(obj).get("Ready") or {}).get("status") == "True"


def restarts(pod: dict) -> int:
    return sum(int(cs.get("restartCount") or 0) for cs in (pod.get("status") or {}).get("containerStatuses") or [])


def failing(pod: dict) -> bool:
    """Going away or gone wrong: deleted (terminating), failed, disrupted."""
    st = pod.get("status") or {}
    disrupted = conditions(pod).get("DisruptionTarget")
    return bool((pod.get("metadata") or {}).get("deletionTimestamp") or st.get("phase") == "Failed"
                or (disrupted and disrupted.get("status") == "True"))


def of_raycluster(doc: Any) -> list[dict]:
    """The RayCluster's pods in a List of ``gke.objects_command`` (what
    ``list_args``' label selector selects)."""
    return [p for p in listed(doc, "Pod") if labels(p).get("ray.io/cluster") == T.RAYCLUSTER_NAME]


def gke_nodes(doc: Any) -> list[dict]:
    """The nodes GKE labels with their node pool, in a List of
    ``gke.objects_command`` (what ``-l cloud.google.com/gke-nodepool`` selects)."""
    return [n for n in listed(doc, "Node") if NODEPOOL_LABEL in labels(n)]


def list_args(env: Environment) -> tuple[str, ...]:
    """`kubectl get` arguments of the RayCluster's pods."""
    return ("pods", "--namespace", env.namespace, "-l", f"ray.io/cluster={T.RAYCLUSTER_NAME}")


def list_command(env: Environment) -> Command:
    """The RayCluster's pods, as JSON."""
    return kube(env, "get", *list_args(env), "--output=json")


def node_command(env: Environment, node: str) -> Command:
    """One node, as JSON (empty output: the API server's NotFound)."""
    return kube(env, "get", "node", node, "--ignore-not-found", "--output=json")
