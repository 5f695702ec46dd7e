"""The Ray dashboard: a port-forward to the head service (GKE), then the
check that the cluster has its head and every TPU worker."""
from __future__ import annotations

from typing import Any

from .. import hosts, rayapi
from .. import tutorial as T
from ..core.command import Command, quote
from ..core.facts import ABSENT, Action, Fact, assume
from ..core.play import Outcome, StepContext
from ..core.procs import PidFile
from ..core.recap import CHANGED, FAILED, OK
from ..core.step import Step
from ..gke import kube, workers
from ..rayapi import version_fact
from ..schema import Environment
from .cluster import credentials_step

PLAY = "dashboard"


def address(env: Environment) -> str:
    if env.kind == "local":
        return f"http://{env.ray_ip}:{env.dashboard_port}"
    return f"http://localhost:{env.dashboard_port}"


def forward_pidfile(env: Environment) -> PidFile:
    """On the host that runs the port-forward (this machine or the
    controller), so a later run finds and stops it."""
    return PidFile(f".state/{env.name}", "port-forward", marker="port-forward", via=hosts.connector(env))


def forward_command(env: Environment) -> Command:
    return Command(kube(env, "port-forward", f"svc/{T.HEAD_SERVICE}", f"{env.dashboard_port}:{T.DASHBOARD_PORT}",
                        "--namespace", env.namespace).argv,
                   background=True, log=f".state/{env.name}/port-forward.log")


def forward_step(env: Environment) -> Step:
    version = version_fact(address(env), hosts.connector(env))
    pf = forward_pidfile(env)

    def run(ctx):
        v = ctx.look(version)
        if v is not ABSENT:
            if isinstance(v, dict) and v.get("ray_version"):
                return Outcome(OK, f"Ray {v['ray_version']} dashboard at {address(env)}")
            return Outcome(FAILED, f"{address(env)} answers, but not as a Ray dashboard: free port "
                                   f"{env.dashboard_port} or set dashboard_port in the inventory")
        pid = ctx.spawn(forward_command(env))
        ctx.act(Action(f"echo $! > {quote(str(pf.path))}", lambda: pf.write(pid)))
        if not ctx.acting:
            ctx.log.emit("verify", version.line())
            return Outcome(CHANGED, f"would start the port-forward to {address(env)}")
        from ..core.step import poll
        why = poll(lambda: None if ctx.look(version, fresh=True) is not ABSENT else "not answering", 30, 1,
                   sleep=ctx.sleep)
        if why:
            return Outcome(FAILED, f"port-forward did not answer in 30s; see .state/{env.name}/port-forward.log")
        return Outcome(CHANGED, f"port-forward started ({address(env)})")

    return Step(PLAY, f"port-forward {address(env)}", run=run, id="dashboard:forward",
                after=("raycluster:apply", "kube:credentials"), probes=(version,))


def nodes_fact(env: Environment) -> Fact:
    """The tutorial's `ray list nodes --address ...`, read from the State API
    endpoint that command calls (no process: the ray CLI alone costs seconds
    of CPU, the request milliseconds). A dry run assumes no answer."""
    return assume(rayapi.nodes_fact(address(env), hosts.connector(env)), ABSENT)


def count(nodes: Any) -> tuple[int, int]:
    alive = [n for n in nodes or [] if n.get("state") == "ALIVE"]
    heads = sum(1 for n in alive if n.get("is_head_node"))
    tpus = sum(1 for n in alive if (n.get("resources_total") or {}).get("TPU"))
    return heads, tpus


def nodes_step(env: Environment) -> Step:
    probe = nodes_fact(env)
    want = workers(env)

    def run(ctx: StepContext) -> Outcome:
        nodes = ctx.look(probe)
        if nodes is ABSENT:
            if not ctx.runner.probing:
                return Outcome(OK, f"would check: 1 head + {want} TPU workers")
            return Outcome(FAILED, f"no Ray dashboard answers at {address(env)}: run `invoke dashboard`")
        heads, tpus = count(nodes)
        if heads == 1 and tpus == want:
            return Outcome(OK, f"1 head + {tpus} TPU workers alive")
        return Outcome(FAILED, f"want 1 head + {want} TPU workers, found {heads} head(s) + {tpus} TPU worker(s) alive")

    return Step(PLAY, "Ray nodes", run=run, id="dashboard:nodes", after=("dashboard:forward",),
                probes=(probe,))


def steps(env: Environment) -> list[Step]:
    if env.kind == "local":
        return [nodes_step(env)]
    return [credentials_step(env, PLAY), forward_step(env), nodes_step(env)]
