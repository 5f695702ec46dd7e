"""A stalled job's evidence, gathered once per stall by the follower's
watch: each training worker's last heartbeat (kept from the followed log,
``Heartbeats``) and its Python stack (``access/worker_stacks.py``), joined
by the worker's node and pid, kept under the run's folder
(``hangs/<time>/``: one ``<host>.txt`` per stack read, ``evidence.json``),
and named by ``hang_diagnosis.diagnose``."""
from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass
from typing import Any

from playbooks.access import connectors
from playbooks.access.worker_stacks import StackRead, WorkerProc, list_workers, read_stacks
from playbooks.config import paths
from playbooks.core.connector import Connector
from playbooks.core.errors import PlaybookError
from playbooks.runs import events as E
from playbooks.runs.hang_diagnosis import Diagnosis, Worker, diagnose


class Heartbeats:
    """Each worker's last ``heartbeat`` event (by rank), from the followed
    log: kept here, never in the run's timeline (one a worker per interval)."""

    def __init__(self) -> None:
        self.last: dict[int, dict] = {}

    def take(self, events: list[dict]) -> list[dict]:
        """The events that are not heartbeats; the heartbeats kept."""
        rest = []
        for e in events:
            if e.get("kind") != E.HEARTBEAT:
                rest.append(e)
            elif isinstance(e.get("rank"), int) and float(e["t"]) >= float(self.last.get(e["rank"], {}).get("t", 0)):
                self.last[e["rank"]] = e
        return rest

    def since(self, t0: float) -> list[dict]:
        """The workers' last beats of the worker group started at ``t0``."""
        return sorted((e for e in self.last.values() if float(e["t"]) >= t0), key=lambda e: e["rank"])


def group_start(events: list[dict]) -> float:
    """When the job's current worker group started (0: not seen)."""
    return max((float(e["t"]) for e in events if e.get("kind") in (*E.STARTS, E.WORKER_STARTED)), default=0.0) - 5.0


def names(beats: list[dict]) -> dict[int, str]:
    """A name per rank, as a person finds the host: its hostname (its pod
    on GKE), or, where hosts share one (the local twin), its slice and
    worker id (the twin's host name)."""
    hostnames = [b.get("hostname") for b in beats]
    unique = len(set(hostnames)) == len(hostnames) and all(hostnames)
    return {b["rank"]: str(b["hostname"]) if unique else f"{b.get('slice')}-{b.get('host')}" for b in beats}


def workers(beats: list[dict], stacks: dict[WorkerProc, StackRead]) -> list[Worker]:
    """The workers, joined by (node id, pid): each heard from, then each
    listed by Ray that never beat."""
    named = names(beats)
    by_proc: dict[tuple[Any, Any], StackRead] = {(w.node_id, w.pid): r for w, r in stacks.items()}
    unlisted = {(w.node_id, w.pid): w for w in stacks}
    out = []
    for b in beats:
        r = by_proc.pop((b.get("node_id"), b.get("pid")), StackRead(unread="not listed by Ray as alive"))
        out.append(Worker(named[b["rank"]], b["rank"], b.get("slice"), r.text, r.no_answer, r.unread,
                          float(b["t"]), E.number(b.get("every")), E.step_of(b)))
    for key, r in by_proc.items():
        w = unlisted[key]
        out.append(Worker(f"pid {w.pid} on node {w.node_id[:8]}", None, None, r.text, r.no_answer, r.unread))
    return out


SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class Found:
    diagnosis: Diagnosis
    folder: str  # where its evidence is kept, as shown


def collect(env: Any, run: str, address: str, via: Connector, beats: list[dict],
            now: float | None = None) -> Found:
    """The workers listed, their stacks read, the evidence kept and named."""
    now = time.time() if now is None else now
    try:
        procs = list_workers(address, via)
        listed = None
    except PlaybookError as e:
        procs, listed = [], str(e).splitlines()[0][:200]
    stacks = read_stacks(address, via, procs)
    ws = workers(beats, stacks)
    if listed is not None:  # no stack could be asked for: say why once
        ws = [w if w.unread is None or w.stack else Worker(**{**asdict(w), "unread": f"workers not listed: {listed}"})
              for w in ws]
    d = diagnose(ws, now)
    folder = paths.here(paths.hang_dir(env.name, run, time.strftime("%Y%m%d-%H%M%S", time.localtime(now))))
    local = connectors.this_machine()
    for w in ws:
        if w.stack is not None:
            local.write(str(folder / f"{SAFE.sub('_', w.name)}.txt"), w.stack.encode())
    record = {"t": now, "line": d.line, "cause": d.cause, "culprits": list(d.culprits),
              "workers": [{k: v for k, v in asdict(w).items() if k != "stack"} | {"stack_read": w.stack is not None}
                          for w in ws]}
    local.write(str(folder / "evidence.json"), (json.dumps(record, indent=1, default=str) + "\n").encode())
    return Found(d, paths.shown(folder))
