"""Where each rank of a running job sits: its host (the twin's
``tpu-group-<slice>-<worker>``) and its pod (GKE: a worker's hostname is its
pod's name), from the trainer's ``worker_started`` events of the job's last
worker group. A pure function of the events: no I/O.

What a chaos task aims at (``--target``): ``first`` (the first worker, as
the tutorial finds it), ``rank0`` (the host of the job's rank 0: the one
that logs the steps and writes the checkpoints' metadata) or ``peer`` (a
host of the job that is not rank 0's), or one host or pod by name.
"""
from __future__ import annotations

from dataclasses import dataclass

from playbooks.runs import events as E

FIRST, RANK0, PEER = "first", "rank0", "peer"
TARGETS = (FIRST, RANK0, PEER)
# The ranks of one worker group start within this many seconds of each other.
GROUP_WINDOW = 120.0


@dataclass(frozen=True)
class Worker:
    rank: int
    host: str | None   # the twin's host name: <TPU_NAME>-<TPU_WORKER_ID>
    pod: str | None    # the worker's hostname: its pod on GKE
    t: float


def _worker(e: dict) -> Worker | None:
    rank = E.step_of({"step": e.get("rank")})
    if rank is None or rank < 0:
        return None
    slice_, host = e.get("slice"), e.get("host")
    name = f"{slice_}-{host}" if isinstance(slice_, str) and slice_ and host is not None else None
    pod = e.get("hostname") if isinstance(e.get("hostname"), str) and e.get("hostname") else None
    return Worker(rank, name, pod, float(e["t"]))


def last_group(events: list[dict], job: str) -> list[Worker]:
    """The workers of job ``job``'s last worker group, by rank ([] when its
    rank 0 has not started yet, or a rank of it is missing)."""
    starts = [e for e in events if e.get("kind") == E.WORKER_STARTED and e.get("job") == job]
    zero = [w for e in starts if (w := _worker(e)) is not None and w.rank == 0]
    if not zero:
        return []
    lead = max(zero, key=lambda w: w.t)
    size = next((e.get("workers") for e in reversed(starts) if _worker(e) == lead), None)
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        return []
    group: dict[int, Worker] = {}
    for e in starts:
        w = _worker(e)
        if (w is not None and e.get("workers") == size and abs(w.t - lead.t) <= GROUP_WINDOW and w.rank < size
                and (w.rank not in group or w.t > group[w.rank].t)):
            group[w.rank] = w
    return [group[r] for r in range(size)] if len(group) == size else []


def aim(group: list[Worker], target: str, name_of) -> tuple[str | None, str]:
    """The name (``name_of(worker)``: its host or pod) a ``rank0`` or
    ``peer`` target is, and in words why; None with the reason when it
    cannot be told."""
    if not group:
        return None, "the running job's worker group is not known yet (no worker_started of its rank 0 and peers)"
    rank0 = name_of(group[0])
    if target == RANK0:
        return (rank0, f"the host of rank 0 of {len(group)}") if rank0 else (None, "rank 0's host is not recorded")
    peers = [n for w in group[1:] if (n := name_of(w)) and n != rank0]
    if not peers:
        return None, f"no host of the {len(group)} workers other than rank 0's ({rank0})"
    return peers[0], f"a peer: the host of rank {next(w.rank for w in group if name_of(w) == peers[0])}, not rank 0's"


def rank_at(events: list[dict], job: str | None, name: str, t: float) -> int | None:
    """Which rank the host (or pod) ``name`` held at time ``t``: from the
    worker_started events of the group running then (None: unknown)."""
    best: Worker | None = None
    for e in events:
        if e.get("kind") != E.WORKER_STARTED or (job is not None and e.get("job") != job):
            continue
        w = _worker(e)
        if w is not None and w.t <= t and name in (w.host, w.pod) and (best is None or w.t > best.t):
            best = w
    return best.rank if best else None
