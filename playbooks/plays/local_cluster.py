"""The local environment's Ray cluster (the twin of the RayCluster on GKE):
start its head and its simulated TPU hosts, stop them, and kill one as a
preemption would. What the twin is made of is in ``playbooks/twin/nodes.py``."""
from __future__ import annotations

import time
from typing import Any

from playbooks.access import connectors
from playbooks.access.ray_api import alive, nodes_fact, version_fact
from playbooks.cloud.endpoints import dashboard
from playbooks.config.schema import Environment
from playbooks.core.command import Command, placeholder, quote, shown
from playbooks.core.facts import ABSENT, Action, Fact, assume
from playbooks.core.step import Await, Broken, Step, Verify, change, fail, ok, skip, wait
from playbooks.runs import chaos_target, placement, timeline
from playbooks.runs import events as E
from playbooks.runs import quarantine_record as quarantined
from playbooks.twin.nodes import (
    HEAD,
    Host,
    head_command,
    host_command,
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
    workers_fact,
)

PLAY = "twin"
START_TIMEOUT = 90.0
# A killed host's node stays ALIVE in Ray's list until Ray notices: a new
# node started before that would stand beside a ghost of itself.
GHOST_TIMEOUT = 90.0


def ports_taken_fact(env: Environment) -> Fact:
    lo, hi = port_range(env)

    def look() -> list[int]:
        here = connectors.this_machine()
        return [p for p in range(lo, hi + 1) if here.port_open(env.ray_ip, p)]

    return Fact(name="local ports", python=look, assumed=[],
                display=f"ss -ltn 'sport >= :{lo} and sport <= :{hi}'  # a port of the local nodes already taken",
                describe=lambda ps: f"port {ps[0]} taken" if ps else "free")


def _started(env: Environment, name: str, what: str, join: bool = True):
    """The verify of a node just started: its process alive, then joined
    (``join``; a late host of the rehearsal joins later: its process alive
    is enough); a process that exits ends the wait at once, with its log's
    line."""
    def check(s: Any) -> str | None:
        if not s.get("process"):
            raise Broken(f"{what} exited: {s.get('exited')}; see {log(env, name)}")
        if not s.get("answering"):
            return f"dashboard not answering yet (see {log(env, name)})"
        if join and not s.get("joined"):
            return f"{what} not registered yet (see {log(env, name)})"
        return None
    return check


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
                verify=Verify(head_up, _started(env, HEAD, "the Ray head"), timeout=START_TIMEOUT, interval=2))


def _ghost_gone(env: Environment, host: Host) -> Await:
    return Await(nodes_fact(dashboard(env), connectors.this_machine()),
                 lambda ns: "still listed" if registered(ns, host) else None,
                 f"the old {host.name} gone from Ray's nodes", timeout=GHOST_TIMEOUT, interval=2)


def _start_host(env: Environment, host: Host, nodes: Any, reason: str, would: str, *before: Any,
                late: float = 0.0, after: tuple[Any, ...] = ()):
    """The change that starts a host (after its ghost is gone, if listed),
    then ``after`` (the chaos restore's event)."""
    ghost = (_ghost_gone(env, host),) if nodes is not ABSENT and registered(nodes, host) else ()
    return change(*before, *ghost, host_command(env, host, late), *after, reason=reason, would=would,
                  found="not running")


def _host_verify(env: Environment, host: Host) -> Verify:
    late = late_seconds(env, host)
    what = f"{host.name}'s process (it joins {late:g}s after its start)" if late else f"{host.name} ALIVE"
    joined = node_state_fact(env, host.name, lambda nodes: registered(nodes, host), what)
    return Verify(joined, _started(env, host.name, f"TPU host {host.name}", join=not late), timeout=START_TIMEOUT,
                  interval=2)


REHEARSAL = "rehearse_late_slice: a slice that comes late, as a flex-start pool's nodes do"


def held_out(host: str, held: dict) -> str | None:
    """Why a quarantined host is not started (None: it is not quarantined)."""
    rec = held.get(host)
    return None if rec is None else (f"TPU host {host} is quarantined: {quarantined.line(host, rec)}; "
                                     f"`invoke hosts.release {host}` gives it back")


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
        if why := held_out(host.name, look(held)):
            return skip(why)
        shape = f"({pod_type(env)}, {env.chips_per_host} chips)"
        if late:
            return _start_host(env, host, listed, f"TPU host {host.name} started {shape}; it joins {late:g}s later "
                                                  f"({REHEARSAL})",
                               f"start TPU host {host.name} {shape}, joining {late:g}s later ({REHEARSAL})", late=late)
        return _start_host(env, host, listed, f"TPU host {host.name} joined {shape}",
                           f"start TPU host {host.name} {shape}")

    return Step(PLAY, f"TPU host {host.name}", decide, id=f"twin:{host.name}", after=("twin:head",),
                probes=(pidf, nodes), verify=_host_verify(env, host))


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
        out = [(h.slice, why) for h in hosts_of(env) if (why := held_out(h.name, look(held)))]
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
                verify=Verify(probe, check, timeout=START_TIMEOUT + longest, interval=2))


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
                verify=Verify(pidf, lambda a: "still running" if a else None, timeout=30, interval=1))


def stop_steps(env: Environment, play: str = "teardown") -> list[Step]:
    return [stop_step(env, h.name, play) for h in reversed(hosts_of(env))] + [stop_step(env, HEAD, play)]


def kill_step(env: Environment, target: str, killed: dict[str, Host]) -> Step:
    """Kill one simulated TPU host at once, as a preempted VM dies: the
    first running one, the running job's ``rank0`` or a ``peer`` host, or a
    host by name (``placement.py``); ``killed`` gets the host."""
    all_hosts = hosts_of(env)
    by_name = {h.name: h for h in all_hosts}
    aimed = chaos_target.fact(env, target, lambda w: w.host, "TPU host") if target in (
        placement.RANK0, placement.PEER) else None
    # A dry run assumes every host runs, so it shows the kill of the first.
    running = {h.name: assume(pid_fact(env, h.name), True) for h in all_hosts}

    def kill_host(h: Host, why: str) -> Any:
        killed["host"] = h
        pf = pidfile(env, h.name)
        return change(Action(f"kill -KILL $(cat {quote(str(pf.path))})  # with its child processes",
                             lambda: connectors.this_machine().kill(pf.pid() or -1)),
                      record(env, E.WORKER_LOST, host=h.name, slice=h.tpu_name, by="chaos", target=target,
                             cause="SIGKILL of its Ray node (chaos.delete-worker)"),
                      reason=f"killed TPU host {h.name}{why}",
                      would=shown(f"kill TPU host {h.name}{why}"), found=f"TPU host {h.name} running")

    def decide_kill(look):
        if aimed is not None:
            name, why = look(aimed)
            if name is None:
                return fail(f"--target={target}: {why}")
            if name not in by_name and name != placeholder("TARGET"):
                return fail(f"--target={target}: the running job's host {name} is not a TPU host of {env.name}")
            h = by_name.get(name) or Host(name, -1, -1)  # a dry run: the host the lookup finds
            if h.name in running and not look(running[h.name]):
                return fail(f"--target={target}: TPU host {h.name} ({why}) is not running")
            return kill_host(h, f" ({why})")
        if target != placement.FIRST:
            if not look(running[target]):
                return fail(f"--target={target}: TPU host {target} is not running")
            return kill_host(by_name[target], "")
        for h in all_hosts:
            if look(running[h.name]):
                return kill_host(h, "")
        return fail("no simulated TPU host is running: run `invoke up` first")

    return Step("chaos", "kill one TPU host", decide_kill, id="chaos:kill")


def chaos_steps(env: Environment, restore_after: float, target: str = placement.FIRST) -> list[Step]:
    """Kill one simulated TPU host (``kill_step``); bring it back after
    ``restore_after`` seconds (0: leave it down)."""
    all_hosts = hosts_of(env)
    killed: dict[str, Host] = {}  # the host this run kills: the one it brings back
    out = [kill_step(env, target, killed)]
    if restore_after > 0:
        stopped = {h.name: pid_fact(env, h.name) for h in all_hosts}
        nodes = nodes_fact(dashboard(env), connectors.this_machine())

        def decide_restore(look):
            # The host this run killed (another chaos run may have killed
            # another host meanwhile: that run brings back its own).
            host = killed.get("host")
            if host is not None and host.name not in stopped:  # a dry run: the host the lookup finds
                return change(Action(f"sleep {restore_after:g}", lambda: None),
                              Action(shown(f"start TPU host {host.name} again, as `invoke up` does"), lambda: None),
                              reason=f"TPU host {host.name} back after {restore_after:g}s",
                              would=shown(f"bring TPU host {host.name} back after {restore_after:g}s"))
            if host is None or look(stopped[host.name]):
                return ok("every TPU host runs: nothing to bring back" if host is None else
                          f"TPU host {host.name} runs again: nothing to bring back")
            if why := held_out(host.name, look(quarantined.fact(env))):
                return ok(f"not brought back: {why}")
            return _start_host(env, host, look(nodes), f"TPU host {host.name} back after {restore_after:g}s",
                               f"bring TPU host {host.name} back after {restore_after:g}s",
                               Action(f"sleep {restore_after:g}", lambda: time.sleep(restore_after)),
                               after=(record(env, E.HOST_BACK, host=host.name, slice=host.tpu_name, by="chaos",
                                             cause=f"started again after {restore_after:g}s (chaos.delete-worker)"),))

        def back(s: Any) -> str | None:
            # Only the host this run brought back (another may be down for
            # another chaos run's sake).
            host = killed.get("host")
            if host is None or host.name not in s:
                return None
            v = s[host.name]
            if not v["process"]:
                raise Broken(f"TPU host {host.name} exited: {v.get('exited')}; see {log(env, host.name)}")
            return None if v["joined"] else f"{host.name} not registered yet"

        out.append(Step("chaos", "bring the TPU host back", decide_restore, id="chaos:restore",
                        after=("chaos:kill",),
                        verify=Verify(hosts_state_fact(env), back, timeout=START_TIMEOUT, interval=2)))
    return out


def record(env: Environment, kind: str, **fields: Any) -> Action:
    """A chaos event, in the timeline of the running job's run."""
    def go() -> None:
        timeline.record(env, kind, **fields)
    return Action(timeline.record_line(env, kind), go)


def hang_steps(env: Environment, restore_after: float) -> list[Step]:
    """Freeze the training worker of one simulated TPU host (SIGSTOP: its
    Ray node, the raylet, stays up, so Ray does not declare the node dead:
    the job hangs, as a worker stuck in a collective or in
    jax.distributed.initialize does); resume it after ``restore_after``
    seconds (SIGCONT; 0: leave it frozen)."""
    workers = workers_fact(env)

    def frozen(s: Any) -> list[tuple[str, list[dict]]]:
        return [(h, ws) for h, ws in (s or {}).items() if ws and all(w["stopped"] for w in ws)]

    def decide_hang(look):
        s = look(workers)
        if frozen(s):
            h, ws = frozen(s)[0]
            return ok(f"the training worker of TPU host {h} is already frozen "
                      f"(pid {', '.join(str(w['pid']) for w in ws)})")
        host, ws = next(((h, w) for h, w in (s or {}).items() if w), (None, []))
        if host is None:
            return fail("no training worker runs on any simulated TPU host: start a job first (`invoke train`)")
        pids = [str(w["pid"]) for w in ws]
        return change(Command(("kill", "-STOP", *pids)),
                      record(env, E.WORKER_HUNG, host=host, pids=pids, by="chaos",
                             cause=f"SIGSTOP of its training worker, pid {', '.join(pids)} (chaos.hang-worker)"),
                      reason=f"froze the training worker of TPU host {host} (pid {', '.join(pids)}, SIGSTOP); its "
                             f"Ray node stays up", would=f"freeze the training worker of TPU host {host}",
                      found=f"pid {', '.join(pids)} running")

    out = [Step("chaos", "freeze one TPU host's training worker", decide_hang, id="chaos:hang",
                verify=Verify(workers, lambda s: None if frozen(s) else "not stopped yet", timeout=30, interval=1))]
    if restore_after > 0:
        # A dry run assumes the freeze took, so it shows the resume.
        stopped = assume(workers, {h: [dict(w, stopped=True) for w in ws] for h, ws in workers.assumed.items()})

        def decide_resume(look):
            s = look(stopped)
            if not frozen(s):
                return ok("no training worker is frozen: nothing to resume")
            h, ws = frozen(s)[0]
            pids = [str(w["pid"]) for w in ws]
            return change(Action(f"sleep {restore_after:g}", lambda: time.sleep(restore_after)),
                          Command(("kill", "-CONT", *pids)),
                          record(env, E.WORKER_RESUMED, host=h, pids=pids, by="chaos",
                                 cause=f"SIGCONT after {restore_after:g}s (chaos.hang-worker)"),
                          reason=f"resumed the training worker of TPU host {h} after {restore_after:g}s (SIGCONT)",
                          would=f"resume it after {restore_after:g}s", found=f"pid {', '.join(pids)} frozen")

        out.append(Step("chaos", "resume the training worker", decide_resume, id="chaos:resume", after=("chaos:hang",),
                        verify=Verify(stopped, lambda s: "still stopped" if frozen(s) else None, timeout=30,
                                      interval=1)))
    return out
