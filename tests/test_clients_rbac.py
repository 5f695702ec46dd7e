"""Least privilege against the fake API server, with the real kubectl: after
`invoke raycluster` (stall_watch: cluster) has applied the watch's account
and rights, each pod of the RayCluster runs as the account its template
names, and kubectl holding that account's token (as the pod does) may do
what the stored RBAC grants it and nothing else (tests/fakes/kube.py's
authorizer). The TPU workers' account is refused a cordon, a taint, a
label, a patch of a node and a pod's delete; the head's (the watch's) may
cordon and delete the namespace's pods, and no more.

`invoke raycluster` against the loopback fakes (tests/fakes/; what runs as
a process and what in-process: tests/clients.py); each account's rights
tried with the real kubectl process, holding that account's token. The
rendered manifests, subject by subject: tests/test_rbac_subjects.py."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.clients import Cloud, ok_run

pytestmark = pytest.mark.clients


def as_account(cloud: Cloud, tmp_path: Path, account: str) -> dict[str, str]:
    """A client environment whose kubeconfig holds only the token of
    service account default/``account``, as a pod of it holds one."""
    path = tmp_path / f"kubeconfig-{account}"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "pod",
        "clusters": [{"name": "fake", "cluster": {"server": cloud.kube.url,
                                                  "certificate-authority": str(cloud.kube.pki.ca_file)}}],
        "users": [{"name": "pod", "user": {"token": cloud.kube.sa_token("default", account)}}],
        "contexts": [{"name": "pod", "context": {"cluster": "fake", "user": "pod", "namespace": "default"}}]}))
    return cloud.env(KUBECONFIG=str(path))


def kubectl(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["kubectl", *args], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=120)


def test_the_workers_account_may_not_touch_a_node_or_a_pod_the_watchs_may(cloud: Cloud, tmp_path):
    cloud.change_inventory(stall_watch="cluster")
    cloud.seed_full()
    cloud.get_credentials()
    ok_run(cloud.invoke("raycluster"))
    pods = cloud.kube.list("pods", "default", "ray.io/cluster=maxtext-tpu-cluster")
    runs_as = {(p["metadata"]["labels"]["ray.io/node-type"], p["spec"]["serviceAccountName"]) for p in pods}
    assert runs_as == {("head", "maxtext-watch-default"), ("worker", "maxtext-ksa")}, runs_as
    worker = next(p for p in pods if p["metadata"]["labels"]["ray.io/node-type"] == "worker")
    node, pod = worker["spec"]["nodeName"], worker["metadata"]["name"]

    as_worker = as_account(cloud, tmp_path, "maxtext-ksa")
    who = 'User "system:serviceaccount:default:maxtext-ksa"'
    for args, verb, resource in (
            (["cordon", node], "get", "nodes"),
            (["taint", "nodes", node, "tpu-playbooks/quarantined=x:NoSchedule"], "get", "nodes"),
            (["label", "nodes", node, "perform-maintenance=true"], "get", "nodes"),
            (["delete", "pod", pod, "--wait=false"], "delete", "pods")):
        r = kubectl(as_worker, *args)
        where = 'in the namespace "default"' if resource == "pods" else "at the cluster scope"
        assert r.returncode == 1 and (f'{resource} "{args[2] if args[0] != "cordon" else node}" is forbidden: {who} '
                                      f'cannot {verb} resource "{resource}" in API group "" {where}') in r.stderr, \
            (args, r.stderr)
    # kubectl reads a node before it patches it; the PATCH alone, as the
    # kubernetes client (the watch's, in a head pod) sends it, is refused too.
    from kubernetes import client
    from kubernetes.client.rest import ApiException
    from kubernetes.config.kube_config import load_kube_config
    configuration = client.Configuration()
    load_kube_config(config_file=as_worker["KUBECONFIG"], client_configuration=configuration)
    api = client.ApiClient(configuration=configuration)
    with pytest.raises(ApiException) as refused:
        client.CoreV1Api(api).patch_node(node, {"spec": {"unschedulable": True}})
    said = json.loads(refused.value.body)["message"]
    assert refused.value.status == 403 and said == (f'nodes "{node}" is forbidden: {who} cannot patch resource "nodes" '
                                                    'in API group "" at the cluster scope'), said
    n = cloud.kube.get("nodes", node)
    assert not n["spec"].get("unschedulable") and not n["spec"].get("taints") and \
        "perform-maintenance" not in n["metadata"].get("labels", {})
    assert cloud.kube.get("pods", pod, "default") is not None

    as_head = as_account(cloud, tmp_path, "maxtext-watch-default")
    assert kubectl(as_head, "cordon", node).returncode == 0
    assert cloud.kube.get("nodes", node)["spec"].get("unschedulable") is True
    assert kubectl(as_head, "uncordon", node).returncode == 0
    r = kubectl(as_head, "delete", "pod", pod, "--wait=false")
    assert r.returncode == 0 and cloud.kube.get("pods", pod, "default") is None, r.stderr
    # Nothing beyond what the watch does: no other namespace's pods, no
    # RayCluster deleted, no service account read.
    for args, said in (
            (["get", "pods", "--namespace", "kube-system"],
             'cannot list resource "pods" in API group "" in the namespace "kube-system"'),
            (["delete", "raycluster", "maxtext-tpu-cluster", "--wait=false"],
             'cannot delete resource "rayclusters" in API group "ray.io" in the namespace "default"'),
            (["get", "serviceaccounts"], 'cannot list resource "serviceaccounts" in API group ""')):
        r = kubectl(as_head, *args)
        assert r.returncode == 1 and said in r.stderr, (args, r.stderr)
    assert cloud.kube.get("rayclusters", "maxtext-tpu-cluster", "default") is not None
