"""Least privilege, subject by subject: for every GKE environment of the
shipped inventory and of the goldens' inventories (as it is, and with
``stall_watch: cluster``), the rendered RayCluster says which Kubernetes
service account each of its pods runs as (the head's, the TPU workers'),
and the RBAC objects ``invoke raycluster`` applies for that environment say
what each account may do. A small RBAC evaluator, written here from
Kubernetes' rules (https://kubernetes.io/docs/reference/access-authn-authz/rbac/:
a RoleBinding grants its role's rules in its own namespace only, a
ClusterRoleBinding everywhere; a rule grants a verb on a resource when its
apiGroups, resources and verbs each hold it or "*"), reads them. The head
(the watch, with ``stall_watch: cluster``) may patch nodes and delete the
namespace's pods; the workers (MaxText, its data code) may do neither, nor
anything else."""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import pytest

from playbooks.cloud import manifests
from playbooks.config.schema import load_inventory
from playbooks.core.inventory import resolve
from tests.conftest import ROOT

INVENTORIES = (ROOT / "inventory.yaml", ROOT / "tests/goldens/capacity-inventory.yaml",
               ROOT / "tests/goldens/generations-inventory.yaml", ROOT / "tests/goldens/quarantine-inventory.yaml")


def gke_environments() -> Iterator[tuple[str, Any]]:
    """(id, environment): each GKE environment as its inventory has it, and
    again with the watch in the cluster where it is not so already."""
    for path in INVENTORIES:
        inv = load_inventory(path)
        for name in inv.names:
            e = inv.env(name)
            if not e.platform.cloud:
                continue
            yield f"{path.stem}:{name}", e
            if e.stall_watch != "cluster":
                yield f"{path.stem}:{name}+cluster", resolve(inv.path, name, {**inv.raw[name],
                                                                              "stall_watch": "cluster"}, inv.schema)


ENVS = dict(gke_environments())
WATCHED = [k for k, e in ENVS.items() if e.stall_watch == "cluster"]


# -- the evaluator -------------------------------------------------------------------------
def names_subject(s: dict, namespace: str, account: str) -> bool:
    """Whether a binding's subject is this service account: by name, or as a
    member of the groups every service account (of its namespace) is in."""
    kind, name = s.get("kind"), s.get("name")
    if kind == "ServiceAccount":
        return name == account and s.get("namespace") == namespace
    if kind == "User":
        return name == f"system:serviceaccount:{namespace}:{account}"
    return kind == "Group" and name in ("system:serviceaccounts", f"system:serviceaccounts:{namespace}",
                                        "system:authenticated")


def grants(docs: Iterable[dict], namespace: str, account: str) -> list[tuple[dict, str | None]]:
    """(rule, where) of every rule bound to this service account: where is
    the RoleBinding's namespace, or None for a ClusterRoleBinding's (everywhere)."""
    docs = list(docs)
    roles = {(d["kind"], (d["metadata"].get("namespace") if d["kind"] == "Role" else None), d["metadata"]["name"]): d
             for d in docs if d.get("kind") in ("Role", "ClusterRole")}
    out = []
    for b in docs:
        if b.get("kind") not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(names_subject(s, namespace, account) for s in b.get("subjects") or []):
            continue
        where = b["metadata"].get("namespace") if b["kind"] == "RoleBinding" else None
        ref = b["roleRef"]
        role = roles.get((ref["kind"], where if ref["kind"] == "Role" else None, ref["name"]))
        assert role is not None, f"{b['kind']} {b['metadata']['name']} binds {ref} that is not rendered"
        assert "aggregationRule" not in role, role              # rules gathered from elsewhere: not evaluated here
        out += [(rule, where) for rule in role.get("rules") or []]
    return out


def holds(values: Iterable[str], value: str) -> bool:
    return "*" in values or value in values


def may(given: list[tuple[dict, str | None]], verb: str, resource: str, namespace: str | None = None,
        group: str = "") -> bool:
    """Whether these grants allow ``verb`` on ``resource`` (of API group
    ``group``) in ``namespace`` (None: a cluster-scoped resource, which no
    RoleBinding grants)."""
    for rule, where in given:
        if where is not None and where != namespace:
            continue
        if holds(rule.get("apiGroups") or [], group) and holds(rule.get("resources") or [], resource) \
                and holds(rule.get("verbs") or [], verb):
            return True
    return False


# -- what the environment applies -------------------------------------------------------
def accounts(e) -> dict[str, str]:
    """Each pod group of the rendered RayCluster -> the service account its
    pods run as (a pod spec without one runs as ``default``)."""
    rc = next(d for d in manifests.raycluster_docs(e) if d.get("kind") == "RayCluster")
    out = {"head": manifests.head_pod_spec(rc).get("serviceAccountName") or "default"}
    for g in rc["spec"]["workerGroupSpecs"]:
        out[f"workers {g['groupName']}"] = manifests.group_pod_spec(g).get("serviceAccountName") or "default"
    return out


def applied_rbac(e) -> list[dict]:
    """The RBAC objects `invoke raycluster` applies for this environment."""
    return manifests.watch_rbac_docs(e) if manifests.watch_rbac_wanted(e) else []


# -- the tests -----------------------------------------------------------------------------
def test_every_kind_of_environment_is_evaluated():
    assert WATCHED and len(ENVS) > len(WATCHED)
    assert any(e.cluster_mode.compute_class for k, e in ENVS.items() if k in WATCHED)    # Autopilot
    assert {manifests.raycluster_manifest(ENVS[k]) for k in WATCHED} == {
        "manifests/ray-cluster.tpu-multi-slice.yaml", manifests.NO_DRANET_MANIFEST}


@pytest.mark.parametrize("name", WATCHED)
def test_the_watch_on_the_head_may_patch_nodes_and_delete_pods_the_workers_nothing(name: str):
    e = ENVS[name]
    rbac, ns = applied_rbac(e), e.namespace
    pods = accounts(e)
    head = grants(rbac, ns, pods["head"])
    assert may(head, "patch", "nodes") and may(head, "get", "nodes"), (pods, head)
    assert may(head, "delete", "pods", ns) and not may(head, "delete", "pods", "kube-system"), (pods, head)
    for group, account in pods.items():
        if group == "head":
            continue
        assert account != pods["head"], f"{name}: the head and the {group} share service account {account}"
        given = grants(rbac, ns, account)
        assert not may(given, "patch", "nodes"), f"{name}: {group} ({account}) may patch nodes"
        assert not may(given, "delete", "pods", ns), f"{name}: {group} ({account}) may delete pods"
        assert given == [], f"{name}: {group} ({account}) is granted {given}"
    # Every subject the bindings name is the head's account.
    subjects = {(s["kind"], s.get("namespace"), s["name"]) for d in rbac for s in d.get("subjects") or []}
    assert subjects == {("ServiceAccount", ns, pods["head"])}


@pytest.mark.parametrize("name", [k for k in ENVS if k not in WATCHED])
def test_without_the_watch_in_the_cluster_no_pod_may_patch_nodes_or_delete_pods(name: str):
    e = ENVS[name]
    rbac = applied_rbac(e)
    assert rbac == []
    for account in accounts(e).values():
        given = grants(rbac, e.namespace, account)
        assert not may(given, "patch", "nodes") and not may(given, "delete", "pods", e.namespace)


def test_the_evaluator_reads_wildcards_groups_and_each_bindings_scope():
    """The evaluator itself: it would see a right granted by "*", by a group
    every service account is in, or by a ClusterRole bound in one namespace."""
    role = {"kind": "ClusterRole", "metadata": {"name": "r"},
            "rules": [{"apiGroups": ["*"], "resources": ["nodes", "pods"], "verbs": ["*"]}]}
    crb = {"kind": "ClusterRoleBinding", "metadata": {"name": "b"},
           "roleRef": {"kind": "ClusterRole", "name": "r"}, "subjects": [{"kind": "Group", "name": "system:serviceaccounts"}]}
    given = grants([role, crb], "default", "w")
    assert may(given, "patch", "nodes") and may(given, "delete", "pods", "other")
    rb = {"kind": "RoleBinding", "metadata": {"name": "b", "namespace": "default"},
          "roleRef": {"kind": "ClusterRole", "name": "r"},
          "subjects": [{"kind": "User", "name": "system:serviceaccount:default:w"}]}
    given = grants([role, rb], "default", "w")
    assert may(given, "delete", "pods", "default") and not may(given, "delete", "pods", "other")
    assert not may(given, "patch", "nodes")                         # a RoleBinding never reaches a node
    assert grants([role, rb], "default", "x") == [] and grants([role, rb], "other", "w") == []
