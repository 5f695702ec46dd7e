"""Starting a node of the twin, as a change a step makes: the start
(after the ghost of a killed host has left Ray's list), and the verify that
it runs and has joined. Used by the cluster's own start (``invoke up``) and
by chaos (a killed host brought back, a host started sick or healed)."""
from __future__ import annotations

from typing import Any

from playbooks.access import connectors
from playbooks.access.ray_api import nodes_fact
from playbooks.cloud.endpoints import dashboard
from playbooks.config.schema import Environment
from playbooks.core.facts import ABSENT
from playbooks.core.step import Await, Broken, Decision, Verify, change
from playbooks.twin.nodes import Host, host_command, late_seconds, log, node_state_fact, registered

START_TIMEOUT = 90.0
# How often a node's start (or stop) is looked at: a Ray node joins in 1-6 s
# here and stops in 1-3 s; each look is one read of the head's node list
# (in-process) or of its pid. Every 2 s, `up` took 14 s for a head and two
# hosts; every 0.5 s, 10 s.
NODE_POLL = 0.5
# A killed host's node stays ALIVE in Ray's list until Ray notices: a new
# node started before that would stand beside a ghost of itself.
GHOST_TIMEOUT = 90.0


def started(env: Environment, name: str, what: str, join: bool = True):
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


def ghost_gone(env: Environment, host: Host) -> Await:
    return Await(nodes_fact(dashboard(env), connectors.this_machine()),
                 lambda ns: "still listed" if registered(ns, host) else None,
                 f"the old {host.name} gone from Ray's nodes", timeout=GHOST_TIMEOUT, interval=2)


def start_host(env: Environment, host: Host, nodes: Any, reason: str, would: str, *before: Any,
               late: float = 0.0, after: tuple[Any, ...] = ()) -> Decision:
    """The change that starts a host (after its ghost is gone, if listed),
    then ``after`` (the chaos restore's event)."""
    ghost = (ghost_gone(env, host),) if nodes is not ABSENT and registered(nodes, host) else ()
    return change(*before, *ghost, host_command(env, host, late), *after, reason=reason, would=would,
                  found="not running")


def host_verify(env: Environment, host: Host) -> Verify:
    late = late_seconds(env, host)
    what = f"{host.name}'s process (it joins {late:g}s after its start)" if late else f"{host.name} ALIVE"
    joined = node_state_fact(env, host.name, lambda nodes: registered(nodes, host), what)
    return Verify(joined, started(env, host.name, f"TPU host {host.name}", join=not late), timeout=START_TIMEOUT,
                  interval=NODE_POLL)
