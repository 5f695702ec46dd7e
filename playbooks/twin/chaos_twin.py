"""The twin's own way to act on a TPU host for the chaos play
(``plays/chaos.py``): a simulated host found by its pid file (the first
running, or by name, or the host of the running job's rank 0 or a peer),
killed (SIGKILL of its Ray node, with its children) and started again as
`invoke up` starts it, its training worker frozen and resumed (SIGSTOP and
SIGCONT of its ``ray::RayTrainWorker`` processes), and made sick: started
again with fewer JAX devices than its chips (XLA_FLAGS), which the health
check's count of the devices JAX sees finds, then healed (started again
whole). Facts, commands and their words; the steps are the play's."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from playbooks.access import connectors
from playbooks.access.ray_api import list_nodes, nodes_fact
from playbooks.cloud.endpoints import dashboard
from playbooks.config import host_notice, paths
from playbooks.config.schema import Environment
from playbooks.core.command import Command, placeholder, quote, shown
from playbooks.core.errors import ProbeFailed
from playbooks.core.facts import ABSENT, Action, Fact, assume
from playbooks.core.step import Broken, Decision, Verify, change, ok
from playbooks.twin import maintenance_sim
from playbooks.twin.node_start import START_TIMEOUT, ghost_gone, start_host
from playbooks.twin.nodes import (
    DEVICE_COUNT,
    Host,
    host_command,
    hosts_of,
    hosts_state_fact,
    log,
    node_of,
    pid_fact,
    pidfile,
    registered,
    workers_fact,
)


class TwinHosts:
    """The chaos play's target on the twin: a simulated TPU host."""

    noun = "TPU host"
    kill_title, kill_id = "kill one TPU host", "chaos:kill"
    hang_title = "freeze one TPU host's training worker"
    after: tuple[str, ...] = ()

    def __init__(self, env: Environment):
        self.env = env
        self.hosts = hosts_of(env)
        self.by_name = {h.name: h for h in self.hosts}

    def name_of(self, worker: Any) -> str | None:
        return worker.host

    def target_problem(self, target: str, targets: tuple[str, ...]) -> str | None:
        if target not in self.by_name:
            return (f"--target {target!r}: not {', '.join(targets)} nor a TPU host of {self.env.name} "
                    f"({', '.join(self.by_name)})")
        return None

    @property
    def sick_devices(self) -> int:
        """The JAX devices of a sick host: one fewer than its own (one chip
        that did not come up)."""
        return self.env.devices_per_host - 1

    @property
    def cannot_sicken(self) -> str | None:
        if self.sick_devices < 1:
            return (f"devices_per_host of {self.env.name} is {self.env.devices_per_host}: a host cannot be started "
                    f"with fewer devices than one (give the environment devices_per_host >= 2)")
        return None

    # -- choose (each chooser answers ("act", host, why), ("ok", None, why) or ("fail", None, why))
    def picker(self) -> _Picker:
        return _Picker(self)

    def label(self, h: Host) -> str:
        return f"TPU host {h.name}"

    def fields(self, h: Host) -> dict[str, Any]:
        return {"host": h.name, "slice": h.tpu_name}

    def known(self, h: Host) -> bool:
        """A host of the environment (not a dry run's stand-in, ${TARGET})."""
        return h.name in self.by_name

    # -- kill, and bring back
    kill_cause = "SIGKILL of its Ray node (chaos.delete-worker)"

    def kill(self, h: Host) -> tuple[Any, ...]:
        pf = pidfile(self.env, h.name)
        return (Action(f"kill -KILL $(cat {quote(str(pf.path))})  # with its child processes",
                       lambda: connectors.this_machine().kill(pf.pid() or -1)),)

    def kill_words(self, h: Host, why: str) -> tuple[str, str]:
        return f"killed TPU host {h.name}{why}", shown(f"kill TPU host {h.name}{why}")

    def stuck(self, h: Host, grace: int | None, reason: str, then: tuple[Any, ...]) -> None:
        """A killed Ray node's process does not linger (a GKE pod may:
        chaos_gke): a failed kill stands."""
        return None

    # -- a notice, then the kill (chaos.preempt-worker)
    def ray_nodes(self) -> Fact:
        """Ray's nodes: the host's node id, which its notice names (a dry
        run assumes every host a node: ${NODE_ID})."""
        return assume(self.nodes(), [{"state": "ALIVE", "node_id": placeholder("NODE_ID"),
                                      "labels": {"ray.io/tpu-slice-name": h.tpu_name,
                                                 "ray.io/tpu-worker-id": str(h.worker)}} for h in self.hosts])

    def preempt_title(self, grace: int) -> str:
        return f"give one TPU host a notice of {grace} s, then kill it"

    def preempt_cause(self, grace: int) -> str:
        return f"its notice's {grace} s ended: SIGKILL of its Ray node (chaos.preempt-worker)"

    def preempt_words(self, h: Host, grace: int, why: str) -> tuple[str, str]:
        return (f"gave TPU host {h.name} a notice of {grace} s{why}, then killed it",
                shown(f"give TPU host {h.name} a notice of {grace} s{why}, then kill it"))

    def preempt_problem(self, h: Host, nodes: Any) -> str | None:
        """A running host that Ray does not list cannot be given a notice."""
        if self.known(h) and node_id(nodes, h) is None:
            return f"TPU host {h.name} is not an alive node of the Ray cluster: its notice would reach no one"
        return None

    def preempt(self, h: Host, grace: int, nodes: Any, given: Action, lost: Action) -> tuple[Any, ...]:
        """The notice as a worker pod's preStop hook gives it on GKE (a
        drain of the host's Ray node, config/host_notice.py), the grace, the
        kill."""
        node = node_id(nodes, h) or placeholder("NODE_ID")
        drain = Command(host_notice.drain_argv(grace, f"chaos.preempt-worker: TPU host {h.name} goes in {grace} s",
                                          node, f"{self.env.ray_ip}:{self.env.gcs_port}"))
        return (given, drain, Action(f"sleep {grace}", lambda: time.sleep(grace)), *self.kill(h), lost)

    # -- a host maintenance for a slice (chaos.maintenance)
    def slice_of(self, h: Host) -> list[Host]:
        """The hosts of ``h``'s slice (a dry run's stand-in: itself)."""
        return [x for x in self.hosts if x.tpu_name == h.tpu_name] or [h]

    def maintenance(self, h: Host, hosts: list[Host], in_s: float, at: float, scheduled: Action,
                    lost: list[Action]) -> tuple[Any, ...]:
        """The schedule the watch reads, the wait, the slice's hosts killed
        at its time (their maintenance), the schedule over."""
        names = [x.name for x in hosts]
        return (maintenance_sim.schedule(self.env, names, at), scheduled,
                Action(f"sleep {in_s:g}", lambda: time.sleep(max(0.0, at - time.time()))),
                *[a for x, gone in zip(hosts, lost) for a in (*self.kill(x), gone)],
                maintenance_sim.done(self.env, names))

    def restorer(self) -> _Restorer:
        """What brings a killed host back after --restore-after."""
        return _Restorer(self)

    # -- freeze (a hang) and resume
    def freezer(self) -> _Freezer:
        return _Freezer(self)

    def freeze(self, v: tuple[str, list[str]]) -> Command:
        return Command(("kill", "-STOP", *v[1]))

    def resume(self, v: tuple[str, list[str]]) -> Command:
        return Command(("kill", "-CONT", *v[1]))

    def hang_fields(self, v: tuple[str, list[str]]) -> dict[str, Any]:
        return {"host": v[0], "pids": v[1]}

    def hang_cause(self, v: tuple[str, list[str]]) -> str:
        return f"SIGSTOP of its training worker, pid {', '.join(v[1])}"

    def hang_words(self, v: tuple[str, list[str]], restore_after: float) -> tuple[str, str, str]:
        host, pids = v[0], ", ".join(v[1])
        left = "" if restore_after > 0 else f" (left frozen: `{self.resume(v).line()}` resumes it)"
        return (f"froze the training worker of TPU host {host} (pid {pids}, SIGSTOP); its Ray node stays up{left}",
                f"freeze the training worker of TPU host {host}" + (" (left frozen)" if left else ""),
                f"pid {pids} running")

    def frozen_verify(self) -> Verify:
        return Verify(workers_fact(self.env), lambda s: None if _frozen(s) else "not stopped yet", timeout=30,
                      interval=1)

    def resumer(self) -> _Resumer:
        """`ps` tells a stopped worker: the freeze is verified, the resume is a step of its own."""
        return _Resumer(self)

    # -- sicken, and heal
    def health_fact(self, h: Host, sick: bool = False) -> Fact:
        return health_fact(self.env, h, self.sick_devices if sick else self.env.devices_per_host)

    def start_again(self, h: Host, devices: int, running: bool, nodes: Any, lost: tuple[Any, ...] = ()) -> tuple:
        """The acts that start ``h`` again now (not late) with ``devices`` JAX
        devices: its kill when ``running`` (then ``lost``, its event), the
        wait for its ghost to leave Ray's nodes (``nodes``: their list),
        its start."""
        killed = (*self.kill(h), *lost) if running else ()
        ghost = (ghost_gone(self.env, h),) if nodes is not ABSENT and registered(nodes, h) else ()
        return (*killed, *ghost, host_command(self.env, h, devices=devices))

    def nodes(self) -> Fact:
        return nodes_fact(dashboard(self.env), connectors.this_machine())

    def health_verify(self, hosts: list[Host], devices: int) -> Verify:
        """Every host of ``hosts`` (filled in by the step's decision) running,
        joined, with ``devices`` devices."""
        env = self.env

        def look() -> dict[str, dict]:
            return {h.name: health(env, h) for h in hosts}

        def check(states: dict[str, dict]) -> str | None:
            for name, s in states.items():
                if not s["process"]:
                    raise Broken(f"TPU host {name} exited; see {log(env, name)}")
                if s["devices"] != devices:
                    raise Broken(f"TPU host {name} gives JAX {s['devices']} devices, not {devices}")
                if not s["joined"]:
                    return f"{name} not registered yet"
            return None

        fact = Fact(name="started hosts", python=look,
                    display=f"kill -0 $(cat {paths.nodes(env.name)}/tpu-*.pid) && curl -fsS "
                            f"{dashboard(env)}/api/v0/nodes  # the hosts started ALIVE, {devices} JAX devices each "
                            f"(XLA_FLAGS in /proc/<pid>/environ)")
        return Verify(fact, check, timeout=START_TIMEOUT, interval=2)


def node_id(nodes: Any, h: Host) -> str | None:
    """The Ray node id of host ``h`` (alive), from Ray's nodes list."""
    n = node_of(nodes, h)
    return n.get("node_id") if n is not None else None


def _frozen(s: Any) -> list[tuple[str, list[dict]]]:
    return [(h, ws) for h, ws in (s or {}).items() if ws and all(w["stopped"] for w in ws)]


class _Picker:
    """A host by its pid file: the first running one, or one by name."""

    def __init__(self, way: TwinHosts):
        self.way = way
        # A dry run assumes every host runs, so it shows the kill of the first.
        self.running = {h.name: assume(pid_fact(way.env, h.name), True) for h in way.hosts}

    def first(self, look: Any) -> tuple[str, Any, str]:
        for h in self.way.hosts:
            if look(self.running[h.name]):
                return "act", h, ""
        return "fail", None, "no simulated TPU host is running: run `invoke up` first"

    def named(self, look: Any, name: str, why: str, target: str, aimed: bool) -> tuple[str, Any, str]:
        if aimed and name not in self.way.by_name and name != placeholder("TARGET"):
            return "fail", None, f"--target={target}: the running job's host {name} is not a TPU host of " \
                                 f"{self.way.env.name}"
        h = self.way.by_name.get(name) or Host(name, -1, -1)  # a dry run: the host the lookup finds
        if h.name in self.running and not look(self.running[h.name]):
            return "fail", None, f"--target={target}: TPU host {h.name}{why} is not running"
        return "act", h, why


class _Restorer:
    """A killed host started again, after --restore-after, as `invoke up` does."""

    def __init__(self, way: TwinHosts):
        self.way = way
        self.stopped = {h.name: pid_fact(way.env, h.name) for h in way.hosts}
        self.nodes = way.nodes()

    def verify(self, killed: dict[str, Any]) -> Verify:
        """The host this run brought back running and joined."""
        env = self.way.env

        def back(s: Any) -> str | None:
            # Only the host this run brought back (another may be down for
            # another chaos run's sake).
            host = killed.get("victim")
            if host is None or host.name not in s:
                return None
            v = s[host.name]
            if not v["process"]:
                raise Broken(f"TPU host {host.name} exited: {v.get('exited')}; see {log(env, host.name)}")
            return None if v["joined"] else f"{host.name} not registered yet"

        return Verify(hosts_state_fact(env), back, timeout=START_TIMEOUT, interval=2)

    def decide(self, look: Any, h: Host, restore_after: float, back: Action,
               held_out: Callable[[], str | None] = lambda: None) -> Decision:
        """Bring ``h`` back (``back``: its event); a host running again, or
        one held out (``held_out``: why, the quarantine's; None: not held): ok."""
        if not self.way.known(h):  # a dry run: the host the lookup finds
            return change(Action(f"sleep {restore_after:g}", lambda: None),
                          Action(shown(f"start TPU host {h.name} again, as `invoke up` does"), lambda: None),
                          reason=f"TPU host {h.name} back after {restore_after:g}s",
                          would=shown(f"bring TPU host {h.name} back after {restore_after:g}s"))
        if look(self.stopped[h.name]):
            return ok(f"TPU host {h.name} runs again: nothing to bring back")
        if why := held_out():
            return ok(f"not brought back: {why}")
        return start_host(self.way.env, h, look(self.nodes), f"TPU host {h.name} back after {restore_after:g}s",
                          f"bring TPU host {h.name} back after {restore_after:g}s",
                          Action(f"sleep {restore_after:g}", lambda: time.sleep(restore_after)), after=(back,))


class _Freezer:
    """The training worker of the first host that runs one (already frozen: nothing to do)."""

    def __init__(self, way: TwinHosts):
        self.workers = workers_fact(way.env)

    def first(self, look: Any) -> tuple[str, Any, str]:
        s = look(self.workers)
        if _frozen(s):
            h, ws = _frozen(s)[0]
            return "ok", None, (f"the training worker of TPU host {h} is already frozen "
                                f"(pid {', '.join(str(w['pid']) for w in ws)})")
        host, ws = next(((h, w) for h, w in (s or {}).items() if w), (None, []))
        if host is None:
            return "fail", None, "no training worker runs on any simulated TPU host: start a job first (`invoke train`)"
        return "act", (host, [str(w["pid"]) for w in ws]), ""


class _Resumer:
    """The frozen training worker (a dry run assumes the freeze took)."""

    def __init__(self, way: TwinHosts):
        workers = workers_fact(way.env)
        self.stopped = assume(workers, {h: [dict(w, stopped=True) for w in ws] for h, ws in workers.assumed.items()})

    def frozen(self, look: Any) -> tuple[str, list[str]] | None:
        s = look(self.stopped)
        if not _frozen(s):
            return None
        h, ws = _frozen(s)[0]
        return h, [str(w["pid"]) for w in ws]

    def words(self, v: tuple[str, list[str]], restore_after: float) -> tuple[str, str, str]:
        pids = ", ".join(v[1])
        return (f"resumed the training worker of TPU host {v[0]} after {restore_after:g}s (SIGCONT)",
                f"resume it after {restore_after:g}s", f"pid {pids} frozen")

    def verify(self) -> Verify:
        return Verify(self.stopped, lambda s: "still stopped" if _frozen(s) else None, timeout=30, interval=1)


# -- a host's health, as chaos.sicken-worker and chaos.heal-worker see it -------
def devices_of(environ: bytes) -> int | None:
    """The JAX devices a process's environment (/proc/<pid>/environ) gives:
    XLA_FLAGS' device count (None: not said)."""
    for var in environ.split(b"\0"):
        name, _, value = var.decode(errors="replace").partition("=")
        if name == "XLA_FLAGS":
            for flag in value.split():
                if flag.startswith(DEVICE_COUNT) and flag[len(DEVICE_COUNT):].isdigit():
                    return int(flag[len(DEVICE_COUNT):])
    return None


def health(env: Environment, h: Host) -> dict[str, Any]:
    """A host's process alive (by its pid file), joined, and the JAX devices
    its Ray node gives its workers (read from its environment: what a
    worker inherits). Not running: devices None."""
    here = connectors.this_machine()
    pid = pidfile(env, h.name).pid()
    if pid is None or not here.alive(pid, ""):
        return {"process": False, "joined": False, "devices": None}
    environ = here.read(f"/proc/{pid}/environ")
    if environ is None:  # gone since
        return {"process": False, "joined": False, "devices": None}
    devices = devices_of(environ)
    if devices is None:
        raise ProbeFailed(f"TPU host {h.name}", f"/proc/{pid}/environ", 1, "", "",
                          why=f"could not tell TPU host {h.name}'s devices: no {DEVICE_COUNT} in its XLA_FLAGS "
                              f"(pid {pid}: not a node this project started?)")
    nodes = list_nodes(dashboard(env), here)
    return {"process": True, "joined": nodes is not ABSENT and registered(nodes, h), "devices": devices}


def health_fact(env: Environment, h: Host, assumed_devices: int) -> Fact:
    pf = pidfile(env, h.name)
    return Fact(name=f"{h.name} health", python=lambda: health(env, h),
                display=f"tr '\\0' '\\n' < /proc/$(cat {quote(str(pf.path))})/environ | grep XLA_FLAGS  "
                        f"# the JAX devices TPU host {h.name} gives its workers",
                assumed={"process": True, "joined": True, "devices": assumed_devices},
                describe=lambda s: f"{s['devices']} of {env.devices_per_host} devices" if s["process"]
                else "not running")

