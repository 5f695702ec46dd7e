"""What the follower does, without a person, about a host that the
evidence names (``stall_action: restart``): a hang's culprit (the hang
diagnosis) or a host the health gate failed. Pure: given the names the
evidence gives (a worker's name: on the twin its simulated host's name,
"<TPU_NAME>-<TPU_WORKER_ID>"; on GKE its pod's hostname), the host each
maps to (the twin: that host; GKE: the pod's node's node pool, a slice),
and whether the job is elastic, it says which hosts to set aside, whether
to stop the job instead, and the one line that says so.

- an elastic job: the named hosts quarantined (``hosts.quarantine``'s
  steps, composed in ``cli/task_steps.py`` and handed down as
  ``Quarantine``), which ends the hung worker group as a lost host does;
  Ray Train's elastic controller goes on from its last checkpoint on the
  slices left. Never every slice: with none left, the job is stopped.
- a job that is not elastic: stopped (it cannot go on without a slice),
  the line naming the host and what to do; nothing set aside.
- no host named (cause unknown, every worker silent), or a name that maps
  to no host: stopped, never a host the evidence did not name.

A gate's failure ends its worker group by itself: for an elastic job the
failed hosts are set aside so that the next group does not take them; for
one that is not elastic, a line naming them (the job fails by itself)."""
from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from playbooks.runs import events as E

BY_STALL = "stall_action: restart"
BY_GATE = "health gate"


@dataclass(frozen=True)
class Quarantine:
    """How the follower sets hosts aside, composed by the task (the follow
    never imports a play): ``hosts``: each host's name -> its slice;
    ``steps(name, why, by)``: the quarantine's steps for a host;
    ``refused``: why no host can be set aside here (Autopilot), or None;
    ``coming``, ``notice``, ``start``: a slice's announced end."""

    elastic: bool
    hosts: Mapping[str, str]
    steps: Callable[[str, str, str], list[Any]]
    refused: str | None = None
    # A slice's announced end (runs/maintenance_watch.py): each host's end
    # to come, read afresh (host -> (time, in words)); the steps that give a
    # host its notice before it (host, time, why); those that start its
    # maintenance at once after the notice's save (None: not here).
    coming: Callable[[], Mapping[str, tuple[float, str]]] | None = None
    notice: Callable[[str, float, str], list[Any]] | None = None
    start: Callable[[str], list[Any]] | None = None
    # The run's hold off GKE maintenance renewed while the job runs (the
    # steps, for a run's name; None: no hold here).
    renew: Callable[[str], list[Any]] | None = None
    # A host set aside for its maintenance given back once it is over (the
    # release's steps; None: nothing is set aside for it here, the twin).
    release: Callable[[str], list[Any]] | None = None
    # The hosts set aside now, read afresh (the record; on GKE those of it
    # whose nodes keep the taint): one a person gave back since (`invoke
    # hosts.release`) counts as a slice again. None, or a look that fails:
    # every host this watch set aside stays so.
    held: Callable[[], Collection[str]] | None = None


@dataclass(frozen=True)
class Plan:
    """What to do: ``hosts`` to set aside (may be none), ``stop``: the job
    stopped, ``line``: said, naming the host(s) and what comes next."""

    hosts: tuple[str, ...]
    stop: bool
    line: str


def gate_names(unhealthy: Sequence[Any], simulated: bool) -> list[str]:
    """The names of the hosts a ``health_gate`` event says failed: the
    twin's "<slice>-<host>" (its hosts share one hostname), GKE's pod
    hostname. An entry that names none is left out."""
    out = []
    for u in unhealthy:
        if not isinstance(u, dict):
            continue
        if simulated:
            name = f"{u['slice']}-{u['host']}" if u.get("slice") and u.get("host") is not None else None
        else:
            name = u.get("hostname") or None
        if name and str(name) not in out:
            out.append(str(name))
    return out


def _mapped(names: Sequence[str], host_of: Callable[[str], str | None]) -> tuple[list[str], list[str]]:
    """The hosts the names map to (each once), and the names that map to none."""
    hosts: list[str] = []
    unmapped: list[str] = []
    for n in names:
        h = host_of(n)
        if h is None:
            unmapped.append(n)
        elif h not in hosts:
            hosts.append(h)
    return hosts, unmapped


def _shown(hosts: Sequence[str]) -> str:
    return ("host " if len(hosts) == 1 else "hosts ") + ", ".join(hosts)


def _next(run: str) -> str:
    return f"`invoke train` resumes run {run} from its last checkpoint"


def _release(hosts: Sequence[str]) -> str:
    return "; ".join(f"`invoke hosts.release {h}`" for h in hosts) + " gives it back once fixed"


def _left(q: Quarantine, hosts: Sequence[str], gone: Collection[str]) -> set[str]:
    """The slices that keep a host when ``hosts`` go (and ``gone`` went)."""
    return {s for h, s in q.hosts.items() if h not in hosts and h not in gone}


def for_stall(q: Quarantine, culprits: Sequence[str] | None, host_of: Callable[[str], str | None],
              sid: str, run: str, gone: Collection[str] = ()) -> Plan:
    """A stall's plan, on the hang diagnosis's ``culprits`` (None: the
    diagnosis could not be made); ``gone``: hosts set aside already."""
    said = f"{BY_STALL}: job {sid}"
    if not culprits:
        why = "the hang diagnosis failed" if culprits is None else "the hang names no host (cause unknown)"
        return Plan((), True, f"{said} stopped: {why}, so no host is set aside; {_next(run)}")
    hosts, unmapped = _mapped(culprits, host_of)
    if unmapped:
        return Plan((), True, f"{said} stopped: the hang names {', '.join(unmapped)}, which is no host of this "
                              f"environment's (its pod or node pool not known), so none is set aside; {_next(run)}")
    if not q.elastic:
        return Plan((), True, f"{said} stopped: the hang names {_shown(hosts)}; a job that is not elastic cannot go "
                              f"on without its slice: fix it, or set it aside (`invoke hosts.quarantine "
                              f"{hosts[0]}`, then `invoke train --elastic`); {_next(run)}")
    if q.refused:
        return Plan((), True, f"{said} stopped: the hang names {_shown(hosts)}, which cannot be set aside here "
                              f"({q.refused}); {_next(run)}")
    if not _left(q, hosts, gone):
        return Plan((), True, f"{said} stopped: the hang names {_shown(hosts)}, every slice of the job: none would "
                              f"be left to go on with, so none is set aside; {_next(run)}")
    return Plan(tuple(hosts), False, f"{said}: {_shown(hosts)} quarantined (named by the hang); the elastic job goes "
                                     f"on from its last checkpoint on the slices left; {_release(hosts)}")


def for_gate(q: Quarantine | None, names: Sequence[str], host_of: Callable[[str], str | None],
             sid: str, gone: Collection[str] = ()) -> Plan | None:
    """A gate's failure's plan (None: it names no host). ``q`` None: the
    follower does not act (``stall_action`` is not restart): a line."""
    if not names:
        return None
    hosts, unmapped = _mapped(names, host_of)
    named = ", ".join(hosts + unmapped)
    if q is None or not q.elastic or q.refused or unmapped or not hosts:
        why = ("the job is not elastic" if q is not None and not q.elastic else
               q.refused if q is not None and q.refused else
               f"{', '.join(unmapped)}: no host of this environment's" if q is not None and unmapped else
               "stall_action is not restart")
        return Plan((), False, f"health gate: job {sid}'s worker group failed its checks on {named}; not set aside "
                               f"({why}): `invoke hosts.quarantine {(hosts + unmapped)[0]}` sets it aside")
    if not _left(q, hosts, gone):
        return Plan((), False, f"health gate: job {sid}'s worker group failed its checks on {named}, every slice of "
                               f"the job: none is set aside (none would be left to go on with)")
    return Plan(tuple(hosts), False, f"health gate: {_shown(hosts)} quarantined (failed its checks); the elastic "
                                     f"job's next worker group goes on without it; {_release(hosts)}")


# The gate's one check across hosts: its failure names no host by itself.
COLLECTIVE = "collective"


def failed_hosts(e: Any) -> list[dict]:
    """The hosts an event of the health gate says failed: a ``health_gate``'s
    ``unhealthy`` (rank 0's word over every host, or only its own when the
    verdicts could not be gathered), and a ``health_checked`` whose own
    checks failed (each host's word on itself: when the hosts' device
    counts differ, the all-gather of the verdicts fails, and only the sick
    host's own event names it). A failed collective alone names nobody."""
    if not isinstance(e, dict):
        return []
    if e.get("kind") == E.HEALTH_GATE:
        return [u for u in (e.get("unhealthy") or []) if isinstance(u, dict)]
    if e.get("kind") == E.HEALTH_CHECKED and isinstance(e.get("checks"), dict):
        failed = [f"{name}: {c.get('detail')}" for name, c in e["checks"].items()
                  if name != COLLECTIVE and isinstance(c, dict) and c.get("ok") is False]
        if failed:
            return [{**{k: e.get(k) for k in ("hostname", "slice", "host", "rank")}, "failed": failed}]
    return []


# A host's part of the gate's HostUnhealthy line (trainer/health_check.py,
# ``message``): "<hostname> (slice <s>, worker <w>, rank <r>): <checks>".
UNHEALTHY_PART = re.compile(r"(?:^|: | \| )(\S+) \(slice (\S+), worker (\S+), rank (\S+)\): ([^|]+?)(?= \||$)")
UNHEALTHY = "health check failed, the worker group stops before MaxText: "


def failed_in_message(message: str) -> list[dict]:
    """The hosts a job's final message names as failing their own checks
    (Ray keeps a failed job's last logs in it): a worker that failed the gate
    may end before its own events reach the driver's log."""
    out: list[dict] = []
    for line in (message or "").splitlines():
        if UNHEALTHY not in line:
            continue
        for m in UNHEALTHY_PART.finditer(line.split(UNHEALTHY, 1)[1]):
            host = {"hostname": m.group(1), "slice": m.group(2), "host": m.group(3), "rank": m.group(4),
                    "failed": [c.strip() for c in m.group(5).split("; ") if c.strip()]}
            if host["failed"] and host not in out:
                out.append(host)
    return out


def gate_refusal(events: Sequence[Any], simulated: bool, elastic: bool, message: str = "") -> str | None:
    """A failed job's one line when a health gate of it failed hosts: which,
    on what checks, and what to do (None: no gate failed one). ``message``:
    the job's final message, read when no event names one."""
    bad = [u for e in events for u in failed_hosts(e)] or failed_in_message(message)
    names = gate_names(bad, simulated)
    if not names:
        return None
    failed = sorted({str(c) for u in bad for c in (u.get("failed") or [])})
    what = f" ({', '.join(failed)})" if failed else ""
    first = names[0]
    todo = ("fix it, or set it aside (`invoke hosts.quarantine " + first + "`) and run `invoke train --elastic`"
            if not elastic else "fix it, or set it aside (`invoke hosts.quarantine " + first + "`) and run "
            "`invoke train` again")
    return (f"the health gate failed on {_shown(names)}{what}; "
            + ("a job that is not elastic cannot go on without its slice: " if not elastic else "") + todo)
