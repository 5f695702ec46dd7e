"""The local environment: a Ray cluster on this machine, a head plus
simulated TPU hosts, the local twin of the RayCluster on GKE.

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
from pathlib import Path

from .. import hosts
from .. import tutorial as T
from ..core.command import Command, quote
from ..core.errors import error_line
from ..core.facts import ABSENT, Action, Fact, assume
from ..core.play import Outcome, StepContext
from ..core.procs import PidFile, running_fact
from ..core.recap import CHANGED, FAILED, OK
from ..core.step import Step, poll
from ..local_ports import LOCAL_PORTS_FIRST_NODE, LOCAL_PORTS_PER_NODE, local_port_span
from ..project import ROOT
from ..rayapi import alive, labels, list_nodes, nodes_fact, version_fact
from ..schema import Environment
from ..tpu import chips

PLAY = "local"
HEAD = "head"
START_TIMEOUT = 90.0


def state_dir(env: Environment) -> Path:
    return ROOT / ".state" / env.name


def rel(p: Path) -> str:
    try:
        return str(p.relative_to(ROOT))
    except ValueError:
        return str(p)


def address(env: Environment) -> str:
    return f"http://{env.ray_ip}:{env.dashboard_port}"


def host_names(env: Environment) -> list[tuple[str, int, int]]:
    """(name, slice, worker id): pod-like names, as KubeRay names TPU pods."""
    return [(f"{T.TPU_WORKER_GROUP}-{s}-{w}", s, w) for s in range(env.slices) for w in range(env.hosts_per_slice)]


def pidfile(env: Environment, name: str) -> PidFile:
    marker = "ray start --head" if name == HEAD else "ray start --address"
    return PidFile(state_dir(env) / "nodes", name, marker, via=hosts.local())


def _log(env: Environment, name: str) -> str:
    return rel(state_dir(env) / "logs" / f"{name}.log")


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


def head_command(env: Environment) -> Command:
    return Command(("ray", "start", "--head", "--block", f"--node-ip-address={env.ray_ip}", f"--port={env.gcs_port}",
                    f"--dashboard-host={env.ray_ip}", f"--dashboard-port={env.dashboard_port}",
                    f"--ray-client-server-port={env.gcs_port + 1}", *node_ports(env, 0), "--num-cpus=1",
                    "--disable-usage-stats"),
                   env=(("JAX_PLATFORMS", "cpu"),), background=True, log=_log(env, HEAD))


def pod_type(env: Environment) -> str:
    return f"v6e-{chips(env.topology)}"


def host_command(env: Environment, name: str, slice_: int, worker: int) -> Command:
    k = 1 + slice_ * env.hosts_per_slice + worker
    # One log monitor (the head's) forwards every node's logs on this machine;
    # a second one would print each line twice.
    return Command(("ray", "start", f"--address={env.ray_ip}:{env.gcs_port}", "--block",
                    f"--node-ip-address={env.ray_ip}", "--num-cpus=1",
                    "--resources=" + json.dumps({"TPU": env.chips_per_host}), *node_ports(env, k),
                    "--include-log-monitor=false", "--disable-usage-stats"),
                   # A TPU host to Ray (TPU_*), CPU devices to JAX: every job on
                   # the twin, also one submitted as to GKE, sees this host's
                   # chips as devices_per_host CPU devices.
                   env=(("TPU_NAME", f"{T.TPU_WORKER_GROUP}-{slice_}"), ("TPU_WORKER_ID", str(worker)),
                        ("TPU_ACCELERATOR_TYPE", pod_type(env)), ("TPU_TOPOLOGY", env.topology),
                        ("JAX_PLATFORMS", "cpu"),
                        ("XLA_FLAGS", f"--xla_force_host_platform_device_count={env.devices_per_host}")),
                   background=True, log=_log(env, name))


def pid_fact(env: Environment, name: str) -> Fact:
    pf = pidfile(env, name)
    return running_fact(pf, rel(pf.path))


def registered(nodes, slice_: int, worker: int) -> bool:
    for n in alive(nodes):
        lb = labels(n)
        if lb.get("ray.io/tpu-slice-name") == f"{T.TPU_WORKER_GROUP}-{slice_}" and \
                lb.get("ray.io/tpu-worker-id") == str(worker):
            return True
    return False


def _spawn(ctx: StepContext, env: Environment, name: str, command: Command) -> None:
    pf = pidfile(env, name)
    pid = ctx.spawn(command)  # None when not acting: then the action does not run either

    def record() -> None:
        if pid is not None:
            pf.write(pid, node=name)

    ctx.act(Action(f"echo $! > {quote(rel(pf.path))}", record))


class Exited(str):
    """Why a wait ended early: the process it waited for is gone."""


def _log_error(log: str) -> str:
    """The line of a node's log that says what went wrong (a traceback's
    exception, as for a failed command)."""
    text = (hosts.local().read(log) or b"").decode(errors="replace")
    return error_line(text)[:200] if text.strip() else "its log is empty"


def _wait(ctx: StepContext, what: str, check, timeout: float = START_TIMEOUT, interval: float = 2.0,
          process: tuple[PidFile, str] | None = None) -> str | None:
    """Poll ``check`` (None = done) in apply mode; print the wait otherwise.
    ``process``: (its pid file, its log): a process that exits ends the wait
    at once, with the line of its log that says why."""
    if not ctx.acting:
        ctx.log.emit("verify", what)
        return None
    gone: list[str] = []

    def check_or_gone() -> str | None:
        if process is not None:
            # By pid only: a process just started may not have exec'd its
            # command line yet (the marker), and its pid cannot be recycled
            # within the wait.
            pf, log = process
            pid = pf.pid()
            if pid is not None and not pf.via.alive(pid, ""):
                gone.append(_log_error(log))
                return None
        return check()

    why = poll(check_or_gone, timeout, interval, sleep=ctx.sleep)
    if gone:
        why = Exited(f"exited: {gone[0]}")
    ctx.log.emit("verify", f"{what}  => {why or 'ok'}")
    return why


def head_step(env: Environment) -> Step:
    pidf, version = pid_fact(env, HEAD), version_fact(address(env))

    def run(ctx: StepContext) -> Outcome:
        running = ctx.look(pidf)
        answering = ctx.look(version)
        if running and answering is not ABSENT:
            return Outcome(OK, f"Ray head running at {address(env)} (Ray {answering.get('ray_version')})")
        if not running:
            lo, hi = port_range(env)
            taken = [p for p in range(lo, hi + 1) if ctx.runner.probing and hosts.local().port_open(env.ray_ip, p)]
            if answering is not ABSENT or taken:
                what = f"port {taken[0]} (of {lo}-{hi}, the local nodes' ports)" if taken else address(env)
                return Outcome(FAILED, f"{what} is taken by a process this project did not start (pid file "
                                       f"{rel(pidfile(env, HEAD).path)}): stop it, or move gcs_port/dashboard_port "
                                       f"in the inventory")
            _spawn(ctx, env, HEAD, head_command(env))

        def up():
            v = hosts.local().get_json(f"{address(env)}/api/version", timeout=3)
            if v is ABSENT:
                return "dashboard not answering yet"
            if not any(n.get("is_head_node") for n in alive(_nodes(env))):
                return "head node not registered yet"
            return None

        why = _wait(ctx, f"curl -fsS {address(env)}/api/version  (and the head node ALIVE)", up,
                    process=(pidfile(env, HEAD), _log(env, HEAD)))
        if why:
            if isinstance(why, Exited):
                return Outcome(FAILED, f"the Ray head {why}; see {_log(env, HEAD)}")
            return Outcome(FAILED, f"the Ray head did not come up in {START_TIMEOUT:.0f}s ({why}); "
                                   f"see {_log(env, HEAD)}")
        if not running and not ctx.acting:
            return Outcome(CHANGED, f"would start the Ray head at {address(env)}")
        return Outcome(CHANGED if not running else OK, f"Ray head started at {address(env)}")

    return Step(PLAY, f"Ray head {address(env)}", run=run, id="local:head", probes=(pidf, version))


def host_step(env: Environment, name: str, slice_: int, worker: int, play: str = PLAY) -> Step:
    pidf, nodes = pid_fact(env, name), nodes_fact(address(env))

    def run(ctx: StepContext) -> Outcome:
        running = ctx.look(pidf)
        listed = ctx.look(nodes)
        if listed is ABSENT:
            return Outcome(FAILED, f"no Ray head answers at {address(env)}: run `invoke up` first")
        is_up = registered(listed, slice_, worker)
        if running and is_up:
            return Outcome(OK, f"TPU host {name} is in the cluster")
        if not running:
            if is_up and ctx.acting:
                # The node of a killed host stays ALIVE until Ray notices; wait,
                # or the new node would stand beside a ghost of itself.
                _wait(ctx, f"ray list nodes --address {address(env)}  (old {name} gone)",
                      lambda: None if not registered(_nodes(env), slice_, worker) else "still listed", 60)
            _spawn(ctx, env, name, host_command(env, name, slice_, worker))

        why = _wait(ctx, f"ray list nodes --address {address(env)}  ({name} ALIVE)",
                    lambda: None if registered(_nodes(env), slice_, worker) else f"{name} not registered yet",
                    process=(pidfile(env, name), _log(env, name)))
        if isinstance(why, Exited):
            return Outcome(FAILED, f"TPU host {name} {why}; see {_log(env, name)}")
        if why:
            return Outcome(FAILED, f"TPU host {name} did not join in {START_TIMEOUT:.0f}s; see {_log(env, name)}")
        if not running and not ctx.acting:
            return Outcome(CHANGED, f"would start TPU host {name} ({pod_type(env)}, {env.chips_per_host} chips)")
        return Outcome(CHANGED if not running else OK, f"TPU host {name} joined ({pod_type(env)}, "
                                                       f"{env.chips_per_host} chips)")

    return Step(play, f"TPU host {name}", run=run, id=f"local:{name}", after=("local:head",),
                probes=(pidf, nodes))


def _nodes(env: Environment) -> list:
    nodes = list_nodes(address(env))
    return [] if nodes is ABSENT else nodes


def steps(env: Environment) -> list[Step]:
    """Bring the local cluster up (a running one is reused). Hosts join one
    after another: Ray nodes starting at once on one machine race for ports."""
    out = [head_step(env)]
    for n, s, w in host_names(env):
        step = host_step(env, n, s, w)
        step.after = (out[-1].id,)
        out.append(step)
    return out


def stop_step(env: Environment, name: str, play: str = "teardown") -> Step:
    pidf = assume(pid_fact(env, name), True)
    pf = pidfile(env, name)

    def decide(look):
        from ..core.step import change, ok
        if not look(pidf):
            return ok(f"{name} is not running")
        return change(Action(f"kill -TERM $(cat {quote(rel(pf.path))})  # with its child processes",
                             lambda: pf.stop(grace=10.0)),
                      reason=f"stopped {name}")

    from ..core.step import Verify
    return Step(play, f"stop {name}", decide, id=f"{play}:stop-{name}",
                verify=Verify(pidf, lambda a: "still running" if a else None, timeout=30, interval=1))


def stop_steps(env: Environment, play: str = "teardown") -> list[Step]:
    return [stop_step(env, n, play) for n, _, _ in reversed(host_names(env))] + [stop_step(env, HEAD, play)]


def chaos_steps(env: Environment, restore_after: float) -> list[Step]:
    """Kill one simulated TPU host at once, as a preempted VM dies; bring it
    back after ``restore_after`` seconds (0: leave it down)."""
    names = host_names(env)
    facts = {n: pid_fact(env, n) for n, _, _ in names}
    chosen: dict[str, tuple[str, int, int]] = {}

    def run_kill(ctx: StepContext) -> Outcome:
        for n, s, w in names:
            if ctx.look(facts[n]) or ctx.mode.value == "dry-run":
                chosen["host"] = (n, s, w)
                pf = pidfile(env, n)

                def kill(pf: PidFile = pf) -> None:
                    hosts.local().kill(pf.pid() or -1)

                ctx.act(Action(f"kill -KILL $(cat {quote(rel(pf.path))})  # with its child processes", kill))
                return Outcome(CHANGED, f"killed TPU host {n}" if ctx.acting else f"would kill TPU host {n}")
        return Outcome(FAILED, "no simulated TPU host is running: run `invoke up` first")

    out = [Step("chaos", "kill one TPU host", run=run_kill, idempotent=False,
                id="chaos:kill")]
    if restore_after > 0:
        def run_restore(ctx: StepContext) -> Outcome:
            n, s, w = chosen.get("host", names[0])
            ctx.act(Action(f"sleep {restore_after:g}", lambda: time.sleep(restore_after)))
            back = host_step(env, n, s, w, play="chaos")
            assert back.run is not None
            return back.run(ctx)

        out.append(Step("chaos", "bring the TPU host back", run=run_restore,
                        idempotent=False, id="chaos:restore", after=("chaos:kill",)))
    return out
