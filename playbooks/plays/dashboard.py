"""The Ray dashboard: a port-forward to the head service (GKE), then the
check that the cluster has its head and every TPU worker."""
from __future__ import annotations

from typing import Any

from playbooks.access import connectors, ray_api
from playbooks.access.ray_api import version_fact
from playbooks.cloud.endpoints import dashboard, forward_command
from playbooks.cloud.slices import from_ray, ray_nodes_as_asked
from playbooks.config import paths
from playbooks.config.schema import Environment
from playbooks.core.facts import ABSENT, Fact, assume
from playbooks.core.step import Step, Verify, change, fail, ok

PLAY = "dashboard"
FORWARD_TIMEOUT = 30


def forward_step(env: Environment) -> Step:
    version = version_fact(dashboard(env), connectors.connector(env))

    def decide(look):
        v = look(version)
        if v is ABSENT:
            return change(forward_command(env), reason=f"port-forward started ({dashboard(env)})",
                          would=f"start the port-forward to {dashboard(env)}", found="no port-forward")
        if isinstance(v, dict) and v.get("ray_version"):
            return ok(f"Ray {v['ray_version']} dashboard at {dashboard(env)}")
        return fail(f"{dashboard(env)} answers, but not as a Ray dashboard: free port {env.dashboard_port} or set "
                    f"dashboard_port in the inventory")

    return Step(PLAY, f"port-forward {dashboard(env)}", decide, id="dashboard:forward",
                after=("raycluster:slices", "kube:credentials"), probes=(version,),
                verify=Verify(version, lambda v: f"not answering (see {paths.forward_log(env.name)})"
                              if v is ABSENT else None, timeout=FORWARD_TIMEOUT, interval=1))


def nodes_fact(env: Environment) -> Fact:
    """The tutorial's `ray list nodes --address ...`, read from the State API
    endpoint that command calls (no process: the ray CLI alone costs seconds
    of CPU, the request milliseconds)."""
    return assume(ray_api.nodes_fact(dashboard(env), connectors.connector(env)), ray_nodes_as_asked(env))


def count(nodes: Any) -> tuple[int, int]:
    alive = ray_api.alive(nodes)
    heads = sum(1 for n in alive if n.get("is_head_node"))
    tpus = sum(1 for n in alive if (n.get("resources_total") or {}).get("TPU"))
    return heads, tpus


def nodes_step(env: Environment) -> Step:
    """1 head and every TPU worker alive in Ray; with min_slices below
    slices, at least that many whole slices (the others named as waiting)."""
    probe = nodes_fact(env)
    want = env.slices * env.hosts_per_slice

    def decide(look):
        nodes = look(probe)
        if nodes is ABSENT:
            return fail(f"no Ray dashboard answers at {dashboard(env)}: run `invoke up`")
        heads, tpus = count(nodes)
        s = from_ray(env, nodes)
        if heads == 1 and tpus == want:
            return ok(f"1 head + {tpus} TPU workers alive")
        if heads == 1 and s.enough(env.min_slices):
            return ok(f"1 head + {tpus} of {want} TPU workers alive; {s.text(env.min_slices)}",
                      notes=[s.waiting_text()])
        return fail(f"want 1 head + {want} TPU workers, found {heads} head(s) + {tpus} TPU worker(s) alive"
                    + ("" if s.complete else f"; {s.text(env.min_slices)}"))

    return Step(PLAY, "Ray nodes", decide, id="dashboard:nodes", after=("dashboard:forward",), probes=(probe,))


def steps(env: Environment) -> list[Step]:
    if env.platform.simulated:
        return [nodes_step(env)]
    return [forward_step(env), nodes_step(env)]
