"""The pod watch of a followed job (GKE): two looks at the RayCluster's
worker pods, as timeline events: a pod placed on its node (``scheduled``,
with the node's node pool where it was read: what prices the pod's slice,
``runs/cost.py``) and a pod lost (``worker_lost``), with what did it in
Kubernetes' words (a preemption, maintenance, a node gone, a failed pod,
deleted)."""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from playbooks.cloud import pods as P
from playbooks.cloud.gke import seconds
from playbooks.cloud.kube_objects import short
from playbooks.config.choices import capacity_option
from playbooks.core.errors import PlaybookError
from playbooks.runs import events as E

_PREEMPTION = re.compile(r"(preempt|spot|impending-node-termination|ShutdownGracePeriod|flex-start)", re.I)
_MAINTENANCE = re.compile(r"(upgrad|maintenance|drain|NodePoolUpdate|auto-repair|repair)", re.I)
# The kubelet's graceful node shutdown (a Spot VM preempted, a node stopped
# for maintenance): DisruptionTarget TerminationByKubelet, "Pod was
# terminated in response to imminent node shutdown."
_SHUTDOWN = re.compile(r"(TerminationByKubelet|imminent node shutdown|NodeShutdown)", re.I)
_NODE_GONE = re.compile(r"(NodeLost|NodeNotReady|DeletionByPodGC|DeletionByTaintManager|"
                        r"node .*(not found|deleted|not ready|unreachable)|Node is not ready|TaintManagerEviction)",
                        re.I)


def loss(pod: dict, events: list[dict], capacity: str | list[str] = "on-demand") -> tuple[str, str]:
    """(by, cause) of a worker pod lost: a preemption, maintenance, a node
    gone, a failed pod, or deleted; its cause in Kubernetes' words. A node
    shut down is a preemption on Spot or flex-start capacity, else
    maintenance (with a capacity list of both kinds: either)."""
    st = pod.get("status") or {}
    dt = P.conditions(pod).get("DisruptionTarget") or {}
    texts = []
    if dt.get("reason") or dt.get("message"):
        texts.append(f"DisruptionTarget {dt.get('reason') or ''}: {short(dt.get('message'))}".strip(": "))
    if st.get("reason") or st.get("message"):
        texts.append(f"pod {st.get('reason') or ''}: {short(st.get('message'))}".strip(": "))
    texts += [f"{e.get('reason')}: {short(e.get('message'))}" for e in events if e.get("type") == "Warning"
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
        kinds = {capacity_option(o).preemptible for o in ([capacity] if isinstance(capacity, str) else capacity)}
        by = "preemption" if kinds == {True} else "maintenance" if kinds == {False} else "preemption or maintenance"
    elif _NODE_GONE.search(joined):
        by = "node gone"
    elif st.get("phase") == "Failed" or any(t.startswith("container ") for t in texts):
        by = "pod failed"
    else:
        by = "deleted"
    return by, (texts[0] if texts else "the pod was deleted (no cause recorded)")


class NodePools:
    """Each node's node pool (GKE's label), read once per node name:
    ``read`` gives the node's JSON, ABSENT (no such node), or raises a
    PlaybookError (it could not look). A node absent, unlabelled or not read
    has no pool, never a guess, and is not read again; ``note`` is told why
    one could not be read."""

    def __init__(self, read: Callable[[str], Any], note: Callable[[str], None] = lambda _: None):
        self.read, self.note = read, note
        self.known: dict[str, str | None] = {}

    def __call__(self, node: str) -> str | None:
        if node not in self.known:
            try:
                got = self.read(node)
            except PlaybookError as e:
                got = None
                self.note(f"node {node}'s pool not read (its pods' slice is priced as not known): "
                          f"{str(e).splitlines()[0][:200]}")
            self.known[node] = P.node_pool(got) if isinstance(got, dict) else None
        return self.known[node]


def pod_changes(before: dict[str, dict], now: dict[str, dict], events: list[dict], t: float,
                capacity: str | list[str] = "on-demand",
                pools: Callable[[str], str | None] | None = None) -> list[dict]:
    """Timeline events from two looks at the worker pods (name -> pod):
    ``scheduled`` (a pod placed on a node: its slice, its node, and the
    node's ``pool`` where ``pools`` knows it) and ``worker_lost`` (a pod
    going away, failed or restarted; what did it)."""
    by_pod: dict[str, list[dict]] = {}
    for ev in events:
        by_pod.setdefault((ev.get("involvedObject") or {}).get("name") or "", []).append(ev)

    def uid(p: dict | None) -> Any:
        return ((p or {}).get("metadata") or {}).get("uid")

    def base(kind: str, p: dict, at: float | None) -> dict:
        return {"t": round(at if at is not None else t, 3), "kind": kind, "step": None, "source": "pods",
                "pod": p["metadata"]["name"], "uid": uid(p), "node": (p.get("spec") or {}).get("nodeName"),
                "slice": P.replica(p)}

    out = []
    for name, p in now.items():
        old = before.get(name) or {}
        same = bool(old) and uid(old) == uid(p)
        node = (p.get("spec") or {}).get("nodeName")
        if node and not (same and (old.get("spec") or {}).get("nodeName")):
            sched = P.conditions(p).get("PodScheduled") or {}
            pool = pools(node) if pools is not None else None
            out.append(dict(base(E.SCHEDULED, p, seconds(sched.get("lastTransitionTime"))),
                            **({"pool": pool} if pool else {})))
        restarted = same and P.restarts(p) > P.restarts(old)
        if (P.failing(p) and not (same and P.failing(old))) or (restarted and not P.failing(p)):
            by, cause = loss(p, by_pod.get(name, []), capacity)
            if restarted and by == "deleted":
                by, cause = "pod failed", f"a container restarted ({P.restarts(p)} restarts)"
            dt = P.conditions(p).get("DisruptionTarget") or {}
            out.append(dict(base(E.WORKER_LOST, p, seconds(dt.get("lastTransitionTime"))), by=by, cause=cause))
    for name, p in before.items():
        if (name not in now or uid(now[name]) != uid(p)) and not P.failing(p):
            by, cause = loss(p, by_pod.get(name, []), capacity)
            out.append(dict(base(E.WORKER_LOST, p, None), by=by,
                            cause=cause if by != "deleted" else "the pod is gone (no cause recorded)"))
    return out
