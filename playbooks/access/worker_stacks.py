"""The training workers' Python stacks, read from the Ray dashboard (Ray
2.60, ray/dashboard/modules/reporter/reporter_head.py):

- the workers: the State API's actors of class ``RayTrainWorker`` that are
  ALIVE (``/api/v0/actors``, the list `ray list actors` reads), each with
  its node id and pid;
- a worker's stack: ``/worker/traceback?node_id=...&pid=...``, which the
  head passes to that node's agent (gRPC ``GetTraceback``), which runs
  ``py-spy dump -p PID`` (no ``--nonblocking``: py-spy stops the process
  while it reads it; ``sudo -n`` first where that needs no password) and
  answers its text (200), or py-spy's failure (500), or 403 when the head
  was started without ``RAY_DASHBOARD_ENABLE_PROFILING=1`` (profiling is
  off by default). Neither the head nor the agent bounds the dump's time:
  each request here has its own timeout, and a request that times out is
  "no answer", itself evidence.

Every request goes through the connector (this machine, or the controller
host that runs the port-forward), each as its curl line."""
from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from typing import Any

from playbooks.core.connector import Connector
from playbooks.core.errors import ProbeFailed
from playbooks.core.facts import ABSENT

WORKER_CLASS = "RayTrainWorker"  # ray/train/v2/_internal/execution/worker_group/worker.py
STACK_TIMEOUT = 10.0  # seconds for one worker's stack (py-spy dump takes well under one)
PARALLEL = 8          # stacks read at once: 64 hosts in at most 8 x STACK_TIMEOUT
DISABLED = 403        # Ray's answer while RAY_DASHBOARD_ENABLE_PROFILING is unset


@dataclass(frozen=True)
class WorkerProc:
    """A training worker's process, as the State API lists it."""

    node_id: str
    pid: int
    actor_id: str = ""


@dataclass(frozen=True)
class StackRead:
    """One worker's stack: its text, or that it gave no answer (timed
    out), or why it could not be read (``unread``)."""

    text: str | None = None
    no_answer: bool = False
    unread: str | None = None


def actors_url(address: str) -> str:
    q = urllib.parse.urlencode([("filter_keys", "class_name"), ("filter_predicates", "="),
                                ("filter_values", WORKER_CLASS), ("filter_keys", "state"),
                                ("filter_predicates", "="), ("filter_values", "ALIVE"),
                                ("limit", "10000"), ("detail", "false")])
    return f"{address}/api/v0/actors?{q}"


def traceback_url(address: str, node_id: str, pid: int) -> str:
    return f"{address}/worker/traceback?{urllib.parse.urlencode({'node_id': node_id, 'pid': pid})}"


def list_workers(address: str, via: Connector, timeout: float = 10.0) -> list[WorkerProc]:
    """The ALIVE training workers (none when nothing answers at the
    address); a dashboard that fails raises ``ProbeFailed``."""
    d = via.get_json(actors_url(address), timeout=timeout)
    if d is ABSENT:
        return []
    rows = (((d or {}).get("data") or {}).get("result") or {}).get("result") or []
    out = []
    for a in rows:
        pid, node = a.get("pid"), a.get("node_id")
        if isinstance(pid, int) and pid > 0 and isinstance(node, str) and node:
            out.append(WorkerProc(node, pid, str(a.get("actor_id") or "")))
    return out


def read_stack(address: str, via: Connector, w: WorkerProc, timeout: float | None = None) -> StackRead:
    try:
        status, body = via.get_text(traceback_url(address, w.node_id, w.pid), timeout=timeout or STACK_TIMEOUT)
    except ProbeFailed as e:
        if "timed out" in (e.stderr or ""):
            return StackRead(no_answer=True)
        return StackRead(unread=f"the dashboard did not answer: {(e.stderr or '').strip()[:200]}")
    if status == 200:
        return StackRead(text=body)
    if status == DISABLED:
        return StackRead(unread="profiling is off on the Ray head (RAY_DASHBOARD_ENABLE_PROFILING=1 turns it on)")
    return StackRead(unread=f"HTTP {status}: {said(body)[:200]}")


def said(body: str) -> str:
    """The words of a failed answer: py-spy's own error (the first line of
    Ray's "=== stderr ===" section) when there is one, else its first line."""
    _, marker, rest = body.partition("=== stderr ===")
    lines = [line.strip() for line in (rest if marker else body).splitlines() if line.strip()]
    return lines[0] if lines and not lines[0].startswith("=== ") else (body.strip().splitlines() or [""])[0]


def read_stacks(address: str, via: Connector, workers: list[WorkerProc],
                timeout: float | None = None) -> dict[WorkerProc, StackRead]:
    """Every worker's stack, ``PARALLEL`` at a time, each within ``timeout``."""
    from concurrent.futures import ThreadPoolExecutor  # only when a stall is diagnosed
    if not workers:
        return {}
    with ThreadPoolExecutor(max_workers=min(PARALLEL, len(workers)), thread_name_prefix="stack") as pool:
        reads: list[Any] = list(pool.map(lambda w: read_stack(address, via, w, timeout), workers))
    return dict(zip(workers, reads, strict=True))
