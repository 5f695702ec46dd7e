"""The local twin: a Ray cluster on this machine, a head plus simulated TPU
hosts, standing in for the RayCluster on GKE. What it is made of: its
nodes, their commands, ports, pid files and logs, and what the Ray State API
says of them. The steps that start and stop its nodes are in
``plays/local_cluster.py``; chaos's (kill, freeze, sicken) in ``plays/chaos.py``
over ``twin/chaos_twin.py``.

A simulated host is a Ray node started with the env vars GKE's TPU webhook
sets on a TPU pod (TPU_NAME, TPU_WORKER_ID, TPU_ACCELERATOR_TYPE,
TPU_TOPOLOGY) and a ``TPU`` resource, so Ray Train's real TPU path
(use_tpu=True, topology, accelerator type, slice placement groups) runs, with
JAX on CPU. Each node runs under ``ray start --block`` in its own session; its
pid is kept in a pid file, and only those pids are ever stopped.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from playbooks.access import connectors
from playbooks.access.ray_api import alive, labels, list_nodes
from playbooks.cloud.endpoints import dashboard
from playbooks.cloud.slices import Slices, name
from playbooks.config import paths
from playbooks.config import tutorial as T
from playbooks.config.local_ports import LOCAL_PORTS_FIRST_NODE, LOCAL_PORTS_PER_NODE, local_port_span
from playbooks.config.schema import Environment
from playbooks.config.tpu import generation
from playbooks.core.command import Command, placeholder, shown
from playbooks.core.errors import ProbeFailed, error_line
from playbooks.core.facts import ABSENT, Fact
from playbooks.core.pidfile import PidFile, running_fact
from playbooks.twin import host_process

HEAD = "head"


@dataclass(frozen=True)
class Host:
    """A simulated TPU host: its pod-like name (as KubeRay names TPU pods),
    its slice and its worker id in the slice."""

    name: str
    slice: int
    worker: int

    @property
    def tpu_name(self) -> str:
        """Its slice's name (TPU_NAME), as its workers report it."""
        return f"{T.TPU_WORKER_GROUP}-{self.slice}"


def hosts_of(env: Environment) -> list[Host]:
    return [Host(f"{T.TPU_WORKER_GROUP}-{s}-{w}", s, w) for s in range(env.slices)
            for w in range(env.hosts_per_slice)]


def slice_names(env: Environment) -> list[str]:
    """Each simulated slice's name (TPU_NAME), index = slice."""
    return list(dict.fromkeys(h.tpu_name for h in hosts_of(env)))


def pidfile(env: Environment, name: str) -> PidFile:
    marker = "ray start --head" if name == HEAD else "ray start --address"
    return PidFile(paths.nodes(env.name), name, marker, via=connectors.this_machine())


def log(env: Environment, name: str) -> str:
    return paths.node_log(env.name, name)


def node_ports(env: Environment, k: int) -> tuple[str, ...]:
    """Ports of node k (0: the head) that Ray would otherwise take from fixed
    defaults (the agent's 52365, the client server's 10001): explicit and
    distinct, so two local clusters (or a user's own Ray) can coexist."""
    p = env.gcs_port + LOCAL_PORTS_FIRST_NODE + LOCAL_PORTS_PER_NODE * k
    return (f"--dashboard-agent-listen-port={p}", f"--dashboard-agent-grpc-port={p + 1}",
            f"--runtime-env-agent-port={p + 2}", f"--metrics-export-port={p + 3}")


def port_range(env: Environment) -> tuple[int, int]:
    """The ports a local cluster uses besides the dashboard: gcs_port and up."""
    return env.gcs_port, env.gcs_port + local_port_span(env.slices, env.hosts_per_slice)


def pod_type(env: Environment) -> str:
    """TPU_ACCELERATOR_TYPE as GKE's device plugin sets it for the
    environment's generation: v6e-4, v5litepod-4, v5p-8 (TensorCores)."""
    return generation(env).pod_type(env.topology)


# The head's GCS sees a host of this machine that died (chaos.delete-worker,
# a crash) as dead after 3 missed health checks 1 s apart (~2.5 s), not Ray's
# 5 checks 3 s apart (~15 s): the elastic job's second try (after its first
# waited out the worker group start timeout, 20 s locally: job.py) and
# `invoke status` see the host gone. A live host answers a check in
# milliseconds here; a check fails only unanswered for
# health_check_timeout_ms (Ray's 10 s, kept) or refused (a dead raylet's port).
HEALTH_CHECKS = (("RAY_health_check_period_ms", "1000"), ("RAY_health_check_failure_threshold", "3"))


# Ray 2.60 drains a node told SIGTERM (`ray start --block`'s handler) for up
# to 30 s before it stops its processes, for Ray Serve's proxies
# (ray/_private/node.py _drain_node_before_shutdown): a head that ran a job
# keeps its autoscaling coordinator actor and never finishes that drain. The
# twin's nodes are told SIGTERM only to stop (teardown, a host set aside or
# restarted by chaos); a notice drains its node itself first
# (config/host_notice.py). Off: a teardown after a job took 10 s (the
# grace), now 2-3 s.
NO_DRAIN_ON_SIGTERM = ("RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "0")


# Ray 2.60's log monitor (one per node: it forwards its workers' output to
# the drivers, the job's log among them) globs its logs folder for new
# files on every pass of its 0.1 s loop while the folder holds fewer than
# RAY_LOG_MONITOR_MANY_FILES_THRESHOLD (1,000) files, and every
# LOG_NAME_UPDATE_INTERVAL_S (0.5 s) past that (ray/_private/log_monitor.py).
# The twin's nodes look every 0.5 s from the first file: a new worker's
# output, read from its first line either way, starts at most 0.5 s later.
# Each of the twin's three nodes spends ~1.1 CPU-seconds a minute idle
# where it spent ~1.7 (measured by hand on this 2-core machine, 2026-12-07:
# each node's log monitor over 60 s, `invoke up -e local` with and without).
FEWER_LOG_SCANS = ("RAY_LOG_MONITOR_MANY_FILES_THRESHOLD", "0")

# What every node of the twin, head and host, starts with (after its own).
EVERY_NODE = (NO_DRAIN_ON_SIGTERM, FEWER_LOG_SCANS)


# The dashboard's /worker/traceback (a worker's Python stack, by py-spy: the
# hang diagnosis reads it) answers 403 unless the head has this (Ray 2.60's
# default: off). The twin's dashboard listens on its ray_ip only.
PROFILING = ("RAY_DASHBOARD_ENABLE_PROFILING", "1")


def head_command(env: Environment) -> Command:
    return Command(("ray", "start", "--head", "--block", f"--node-ip-address={env.ray_ip}", f"--port={env.gcs_port}",
                    f"--dashboard-host={env.ray_ip}", f"--dashboard-port={env.dashboard_port}",
                    f"--ray-client-server-port={env.gcs_port + 1}", *node_ports(env, 0), "--num-cpus=1",
                    # Its own temp folder, as each host has: a job's supervisor finds
                    # its cluster's address in <temp>/ray_current_cluster, which with
                    # the default /tmp/ray is the newest cluster on this machine (a
                    # test's, another environment's twin), and the job's driver then
                    # waits on that cluster's GCS, not its own.
                    f"--temp-dir={paths.node_temp(env.name, HEAD)}", "--disable-usage-stats"),
                   env=(("JAX_PLATFORMS", "cpu"), *HEALTH_CHECKS, PROFILING, *EVERY_NODE), background=True,
                   log=log(env, HEAD),
                   pid_file=pidfile(env, HEAD))


# A host's process runs `ray start` as its child and starts it again if it
# fails to start under load (``host_process``); its command line holds the
# pid file's marker, so a re-run, status and teardown see one process tree
# throughout. A late host (rehearse_late_slice) waits first: the seconds
# asked, or until it gets SIGUSR1 (`kill -USR1 <its pid>`: the slice joins
# now, when a rehearsal, or a test, wants it at a moment of the job rather
# than of the clock).
HOST_PROCESS = ("python", "-m", "playbooks.twin.host_process")
# The late slice's hosts join one after another, as the others do.
LATE_STAGGER = 5.0


def late_seconds(env: Environment, host: Host) -> float:
    """How long after its start a host joins: rehearse_late_slice's seconds
    for the last slice's hosts (staggered), 0 for every other host."""
    late = env.rehearse_late_slice
    if not late or host.slice != env.slices - 1:
        return 0.0
    return late + LATE_STAGGER * host.worker


# How a host's process is told its JAX devices (XLA_FLAGS).
DEVICE_COUNT = "--xla_force_host_platform_device_count="


def host_command(env: Environment, host: Host, late: float = 0.0, devices: int | None = None) -> Command:
    """``ray start`` of a simulated TPU host; ``devices``: the CPU devices
    it gives JAX when not its devices_per_host (a host made sick by chaos:
    fewer devices than its chips)."""
    k = 1 + host.slice * env.hosts_per_slice + host.worker
    # Its own temp folder, as a pod has its own disk (paths.node_temp: nodes
    # sharing one would share, and pull from under each other, the job's
    # unpacked working directory). So its own log monitor forwards its
    # workers' output, as on GKE.
    argv: tuple[str, ...] = (
        "ray", "start", f"--address={env.ray_ip}:{env.gcs_port}", "--block", f"--node-ip-address={env.ray_ip}",
        "--num-cpus=1", "--resources=" + json.dumps({"TPU": env.chips_per_host}), *node_ports(env, k),
        f"--temp-dir={paths.node_temp(env.name, host.name)}", "--disable-usage-stats")
    argv = (*HOST_PROCESS, *((f"{host_process.JOIN_AFTER}{late:g}",) if late else ()), *argv)
    return Command(argv,
                   # A TPU host to Ray (TPU_*), CPU devices to JAX: every job on
                   # the twin, also one submitted as to GKE, sees this host's
                   # chips as devices_per_host CPU devices.
                   env=(("TPU_NAME", host.tpu_name), ("TPU_WORKER_ID", str(host.worker)),
                        ("TPU_ACCELERATOR_TYPE", pod_type(env)), ("TPU_TOPOLOGY", env.topology),
                        ("JAX_PLATFORMS", "cpu"), *EVERY_NODE,
                        ("XLA_FLAGS", f"{DEVICE_COUNT}{env.devices_per_host if devices is None else devices}")),
                   background=True, log=log(env, host.name), pid_file=pidfile(env, host.name))


def pid_fact(env: Environment, name: str) -> Fact:
    pf = pidfile(env, name)
    return running_fact(pf, str(pf.path))


def node_of(nodes: Any, host: Host) -> dict | None:
    """The alive Ray node of a simulated host in Ray's nodes list (its TPU
    labels: its slice's name and its worker id), or None."""
    for n in alive(nodes if isinstance(nodes, list) else []):
        lb = labels(n)
        if lb.get("ray.io/tpu-slice-name") == host.tpu_name and lb.get("ray.io/tpu-worker-id") == str(host.worker):
            return n
    return None


def registered(nodes: Any, host: Host) -> bool:
    return node_of(nodes, host) is not None


NOT_STARTED = "not started (no pid file)"


def log_error(env: Environment, name: str, pid: int | None) -> str:
    """The line of a node's log that says what went wrong (a traceback's
    exception, as for a failed command). A node without a pid file was
    never started, or was stopped (teardown): its log, if any, is an old
    run's, and says nothing of now."""
    if pid is None:
        return NOT_STARTED
    text = (connectors.this_machine().read(log(env, name)) or b"").decode(errors="replace")
    return error_line(text)[:200] if text.strip() else "its log is empty"


def node_state(env: Environment, name: str, joined: Any) -> dict:
    """What a starting node is: its process alive (by pid alone: a process
    just started may not have exec'd its command line yet), whether it has
    joined (``joined(nodes)`` on the State API's node list), and, when its
    process is gone, the line of its log that says why."""
    pf = pidfile(env, name)
    pid = pf.pid()
    nodes = list_nodes(dashboard(env), connectors.this_machine())
    state: dict[str, Any] = {"process": pid is not None and pf.via.alive(pid, ""),
             "answering": nodes is not ABSENT,
             "joined": nodes is not ABSENT and joined(nodes)}
    if not state["process"]:
        state["exited"] = log_error(env, name, pid)
    return state


def node_state_fact(env: Environment, name: str, joined: Any, what: str) -> Fact:
    url = f"{dashboard(env)}/api/v0/nodes"
    return Fact(name=f"{name} node", python=lambda: node_state(env, name, joined),
                display=f"kill -0 $(cat {paths.nodes(env.name)}/{name}.pid) && curl -fsS {url}  # {what}",
                describe=lambda s: "joined" if s.get("joined") else "process running" if s.get("process")
                else "not running")


def hosts_state(env: Environment) -> dict:
    """Every simulated host: its process alive (by pid alone) and joined."""
    nodes = list_nodes(dashboard(env), connectors.this_machine())
    out = {}
    for h in hosts_of(env):
        pf = pidfile(env, h.name)
        pid = pf.pid()
        s: dict[str, Any] = {"process": pid is not None and pf.via.alive(pid, ""),
                             "joined": nodes is not ABSENT and registered(nodes, h)}
        if not s["process"]:
            s["exited"] = log_error(env, h.name, pid)
        elif not s["joined"] and (d := pf.read()):
            s["started"] = d.get("started")
        out[h.name] = s
    return out


def hosts_state_fact(env: Environment) -> Fact:
    return Fact(name="TPU hosts", python=lambda: hosts_state(env),
                display=f"kill -0 $(cat {paths.nodes(env.name)}/tpu-*.pid) && curl -fsS {dashboard(env)}/api/v0/nodes"
                        f"  # every TPU host ALIVE",
                assumed={h.name: {"process": True, "joined": True} for h in hosts_of(env)},
                describe=lambda s: f"{sum(1 for v in s.values() if v['joined'])} of {len(s)} joined")


def _not_joined(env: Environment, host: Host, s: dict) -> str:
    if s.get("exited") == NOT_STARTED:
        return f"{host.name} not started"
    if not s.get("process"):
        return f"{host.name} not running: {s.get('exited')}"
    late = late_seconds(env, host)
    if late and s.get("started"):
        left = float(s["started"]) + late - time.time()
        when = f"in about {left:.0f}s" if left > 0 else f"{-left:.0f}s ago, not registered yet"
        return f"{host.name} joins {late:g}s after its start (rehearse_late_slice): {when}"
    return f"{host.name} not registered yet"


def slices_of(env: Environment, state: dict) -> Slices:
    """The twin's slices: whole when every host of the slice has joined."""
    whole, waiting = [], []
    for i in range(env.slices):
        hs = [h for h in hosts_of(env) if h.slice == i]
        gone = [h for h in hs if not (state.get(h.name) or {}).get("joined")]
        if not gone:
            whole.append(name(i))
        else:
            waiting.append((name(i), f"{len(hs) - len(gone)} of {len(hs)} hosts joined; "
                                     + _not_joined(env, gone[0], state.get(gone[0].name) or {})))
    return Slices(env.slices, tuple(whole), tuple(waiting))


# -- a hung worker (chaos.hang-worker) ---------------------------------------------
# Ray Train runs one training worker per TPU host: a `ray::RayTrainWorker`
# process under the host's Ray node (its raylet's child). Freezing it leaves
# the raylet up, so Ray does not declare the node dead: the job hangs.
TRAIN_WORKER = "ray::RayTrainWorker"
PS = ("ps", "-e", "-o", "pid=,ppid=,stat=,args=")


def process_table(text: str) -> dict[int, tuple[int, str, str]]:
    """pid -> (ppid, state, command line), from `ps -e -o pid=,ppid=,stat=,args=`."""
    out = {}
    for line in text.splitlines():
        parts = line.split(None, 3)
        if len(parts) == 4 and parts[0].isdigit() and parts[1].isdigit():
            out[int(parts[0])] = (int(parts[1]), parts[2], parts[3])
    return out


def training_workers(table: dict[int, tuple[int, str, str]], root: int) -> list[dict]:
    """The training worker processes under ``root`` (a host's Ray node): pid,
    and whether they are stopped (state T)."""
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        kids.setdefault(ppid, []).append(pid)
    out, todo = [], list(kids.get(root, []))
    while todo:
        p = todo.pop(0)
        todo.extend(kids.get(p, []))
        ppid, state, args = table[p]
        if args.startswith(TRAIN_WORKER):
            out.append({"pid": p, "stopped": state.startswith("T")})
    return sorted(out, key=lambda w: w["pid"])


def workers_state(env: Environment) -> dict[str, list[dict]]:
    """Each running simulated host's training worker processes (through
    this machine's connector: its pid file, `ps`)."""
    here = connectors.this_machine()
    r = here.run(list(PS), timeout=30)
    if r.rc != 0:
        raise ProbeFailed("training workers", " ".join(PS), r.rc, r.stdout, r.stderr,
                          why=f"could not list the processes: {r.stderr.strip()[:200]}")
    table = process_table(r.stdout)
    out = {}
    for h in hosts_of(env):
        pid = pidfile(env, h.name).pid()
        if pid is not None and here.alive(pid, ""):
            out[h.name] = training_workers(table, pid)
    return out


def workers_fact(env: Environment) -> Fact:
    first = hosts_of(env)[0].name
    return Fact(name="training workers", python=lambda: workers_state(env),
                display=f"ps -e -o pid=,ppid=,stat=,args=  # the {TRAIN_WORKER} processes under each TPU host's "
                        f"pid ({paths.nodes(env.name)}/<host>.pid)",
                assumed={first: [{"pid": placeholder("PID"), "stopped": False}]},
                describe=lambda s: shown(", ".join(f"{h}: " + (" ".join(
                    f"{w['pid']}{' (stopped)' if w['stopped'] else ''}" for w in ws) or "none")
                    for h, ws in s.items()) or "no TPU host running"))
