"""The cluster's RayCluster, pods and events as kubectl reads them where
the commands run: why its workers are not running, one line per cause
(whether its slices are whole: ``slices.py``)."""
from __future__ import annotations

import re
from collections import OrderedDict
from typing import Any

from playbooks.access import connectors
from playbooks.access.cli_clients import json_object
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


def _pods(env: Environment) -> tuple[str, ...]:
    return ("pods", "--namespace", env.namespace, "-l", f"ray.io/cluster={T.RAYCLUSTER_NAME}")


def pods_command(env: Environment):
    """The RayCluster's pods, as a followed job's watch reads them (and the
    namespace's events)."""
    return kube(env, "get", *_pods(env), "--output=json")


def pods_and_events(env: Environment) -> tuple[list[dict], list[dict]]:
    """The RayCluster's pods and the namespace's events (the API's JSON)."""
    pods = kubectl_json(env, *_pods(env))
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
                text = _tail(env, name, cs.get("name"))
                tail = " | ".join(ln.strip() for ln in (text or "").splitlines()[-3:] if ln.strip())
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
                         f"--context={kube_context(env)}  # and kubectl get events, kubectl logs --tail=3"),
                assumed=[], describe=lambda cs: "; ".join(cs) or "no cause found")


# -- the worker pods while a job runs (the pod watch of a followed job) -------------------
# KubeRay >= 1.5 labels the pods of a multi-host replica (one TPU slice) with
# its name; the TPU webhook's older label names its index.
SLICE_LABELS = ("ray.io/worker-group-replica-name", "ray.io/worker-group-replica-index", "replicaIndex")
_PREEMPTION = re.compile(r"(preempt|spot|impending-node-termination|ShutdownGracePeriod|flex-start)", re.I)
_MAINTENANCE = re.compile(r"(upgrad|maintenance|drain|NodePoolUpdate|auto-repair|repair)", re.I)
# The kubelet's graceful node shutdown (a Spot VM preempted, a node stopped
# for maintenance): DisruptionTarget TerminationByKubelet, "Pod was
# terminated in response to imminent node shutdown."
_SHUTDOWN = re.compile(r"(TerminationByKubelet|imminent node shutdown|NodeShutdown)", re.I)
_NODE_GONE = re.compile(r"(NodeLost|NodeNotReady|DeletionByPodGC|DeletionByTaintManager|"
                        r"node .*(not found|deleted|not ready|unreachable)|Node is not ready|TaintManagerEviction)",
                        re.I)


def is_worker(pod: dict) -> bool:
    return ((pod.get("metadata") or {}).get("labels") or {}).get("ray.io/node-type") == "worker"


def slice_of(pod: dict) -> str | None:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return next((str(labels[k]) for k in SLICE_LABELS if labels.get(k) is not None), None)


def _rfc3339(text: Any) -> float | None:
    import calendar
    import time as _time
    if not isinstance(text, str):
        return None
    try:
        return float(calendar.timegm(_time.strptime(text[:19], "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return None


def _conditions(pod: dict) -> dict[str, dict]:
    return {c.get("type"): c for c in (pod.get("status") or {}).get("conditions") or []}


def _restarts(pod: dict) -> int:
    return sum(int(cs.get("restartCount") or 0) for cs in (pod.get("status") or {}).get("containerStatuses") or [])


def failing(pod: dict) -> bool:
    """Going away or gone wrong: deleted (terminating), failed, disrupted."""
    st = pod.get("status") or {}
    dt = _conditions(pod).get("DisruptionTarget")
    return bool((pod.get("metadata") or {}).get("deletionTimestamp") or st.get("phase") == "Failed"
                or (dt and dt.get("status") == "True"))


def loss(pod: dict, events: list[dict], capacity: str | list[str] = "on-demand") -> tuple[str, str]:
    """(by, cause) of a worker pod lost: a preemption, maintenance, a node
    gone, a failed pod, or deleted; its cause in Kubernetes' words. A node
    shut down is a preemption on Spot or flex-start capacity, else
    maintenance (with a capacity list of both kinds: either)."""
    st = pod.get("status") or {}
    dt = _conditions(pod).get("DisruptionTarget") or {}
    texts = []
    if dt.get("reason") or dt.get("message"):
        texts.append(f"DisruptionTarget {dt.get('reason') or ''}: {_short(dt.get('message'))}".strip(": "))
    if st.get("reason") or st.get("message"):
        texts.append(f"pod {st.get('reason') or ''}: {_short(st.get('message'))}".strip(": "))
    texts += [f"{e.get('reason')}: {_short(e.get('message'))}" for e in events if e.get("type") == "Warning"
              or e.get("reason") in ("Preempting", "Killing", "NodeNotReady", "Evicted", "TaintManagerEviction")]
    for cs in st.get("containerStatuses") or []:
        term = ((cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated") or {})
        if term and (term.get("exitCode") or term.get("reason") == "OOMKilled"):
            texts.append(f"container {cs.get('name')} {term.get('reason') or 'terminated'} "
                         f"(exit code {term.get('exitCode')})")
    joined = " | ".join(texts)
    if _PREEMPTION.search(joined):
        by = "preemption"
    elif _MAINTENANCE.search(joined):
        by = "maintenance"
    elif _SHUTDOWN.search(joined):
        kinds = {o in ("spot", "flex-start") for o in ([capacity] if isinstance(capacity, str) else capacity)}
        by = "preemption" if kinds == {True} else "maintenance" if kinds == {False} else "preemption or maintenance"
    elif _NODE_GONE.search(joined):
        by = "node gone"
    elif st.get("phase") == "Failed" or any(t.startswith("container ") for t in texts):
        by = "pod failed"
    else:
        by = "deleted"
    return by, (texts[0] if texts else "the pod was deleted (no cause recorded)")


def pod_changes(before: dict[str, dict], now: dict[str, dict], events: list[dict], t: float,
                capacity: str | list[str] = "on-demand") -> list[dict]:
    """Timeline events from two looks at the worker pods (name -> pod):
    ``scheduled`` (a pod placed on a node: its slice, its node) and
    ``worker_lost`` (a pod going away, failed or restarted; what did it)."""
    by_pod: dict[str, list[dict]] = {}
    for ev in events:
        by_pod.setdefault((ev.get("involvedObject") or {}).get("name") or "", []).append(ev)

    def uid(p: dict | None) -> Any:
        return ((p or {}).get("metadata") or {}).get("uid")

    def base(kind: str, p: dict, at: float | None) -> dict:
        return {"t": round(at if at is not None else t, 3), "kind": kind, "step": None, "source": "pods",
                "pod": p["metadata"]["name"], "uid": uid(p), "node": (p.get("spec") or {}).get("nodeName"),
                "slice": slice_of(p)}

    out = []
    for name, p in now.items():
        old = before.get(name) or {}
        same = bool(old) and uid(old) == uid(p)
        node = (p.get("spec") or {}).get("nodeName")
        if node and not (same and (old.get("spec") or {}).get("nodeName")):
            sched = _conditions(p).get("PodScheduled") or {}
            out.append(base("scheduled", p, _rfc3339(sched.get("lastTransitionTime"))))
        restarted = same and _restarts(p) > _restarts(old)
        if (failing(p) and not (same and failing(old))) or (restarted and not failing(p)):
            by, cause = loss(p, by_pod.get(name, []), capacity)
            if restarted and by == "deleted":
                by, cause = "pod failed", f"a container restarted ({_restarts(p)} restarts)"
            dt = _conditions(p).get("DisruptionTarget") or {}
            out.append(dict(base("worker_lost", p, _rfc3339(dt.get("lastTransitionTime"))), by=by, cause=cause))
    for name, p in before.items():
        if (name not in now or uid(now[name]) != uid(p)) and not failing(p):
            by, cause = loss(p, by_pod.get(name, []), capacity)
            out.append(dict(base("worker_lost", p, None), by=by,
                            cause=cause if by != "deleted" else "the pod is gone (no cause recorded)"))
    return out
