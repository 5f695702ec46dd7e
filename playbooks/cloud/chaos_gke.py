"""GKE's own way to act on a TPU host for the chaos play (``plays/chaos.py``):
a Ray TPU worker pod found by the tutorial's label (or by name, or the pod
of the running job's rank 0 or a peer), deleted (KubeRay recreates it: there
is nothing to bring back), its training worker stopped and resumed through
`kubectl exec`. A real TPU host cannot be made sick from outside: said in
one line (``CANNOT_SICKEN``). Facts, commands and their words; the steps
are the play's."""
from __future__ import annotations

import dataclasses
import re
from typing import Any

from playbooks.access import connectors
from playbooks.access.cli_clients import fact
from playbooks.cloud import kube_objects, pod_delete
from playbooks.cloud import pods as P
from playbooks.cloud.gke import kube
from playbooks.cloud.slice_ends import MAINTENANCE_LABEL
from playbooks.config import tutorial as T
from playbooks.config.schema import Environment
from playbooks.core.command import Command, placeholder, shown
from playbooks.core.errors import ProbeFailed
from playbooks.core.facts import ABSENT, Action, Completed, Fact

# A pod's name: a DNS-1123 subdomain (what `kubectl delete pod` takes).
POD_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")

# Why there is no chaos.sicken-worker on GKE. A TPU VM's chips, driver and
# firmware are its own: nothing outside it fails them. Its pod's env
# (TPU_VISIBLE_CHIPS, say) is the RayCluster's, for every worker at once,
# and a container's env cannot change while it runs (a restart of its `ray
# start` is the same container again, with the same env).
CANNOT_SICKEN = ("on GKE there is no way to make a real TPU host sick from outside it (its chips and driver are "
                 "its own; a worker pod's env is the whole RayCluster's): the twin only (a local environment)")


def first_worker_fact(env: Environment) -> Fact:
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


# What stops (or resumes) the training worker in a worker pod: every process
# whose command line is Ray Train's worker's (its raylet, the pod's Ray node,
# stays up). /proc, not pkill: the Ray image need not have procps.
SIGNAL_WORKERS = ('n=0; for d in /proc/[0-9]*; do case "$(tr "\\0" " " 2>/dev/null < "$d/cmdline")" in '
                  '"ray::RayTrainWorker"*) kill -{sig} "${{d#/proc/}}" && n=$((n+1));; esac; done; '
                  '[ "$n" -gt 0 ] || {{ echo "no ray::RayTrainWorker process in this pod" >&2; exit 1; }}')


def signal_workers(env: Environment, pod: str, sig: str) -> Command:
    return kube(env, "exec", pod, "--namespace", env.namespace, "--", "sh", "-c", SIGNAL_WORKERS.format(sig=sig))


class GkeWorkers:
    """The chaos play's target on GKE: a pod is a host (a worker's
    hostname is its pod's name)."""

    noun = "pod"
    cannot_sicken = CANNOT_SICKEN
    kill_title, kill_id = "delete one Ray TPU worker pod", "chaos:delete"
    hang_title = "stop the training worker in one Ray TPU worker pod"
    after = ("kube:credentials",)

    def __init__(self, env: Environment):
        self.env = env

    def name_of(self, worker: Any) -> str | None:
        return worker.pod

    def target_problem(self, target: str, targets: tuple[str, ...]) -> str | None:
        if not POD_NAME.match(target):
            return f"--target {target!r}: not {', '.join(targets)} nor a pod's name (a DNS-1123 subdomain)"
        return None

    def none_running(self) -> str:
        return (f"no pod labelled {T.WORKER_SELECTOR} in namespace {self.env.namespace}: is the RayCluster up?")

    # -- choose (each chooser answers ("act", pod, why) or ("fail", None, why))
    def picker(self) -> _Picker:
        return _Picker(self)

    def label(self, pod: str) -> str:
        return f"pod {pod}"

    def fields(self, pod: str) -> dict[str, Any]:
        return {"pod": pod}

    # -- kill
    kill_cause = "the pod deleted (chaos.delete-worker)"

    def kill(self, pod: str) -> tuple[Any, ...]:
        """The pod deleted, bounded (``cloud/pod_delete``: a pod still
        Terminating after it is for ``stuck``)."""
        return (pod_delete.delete(self.env, pod),)

    def stuck(self, pod: str, grace: int | None, reason: str, then: tuple[Any, ...]) -> Any:
        """What the kill does when its delete fails: a pod still
        Terminating (its node's kubelet dead) force-deleted or left, as
        ``stuck_pod`` says, then ``then``."""
        return pod_delete.when_stuck(self.env, [pod], grace, reason, then)

    def kill_words(self, pod: str, why: str) -> tuple[str, str]:
        """(reason, would) of the kill."""
        return f"deleted pod {pod}{why}", ""

    # -- a notice, then the end (chaos.preempt-worker)
    def ray_nodes(self) -> None:
        """The pod's own preStop hook names its node: nothing to look up."""
        return None

    def preempt_title(self, grace: int) -> str:
        return f"delete one Ray TPU worker pod with a grace period of {grace} s"

    def preempt_cause(self, grace: int) -> str:
        return f"the pod deleted with a grace period of {grace} s (chaos.preempt-worker)"

    def preempt_words(self, pod: str, grace: int, why: str) -> tuple[str, str]:
        return f"deleted pod {pod}{why} with a grace period of {grace} s (its preStop hook gave the notice)", ""

    def preempt_problem(self, pod: str, nodes: Any) -> str | None:
        return None

    def preempt(self, pod: str, grace: int, nodes: Any, given: Any, lost: Any) -> tuple[Any, ...]:
        """The pod deleted with a grace period, as GKE ends a Spot VM's pods:
        its preStop hook drains its Ray node (config/host_notice.py), the kubelet
        ends it when the grace is over; `kubectl delete` waits for that."""
        return (given, pod_delete.delete(self.env, pod, grace), lost)

    # -- a host maintenance for a slice (chaos.maintenance)
    def slice_of(self, pod: str) -> list[str]:
        return [pod]

    def maintenance(self, pod: str, hosts: list[str], in_s: float, at: float, scheduled: Any,
                    lost: list[Any]) -> tuple[Any, ...]:
        """The pod's slice's nodes labelled as GKE labels a scheduled host
        maintenance (``${AT}``: now + in_s, epoch seconds). GKE's own
        maintenance is not simulated: the slice is not ended at that time."""
        command = kube(self.env, "label", "nodes", "-l", f"{P.NODEPOOL_LABEL}=${{POOL}}",
                       f"{MAINTENANCE_LABEL}={placeholder('AT')}", "--overwrite")

        def go() -> None:
            node = kube_objects.kubectl_json(self.env, "pod", pod, "--namespace", self.env.namespace)
            pool = kube_objects.node(self.env, (node.get("spec") or {}).get("nodeName") or "")
            name = (((pool or {}).get("metadata") or {}).get("labels") or {}).get(P.NODEPOOL_LABEL)
            if not name:
                raise RuntimeError(f"pod {pod}: its node's pool is not known")
            argv = kube(self.env, "label", "nodes", "-l", f"{P.NODEPOOL_LABEL}={name}",
                        f"{MAINTENANCE_LABEL}={int(at)}", "--overwrite").argv
            r = connectors.connector(self.env).run(argv, timeout=60)
            if r.rc != 0:
                raise RuntimeError(f"{' '.join(argv)}: exit {r.rc}: {r.stderr.strip()[-200:]}")

        # go() runs the label through the connector: say, as a dry run says of a command, what answers it
        words = connectors.connector(self.env).in_process(kube(
            self.env, "label", "nodes", "-l", f"{P.NODEPOOL_LABEL}=pool", f"{MAINTENANCE_LABEL}=0", "--overwrite").argv)
        said = shown(f"  # POOL: pod {pod}'s node pool; AT: now + {in_s:g} s") + (f"  # in-process: {words}"
                                                                                   if words else "")
        return (Action(command.line() + said, go), scheduled)

    def restorer(self) -> None:
        """KubeRay recreates a deleted pod itself: nothing to bring back."""
        return None

    # -- freeze (a hang) and resume
    def freezer(self) -> _Freezer:
        return _Freezer(self)

    def freeze(self, pod: str) -> Command:
        return signal_workers(self.env, pod, "STOP")

    def resume(self, pod: str) -> Command:
        return signal_workers(self.env, pod, "CONT")

    def frozen_verify(self) -> None:
        """A stopped worker is not looked at (its pod is): no verify."""
        return None

    def resumer(self) -> None:
        """No look at a stopped worker: the resume is in the freeze's change."""
        return None

    def hang_fields(self, pod: str) -> dict[str, Any]:
        return {"pod": pod}

    def hang_cause(self, pod: str) -> str:
        return "SIGSTOP of its training worker"

    def hang_words(self, pod: str, restore_after: float) -> tuple[str, str, str]:
        """(reason, would, found) of the freeze (with its resume: one change)."""
        return (f"stopped the training worker in pod {pod}" + (
            f", resumed it after {restore_after:g}s" if restore_after > 0 else
            f" (left stopped: `{self.resume(pod).line()}` resumes it)"), "", f"pod {pod} training")


class _Picker:
    """A pod by the tutorial's label (the first), or by name (taken as given)."""

    def __init__(self, way: GkeWorkers):
        self.way, self.probe = way, first_worker_fact(way.env)

    def first(self, look: Any) -> tuple[str, Any, str]:
        pod = look(self.probe)
        return ("fail", None, self.way.none_running()) if pod is ABSENT else ("act", pod, "")

    def named(self, look: Any, name: str, why: str, target: str, aimed: bool) -> tuple[str, Any, str]:
        return "act", name, why


class _Freezer(_Picker):
    """The pod whose training worker is stopped: the first by label (a
    stopped worker is not looked at)."""
