"""The twin's simulated host maintenance: for each simulated TPU host, the
time its maintenance is scheduled (epoch seconds), as GKE labels a TPU node
``cloud.google.com/scheduled-maintenance-time`` days ahead. One JSON file on
this machine (``paths.maintenance``): written by ``chaos.maintenance`` (the
schedule, then its end), read by the watch (``runs/maintenance_watch.py``)
through the same look as GKE's labels.

A file that cannot be read, or is not this record, is "could not look"
(ProbeFailed): never taken for "nothing scheduled"."""
from __future__ import annotations

from typing import Any

from playbooks.access import host_records
from playbooks.config import paths
from playbooks.core.errors import ProbeFailed
from playbooks.core.facts import Action, Fact


def _file(env: Any) -> str:
    return paths.maintenance(env.name)


def read(env: Any) -> dict[str, float]:
    """host -> its maintenance's time; {} when nothing is scheduled."""
    try:
        hosts = host_records.read(_file(env), lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
                                  'times ({"hosts": {NAME: EPOCH}})')
    except host_records.Unreadable as e:
        raise _bad(env, str(e)) from None
    return {str(k): float(v) for k, v in hosts.items()}


def _bad(env: Any, what: str) -> ProbeFailed:
    return ProbeFailed("simulated maintenance", f"cat {_file(env)}", 1, "", what,
                       why=f"could not look: {_file(env)} {what}: remove it or fix it by hand")


def fact(env: Any) -> Fact:
    return Fact(name="simulated maintenance", python=lambda: read(env), display=f"cat {_file(env)}", assumed={},
                describe=lambda hs: ", ".join(f"{h} at {t:.0f}" for h, t in sorted(hs.items())) or "none")


def schedule(env: Any, hosts: list[str], at: float) -> Action:
    """The action that schedules ``hosts``' maintenance at ``at``."""
    def go() -> None:
        now = read(env)
        now.update(dict.fromkeys(hosts, at))
        host_records.write(_file(env), now)
    return Action(f"# schedule the maintenance of {', '.join(hosts)} in {_file(env)} (as GKE's "
                  f"cloud.google.com/scheduled-maintenance-time label)", go)


def done(env: Any, hosts: list[str]) -> Action:
    """The action that ends ``hosts``' maintenance (GKE removes its label)."""
    def go() -> None:
        host_records.write(_file(env), {h: t for h, t in read(env).items() if h not in hosts})
    return Action(f"# end the maintenance of {', '.join(hosts)} in {_file(env)}", go)
