"""The hosts an environment has set aside: which host (the twin: a
simulated host's name; GKE: a slice, its node pool and the nodes it had
when set aside), why (one line: the failed check, the hang's diagnosis, a
person's words), since when and by what. One JSON file on this machine
(``paths.quarantine``), read by ``invoke hosts``, ``status`` and the twin's
start of a host; written only by the quarantine and release steps' actions.

A file that cannot be read, or is not this record, is "could not look"
(ProbeFailed): never taken for "none set aside"."""
from __future__ import annotations

import time
from typing import Any

from playbooks.access import host_records
from playbooks.config import paths
from playbooks.core.errors import ProbeFailed
from playbooks.core.facts import Action, Fact


def _file(env: Any) -> str:
    return paths.quarantine(env.name)


def entry(slice_: str, why: str, by: str, nodes: list[str] | tuple[str, ...] = (),
          since: float | None = None) -> dict:
    """One host's record (``nodes``: a GKE slice's nodes when set aside)."""
    return {"slice": slice_, "nodes": list(nodes), "why": why, "by": by,
            "since": time.time() if since is None else since}


def _bad(env: Any, what: str) -> ProbeFailed:
    return ProbeFailed("quarantined hosts", f"cat {_file(env)}", 1, "", what,
                       why=f"could not look: {_file(env)} {what}: remove it or fix it by hand")


def read(env: Any) -> dict[str, dict]:
    """host -> its record; {} when the file does not exist."""
    try:
        return host_records.read(_file(env), lambda v: isinstance(v, dict), 'hosts ({"hosts": {NAME: {...}}})')
    except host_records.Unreadable as e:
        raise _bad(env, str(e)) from None


def write(env: Any, hosts: dict[str, dict]) -> None:
    host_records.write(_file(env), hosts)


def fact(env: Any, assumed: dict[str, dict] | None = None) -> Fact:
    """The record, as a read-only look (a dry run assumes ``assumed``: none)."""
    return Fact(name="quarantined hosts", python=lambda: read(env), display=f"cat {_file(env)}",
                assumed={} if assumed is None else assumed,
                describe=lambda hs: ", ".join(sorted(hs)) or "none")


def add(env: Any, name: str, record: dict) -> Action:
    """The action that records ``name`` as set aside (a fresh read first: another entry made since stays)."""
    def go() -> None:
        hosts = read(env)
        hosts[name] = record
        write(env, hosts)
    return Action(f"# record {name} as quarantined in {_file(env)}: {record['why']}", go)


def remove(env: Any, name: str) -> Action:
    def go() -> None:
        hosts = read(env)
        hosts.pop(name, None)
        write(env, hosts)
    return Action(f"# remove {name} from {_file(env)}", go)


def since(record: dict) -> float | None:
    """When a host's record was written (None: its time is not a number)."""
    try:
        return float(record.get("since") or 0)
    except (TypeError, ValueError, OverflowError):
        return None


def since_text(record: dict) -> str:
    t = since(record)
    try:
        return "?" if t is None else time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(t))
    except (ValueError, OverflowError, OSError):
        return "?"


def line(name: str, record: dict) -> str:
    """One host's record in one line."""
    nodes = record.get("nodes") or []
    on = f" (nodes {', '.join(nodes)})" if nodes else ""
    return (f"{name}: slice {record.get('slice') or '?'}{on}, since {since_text(record)}, by "
            f"{record.get('by') or '?'}: {record.get('why') or '?'}")


def held_out(host: str, held: dict) -> str | None:
    """Why a quarantined host is not started (None: it is not quarantined):
    by `invoke up`, a chaos task's restore or heal alike."""
    rec = held.get(host)
    return None if rec is None else (f"TPU host {host} is quarantined: {line(host, rec)}; "
                                     f"`invoke hosts.release {host}` gives it back")
