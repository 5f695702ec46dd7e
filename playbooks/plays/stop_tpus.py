"""`invoke stop-tpus`: the TPUs' bill stopped, everything else kept. Named
for what it stops: the TPUs, nothing else (not `pause`, which would say a
job waits to go on; a job running on the TPUs ends with them, and resumes
from its last finalized checkpoint when `invoke up` has made them again
and `invoke train` is run again).

On GKE Standard, each TPU node pool of the environment is deleted; the
cluster (its fee, its CPU ``default-pool``), the RayCluster (its head runs
on the CPU pool; its TPU workers wait, Pending, for nodes), the bucket with
every checkpoint, the networks and the maintenance holds stay. Deleted, not
resized to 0: GKE treats a multi-host TPU slice's nodes as one atomic unit
and lets no node be added to a multi-host TPU slice node pool after it is
made ("Atomicity", "Immutable", and "Multi-host TPU slice node pools" in
https://cloud.google.com/kubernetes-engine/docs/concepts/tpus), so a
`gcloud container node-pools resize --num-nodes` back from 0 is not a way
GKE documents for these pools; a deleted pool is made again by `invoke up`
(the nodepools play creates a pool that is absent), every flag as before.
A flex-start pool is deleted too: it would make nodes again for the
RayCluster's Pending workers.

On Autopilot there are no node pools of ours: Autopilot makes the TPU nodes
for the RayCluster's TPU workers and removes them when the pods go. The
RayCluster is deleted (`invoke up` applies it again: an absent one is
applied, a scaled one would be drift); the cluster, the ComputeClass and the
bucket stay.

On the local twin the simulated TPU hosts' processes (its Ray worker
nodes) are stopped; the Ray head, its jobs' history, the runs' checkpoints
and timelines on this machine stay (`plays/local_cluster.py`'s stop steps,
put together in ``cli/task_steps.py``).

Each step deletes only what it finds; a second run changes nothing."""
from __future__ import annotations

from collections.abc import Callable

from playbooks.cloud import capacity_options as cap
from playbooks.cloud.gke import (
    clusters_fact,
    kube,
    kube_context,
    nodepool_name,
    nodepools_fact,
    raycluster_fact,
    running_cluster,
)
from playbooks.cloud.kube_context import has_context, kubeconfig_fact
from playbooks.config import tutorial as T
from playbooks.config.schema import Environment
from playbooks.core.command import Command
from playbooks.core.facts import ABSENT, assume
from playbooks.core.step import Step, Verify, change, gone, ok, wait

PLAY = "stop-tpus"
DELETE_TIMEOUT = 30 * 60
NEXT = ("`invoke up` makes the TPUs again, and `invoke train` resumes a run from its last finalized checkpoint")


def pool_step(env: Environment, i: int, delete: Command) -> Step:
    """Slice i's TPU node pool deleted (``delete``: the nodepools play's
    command, handed in: a play never imports another)."""
    name = nodepool_name(env, i)
    clusters = assume(clusters_fact(env), running_cluster(env))
    probe = assume(nodepools_fact(env, name), {"name": name, "status": "RUNNING"})

    def decide(look):
        if look(clusters) is ABSENT:
            return ok(f"no cluster {env.cluster_name}: no TPU node pool of it bills")
        p = look(probe)
        if p is ABSENT:
            return ok(f"node pool {name} is not there: none of its TPUs bills")
        if p.get("status") == "STOPPING":
            return wait(f"node pool {name} is already being deleted")
        what = cap.pool_capacity(p) if p.get("config") else "its TPUs"
        return change(delete, reason=f"deleted ({what}): `invoke up` makes it again",
                      would=f"delete node pool {name} ({what})", found=str(p.get("status") or "present"))

    return Step(PLAY, f"TPU node pool {name}", decide, id=f"{PLAY}:{name}", probes=(clusters, probe),
                verify=Verify(probe, gone(f"node pool {name}"), timeout=DELETE_TIMEOUT, interval=15))


def raycluster_step(env: Environment) -> Step:
    """Autopilot: the RayCluster deleted, and with its TPU workers the TPU
    nodes Autopilot made for them."""
    clusters = assume(clusters_fact(env), running_cluster(env))
    kubeconfig = assume(kubeconfig_fact(env), {"contexts": [{"name": kube_context(env)}]})
    probe = assume(raycluster_fact(env), {"metadata": {"name": T.RAYCLUSTER_NAME}})

    def decide(look):
        if look(clusters) is ABSENT:
            return ok(f"no cluster {env.cluster_name}: no TPU node of it bills")
        if not has_context(look(kubeconfig), kube_context(env)):
            return ok(f"no kubeconfig context {kube_context(env)}: run `invoke cluster` for its credentials")
        if look(probe) is ABSENT:
            return ok(f"RayCluster {T.RAYCLUSTER_NAME} is not there: no TPU worker asks Autopilot for TPUs")
        return change(kube(env, "delete", "raycluster", T.RAYCLUSTER_NAME, "--namespace", env.namespace),
                      reason="deleted: Autopilot removes the TPU nodes it made for its workers; `invoke up` applies "
                             "it again", would=f"delete RayCluster {T.RAYCLUSTER_NAME} (its TPU workers' nodes go "
                                               f"with them)", found="present")

    return Step(PLAY, f"RayCluster {T.RAYCLUSTER_NAME}", decide, id=f"{PLAY}:raycluster", after=("kube:credentials",),
                verify=Verify(probe, gone("RayCluster"), timeout=300, interval=5))


def kept(env: Environment) -> str:
    """What stop-tpus keeps, in one line."""
    if env.platform.simulated:
        return ("the Ray head (its jobs' history), the runs' checkpoints and timelines on this machine; the simulated "
                "TPU hosts are the TPUs here")
    if not env.cluster_mode.our_node_pools:
        return (f"cluster {env.cluster_name} (its fee), its ComputeClass and service account, bucket "
                f"gs://{env.gs_bucket} (every run's checkpoints), the runs' timelines on this machine")
    return (f"cluster {env.cluster_name} (its fee, its CPU node pools), the RayCluster (its head; its TPU workers wait "
            f"for nodes), bucket gs://{env.gs_bucket} (every run's checkpoints), the runs' timelines on this machine")


def next_step(env: Environment, after: tuple[str, ...]) -> Step:
    """What was kept and what comes next: said, never a change."""
    status = "" if env.platform.simulated else "; `invoke status` says what still bills"
    return Step(PLAY, "kept", lambda look: ok(f"kept {kept(env)}{status}; {NEXT}"), id=f"{PLAY}:kept", after=after)


def steps(env: Environment, delete: Callable[[str], Command]) -> list[Step]:
    """GKE: each slice's TPU node pool deleted (Standard: ``delete(name)``
    is the pool's delete command), or the RayCluster (Autopilot; kubectl's
    credentials put first by ``cli/task_steps.py``); then what was kept."""
    if env.cluster_mode.our_node_pools:
        out = [pool_step(env, i, delete(nodepool_name(env, i))) for i in range(env.slices)]
    else:
        out = [raycluster_step(env)]
    return out + [next_step(env, tuple(s.id for s in out))]
