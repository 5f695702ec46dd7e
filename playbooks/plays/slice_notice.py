"""A slice's announced end, met by the watch (``runs/follow.py``,
``Watch.maintenance``): what is coming for each host (``coming``), the
notice a host is given before it (``notice_steps``), and, with
``maintenance_start: after_save``, the maintenance started at once after the
notice's save (``start_steps``).

- On GKE a host is a slice's node pool. What is coming: its nodes' earliest
  ``cloud.google.com/scheduled-maintenance-time`` label, or its flex-start
  end (``cloud/slice_ends.py``). Its notice is the quarantine's steps
  (composed by the task: a play imports no other), whose pods deleted with
  their grace period run the preStop hook that drains their Ray nodes
  (``config/host_notice.py``). Its start: GKE's documented `kubectl label
  nodes -l cloud.google.com/gke-nodepool=POOL
  cloud.google.com/perform-maintenance=true --overwrite`
  (https://cloud.google.com/kubernetes-engine/docs/how-to/perform-host-maintenance-accelerators,
  the parallel strategy); GKE removes the label when the maintenance is done.
- On the twin a host is a simulated host. What is coming: its record
  (``twin/maintenance_sim.py``, written by ``chaos.maintenance``). Its
  notice: the drain of its Ray node with the maintenance as deadline, the
  command the preStop hook runs on GKE. The twin has no maintenance to
  start: ``chaos.maintenance`` ends the host at its time.
"""
from __future__ import annotations

import time
from typing import Any

from playbooks.access.cli_clients import fact, json_object
from playbooks.cloud import pods as P
from playbooks.cloud import slice_ends
from playbooks.cloud.capacity_options import LABEL as CAPACITY_LABEL
from playbooks.cloud.gke import kube, nodepool_name, nodepools_list_fact, objects_command
from playbooks.cloud.kube_objects import kubectl_json
from playbooks.config import host_notice
from playbooks.config.schema import Environment
from playbooks.core.command import Command, placeholder
from playbooks.core.errors import ProbeFailed
from playbooks.core.step import Step, change, fail, ok
from playbooks.twin import maintenance_sim
from playbooks.twin.chaos_twin import TwinHosts, node_id

PERFORM_LABEL = "cloud.google.com/perform-maintenance"


def coming(env: Environment) -> dict[str, tuple[float, str]]:
    """Each host's end to come, read now (host -> (time, in words))."""
    if env.platform.simulated:
        return {h: (at, f"host maintenance at {slice_ends.utc(at)} (simulated)")
                for h, at in maintenance_sim.read(env).items()}
    pools = [nodepool_name(env, i) for i in range(env.slices)]
    return slice_ends.coming(kubectl_json(env, "nodes", "-l", P.NODEPOOL_LABEL), P.NODEPOOL_LABEL, CAPACITY_LABEL,
                             pools)


def notice_steps(env: Environment, host: str, at: float, why: str) -> list[Step]:
    """The twin's notice to a simulated host: its Ray node drained with
    ``at`` as deadline (GKE's notice is the quarantine's: the task composes it)."""
    w = TwinHosts(env)
    nodes = w.ray_nodes()
    h = w.by_name.get(host)

    def decide(look: Any):
        if h is None:
            return fail(f"{host} is not a TPU host of {env.name}")
        node = node_id(look(nodes), h)
        if node is None and w.known(h):
            return ok(f"TPU host {host} is not an alive node of the Ray cluster: nothing to give notice to")
        grace = max(1, int(at - time.time()))
        drain = Command(host_notice.drain_argv(grace, f"{why}: TPU host {host} goes in {grace} s",
                                               node or placeholder("NODE_ID"), f"{env.ray_ip}:{env.gcs_port}"))
        return change(drain, reason=f"gave TPU host {host} its notice, {grace} s before its {why}",
                      would=f"give TPU host {host} its notice before its {why}")

    return [Step("maintenance", f"give TPU host {host} its notice", decide, id=f"maintenance:notice:{host}")]


def start_command(env: Environment, pool: str) -> Command:
    return kube(env, "label", "nodes", "-l", f"{P.NODEPOOL_LABEL}={pool}", f"{PERFORM_LABEL}=true", "--overwrite")


def start_steps(env: Environment, pool: str) -> list[Step]:
    """GKE: the slice's maintenance started at once (its nodes labelled
    as GKE's page says); a pool whose nodes all carry the label already: ok."""
    probe = fact(f"slice {pool}'s nodes", kube(env, "get", "nodes", "-l", f"{P.NODEPOOL_LABEL}={pool}",
                                               "--output=json"), json_object(f"slice {pool}'s nodes"),
                 assumed={"items": [{"metadata": {"name": placeholder("NODE")}}]},
                 describe=lambda d: f"{len(d.get('items') or [])} node(s)")

    def decide(look: Any):
        nodes = look(probe).get("items") or []
        labelled = [n for n in nodes if ((n.get("metadata") or {}).get("labels") or {}).get(PERFORM_LABEL) == "true"]
        if nodes and len(labelled) == len(nodes):
            return ok(f"the maintenance of slice {pool} is started already ({len(nodes)} node(s) labelled)")
        if not nodes:
            return ok(f"slice {pool} has no nodes: no maintenance to start")
        return change(start_command(env, pool), reason=f"started the host maintenance of slice {pool} "
                                                       f"({len(nodes)} node(s))",
                      would=f"start the host maintenance of slice {pool}")

    return [Step("maintenance", f"start the host maintenance of slice {pool}", decide,
                 id=f"maintenance:start:{pool}", probes=(probe,))]


def ends_step(env: Environment, play: str, sid: str) -> Step:
    """What is coming for each slice, per node pool: its nodes' earliest
    scheduled host maintenance (GKE's node label), and a flex-start pool's
    end (its run duration from its first node): ``cloud/slice_ends.py``.
    Information, never a finding (`invoke status`'s row, and `train`'s
    before it submits: how long each slice has left); read from the node
    list status's nodes row reads (one kubectl call)."""
    pools = [nodepool_name(env, i) for i in range(env.slices)]
    probe = fact("TPU nodes' maintenance", objects_command(env),
                 lambda c: slice_ends.nodes_by_pool({"items": P.gke_nodes(json_object("TPU nodes")(c))},
                                                    P.NODEPOOL_LABEL),
                 assumed={p: [slice_ends.Node(f"{p}-node-{h}") for h in range(env.hosts_per_slice)] for p in pools},
                 describe=lambda d: ", ".join(f"{p} {len(n)} node(s)" for p, n in sorted(d.items())) or "none")
    pools_probe = nodepools_list_fact(env)

    def decide(look: Any):
        have = look(probe)
        try:  # each pool's config: flex-start, its max run duration
            listed, known = {p.get("name"): p for p in look(pools_probe)}, True
        except ProbeFailed:
            listed, known = {}, False
        each, due = [], []
        for name in pools:
            nodes = have.get(name, [])
            pool = listed.get(name) if known else None
            if known and pool is None and not nodes:
                each.append(f"{name}: no node pool")
                continue
            words, scheduled = slice_ends.slice_words(name, nodes, pool,
                                                      slice_ends.is_flex_start(pool, nodes, CAPACITY_LABEL),
                                                      time.time())
            each.append(words)
            if scheduled:
                due.append(name)
        notes = [f"a slice runs only whole: one node's maintenance interrupts all of {', '.join(due)} "
                 "(GKE terminates a TPU node for it: TPUs do not live-migrate)"] if due else []
        return ok("; ".join(each), notes=notes)

    return Step(play, "TPU host maintenance, flex-start ends", decide, id=sid, probes=(probe, pools_probe),
                after=("kube:credentials", *[f"nodepools:{p}" for p in pools]))

