"""The cluster's RayCluster, pods and events through the `kubernetes` Python
client: a per-context client from the kubeconfig `get-credentials` writes
(GKE's exec credential plugin gives it, and refreshes, its token), a watch of
the RayCluster's readiness, and why its workers are not running, one line
per cause.

The client is imported only when it is used (it is a heavy import).
"""
from __future__ import annotations

import re
from collections import OrderedDict
from typing import Any

from . import tutorial as T
from .core.errors import ProbeFailed
from .core.inventory import Env
from .core.runner import ABSENT, Fact
from .gke import kube_context, workers

GROUP, VERSION, PLURAL = "ray.io", "v1", "rayclusters"


_clients: dict[tuple[str, str], Any] = {}


def client(env: Env):
    """An ApiClient for this environment's context (not the current one),
    made once: its exec plugin's token is refreshed when it expires."""
    import os
    from kubernetes import config
    key = (kube_context(env), os.environ.get("KUBECONFIG", ""))
    if key not in _clients:
        try:
            _clients[key] = config.new_client_from_config(context=kube_context(env))
        except Exception as e:  # a missing context, an unreadable kubeconfig
            raise ProbeFailed("kubernetes", f"kubeconfig context {kube_context(env)}", None, "", str(e),
                              why=f"could not look: {type(e).__name__}: {str(e).splitlines()[0][:200]}") from None
    return _clients[key]


def _api_error(what: str, e: Exception) -> ProbeFailed:
    status = getattr(e, "status", None)
    reason = getattr(e, "reason", None) or type(e).__name__
    return ProbeFailed(what, f"kubernetes client: {what}", status, "", str(e)[:2000],
                       why=f"could not look: {status or ''} {reason}".strip())


def ready(env: Env, rc: Any) -> str | None:
    """None when the head pod is ready and every worker is (KubeRay's
    conditions and counts, not the deprecated state alone)."""
    if rc is ABSENT or rc is None:
        return "RayCluster not found"
    st = rc.get("status") or {}
    want = workers(env)
    conds = {c.get("type"): c.get("status") for c in st.get("conditions") or []}
    have = st.get("readyWorkerReplicas", st.get("availableWorkerReplicas", 0)) or 0
    head = conds.get("HeadPodReady") == "True" if conds else st.get("state") == "ready"
    if head and have >= want and (not conds or conds.get("ReplicaFailure") != "True"):
        return None
    return f"head {'ready' if head else 'not ready'}, {have} of {want} TPU workers ready"


def watch_raycluster(env: Env, seconds: float) -> Any:
    """The RayCluster, as soon as it changes (or after ``seconds``): its
    watch, not a poll. ABSENT when it does not exist."""
    from kubernetes import client as k, watch
    api = k.CustomObjectsApi(client(env))
    try:
        found = api.list_namespaced_custom_object(GROUP, VERSION, env.namespace, PLURAL,
                                                  field_selector=f"metadata.name={T.RAYCLUSTER_NAME}")
        items = found.get("items") or []
        latest = items[0] if items else ABSENT
        if latest is not ABSENT and ready(env, latest) is None:
            return latest
        version = (found.get("metadata") or {}).get("resourceVersion")
        w = watch.Watch()
        for event in w.stream(api.list_namespaced_custom_object, GROUP, VERSION, env.namespace, PLURAL,
                              field_selector=f"metadata.name={T.RAYCLUSTER_NAME}", resource_version=version,
                              timeout_seconds=max(1, int(seconds))):
            latest = ABSENT if event["type"] == "DELETED" else event["object"]
            w.stop()  # it changed: the verify looks at it
        return latest
    except Exception as e:
        if isinstance(e, ProbeFailed):
            raise
        raise _api_error("watch raycluster", e) from None


def raycluster_watch_fact(env: Env, seconds: float = 15.0) -> Fact:
    return Fact(name=f"RayCluster {T.RAYCLUSTER_NAME}", python=lambda: watch_raycluster(env, seconds),
                display=(f"kubectl get raycluster {T.RAYCLUSTER_NAME} --namespace {env.namespace} --watch "
                         f"--context={kube_context(env)}  # the kubernetes client's watch"),
                describe=lambda rc: ready(env, rc) or "ready")


# -- why the workers are not running ----------------------------------------------------
def _tail(core, pod: str, namespace: str, container: str | None) -> str:
    try:
        text = core.read_namespaced_pod_log(pod, namespace, container=container, tail_lines=3, previous=True)
    except Exception:
        try:
            text = core.read_namespaced_pod_log(pod, namespace, container=container, tail_lines=3)
        except Exception:
            return ""
    return " | ".join(line.strip() for line in (text or "").splitlines()[-3:] if line.strip())


def causes(env: Env) -> list[str]:
    """One line per cause of the RayCluster's pods not running, from their
    phases, container states, scheduling conditions and events."""
    from kubernetes import client as k
    api = client(env)
    core = k.CoreV1Api(api)
    ns = env.namespace
    try:
        pods = core.list_namespaced_pod(ns, label_selector=f"ray.io/cluster={T.RAYCLUSTER_NAME}").items
        events = core.list_namespaced_event(ns).items
    except Exception as e:
        raise _api_error("pods and events", e) from None
    by_object: dict[str, list] = {}
    for ev in events:
        by_object.setdefault(ev.involved_object.name or "", []).append(ev)
    found: "OrderedDict[str, list[str]]" = OrderedDict()

    def add(cause: str, pod: str) -> None:
        found.setdefault(cause, []).append(pod)

    for ev in by_object.get(T.RAYCLUSTER_NAME, []):
        if ev.type == "Warning" and (ev.reason or "").startswith("FailedCreate"):
            add(f"KubeRay cannot create the pods: {_short(ev.message)}", T.RAYCLUSTER_NAME)
    for pod in pods:
        name = pod.metadata.name
        for cs in (pod.status.container_statuses or []) + (pod.status.init_container_statuses or []):
            waiting = cs.state.waiting if cs.state else None
            if waiting and waiting.reason in ("ImagePullBackOff", "ErrImagePull", "InvalidImageName"):
                add(f"cannot pull image {cs.image}: {waiting.reason}: {_short(waiting.message)}", name)
            elif waiting and waiting.reason == "CrashLoopBackOff":
                tail = _tail(core, name, ns, cs.name)
                add(f"container {cs.name} keeps crashing ({cs.restart_count} restarts)"
                    + (f"; its last lines: {_short(tail)}" if tail else ""), name)
            elif waiting and waiting.reason in ("CreateContainerConfigError", "CreateContainerError"):
                add(f"container {cs.name} cannot start: {waiting.reason}: {_short(waiting.message)}", name)
        pod_events = by_object.get(name, [])
        scheduled = {c.type: c for c in pod.status.conditions or []}.get("PodScheduled")
        if pod.status.phase == "Pending" and scheduled is not None and scheduled.status == "False":
            message = scheduled.message or next((e.message for e in pod_events if e.reason == "FailedScheduling"), "")
            add(scheduling(message), name)
        elif pod.status.phase == "Pending" and any(e.reason == "FailedScheduling" for e in pod_events):
            add(scheduling(next(e.message for e in pod_events if e.reason == "FailedScheduling")), name)
        for e in pod_events:
            if e.reason == "FailedMount":
                add(mount(env, e.message), name)
    return [f"{cause} ({_who(pods_of)})" for cause, pods_of in found.items()]


def _who(pods: list[str]) -> str:
    pods = list(dict.fromkeys(pods))
    return (f"{len(pods)} pods: {', '.join(pods[:3])}{', ...' if len(pods) > 3 else ''}" if len(pods) > 1
            else pods[0])


def _short(text: str | None, n: int = 240) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= n else text[:n - 3] + "..."


_TPU = re.compile(r"Insufficient google\.com/tpu")
_SELECTOR = re.compile(r"(didn't match Pod's node affinity/selector|node\(s\) didn't match|ComputeClass)", re.I)
_CLAIM = re.compile(r"(cannot allocate all claims|resourceclaim|claim .* not (yet )?allocated)", re.I)


def scheduling(message: str | None) -> str:
    """A scheduler's message, with what it means."""
    m = _short(message)
    if _TPU.search(m):
        return f"no node with free TPU chips: the scheduler says {m!r} (no TPU capacity yet: node pools, quota)"
    if _CLAIM.search(m):
        return f"the DRANET NIC claim is not allocated: the scheduler says {m!r}"
    if _SELECTOR.search(m):
        return f"no node matches the workers' node selector or compute class: the scheduler says {m!r}"
    return f"not scheduled: {m!r}"


def mount(env: Env, message: str | None) -> str:
    m = _short(message)
    if re.search(r"(PermissionDenied|permission|403|Forbidden|does not have storage)", m, re.I):
        return (f"the GCS FUSE mount of gs://{env.gs_bucket} is refused: the workload-identity binding of "
                f"{env.namespace}/{env.ksa_name} (`invoke storage`); the kubelet says {m!r}")
    return f"a volume mount failed: {m!r}"


def causes_fact(env: Env) -> Fact:
    return Fact(name="why the workers are not running", python=lambda: causes(env),
                display=(f"kubectl get pods,events --namespace {env.namespace} -l ray.io/cluster={T.RAYCLUSTER_NAME} "
                         f"--context={kube_context(env)}  # the kubernetes client: pods, their states, events"),
                assumed=[], describe=lambda cs: "; ".join(cs) or "no cause found")
