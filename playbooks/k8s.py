"""The cluster's RayCluster, pods and events through the `kubernetes` Python
client: a per-context client from the kubeconfig `get-credentials` writes
(GKE's exec credential plugin gives it, and refreshes, its token), a watch of
the RayCluster's readiness, and why its workers are not running, one line
per cause.

The client is imported only when it is used (it is a heavy import).
"""
from __future__ import annotations

import json
import re
from collections import OrderedDict
from typing import Any

from . import hosts
from . import tutorial as T
from .core.errors import ProbeFailed
from .core.facts import ABSENT, Fact
from .gke import kube, kube_context, workers
from .schema import Environment

GROUP, VERSION, PLURAL = "ray.io", "v1", "rayclusters"


_clients: dict[tuple[str, str], Any] = {}


def client(env: Environment):
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


def ready(env: Environment, rc: Any) -> str | None:
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


def watch_raycluster(env: Environment, seconds: float) -> Any:
    """The RayCluster, as soon as it changes (or after ``seconds``): its
    watch, not a poll. ABSENT when it does not exist."""
    if hosts.controller(env):
        return _poll_raycluster(env, seconds)
    from kubernetes import client as k
    from kubernetes import watch
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


# -- on a controller host: the same reads with kubectl there ------------------------------
# The kubeconfig, its credentials (the auth plugin and the controller's gcloud
# identity) and, for a private cluster, the only route to the endpoint are on
# the controller: a tunnel to the endpoint would still need them here. So the
# reads run there, with kubectl, and return the API's JSON, which is what the
# client's objects serialize to.
def kubectl_json(env: Environment, *args: str, timeout: float = 60) -> Any:
    argv = kube(env, "get", *args, "--output=json").argv
    r = hosts.connector(env).run(argv, timeout=timeout)
    if r.rc != 0:
        from .core.errors import error_line
        raise ProbeFailed("kubectl", " ".join(argv), r.rc, r.stdout, r.stderr,
                          why=f"could not look: {error_line(r.stderr, r.stdout)}")
    try:
        return json.loads(r.stdout)
    except json.JSONDecodeError:
        raise ProbeFailed("kubectl", " ".join(argv), r.rc, r.stdout, r.stderr,
                          why="could not look: kubectl's answer is not JSON") from None


def _raycluster_now(env: Environment) -> Any:
    found = kubectl_json(env, "rayclusters.ray.io", "--namespace", env.namespace,
                         f"--field-selector=metadata.name={T.RAYCLUSTER_NAME}")
    items = found.get("items") or []
    return items[0] if items else ABSENT


def _poll_raycluster(env: Environment, seconds: float, every: float = 2.0) -> Any:
    """A watch's answer by polling kubectl on the controller: at once when
    ready, else when it changes or after ``seconds``."""
    import time
    latest = _raycluster_now(env)
    if latest is not ABSENT and ready(env, latest) is None:
        return latest
    seen = (latest or {}).get("metadata", {}).get("resourceVersion") if latest is not ABSENT else None
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(min(every, max(0.0, deadline - time.monotonic())))
        latest = _raycluster_now(env)
        now = (latest or {}).get("metadata", {}).get("resourceVersion") if latest is not ABSENT else None
        if now != seen:
            break
    return latest


def raycluster_watch_fact(env: Environment, seconds: float = 15.0) -> Fact:
    return Fact(name=f"RayCluster {T.RAYCLUSTER_NAME}", python=lambda: watch_raycluster(env, seconds),
                display=(f"kubectl get raycluster {T.RAYCLUSTER_NAME} --namespace {env.namespace} --watch "
                         f"--context={kube_context(env)}  # the kubernetes client's watch"),
                describe=lambda rc: ready(env, rc) or "ready")


# -- why the workers are not running ----------------------------------------------------
def _tail_with_client(core, pod: str, namespace: str, container: str | None) -> str:
    try:
        return core.read_namespaced_pod_log(pod, namespace, container=container, tail_lines=3, previous=True)
    except Exception:
        try:
            return core.read_namespaced_pod_log(pod, namespace, container=container, tail_lines=3)
        except Exception:
            return ""


def _tail_with_kubectl(env: Environment, pod: str, container: str | None) -> str:
    via = hosts.connector(env)
    for previous in (("--previous",), ()):
        argv = kube(env, "logs", pod, "--namespace", env.namespace, *(("-c", container) if container else ()),
                    "--tail=3", *previous).argv
        r = via.run(argv, timeout=30)
        if r.rc == 0:
            return r.stdout
    return ""


def pods_and_events(env: Environment):
    """The RayCluster's pods, the namespace's events (as the API's JSON) and
    a reader of a container's last log lines."""
    ns = env.namespace
    if hosts.controller(env):
        pods = kubectl_json(env, "pods", "--namespace", ns, "-l", f"ray.io/cluster={T.RAYCLUSTER_NAME}")
        events = kubectl_json(env, "events", "--namespace", ns)
        return pods.get("items") or [], events.get("items") or [], lambda p, c: _tail_with_kubectl(env, p, c)
    from kubernetes import client as k
    api = client(env)
    core = k.CoreV1Api(api)
    try:
        pods = core.list_namespaced_pod(ns, label_selector=f"ray.io/cluster={T.RAYCLUSTER_NAME}")
        events = core.list_namespaced_event(ns)
    except Exception as e:
        raise _api_error("pods and events", e) from None
    as_json = api.sanitize_for_serialization
    return (as_json(pods).get("items") or [], as_json(events).get("items") or [],
            lambda p, c: _tail_with_client(core, p, ns, c))


def causes(env: Environment) -> list[str]:
    """One line per cause of the RayCluster's pods not running, from their
    phases, container states, scheduling conditions and events."""
    pods, events, tail_of = pods_and_events(env)
    by_object: dict[str, list[dict]] = {}
    for ev in events:
        by_object.setdefault((ev.get("involvedObject") or {}).get("name") or "", []).append(ev)
    found: "OrderedDict[str, list[str]]" = OrderedDict()

    def add(cause: str, pod: str) -> None:
        found.setdefault(cause, []).append(pod)

    for ev in by_object.get(T.RAYCLUSTER_NAME, []):
        if ev.get("type") == "Warning" and (ev.get("reason") or "").startswith("FailedCreate"):
            add(f"KubeRay cannot create the pods: {_short(ev.get('message'))}", T.RAYCLUSTER_NAME)
    for pod in pods:
        name = (pod.get("metadata") or {}).get("name") or "?"
        status = pod.get("status") or {}
        for cs in (status.get("containerStatuses") or []) + (status.get("initContainerStatuses") or []):
            waiting = (cs.get("state") or {}).get("waiting") or {}
            reason = waiting.get("reason")
            if reason in ("ImagePullBackOff", "ErrImagePull", "InvalidImageName"):
                add(f"cannot pull image {cs.get('image')}: {reason}: {_short(waiting.get('message'))}", name)
            elif reason == "CrashLoopBackOff":
                text = tail_of(name, cs.get("name"))
                tail = " | ".join(l.strip() for l in (text or "").splitlines()[-3:] if l.strip())
                add(f"container {cs.get('name')} keeps crashing ({cs.get('restartCount', 0)} restarts)"
                    + (f"; its last lines: {_short(tail)}" if tail else ""), name)
            elif reason in ("CreateContainerConfigError", "CreateContainerError"):
                add(f"container {cs.get('name')} cannot start: {reason}: {_short(waiting.get('message'))}", name)
        pod_events = by_object.get(name, [])
        scheduled = {c.get("type"): c for c in status.get("conditions") or []}.get("PodScheduled")
        failed_scheduling = [e.get("message") for e in pod_events if e.get("reason") == "FailedScheduling"]
        if status.get("phase") == "Pending" and scheduled is not None and scheduled.get("status") == "False":
            add(scheduling(scheduled.get("message") or next(iter(failed_scheduling), "")), name)
        elif status.get("phase") == "Pending" and failed_scheduling:
            add(scheduling(failed_scheduling[0]), name)
        for e in pod_events:
            if e.get("reason") == "FailedMount":
                add(mount(env, e.get("message")), name)
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


def mount(env: Environment, message: str | None) -> str:
    m = _short(message)
    if re.search(r"(PermissionDenied|permission|403|Forbidden|does not have storage)", m, re.I):
        return (f"the GCS FUSE mount of gs://{env.gs_bucket} is refused: the workload-identity binding of "
                f"{env.namespace}/{env.ksa_name} (`invoke storage`); the kubelet says {m!r}")
    return f"a volume mount failed: {m!r}"


def causes_fact(env: Environment) -> Fact:
    return Fact(name="why the workers are not running", python=lambda: causes(env),
                display=(f"kubectl get pods,events --namespace {env.namespace} -l ray.io/cluster={T.RAYCLUSTER_NAME} "
                         f"--context={kube_context(env)}  # the kubernetes client: pods, their states, events"),
                assumed=[], describe=lambda cs: "; ".join(cs) or "no cause found")
