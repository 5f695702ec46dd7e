"""The local environment's Ray cluster (the twin of the RayCluster on GKE):
start its head and its simulated TPU hosts, and stop them. What the twin is
made of is in ``playbooks/twin/nodes.py``; its chaos (a host killed, frozen,
made sick) is the one chaos play's, ``plays/chaos.py``."""
from __future__ import annotations

from typing import Any

from playbooks.access import connectors
from playbooks.access.ray_api import alive, nodes_fact, version_fact
from playbooks.cloud.endpoints import dashboard
from playbooks.config.schema import Environment
from playbooks.core.command import quote
from playbooks.core.facts import ABSENT, Action, Fact, assume
from playbooks.core.step import Broken, Step, Verify, change, fail, ok, skip, wait
from playbooks.runs import quarantine_record as quarantined
from playbooks.twin.node_start import NODE_POLL, START_TIMEOUT, host_verify, start_host, started
from playbooks.twin.nodes import (
    HEAD,
    Host,
    head_command,
    hosts_of,
    hosts_state_fact,
    late_seconds,
    log,
    node_state_fact,
    pid_fact,
    pidfile,
    pod_type,
    port_range,
    registered,
    slices_of,
)

PLAY = "twin"


def ports_taken_fact(env: Environment) -> Fact:
    lo, hi = port_range(env)

    def look() -> list[int]:
        here = connectors.this_machine()
        return [p for p in range(lo, hi + 1) if here.port_open(env.ray_ip, p)]

    return Fact(name="local ports", python=look, assumed=[],
                display=f"ss -ltn 'sport >= :{lo} and sport <= :{hi}'  # a port of the local nodes already taken",
                describe=lambda ps: f"port {ps[0]} taken" if ps else "free")


def head_step(env: Environment) -> Step:
    pidf, taken = pid_fact(env, HEAD), ports_taken_fact(env)
    version = version_fact(dashboard(env), connectors.this_machine())

    def decide(look):
        running, answering = look(pidf), look(version)
        if running and answering is not ABSENT:
            return ok(f"Ray head running at {dashboard(env)} (Ray {answering.get('ray_version')})")
        if running:
            return wait(f"the Ray head's process runs; its dashboard at {dashboard(env)} does not answer yet")
        ports = look(taken)
        if answering is not ABSENT or ports:
            lo, hi = port_range(env)
            what = f"port {ports[0]} (of {lo}-{hi}, the local nodes' ports)" if ports else dashboard(env)
            return fail(f"{what} is taken by a process this project did not start (pid file "
                        f"{pidfile(env, HEAD).path}): stop it, or move gcs_port/dashboard_port in the inventory")
        return change(head_command(env), reason=f"Ray head started at {dashboard(env)}",
                      would=f"start the Ray head at {dashboard(env)}", found="not running")

    head_up = node_state_fact(env, HEAD, lambda nodes: any(n.get("is_head_node") for n in alive(nodes)),
                              "the head node ALIVE")
    return Step(PLAY, f"Ray head {dashboard(env)}", decide, id="twin:head", probes=(pidf, version),
                verify=Verify(head_up, started(env, HEAD, "the Ray head"), timeout=START_TIMEOUT, interval=NODE_POLL))


REHEARSAL = "rehearse_late_slice: a slice that comes late, as a flex-start pool's nodes do"


def host_step(env: Environment, host: Host) -> Step:
    pidf, nodes = pid_fact(env, host.name), nodes_fact(dashboard(env), connectors.this_machine())
    late = late_seconds(env, host)
    held = quarantined.fact(env)

    def decide(look):
        running, listed = look(pidf), look(nodes)
        if running:
            if listed is ABSENT:
                return fail(f"no Ray head answers at {dashboard(env)}: run `invoke up`")
            if registered(listed, host):
                return ok(f"TPU host {host.name} is in the cluster")
            if late:
                return ok(f"TPU host {host.name}'s process runs; it joins {late:g}s after its start ({REHEARSAL})")
            return wait(f"TPU host {host.name}'s process runs; it has not joined yet")
        if why := quarantined.held_out(host.name, look(held)):
            return skip(why)
        shape = f"({pod_type(env)}, {env.chips_per_host} chips)"
        if late:
            return start_host(env, host, listed, f"TPU host {host.name} started {shape}; it joins {late:g}s later "
                                                  f"({REHEARSAL})",
                               f"start TPU host {host.name} {shape}, joining {late:g}s later ({REHEARSAL})", late=late)
        return start_host(env, host, listed, f"TPU host {host.name} joined {shape}",
                           f"start TPU host {host.name} {shape}")

    return Step(PLAY, f"TPU host {host.name}", decide, id=f"twin:{host.name}", after=("twin:head",),
                probes=(pidf, nodes), verify=host_verify(env, host))


def slices_step(env: Environment, after: str) -> Step:
    """Done when min_slices slices are whole (every host joined); the
    others are named as waiting (in the recap, status, the heartbeats)."""
    probe, held = hosts_state_fact(env), quarantined.fact(env)
    need = env.min_slices
    longest = max((late_seconds(env, h) for h in hosts_of(env)), default=0.0)

    def decide(look):
        s = slices_of(env, look(probe))
        if s.enough(need):
            return ok(s.text(need), notes=[s.waiting_text()])
        # A quarantined host never joins: said at once, not after a wait.
        out = [(h.slice, why) for h in hosts_of(env) if (why := quarantined.held_out(h.name, look(held)))]
        if out and env.slices - len({i for i, _ in out}) < need:
            return fail(f"{s.text(need)}: {out[0][1]}")
        return wait(s.text(need))

    def check(state: Any) -> str | None:
        s = slices_of(env, state)
        if s.enough(need):
            return None
        gone = [f"TPU host {n} exited: {v.get('exited')}; see {log(env, n)}" for n, v in state.items()
                if not v.get("process")]
        if gone:
            raise Broken(gone[0])
        return s.why(need)

    return Step(PLAY, "TPU slices", decide, id="twin:slices", after=(after,), probes=(probe,),
                verify=Verify(probe, check, timeout=START_TIMEOUT + longest, interval=NODE_POLL))


def steps(env: Environment) -> list[Step]:
    """Bring the local cluster up (a running one is reused). Hosts join one
    after another: Ray nodes starting at once on one machine race for ports.
    Then the slices: min_slices of them whole."""
    out = [head_step(env)]
    for h in hosts_of(env):
        step = host_step(env, h)
        step.after = (out[-1].id,)
        out.append(step)
    return out + [slices_step(env, out[-1].id)]


def stop_step(env: Environment, name: str, play: str) -> Step:
    pidf = assume(pid_fact(env, name), True)
    pf = pidfile(env, name)

    def decide(look):
        if not look(pidf):
            return ok(f"{name} is not running")
        return change(Action(f"kill -TERM $(cat {quote(str(pf.path))})  # with its child processes",
                             lambda: pf.stop(grace=10.0)),
                      reason=f"stopped {name}", would=f"stop {name}", found="running")

    return Step(play, f"stop {name}", decide, id=f"{play}:stop-{name}",
                verify=Verify(pidf, lambda a: "still running" if a else None, timeout=30, interval=NODE_POLL))


def stop_steps(env: Environment, play: str = "teardown") -> list[Step]:
    return [stop_step(env, h.name, play) for h in reversed(hosts_of(env))] + [stop_step(env, HEAD, play)]
