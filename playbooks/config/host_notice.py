"""A notice to go, as Ray is told it: one home for the command that gives a
TPU host's Ray node its notice, which GKE's worker pods run in their preStop
hook and the twin's ``chaos.preempt-worker`` runs for a simulated host.

``ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION
--deadline-remaining-seconds N`` (a hidden command of Ray 2.60, the
GCS's DrainNode, which the autoscaler uses for preemptions: a busy node's
drain for a preemption is accepted): Ray schedules nothing new there, and Ray
Train's PreemptionWatcher marks the job's workers, which the trainer turns
into a save (``trainer/notice.py``). The command does not end the node:
the caller does (the kubelet at the end of the pod's grace; the chaos task).

Why a preStop hook on GKE: a Spot VM's preemption notice becomes the pods'
graceful termination (GKE gives non-system Pods the first 15 s of the
30 s, or 105 s of 120 s where this project lengthens it: config/spot_grace.py,
https://docs.cloud.google.com/kubernetes-engine/docs/concepts/spot-vms),
and the kubelet then sends SIGTERM to the container's first process, ``ray
start --block``, which stops the node's processes, the training worker
among them, at once: the save never begins. The hook runs before that
SIGTERM: it drains the node, then waits while a training worker still runs
on it (the group ends once the save is finalized), within the pod's grace.
"""
from __future__ import annotations

REASON = "DRAIN_NODE_REASON_PREEMPTION"
# Kubernetes' default terminationGracePeriodSeconds: the worker pods' grace
# where no lengthened Spot pool gives them more (choices.worker_grace_s).
# The hook gives Ray the pods' grace as the drain's deadline: it bounds the
# waits of the trainer's retry (elastic_control.FreshClusterView); the node
# goes when its pod does.
POD_GRACE_S = 30
# The range chaos.preempt-worker's --grace takes (its default: what a
# preemption gives the job's pods, choices.preemption_grace_s).
GRACE_MIN_S, GRACE_MAX_S = 1, 3600
# The training worker's process title (Ray Train's worker actor).
TRAIN_WORKER = "ray::RayTrainWorker"


def grace_problem(grace: float) -> str | None:
    """What is wrong with a notice's grace, in one line (None: nothing)."""
    if not GRACE_MIN_S <= grace <= GRACE_MAX_S or grace != int(grace):
        return f"--grace {grace:g}: must be a whole number of seconds from {GRACE_MIN_S} to {GRACE_MAX_S}"
    return None


def drain_argv(grace_s: int, why: str, node_id: str | None = None, address: str | None = None) -> tuple[str, ...]:
    """``ray drain-node`` of ``node_id`` (None: the node it runs on) for a
    preemption in ``grace_s`` seconds."""
    return ("ray", "drain-node", *((f"--address={address}",) if address else ()),
            *((f"--node-id={node_id}",) if node_id else ()), f"--reason={REASON}", f"--reason-message={why}",
            f"--deadline-remaining-seconds={int(grace_s)}")


# The hook: the drain, then a wait while a training worker runs in the pod
# (its processes read from /proc: the Ray image need not have procps).
# Python, not sh: the manifest's values may hold no "$" (envsubst).
_HOOK = """import os, subprocess, time
subprocess.run({argv!r})
def busy():
    for p in os.listdir('/proc'):
        try:
            if p.isdigit() and open('/proc/' + p + '/cmdline', 'rb').read().startswith({title!r}):
                return True
        except OSError:
            pass
    return False
while busy():
    time.sleep(1)
"""


def prestop_hook(grace_s: int = POD_GRACE_S) -> dict:
    """The worker container's ``lifecycle``: its preStop hook drains its
    own Ray node (the deadline: the pod's grace, ``grace_s``), then waits
    while a training worker runs."""
    argv = list(drain_argv(grace_s, "the pod is terminating: a preemption, a maintenance or a deletion"))
    return {"preStop": {"exec": {"command": ["python", "-c", _HOOK.format(argv=argv, title=TRAIN_WORKER.encode())]}}}
