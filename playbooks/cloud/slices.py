"""Slices: which TPU slices of an environment are whole (every one of their
hosts ready) and which are still waiting, and why. A job starts on whole
slices only: a slice with one host missing cannot run (its ICI mesh is
incomplete), so readiness is counted per slice, never per worker.

Three views of the same thing, one rule:

- Kubernetes (`raycluster`, `status`): the RayCluster's worker pods,
  grouped by the replica they belong to. A multi-host replica (a slice) is
  labelled by KubeRay >= 1.5 with ``ray.io/worker-group-replica-index``
  (0..replicas-1; with its RayMultiHostIndexing feature gate, alpha and off
  by default) and by GKE's TPU webhook (the Ray operator add-on) with
  ``replicaIndex: <group>-<index>``, the label Ray's own KubeRay autoscaler
  reads (ray/autoscaler/_private/kuberay/node_provider.py,
  ``REPLICA_INDEX_KEY``). Either is read; KubeRay's first.
- Ray (`train`): the alive nodes with TPU resources, grouped by the labels
  Ray gives a TPU host from TPU_NAME and TPU_WORKER_ID
  (``ray.io/tpu-slice-name``, ``ray.io/tpu-worker-id``): what a job's
  slice placement groups are made of.
- The local twin: its hosts' processes and their joining
  (``playbooks/twin/nodes.py`` builds a Slices from them).

``min_slices`` (the inventory's; default every slice) is how many whole
slices `up` waits for; the others are named as waiting, in the recap,
`status` and the heartbeats.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from playbooks.access.cli_clients import fact, json_object
from playbooks.access.ray_api import alive, labels
from playbooks.cloud import pods as P
from playbooks.cloud.gke import objects_command
from playbooks.config import tutorial as T
from playbooks.config.schema import Environment
from playbooks.core.facts import ABSENT, Completed, Fact

# Ray's labels of a TPU host (from TPU_NAME and TPU_WORKER_ID).
RAY_SLICE = "ray.io/tpu-slice-name"
RAY_WORKER_ID = "ray.io/tpu-worker-id"

_INDEXED = re.compile(rf"^{re.escape(T.TPU_WORKER_GROUP)}-(\d+)$")


def name(key: str | int) -> str:
    """A slice as it is said: ``slice 1`` for replica 1 (``tpu-group-1``,
    its TPU_NAME), else the name it has."""
    if isinstance(key, int) or str(key).isdigit():
        return f"slice {int(key)}"
    m = _INDEXED.match(str(key))
    return f"slice {int(m.group(1))}" if m else str(key)


@dataclass(frozen=True)
class Slices:
    """``want`` slices asked for; ``whole``: the names of those every host
    of which is ready; ``waiting``: (name, why) of the others; ``head``:
    the Ray head ready (None where this view does not show it)."""

    want: int
    whole: tuple[str, ...] = ()
    waiting: tuple[tuple[str, str], ...] = ()
    head: bool | None = None

    @property
    def count(self) -> int:
        return len(self.whole)

    def enough(self, need: int) -> bool:
        return self.head is not False and self.count >= need

    @property
    def complete(self) -> bool:
        return self.enough(self.want)

    def waiting_text(self) -> str:
        """``waiting: slice 1 (0 of 4 TPU workers ready: ...)``, or ""."""
        return ("waiting: " + "; ".join(f"{s} ({why})" for s, why in self.waiting)) if self.waiting else ""

    def text(self, need: int | None = None) -> str:
        """What is ready, what it needs (when not every slice), what waits."""
        out = f"{self.count} of {self.want} slices ready"
        if need is not None and need < self.want:
            out += f" (min_slices {need})"
        if self.head is False:
            out += ", the Ray head not ready"
        return out + (f"; {self.waiting_text()}" if self.waiting else "")

    def why(self, need: int) -> str | None:
        """None when ``need`` whole slices (and the head) are ready; else
        what is missing, naming the slices still waiting."""
        return None if self.enough(need) else self.text(need)


def every(env: Environment) -> Slices:
    """The slices as asked: all whole (a dry run's assumption)."""
    return Slices(env.slices, tuple(name(i) for i in range(env.slices)), (), True)


# -- Kubernetes: the RayCluster's pods (what a pod is: pods.py) ------------------------
def replica(pod: dict) -> str | None:
    """The slice of a worker pod, as it is said (``slice 1``)."""
    r = P.replica(pod)
    return name(r) if r is not None else None


def _pending(pods: list[dict]) -> str:
    """Why the first pod not ready is not: the scheduler's message, or its phase."""
    for p in pods:
        if P.ready(p):
            continue
        st = p.get("status") or {}
        sched = P.conditions(p).get("PodScheduled") or {}
        if sched.get("status") == "False" and sched.get("message"):
            msg = " ".join(str(sched["message"]).split())
            return f"{st.get('phase') or 'Pending'}: {msg[:120]}{'...' if len(msg) > 120 else ''}"
        return st.get("phase") or "not ready"
    return ""


def from_pods(env: Environment, pods: list[dict]) -> Slices:
    """Whole slices from the RayCluster's pods: a replica whose
    ``hosts_per_slice`` worker pods are all ready. A single-host slice is
    one pod. Multi-host workers without a replica label cannot be told
    apart: then the slices are whole only when every worker is ready."""
    hosts = env.hosts_per_slice
    head = any(P.ready(p) for p in pods if P.role(p) == "head")
    workers = [p for p in pods if P.is_tpu_worker(p)]
    by: dict[str, list[dict]] = {}
    unlabelled: list[dict] = []
    for p in workers:
        r = replica(p)
        if r is None and hosts == 1:
            r = P.name(p)
        (by.setdefault(r, []) if r is not None else unlabelled).append(p)
    if unlabelled:
        ready = sum(1 for p in workers if P.ready(p))
        if ready >= env.slices * hosts:
            return Slices(env.slices, tuple(name(i) for i in range(env.slices)), (), head)
        return Slices(env.slices, (), (("every slice", f"{ready} of {env.slices * hosts} TPU workers ready; the "
                                                       f"workers carry no replica label, so a slice cannot be told "
                                                       f"whole before every worker is"),), head)
    whole, waiting = [], []
    for r, ps in sorted(by.items()):
        ready = sum(1 for p in ps if P.ready(p))
        if ready >= hosts:
            whole.append(r)
        else:
            why = _pending(ps)
            waiting.append((r, f"{ready} of {hosts} TPU workers ready" + (f": {why}" if why else "")))
    named = set(by)
    missing = [name(i) for i in range(env.slices) if name(i) not in named]
    for m in missing[:max(0, env.slices - len(by))]:
        waiting.append((m, "no pods yet"))
    return Slices(env.slices, tuple(whole[:env.slices]), tuple(waiting), head)


def pods_fact(env: Environment) -> Fact:
    """The RayCluster's pods (its head and workers), read as Slices: from
    the one read of the namespace's objects (``gke.objects_command``)."""
    command = objects_command(env)

    def parse(c: Completed) -> Slices:
        return from_pods(env, P.of_raycluster(json_object("TPU slices")(c)))

    return fact("TPU slices", command, parse, assumed=every(env), describe=lambda s: s.text(env.min_slices))


# -- Ray: the alive TPU nodes ----------------------------------------------------------
def from_ray(env: Environment, nodes: Any) -> Slices:
    """Whole slices as Ray sees them (what a job is placed on): the alive
    TPU nodes of each ``ray.io/tpu-slice-name``, one per worker id."""
    if nodes is ABSENT:
        return Slices(env.slices, (), (("every slice", "no Ray cluster answers"),), False)
    head = any(n.get("is_head_node") for n in alive(nodes))
    by: dict[str, set[str]] = {}
    unlabelled = 0
    for n in alive(nodes):
        if not (n.get("resources_total") or {}).get("TPU"):
            continue
        lb = labels(n)
        if lb.get(RAY_SLICE):
            by.setdefault(lb[RAY_SLICE], set()).add(str(lb.get(RAY_WORKER_ID, "")))
        else:
            unlabelled += 1
    hosts = env.hosts_per_slice
    whole = [name(s) for s, ids in sorted(by.items()) if len(ids) >= hosts]
    waiting = [(name(s), f"{len(ids)} of {hosts} hosts in Ray") for s, ids in sorted(by.items()) if len(ids) < hosts]
    absent = env.slices - len(by)
    if absent > 0:
        known = {name(s) for s in by}
        names = [name(i) for i in range(env.slices) if name(i) not in known][:absent]
        waiting += [(n, "no host in Ray yet") for n in names]
    if unlabelled:
        waiting.append((f"{unlabelled} TPU node(s)", f"without a {RAY_SLICE} label (not placed as a slice)"))
    return Slices(env.slices, tuple(whole), tuple(waiting), head)


def ray_nodes_as_asked(env: Environment) -> list[dict]:
    """What Ray's node list shows of a cluster as asked (a dry run's
    assumption): the head and every slice's hosts, labelled as Ray labels
    TPU hosts."""
    return [{"state": "ALIVE", "is_head_node": True, "resources_total": {}, "labels": {}}] + [
        {"state": "ALIVE", "is_head_node": False, "resources_total": {"TPU": env.chips_per_host},
         "labels": {RAY_SLICE: f"{T.TPU_WORKER_GROUP}-{s}", RAY_WORKER_ID: str(w)}}
        for s in range(env.slices) for w in range(env.hosts_per_slice)]
