"""A pod's delete, bounded: the one way the plays delete a pod (a
quarantine's worker pods, chaos.delete-worker's and chaos.preempt-worker's).

`kubectl delete pod` waits (its default ``--wait``) until the pod is gone,
and its default ``--timeout=0s`` waits a week (168 h: kubectl's
``pkg/cmd/delete/delete.go``): for a watch, forever. A pod
whose node's kubelet is dead (a NotReady node: the sick host a quarantine
moves off) is never confirmed gone: it stays Terminating ("If the node
hosting a pod is down or cannot reach the API server, termination may take
significantly longer than the grace period":
https://kubernetes.io/docs/reference/kubectl/generated/kubectl_delete/).
So each delete here says its bound, ``--timeout`` (the inventory's
``stuck_pod_after``, and a longer grace's excess over the default 30 s:
the grace given, else the worker pods' own, ``choices.worker_grace_s``),
and the connector's command timeout ends the process ``BACKSTOP_S`` later.

A delete that fails is looked at again, fresh (``when_stuck``: the step's
``instead``): a pod still there with its deletionTimestamp is stuck, and
``stuck_pod`` says what then: ``force``, deleted again with
``--grace-period=0 --force`` (the API server removes it at once, without
the kubelet's word: https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-termination-forced),
or ``leave``, said and left Terminating, the step going on. Either way one
line per pod says why: how long it waited, and its node's state."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from playbooks.access.cli_clients import fact, kube_object
from playbooks.cloud import pods as P
from playbooks.cloud.gke import kube
from playbooks.config.choices import worker_grace_s
from playbooks.config.host_notice import POD_GRACE_S
from playbooks.config.schema import Environment
from playbooks.core.command import Command
from playbooks.core.facts import ABSENT, Fact
from playbooks.core.step import Act, Decision, Look, change

FORCE = "force"
# The connector ends a delete's kubectl this long after its own --timeout
# (a kubectl that does not end by itself).
BACKSTOP_S = 30
# A force delete's own bound: the API server removes the pod at once (a
# finalizer would still hold it: then the step fails, bounded).
FORCE_TIMEOUT_S = 30


def bound(env: Environment, grace: int | None = None) -> int:
    """Seconds a delete of a pod given ``grace`` (None: its own, the
    worker pods' grace) waits for it to go."""
    return env.stuck_pod_after + max(0, (grace if grace is not None else worker_grace_s(env)) - POD_GRACE_S)


def _bounded(env: Environment, pod: str, seconds: int, *flags: str) -> Command:
    c = kube(env, "delete", "pod", pod, "--namespace", env.namespace, *flags, f"--timeout={seconds}s")
    return dataclasses.replace(c, timeout=seconds + BACKSTOP_S)


def delete(env: Environment, pod: str, grace: int | None = None) -> Command:
    """`kubectl delete pod` of ``pod`` (with ``grace``: that grace period),
    waiting at most ``bound`` for it to go."""
    return _bounded(env, pod, bound(env, grace), *((f"--grace-period={grace}",) if grace is not None else ()))


def force(env: Environment, pod: str) -> Command:
    """The pod removed at once (grace period 0, ``--force``)."""
    return _bounded(env, pod, FORCE_TIMEOUT_S, "--grace-period=0", "--force")


def leaves(env: Environment) -> bool:
    """A stuck pod is left Terminating (``stuck_pod: leave``), not forced."""
    return env.stuck_pod != FORCE


def pod_fact(env: Environment, pod: str) -> Fact:
    """One pod as the API server has it (ABSENT: gone)."""
    return fact(f"pod {pod}", kube(env, "get", "pod", pod, "--namespace", env.namespace, "--ignore-not-found",
                                   "--output=json"), kube_object(f"pod {pod}"),
                describe=lambda o: "Terminating" if terminating(o) else "there, not deleted")


def node_fact(env: Environment, node: str) -> Fact:
    return fact(f"node {node}", P.node_command(env, node), kube_object(f"node {node}"),
                describe=lambda n: "Ready" if P.ready(n) else "NotReady")


def terminating(pod: Any) -> bool:
    """Deleted (its deletionTimestamp set), not yet gone."""
    return pod is not ABSENT and bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def why_stuck(env: Environment, look: Look, pod: dict) -> str:
    """Why a Terminating pod is still there, as far as its node says: the
    node NotReady (its kubelet's word never came), gone, or Ready; a
    finalizer that holds it."""
    node = (pod.get("spec") or {}).get("nodeName")
    if not node:
        said = "it has no node"
    else:
        n = look(node_fact(env, node))
        if n is ABSENT:
            said = f"its node {node} is gone"
        elif P.ready(n):
            said = f"its node {node} is Ready"
        else:
            message = (P.conditions(n).get("Ready") or {}).get("message")
            said = f"its node {node} is NotReady" + (f" ({message})" if message else "")
    held = (pod.get("metadata") or {}).get("finalizers")
    return said + (f"; finalizers {', '.join(held)}" if held else "")


def when_stuck(env: Environment, pods: Sequence[str], grace: int | None, reason: str, then: Sequence[Act] = (),
               left: set[str] | None = None) -> Callable[[Look, str], Decision | None]:
    """The ``instead`` of a change that deleted ``pods`` (each with
    ``delete``, then ``then``): after a failure, each pod looked at again.
    A stuck one (still Terminating) force-deleted or left, as
    ``stuck_pod`` says (a left one goes into ``left``: the step's verify
    lets it be); one not deleted yet (the change stopped at an earlier
    failure) deleted once more. None, the failure standing: nothing stuck
    and nothing to delete again, or a pod still there after its second
    delete or its force delete."""
    waited, kept = bound(env, grace), left if left is not None else set()
    forced: set[str] = set()      # force-deleted: still there after it, the failure stands
    again_once: set[str] = set()  # deleted once more: the same
    said: list[str] = []          # every round's lines, for the step's reason
    by_force = not leaves(env)

    def instead(look: Look, why: str) -> Decision | None:
        now = {p: look(pod_fact(env, p)) for p in pods}
        stuck = [p for p, o in now.items() if terminating(o) and p not in kept]
        again = [p for p, o in now.items() if o is not ABSENT and not terminating(o)]
        if (not stuck and not again) or forced & set(stuck) or again_once & set(again):
            return None
        again_once.update(again)
        lines = [f"pod {p} still Terminating after {waited}s: {why_stuck(env, look, now[p])}; "
                 f"{'force-deleted' if by_force else 'left'} (stuck_pod: {env.stuck_pod})" for p in stuck]
        if by_force:
            forced.update(stuck)
        else:
            kept.update(stuck)
        said.extend(lines)
        acts = [*(force(env, p) for p in stuck if by_force), *(delete(env, p, grace) for p in again), *then]
        return change(*acts, reason="; ".join([reason, *said]), notes=lines, instead=instead)

    return instead
