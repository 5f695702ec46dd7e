"""The cluster's RayCluster, pods and events as kubectl reads them where
the commands run: why its workers are not running, one line per cause
(what a pod is: ``pods.py``; whether the slices are whole: ``slices.py``;
what the pod watch of a followed job makes of them:
``playbooks/runs/pod_watch.py``)."""
from __future__ import annotations

import re
from collections import OrderedDict
from typing import Any

from playbooks.access import connectors
from playbooks.access.cli_clients import json_object, kube_object
from playbooks.cloud import pods as P
from playbooks.cloud.gke import kube, kube_context
from playbooks.config import tutorial as T
from playbooks.config.schema import Environment
from playbooks.core.facts import Completed, Fact


# -- reads: kubectl where the commands run ----------------------------------------------
# The kubeconfig, its credentials (the auth plugin and gcloud's identity) and,
# for a private cluster, the only route to the endpoint are where the commands
# run (this machine or the controller): the reads are `kubectl get -o json`
# there. On this machine the connector may answer them through the
# `kubernetes` client instead (no process; the same JSON: k8s_client.py).
def kubectl_json(env: Environment, *args: str, timeout: float = 60) -> Any:
    command = kube(env, "get", *args, "--output=json")
    r = connectors.connector(env).run(command.argv, timeout=timeout)
    return json_object("kubectl")(Completed(command.line(), r.rc, r.stdout, r.stderr, r.seconds))


def node(env: Environment, name: str, timeout: float = 30) -> Any:
    """One node (the API's JSON), ABSENT where the API server says there is
    none; ProbeFailed where it could not look."""
    command = P.node_command(env, name)
    r = connectors.connector(env).run(command.argv, timeout=timeout)
    return kube_object("kubectl")(Completed(command.line(), r.rc, r.stdout, r.stderr, r.seconds))


# -- why the workers are not running ----------------------------------------------------
def _tail(env: Environment, pod: str, container: str | None) -> str:
    """A container's last log lines (of its previous run when it restarted)."""
    via = connectors.connector(env)
    for previous in (("--previous",), ()):
        argv = kube(env, "logs", pod, "--namespace", env.namespace, *(("-c", container) if container else ()),
                    "--tail=3", *previous).argv
        r = via.run(argv, timeout=30)
        if r.rc == 0:
            return r.stdout
    return ""


def pods_and_events(env: Environment) -> tuple[list[dict], list[dict]]:
    """The RayCluster's pods and the namespace's events (the API's JSON)."""
    pods = kubectl_json(env, *P.list_args(env))
    events = kubectl_json(env, "events", "--namespace", env.namespace)
    return pods.get("items") or [], events.get("items") or []


def causes(env: Environment) -> list[str]:
    """One line per cause of the RayCluster's pods not running, from their
    phases, container states, scheduling conditions and events."""
    pods, events = pods_and_events(env)
    by_object: dict[str, list[dict]] = {}
    for ev in events:
        by_object.setdefault((ev.get("involvedObject") or {}).get("name") or "", []).append(ev)
    found: OrderedDict[str, list[str]] = OrderedDict()

    def add(cause: str, pod: str) -> None:
        found.setdefault(cause, []).append(pod)

    for ev in by_object.get(T.RAYCLUSTER_NAME, []):
        if ev.get("type") == "Warning" and (ev.get("reason") or "").startswith("FailedCreate"):
            add(f"KubeRay cannot create the pods: {short(ev.get('message'))}", T.RAYCLUSTER_NAME)
    for pod in pods:
        name = P.name(pod)
        status = pod.get("status") or {}
        for cs in (status.get("containerStatuses") or []) + (status.get("initContainerStatuses") or []):
            waiting = (cs.get("state") or {}).get("waiting") or {}
            reason = waiting.get("reason")
            if reason in ("ImagePullBackOff", "ErrImagePull", "InvalidImageName"):
                add(f"cannot pull image {cs.get('image')}: {reason}: {short(waiting.get('message'))}", name)
            elif reason == "CrashLoopBackOff":
                text = _tail(env, name, cs.get("name"))
                tail = " | ".join(ln.strip() for ln in (text or "").splitlines()[-3:] if ln.strip())
                add(f"container {cs.get('name')} keeps crashing ({cs.get('restartCount', 0)} restarts)"
                    + (f"; its last lines: {short(tail)}" if tail else ""), name)
            elif reason in ("CreateContainerConfigError", "CreateContainerError"):
                add(f"container {cs.get('name')} cannot start: {reason}: {short(waiting.get('message'))}", name)
        pod_events = by_object.get(name, [])
        scheduled = P.conditions(pod).get("PodScheduled")
        failed_scheduling = [e.get("message") for e in pod_events if e.get("reason") == "FailedScheduling"]
        if status.get("phase") == "Pending" and scheduled is not None and scheduled.get("status") == "False":
            add(scheduling(scheduled.get("message") or next(iter(failed_scheduling), "")), name)
        elif status.get("phase") == "Pending" and failed_scheduling:
            add(scheduling(failed_scheduling[0]), name)
        for e in pod_events:
            if e.get("reason") == "FailedMount":
                add(mount(env, e.get("message"), (pod.get("spec") or {}).get("serviceAccountName")), name)
    return [f"{cause} ({_who(pods_of)})" for cause, pods_of in found.items()]


def _who(pods: list[str]) -> str:
    pods = list(dict.fromkeys(pods))
    return (f"{len(pods)} pods: {', '.join(pods[:3])}{', ...' if len(pods) > 3 else ''}" if len(pods) > 1
            else pods[0])


def short(text: str | None, n: int = 240) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= n else text[:n - 3] + "..."


_TPU = re.compile(r"Insufficient google\.com/tpu")
_SELECTOR = re.compile(r"(didn't match Pod's node affinity/selector|node\(s\) didn't match|ComputeClass)", re.I)
_CLAIM = re.compile(r"(cannot allocate all claims|resourceclaim|claim .* not (yet )?allocated)", re.I)


def scheduling(message: str | None) -> str:
    """A scheduler's message, with what it means."""
    m = short(message)
    if _TPU.search(m):
        return f"no node with free TPU chips: the scheduler says {m!r} (no TPU capacity yet: node pools, quota)"
    if _CLAIM.search(m):
        return f"the DRANET NIC claim is not allocated: the scheduler says {m!r}"
    if _SELECTOR.search(m):
        return f"no node matches the workers' node selector or compute class: the scheduler says {m!r}"
    return f"not scheduled: {m!r}"


def mount(env: Environment, message: str | None, account: str | None = None) -> str:
    """A failed mount, with the binding to look at: that of the pod's
    service account (the head's may be its own: manifests.head_ksa_name)."""
    m = short(message)
    if re.search(r"(PermissionDenied|permission|403|Forbidden|does not have storage)", m, re.I):
        return (f"the GCS FUSE mount of gs://{env.gs_bucket} is refused: the workload-identity binding of "
                f"{env.namespace}/{account or env.ksa_name} (`invoke storage`); the kubelet says {m!r}")
    return f"a volume mount failed: {m!r}"


def causes_fact(env: Environment) -> Fact:
    return Fact(name="why the workers are not running", python=lambda: causes(env),
                display=(f"kubectl get pods,events --namespace {env.namespace} -l ray.io/cluster={T.RAYCLUSTER_NAME} "
                         f"--context={kube_context(env)}  # and kubectl get events, kubectl logs --tail=3"),
                assumed=[], describe=lambda cs: "; ".join(cs) or "no cause found")
