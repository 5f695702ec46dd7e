"""§9 Chaos: delete one Ray TPU worker pod while a job trains, as the
tutorial does (find it by label, delete it)."""
from __future__ import annotations

import dataclasses
import time
from typing import Any

from playbooks.access.cli_clients import fact
from playbooks.cloud.gke import kube
from playbooks.config import tutorial as T
from playbooks.config.schema import Environment
from playbooks.core.command import placeholder
from playbooks.core.errors import ProbeFailed
from playbooks.core.facts import ABSENT, Action, Completed
from playbooks.core.step import Step, change, fail
from playbooks.runs import chaos_target, placement, timeline
from playbooks.runs import events as E


def first_worker_fact(env: Environment):
    c = kube(env, "get", "pods", "-l", T.WORKER_SELECTOR, "--namespace", env.namespace,
             "-o", "jsonpath={.items[0].metadata.name}")
    c = dataclasses.replace(c, binds="POD")

    def parse(r: Completed) -> Any:
        if r.ok:
            return r.stdout.strip() or ABSENT
        if "array index out of bounds" in r.stderr:
            return ABSENT  # the list came back empty: no worker pod
        raise ProbeFailed("worker pod", r.line, r.rc, r.stdout, r.stderr,
                          why=f"could not look: {r.first_error_line()}")

    return fact("a Ray TPU worker pod", c, parse, assumed=placeholder("POD"))


def delete_step(env: Environment, target: str = placement.FIRST) -> Step:
    """The tutorial's find-then-delete of the first worker pod; or, with
    ``target``, the pod of the running job's rank 0, a peer's, or a pod by
    name (a worker's hostname is its pod's name)."""
    probe = first_worker_fact(env)
    aimed = chaos_target.fact(env, target, lambda w: w.pod, "pod") if target in (
        placement.RANK0, placement.PEER) else None

    def delete(pod: str, why: str = ""):
        return change(kube(env, "delete", "pod", pod, "--namespace", env.namespace),
                      record(env, E.WORKER_LOST, pod=pod, by="chaos", target=target,
                             cause="the pod deleted (chaos.delete-worker)"),
                      reason=f"deleted pod {pod}{why}", found=f"pod {pod} running")

    def decide(look):
        if aimed is not None:
            pod, why = look(aimed)
            return fail(f"--target={target}: {why}") if pod is None else delete(pod, f" ({why})")
        if target != placement.FIRST:
            return delete(target)
        pod = look(probe)
        if pod is ABSENT:
            return fail(f"no pod labelled {T.WORKER_SELECTOR} in namespace {env.namespace}: is the RayCluster up?")
        return delete(pod)

    return Step("chaos", "delete one Ray TPU worker pod", decide, id="chaos:delete", after=("kube:credentials",))


def steps(env: Environment, target: str = placement.FIRST) -> list[Step]:
    """KubeRay recreates the deleted pod itself: nothing to restore. (The
    local twin's chaos is ``plays/local_cluster.py``.)"""
    return [delete_step(env, target)]


def record(env: Environment, kind: str, **fields: Any) -> Action:
    """A chaos event, in the timeline of the running job's run (found
    through the Ray dashboard's port-forward; none: not recorded)."""
    def go() -> None:
        timeline.record(env, kind, **fields)
    return Action(timeline.record_line(env, kind), go)


# What stops (or resumes) the training worker in a worker pod: every process
# whose command line is Ray Train's worker's (its raylet, the pod's Ray node,
# stays up). /proc, not pkill: the Ray image need not have procps.
SIGNAL_WORKERS = ('n=0; for d in /proc/[0-9]*; do case "$(tr "\\0" " " 2>/dev/null < "$d/cmdline")" in '
                  '"ray::RayTrainWorker"*) kill -{sig} "${{d#/proc/}}" && n=$((n+1));; esac; done; '
                  '[ "$n" -gt 0 ] || {{ echo "no ray::RayTrainWorker process in this pod" >&2; exit 1; }}')


def signal_workers(env: Environment, pod: str, sig: str):
    return kube(env, "exec", pod, "--namespace", env.namespace, "--", "sh", "-c", SIGNAL_WORKERS.format(sig=sig))


def hang_steps(env: Environment, restore_after: float) -> list[Step]:
    """Stop the trainer process in one worker pod (SIGSTOP through kubectl
    exec): the pod and its Ray node stay up, the job hangs; resume it after
    ``restore_after`` seconds (SIGCONT; 0: leave it stopped)."""
    probe = first_worker_fact(env)

    def decide(look):
        pod = look(probe)
        if pod is ABSENT:
            return fail(f"no pod labelled {T.WORKER_SELECTOR} in namespace {env.namespace}: is the RayCluster up?")
        then: tuple = ()
        if restore_after > 0:
            then = (Action(f"sleep {restore_after:g}", lambda: time.sleep(restore_after)),
                    signal_workers(env, pod, "CONT"),
                    record(env, E.WORKER_RESUMED, pod=pod, by="chaos",
                           cause=f"SIGCONT after {restore_after:g}s (chaos.hang-worker)"))
        return change(signal_workers(env, pod, "STOP"),
                      record(env, E.WORKER_HUNG, pod=pod, by="chaos",
                             cause="SIGSTOP of its training worker (chaos.hang-worker)"), *then,
                      reason=f"stopped the training worker in pod {pod}" + (
                          f", resumed it after {restore_after:g}s" if restore_after > 0 else
                          f" (left stopped: `{signal_workers(env, pod, 'CONT').line()}` resumes it)"),
                      found=f"pod {pod} training")

    return [Step("chaos", "stop the training worker in one Ray TPU worker pod", decide, id="chaos:hang",
                 after=("kube:credentials",))]
