"""§9 Chaos: delete one Ray TPU worker pod while a job trains, as the
tutorial does (find it by label, delete it)."""
from __future__ import annotations

import dataclasses
from typing import Any

from .. import tutorial as T
from ..clients import fact
from ..core.command import placeholder
from ..core.errors import ProbeFailed
from ..core.facts import ABSENT, Completed
from ..core.step import Step, change, fail
from ..gke import kube
from ..schema import Environment


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


def delete_step(env: Environment) -> Step:
    probe = first_worker_fact(env)

    def decide(look):
        pod = look(probe)
        if pod is ABSENT:
            return fail(f"no pod labelled {T.WORKER_SELECTOR} in namespace {env.namespace}: is the RayCluster up?")
        return change(kube(env, "delete", "pod", pod, "--namespace", env.namespace), reason=f"deleted pod {pod}",
                      found=f"pod {pod} running")

    return Step("chaos", "delete one Ray TPU worker pod", decide, id="chaos:delete", after=("kube:credentials",))


def steps(env: Environment) -> list[Step]:
    """KubeRay recreates the deleted pod itself: nothing to restore. (The
    local twin's chaos is ``plays/twin.py``.)"""
    return [delete_step(env)]
