"""A host set aside, and given back: the record (``runs/quarantine_record``)
and, on GKE, a slice's nodes cordoned and tainted so that KubeRay's
recreated worker pods land elsewhere, its worker pods deleted (moved off),
and, if the inventory says so, its node pool made again (the delete here,
the create by the ``nodepools`` play's own step: ``cli/task_steps.py``
composes them). Release: uncordoned, the taint removed, the record cleared.

On the twin the host's Ray node is stopped and started again by the
``local_cluster`` play's steps (composed in ``cli/task_steps.py``); its host
step does not start a host of the record.

Which nodes: the record's (written first, with the slice's nodes as they
are then); before it is written (a dry run, check mode) the slice's nodes
now. A pool made again has new nodes, not set aside: they are left alone."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from playbooks.access.cli_clients import fact, json_object
from playbooks.cloud import kube_objects, pod_delete
from playbooks.cloud import pods as P
from playbooks.cloud.gke import kube, listed, nodepool_name, nodepools_fact, objects_command
from playbooks.config import tutorial as T
from playbooks.config.schema import Environment
from playbooks.core.command import Command, placeholder, shown
from playbooks.core.facts import ABSENT, Action, Completed, Fact, assume
from playbooks.core.step import Step, Verify, change, fail, ok
from playbooks.runs import quarantine_record as R
from playbooks.runs import timeline

PLAY = "quarantine"
RELEASE = "release"
# The taint that keeps pods off a quarantined node: no pod of ours tolerates
# it (manifests/ tolerate google.com/tpu only; tests/test_quarantine.py).
TAINT_KEY = "tpu-playbooks.dev/quarantined"
TAINT = f"{TAINT_KEY}=true:NoSchedule"
POOL_DELETE_TIMEOUT = 30 * 60


def slice_of(env: Environment, name: str) -> int | None:
    """The slice a GKE host name names (its node pool's name), or None."""
    return next((i for i in range(env.slices) if nodepool_name(env, i) == name), None)


def known_hosts(env: Environment) -> list[str]:
    return [nodepool_name(env, i) for i in range(env.slices)]


# -- what is there: the slice's nodes, the worker pods ------------------------------
def _nodes(c: Any) -> dict[str, dict]:
    return _node_states(json_object("nodes")(c))


def _node_states(doc: dict) -> dict[str, dict]:
    return {(n.get("metadata") or {}).get("name", "?"): _marks(n.get("spec") or {}) for n in doc.get("items") or []}


def _marks(spec: dict) -> dict[str, bool]:
    """A node's spec: cordoned (``unschedulable``), tainted (our key)."""
    return {"cordoned": bool(spec.get("unschedulable")),
            "tainted": any(t.get("key") == TAINT_KEY for t in spec.get("taints") or [])}


def nodes_fact(env: Environment, pool: str, cordoned: bool = False) -> Fact:
    """The pool's nodes: name -> cordoned, tainted (a dry run: one node per
    host, ``cordoned`` and tainted as said)."""
    assumed = {placeholder(f"NODE{w}"): {"cordoned": cordoned, "tainted": cordoned}
               for w in range(env.hosts_per_slice)}
    return fact(f"nodes of {pool}", kube(env, "get", "nodes", "-l", f"{P.NODEPOOL_LABEL}={pool}", "--output=json"),
                _nodes, assumed=assumed,
                describe=lambda ns: shown(", ".join(f"{n}{' cordoned' if v['cordoned'] else ''}"
                                                    f"{' tainted' if v['tainted'] else ''}" for n, v in ns.items()))
                or "none")


def _pods(c: Any) -> dict[str, dict]:
    return {(p.get("metadata") or {}).get("name", "?"): {"node": (p.get("spec") or {}).get("nodeName") or "",
                                                        "terminating": pod_delete.terminating(p)}
            for p in json_object("worker pods")(c).get("items") or []}


def pods_fact(env: Environment) -> Fact:
    """The Ray TPU worker pods: name -> its node, whether it is Terminating
    (a dry run: one per node, running)."""
    assumed = {placeholder(f"POD{w}"): {"node": placeholder(f"NODE{w}"), "terminating": False}
               for w in range(env.hosts_per_slice)}
    return fact("Ray TPU worker pods", kube(env, "get", "pods", "-l", T.WORKER_SELECTOR, "--namespace",
                                            env.namespace, "--output=json"), _pods, assumed=assumed,
                describe=lambda ps: f"{len(ps)} pod(s)")


def _targets(env: Environment, name: str, look: Callable[[Fact], Any], nodes: Fact, held: Fact) -> dict[str, dict]:
    """The nodes this host's quarantine is about, as they are now: the
    record's (those still there), else the slice's."""
    now = look(nodes)
    recorded = (look(held).get(name) or {}).get("nodes")
    return {n: v for n, v in now.items() if n in recorded} if recorded else now


def held_now(env: Environment) -> set[str]:
    """The hosts set aside now, as a watch deciding which slices are left
    reads them (``ProbeFailed`` when it cannot look). The twin: the
    record's. GKE: the record's hosts of which a recorded node still
    carries the taint: `hosts.release` untaints them before it forgets the
    host, and the record a watch in a head pod keeps (its own copy) never
    hears of a release from this machine; a host whose recorded nodes are
    all gone (its pool made again) is new hardware."""
    record = R.read(env)
    if not env.platform.cloud:
        return set(record)
    return {name for name, rec in record.items()
            if in_force(rec, _node_states(kube_objects.kubectl_json(env, "nodes", "-l",
                                                                    f"{P.NODEPOOL_LABEL}={name}")))}


def in_force(rec: dict, now: dict[str, dict]) -> bool:
    """A GKE host's record still sets its slice aside: a node of the record
    (``now``: the slice's nodes as they are) carries the taint, or the
    record names no node (the slice had none when it was set aside)."""
    recorded = set(rec.get("nodes") or [])
    return not recorded or any(v["tainted"] for n, v in now.items() if n in recorded)


# -- quarantine ---------------------------------------------------------------------
def record_step(env: Environment, name: str, slice_: str, why: str, by: str, nodes: Fact | None = None,
                play: str = PLAY, renew: bool = False) -> Step:
    """The host written into the record (with the slice's nodes, on GKE).
    A host already in it keeps its first record; with ``renew`` (a watch,
    which sets aside only a host not held now: ``held_now``) a GKE record no
    longer in force is written anew: its nodes were given back by a release
    the record never heard of (a watch in a head pod keeps its own copy), or
    its pool was made again (new nodes, which are the ones to set aside)."""
    held = R.fact(env)

    def decide(look):
        had = look(held).get(name)
        stale = had is not None and renew and nodes is not None and not in_force(had, look(nodes))
        if had is not None and not stale:
            return ok(f"{name} is quarantined since {R.since_text(had)}: {had.get('why')}")
        names = sorted(look(nodes)) if nodes is not None else []
        anew = " anew" if stale else ""
        return change(R.add(env, name, R.entry(slice_, why, by, names)), reason=f"recorded {name}{anew}: {why}",
                      would=f"record {name}{anew} as quarantined: {why}",
                      found=f"in the record since {R.since_text(had)}, but no node of it carries the taint now"
                      if stale else "not quarantined")

    return Step(play, f"record {name}", decide, id=f"{play}:record",
                verify=Verify(held, lambda hs: None if name in hs else "not in the record"))


def _node_step(env: Environment, name: str, what: str, needs: Callable[[dict], bool],
               command: Callable[[str], Command], select: Callable[[Callable[[Fact], Any]], dict[str, dict]],
               nodes: Fact, play: str, after: tuple[str, ...]) -> Step:
    """One kubectl change per node of the host (``select``) that ``needs``
    it; verified when none of those needs it any more."""
    chosen: list[str] = []

    def decide(look):
        targets = select(look)
        todo = sorted(n for n, v in targets.items() if needs(v))
        chosen[:] = todo
        if not targets:
            return ok(f"no node of {name} is left: nothing to {what}")
        if not todo:
            return ok(f"every node of {name} ({len(targets)}) is as asked: nothing to {what}")
        return change(*[command(n) for n in todo], reason=f"{what}: {', '.join(todo)}",
                      would=f"{what} {', '.join(todo)}", found=f"{len(todo)} node(s) to {what}")

    def check(now: Any) -> str | None:
        left = [n for n in chosen if n in now and needs(now[n])]
        return f"{', '.join(left)}: not yet" if left else None

    return Step(play, f"{what} the nodes of {name}", decide, id=f"{play}:{what}", after=after,
                verify=Verify(nodes, check, timeout=30, interval=2))


def pods_step(env: Environment, name: str, held: Fact, nodes: Fact) -> Step:
    """The worker pods on the host's nodes deleted: KubeRay makes them again,
    and the taint keeps them off these nodes. Each delete is bounded: a pod
    still Terminating after it (its node's kubelet dead, as on a sick host)
    is force-deleted or left, as ``stuck_pod`` says (``cloud/pod_delete``);
    with ``leave``, a pod already Terminating is not deleted again."""
    pods = pods_fact(env)
    chosen: list[str] = []
    left: set[str] = set()  # stuck, and left Terminating (stuck_pod: leave): the verify lets them be

    def decide(look):
        targets = _targets(env, name, look, nodes, held)
        there = {p: v for p, v in look(pods).items() if v["node"] and v["node"] in targets}
        kept = sorted(p for p, v in there.items() if v["terminating"] and pod_delete.leaves(env))
        todo = sorted(set(there) - set(kept))
        chosen[:] = todo
        left.clear()
        if not todo:
            return ok(f"no Ray worker pod runs on the nodes of {name}" + (
                f" ({', '.join(kept)} Terminating, left: stuck_pod: {env.stuck_pod})" if kept else ""))
        reason = f"deleted {', '.join(todo)} (KubeRay makes them again, elsewhere)"
        return change(*[pod_delete.delete(env, p) for p in todo], reason=reason,
                      would=f"delete worker pod(s) {', '.join(todo)}", found=f"{len(todo)} pod(s) on its nodes",
                      instead=pod_delete.when_stuck(env, todo, None, reason, left=left))

    def check(now: Any) -> str | None:
        there = [p for p in chosen if p in now and p not in left]
        return f"{', '.join(there)} still there" if there else None

    return Step(PLAY, f"move the worker pods off {name}", decide, id=f"{PLAY}:pods",
                after=(f"{PLAY}:cordon", f"{PLAY}:taint"), verify=Verify(pods, check, timeout=120, interval=3))


def replace_step(env: Environment, name: str, held: Fact, nodes: Fact, delete: Command) -> Step:
    """The slice's pool deleted while a node of the record is still in it
    (the pool's own step, after this one, makes it again: new nodes)."""
    pool = nodepools_fact(env, name)

    def decide(look):
        targets = _targets(env, name, look, nodes, held)
        if not targets:
            return ok(f"no quarantined node of {name} is left in its pool: nothing to replace")
        return change(delete, reason=f"deleted node pool {name} ({len(targets)} quarantined node(s)); made again next",
                      would=f"delete node pool {name}, to make it again", found="its quarantined nodes")

    return Step(PLAY, f"replace node pool {name}", decide, id=f"{PLAY}:replace", after=(f"{PLAY}:pods",),
                verify=Verify(pool, lambda p: None if p is ABSENT else f"node pool {name} still there",
                              timeout=POOL_DELETE_TIMEOUT, interval=15))


def gke_steps(env: Environment, name: str, why: str, by: str, delete_pool: Command | None = None,
              renew: bool = False) -> list[Step]:
    """Quarantine a slice (``name``: its node pool): record, cordon, taint,
    the worker pods moved off; with ``delete_pool``, its pool deleted (the
    caller adds the pool's create step after it); ``renew``: see record_step."""
    nodes, held = nodes_fact(env, name), R.fact(env)

    def select(look):
        return _targets(env, name, look, nodes, held)

    out = [record_step(env, name, name, why, by, nodes, renew=renew),
           _node_step(env, name, "cordon", lambda v: not v["cordoned"], lambda n: kube(env, "cordon", n), select,
                      nodes, PLAY, (f"{PLAY}:record",)),
           _node_step(env, name, "taint", lambda v: not v["tainted"],
                      lambda n: kube(env, "taint", "nodes", n, TAINT, "--overwrite"), select, nodes, PLAY,
                      (f"{PLAY}:cordon",)),
           pods_step(env, name, held, nodes)]
    if delete_pool is not None:
        out.append(replace_step(env, name, held, nodes, delete_pool))
    return out


# -- release ------------------------------------------------------------------------
def forget_step(env: Environment, name: str, play: str = RELEASE, after: tuple[str, ...] = ()) -> Step:
    """The host taken out of the record (last: a release cut short is found again)."""
    held = assume(R.fact(env), {name: R.entry(name, "(as recorded)", "(as recorded)")})

    def decide(look):
        if name not in look(held):
            return ok(f"{name} is not in the record")
        # The runs that set it aside count its slice as set aside (cost)
        # until this event.
        released = Action(timeline.release_line(env, name), lambda: timeline.record_release(env, name))
        return change(R.remove(env, name), released, reason=f"{name} taken out of the record",
                      would=f"take {name} out of the record", found="quarantined")

    return Step(play, f"forget {name}", decide, id=f"{play}:record", after=after,
                verify=Verify(held, lambda hs: "still in the record" if name in hs else None))


def release_gke_steps(env: Environment, name: str) -> list[Step]:
    """Uncordon and untaint the slice's nodes that are of the record or carry
    our taint (never a node someone else cordoned), then forget it."""
    nodes = nodes_fact(env, name, cordoned=True)
    held = assume(R.fact(env), {name: R.entry(name, "(as recorded)", "(as recorded)")})

    def ours(look):
        recorded = set((look(held).get(name) or {}).get("nodes") or [])
        return {n: v for n, v in look(nodes).items() if n in recorded or v["tainted"]}

    return [_node_step(env, name, "uncordon", lambda v: v["cordoned"], lambda n: kube(env, "uncordon", n), ours,
                       nodes, RELEASE, ()),
            _node_step(env, name, "untaint", lambda v: v["tainted"],
                       lambda n: kube(env, "taint", "nodes", n, f"{TAINT_KEY}-"), ours, nodes, RELEASE,
                       (f"{RELEASE}:uncordon",)),
            forget_step(env, name, after=(f"{RELEASE}:untaint",))]


# -- what is set aside (`invoke hosts`, a row of `status`) ----------------------------
# Where a host's quarantine is known from: this checkout's record (a file on
# this machine), and on GKE the nodes themselves (the truth: a quarantine by a
# teammate, another machine or the watch in the head pod is there and in no
# record of this machine).
RECORD = "this checkout's record"
CLUSTER = "node taint/cordon on the cluster"


def _cluster_nodes(c: Completed) -> dict[str, dict]:
    """node -> its pool, cordoned, tainted: every node of the cluster, from
    the List of ``gke.objects_command``."""
    out = {}
    for n in listed(json_object("nodes")(c), "Node"):
        md = n.get("metadata") or {}
        out[md.get("name", "?")] = {"pool": (md.get("labels") or {}).get(P.NODEPOOL_LABEL) or "?",
                                    **_marks(n.get("spec") or {})}
    return out


def cluster_nodes_fact(env: Environment) -> Fact:
    """Every node of the cluster, cordoned or not, with our taint or not:
    the read `invoke status` makes of every object of ours (one call)."""
    return fact("the cluster's nodes", objects_command(env), _cluster_nodes, assumed={},
                describe=lambda ns: f"{sum(v['cordoned'] or v['tainted'] for v in ns.values())} of {len(ns)} "
                                    f"node(s) cordoned or tainted")


def listing(env: Environment, look: Callable[[Fact], Any]) -> list[dict]:
    """Each host set aside, or that was: the twin's record; on GKE every
    node pool of which a node is cordoned or carries the taint now, joined
    with the record's hosts (each with its nodes as they are now: cordoned,
    tainted, gone), and where each is known from (``source``)."""
    record = look(R.fact(env))
    if not env.platform.cloud:
        return [_row(name, rec, [RECORD], True, None) for name, rec in sorted(record.items())]
    nodes = look(cluster_nodes_fact(env))
    marked: dict[str, dict[str, dict]] = {}
    for n, v in nodes.items():
        if v["cordoned"] or v["tainted"]:
            marked.setdefault(v["pool"], {})[n] = v
    return [_gke_row(host, record.get(host), nodes, marked.get(host, {}))
            for host in sorted(set(record) | set(marked))]


def _row(host: str, rec: dict | None, source: list[str], held: bool, note: str | None) -> dict:
    """A host's row; ``rec`` None: in no record here (why, since, by unknown)."""
    if rec is None:
        return {"host": host, "slice": host, "why": None, "since": None, "by": None, "nodes": None,
                "source": source, "held": held, "note": note}
    return {"host": host, "slice": rec.get("slice"), "why": rec.get("why"), "since": R.since_text(rec),
            "by": rec.get("by"), "nodes": None, "source": source, "held": held, "note": note}


def _gke_row(host: str, rec: dict | None, nodes: dict[str, dict], marked: dict[str, dict]) -> dict:
    """One GKE host: the record's nodes (None: gone) and the pool's nodes
    cordoned or tainted now. Set aside (``held``) while a node of the pool
    carries the taint, or the record names no node (as ``held_now``)."""
    recorded = list((rec or {}).get("nodes") or [])
    tainted = any(v["tainted"] for v in marked.values())
    held = tainted or (rec is not None and not recorded)
    if rec is not None:
        note = None if held else (f"no node of it carries the taint now: given back from elsewhere (a release this "
                                  f"record never heard of) or its pool made again; not set aside: "
                                  f"`invoke hosts.release {host}` clears this record")
    elif tainted:
        note = ("set aside on the cluster, in no record of this checkout: by a teammate, another machine or the "
                "watch in the head pod (why, since when and by what are in their record)")
    else:
        note = ("cordoned, without the quarantine taint: not set aside by these tasks (a person's cordon, or GKE's "
                "while it upgrades or repairs a node)")
    row = _row(host, rec, ([RECORD] if rec is not None else []) + ([CLUSTER] if marked else []), held, note)
    row["nodes"] = {**{n: nodes.get(n) for n in recorded}, **marked}
    return row


def row_lines(row: dict) -> list[str]:
    """A host of ``listing`` in lines: the host (the twin: its record), then
    on GKE where it is known from and each node now."""
    recorded = RECORD in row["source"]
    out = [f"{row['host']}: slice {row['slice']}, since {row['since']}, by {row['by']}: {row['why']}" if recorded
           else f"{row['host']}: {row['note']}"]
    if row["nodes"] is None:
        return out
    out.append(f"  source: {' and '.join(row['source']) or '?'}"
               + (f" only: {row['note']}" if recorded and row["note"] else ""))
    for n, v in row["nodes"].items():
        out.append(f"  node {n}: gone (its pool made again, or the node replaced)" if v is None else
                   f"  node {n}: {'cordoned' if v['cordoned'] else 'NOT cordoned'}, "
                   f"{'tainted' if v['tainted'] else 'NOT tainted'}")
    return out


def none_line(env: Environment) -> str:
    """What `invoke hosts` says when nothing is set aside, and where it looked."""
    return ("no host is quarantined: no node cordoned or tainted on the cluster, none in this checkout's record"
            if env.platform.cloud else "no host is quarantined")


def list_step(env: Environment, play: str = "hosts", held_fails: bool = False) -> Step:
    """Read-only: the hosts set aside (on GKE the nodes are read: a look
    that fails is "could not look", never "none"). ``held_fails`` (a row
    of `status`): a host set aside is not as the inventory asks (its slice
    is held out); a node only cordoned, or a record no longer in force, is
    said in its notes."""
    def decide(look):
        rows = listing(env, look)
        if not rows:
            return ok(none_line(env), data=[])
        lines = [line for r in rows for line in row_lines(r)]
        held = [r["host"] for r in rows if r["held"]]
        others = [r["host"] for r in rows if not r["held"]]
        said = (f"{len(held)} quarantined: {', '.join(held)}" if held else "no host is quarantined") + (
            f"; not set aside, but said: {', '.join(others)}" if others else "")
        if held_fails and held:
            return fail(f"{said} (`invoke hosts`; `invoke hosts.release NAME` gives one back)", notes=lines)
        return ok(said, data=rows, notes=lines)

    probes = (R.fact(env), cluster_nodes_fact(env)) if env.platform.cloud else (R.fact(env),)
    return Step(play, "quarantined hosts", decide, id=f"{play}:quarantined", probes=probes)
