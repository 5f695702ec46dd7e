"""A run's timeline: ``.state/<env>/training/<run>/events.jsonl``, one JSON
line per event, the same locally and on GKE. Every event has its time
(``t``, seconds since the epoch), its ``kind``, the ``step`` it came at (None
when it has none) and its ``source``; most also name their ``job``.

Where they come from:

- ``trainer``: the trainer scripts print their own events, one JSON line each
  (``trainer event: {...}``, trainer/maxtext_ray.py), with the time they
  happened on the worker: ``worker_started`` (each worker: its rank,
  slice, host in the slice and hostname: its pod on GKE), ``jax_initialized``,
  ``health_checked`` (each host's health gate, trainer/health_check.py) and
  ``health_gate`` (rank 0: its verdict over every host), ``compile_started``/``compile_ended``
  (jax.monitoring's spans), ``step``, ``first_step``, ``checkpoint_saved``
  (step, seconds), ``checkpoint_finalized`` (step, seconds since the save
  began, finalized true or false and why), ``save_schedule`` (rank 0, per
  group: checkpoint_period, enabled, steps), ``notice_received`` (a
  worker whose node Ray drains: node, deadline, the save asked),
  ``restore_started``, ``restored`` (step, seconds),
  ``first_step_after_restore`` (restored_from); from the first host of each
  other slice, ``peer_step`` (its rank: the steps it finishes).
- ``ray_train``/``ray``: Ray Train's and Ray's lines in the followed log
  (they carry no time: each is given one, and says how, ``t_from``, as
  ``Reader`` below says): ``workers_started`` and ``workers_restarted`` (how
  many), ``failure`` (Ray Train's failure policy: RETRY or RAISE, its
  source, its error), ``resize`` (from, to), ``worker_lost`` (a node Ray
  marked dead).
- ``train``/``logs``: the follower: ``submitted``, ``stall_started``,
  ``stall_ended``, ``stopped`` (stall_action: stop, or restart with no
  host to set aside), ``hang_diagnosed``, ``quarantined`` (a host set
  aside by stall_action: restart or a failed health gate: host, slice, why,
  by; ``runs/restart.py``), ``job_end`` (status).
- ``chaos``: the chaos tasks, for the run of the running job:
  ``worker_lost`` (by chaos: the host or pod; a twin's host with its
  slice), ``worker_hung``, ``worker_resumed``, ``host_back`` (a twin's
  killed host started again, with its slice: billed again, ``cost.py``),
  ``host_sickened`` (a twin's host started again with fewer JAX devices:
  ``devices`` of ``of``; billed again), ``host_healed`` (whole again) and
  ``notice_given`` (chaos.preempt-worker: a host told to go in grace_s).
- ``pods``: on GKE, the pod watch while a job is followed: ``scheduled``
  (a worker pod on a node, its slice) and ``worker_lost`` (by a preemption,
  maintenance, a node gone, a failed pod; with its Kubernetes cause).

A log read again from its start (``invoke logs --follow`` after ``train``)
adds nothing twice: an event is known by its key (``key``). Ray's lines,
read again later, keep the time they were first written with.
"""
from __future__ import annotations

import io
import json
import math
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from playbooks.access import connectors
from playbooks.access.ray_api import jobs_fact, ours, run_of
from playbooks.cloud.endpoints import dashboard
from playbooks.config import paths
from playbooks.core.facts import ABSENT
from playbooks.runs import events as E
from playbooks.runs.job_log import clean

FILE = "events.jsonl"
TRAINER = "trainer event: "  # trainer/maxtext_ray.py's EVENT

FAILURE = re.compile(r"\[FailurePolicy\] (\w+)")
FAILURE_SOURCE = re.compile(r"^\s*Source: (.+?)\s*$")
FAILURE_COUNT = re.compile(r"^\s*Error count: (\d+)")
FAILURE_ERROR = re.compile(r"^Error: (.+?)\s*$")
RESIZE = re.compile(r"Deciding to resize the worker group from (\d+) -> (\d+) workers")
NODE_DEAD = re.compile(r"The node with node id: (\w+) and address: (\S+) and node name: (\S+) has been marked dead "
                       r"because (.+?)\.(?: |$)")
PREFIX = re.compile(r"^\((?:[^)]*)\)\s?")  # Ray's "(TrainController pid=9) "


def path(env: Any, run: str) -> Path:
    return paths.here(paths.events(env.name, run))


def key(e: dict) -> tuple:
    """What identifies an event: a line of Ray's by its kind and how many
    came before it in its job's log; anything else by its own time."""
    if "n" in e:
        return (e.get("job"), e.get("kind"), e.get("n"))
    return (e.get("job"), e.get("kind"), e.get("t"), e.get("rank"), e.get("step"), e.get("pod"), e.get("host"))


# A time of an event: seconds since the epoch, finite, before the year 2286.
LATEST = 1e10
# An event is a short line; a longer one is damage, skipped unread.
MAX_LINE = 64 * 1024


def valid(e: Any) -> bool:
    t = e.get("t") if isinstance(e, dict) else None
    return (isinstance(e, dict) and isinstance(e.get("kind"), str) and isinstance(t, (int, float))
            and not isinstance(t, bool) and math.isfinite(t) and 0 <= t <= LATEST)


def event_of(line: bytes | str) -> dict | None:
    """The event of one line of events.jsonl, or None when it is not one
    (cut short, not UTF-8, not JSON, not an event, too long)."""
    if len(line) > MAX_LINE:
        return None
    try:
        text = line.decode() if isinstance(line, bytes) else line
        e = json.loads(text)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return e if valid(e) else None


@dataclass
class Read:
    """What a timeline holds that can be read, and how many lines could not."""

    events: list[dict] = field(default_factory=list)
    skipped: int = 0

    def note(self, where: str) -> str | None:
        if not self.skipped:
            return None
        return (f"{self.skipped} line(s) of {where} could not be read (cut short, not UTF-8, not an event, or over "
                f"{MAX_LINE // 1024} KiB) and were skipped")


def parse_lines(lines: Iterable[bytes | str]) -> Read:
    out = Read()
    for line in lines:
        if not line.strip():
            continue
        e = event_of(line)
        if e is None:
            out.skipped += 1
        else:
            out.events.append(e)
    return out


def parse(text: str) -> list[dict]:
    """The events of an events.jsonl text (a line that is not one is skipped)."""
    return parse_lines(text.splitlines()).events


def lines_of(f: BinaryIO) -> Iterator[bytes]:
    """The lines of a binary file, each at most MAX_LINE + 1 bytes held in
    memory: the rest of a longer line is read past in chunks, and the line
    comes back too long (so it is skipped)."""
    while True:
        line = f.readline(MAX_LINE + 1)
        if not line:
            return
        if len(line) > MAX_LINE and not line.endswith(b"\n"):
            while (chunk := f.readline(MAX_LINE)) and not chunk.endswith(b"\n"):
                pass
        yield line.rstrip(b"\n")


def read_checked(env: Any, run: str) -> Read:
    """A run's events, in time order, and how many lines were skipped (none
    of a missing file)."""
    try:
        data = connectors.this_machine().read(str(path(env, run)))
    except OSError:  # a folder where the file should be, no permission: nothing to read
        return Read()
    if not data:
        return Read()
    got = parse_lines(lines_of(io.BytesIO(data)))
    got.events = ordered(got.events)
    return got


def read(env: Any, run: str) -> list[dict]:
    """A run's events, in time order ([] when it has none)."""
    return read_checked(env, run).events


def ordered(events: Iterable[dict]) -> list[dict]:
    return sorted(events, key=lambda e: float(e["t"]))


# The mark of an event the watch in a GKE head pod also writes into its Ray
# job's log, for this machine to take back (runs/watch_records.py).
MARK = "@tpu-playbooks event "


def append(env: Any, run: str, events: Iterable[dict]) -> None:
    events = list(events)
    data = "".join(json.dumps(e, default=str) + "\n" for e in events)
    if data:
        connectors.this_machine().append(str(path(env, run)), data.encode())
    if events and connectors.in_a_head_pod():
        print("".join(f"{MARK}{json.dumps({'run': run, 'event': e}, default=str)}\n" for e in events), end="",
              flush=True)


def who(e: dict) -> str:
    """What did it, in a few words: by whom (where): its cause."""
    if e.get("kind") == E.RESIZE:
        return f"Ray Train resized the worker group {e.get('workers_from', '?')} -> {e.get('workers', '?')}"
    if e.get("kind") == E.FAILURE:
        return f"Ray Train's failure policy: {e.get('decision', '?')}" + (f" ({e['error']})" if e.get("error") else "")
    by = e.get("by") or e.get("kind", "?")
    where = e.get("host") or e.get("pod") or e.get("node")
    cause = e.get("cause") or e.get("error")
    return f"{by}" + (f" ({where})" if where else "") + (f": {cause}" if cause and cause != by else "")


def event(kind: str, source: str, step: int | None = None, t: float | None = None, **fields: Any) -> dict:
    return {"t": round(time.time() if t is None else t, 3), "kind": kind, "step": step, "source": source, **fields}


# Ray's lines in a job's log carry no time of their own (Ray 2.60: Ray
# Train's controller logs "%(message)s" to its console, and the driver
# prints a raylet's "marked dead" error as it is), so each gets one here:
# - a worker group's line, the time the trainer says that group's workers
#   started (``worker_started``/``jax_initialized`` of as many workers): Ray
#   Train prints the line once it has launched the training function on
#   them (``t_from``: "trainer");
# - while the log is read as it is written (the trainer's last event read
#   within ``LIVE_S`` of its own time), the time it is read ("read");
# - else (a log read from its start, or again after its stream dropped)
#   the middle of what the log's order allows: after the trainer's latest
#   event before it, before the first one after it (and before it was
#   read), ``t_uncertain_s`` either way ("between"); with no trainer event
#   before it, that bound ("before": at or before it, by how much unknown).
# ``t_read``: when it was read, where that is not its time.
LIVE_S = 10.0
# A line held for its bound, with no trainer event after it, is given one
# (the time it was read as its upper bound) after this many seconds.
HOLD_S = 5.0


@dataclass
class Held:
    """A Ray line's event waiting for its time: when it was read, the
    trainer's latest time before it, and whether the log was read as it
    was written."""

    event: dict
    read: float
    after: float | None
    live: bool


class Reader:
    """A job's log lines, as they are read, into events: the trainer's own
    (with their time), Ray Train's and Ray's (numbered, so that a log read
    again adds them once; their time as above)."""

    def __init__(self, job: str, clock: Callable[[], float] = time.time):
        self.job, self.clock = job, clock
        self.counts: dict[str, int] = {}
        self.disrupted = False  # a failure or resize seen: the next worker group is a restart
        self.last_step: int | None = None
        self._failure: Held | None = None
        self._after_failure = 0
        self.live = False  # the log is read as it is written (not known until a trainer event says so)
        self.latest: float | None = None  # the trainer's latest time so far, in the log's order
        self.held: list[Held] = []
        self.starts: list[dict] = []  # the trainer's worker-group starts no group line has claimed yet

    def reconnected(self) -> None:
        """The log is read again from where it was (its stream dropped):
        what comes first was written while it was down."""
        self.live = False

    def _ray(self, kind: str, source: str, **fields: Any) -> Held:
        n = self.counts[kind] = self.counts.get(kind, 0) + 1
        e = {"t": None, "kind": kind, "step": self.last_step, "source": source, "job": self.job, "n": n, **fields}
        return Held(e, round(self.clock(), 3), self.latest, self.live)

    @staticmethod
    def _timed(h: Held, before: float | None = None, anchor: dict | None = None) -> dict:
        """A held line's event with its time: the trainer's start it anchors
        on, the time it was read (read live, or nothing before it), or the
        middle of the bounds the log's order gives it."""
        e = h.event
        if anchor is not None:
            return dict(e, t=round(float(anchor["t"]), 3), t_from="trainer", t_read=h.read)
        if h.live:
            return dict(e, t=h.read, t_from="read")
        hi = min(h.read, before) if before is not None else h.read
        if h.after is None:  # no trainer event before it: at or before its bound, how long before unknown
            return dict(e, t=round(hi, 3), t_from="before", t_read=h.read)
        hi = max(h.after, hi)
        return dict(e, t=round((h.after + hi) / 2, 3), t_from="between", t_uncertain_s=round((hi - h.after) / 2, 3),
                    t_read=h.read)

    def _start_of(self, h: Held, starts: list[dict]) -> dict | None:
        """The trainer's start of the worker group a group line says, if read."""
        if h.event["kind"] not in E.GROUP_LINES:
            return None
        n = h.event.get("workers")
        return next((s for s in starts if s.get("workers") in (None, n)), None)

    def _release(self, before: float | None = None, start: dict | None = None) -> tuple[list[dict], bool]:
        """Every held line, in the log's order, with its time (``before``:
        the time of the trainer's event that comes next; ``start``: that
        event, a worker group's start), and whether a group line claimed
        the start."""
        held, self.held = self.held, []
        out, claimed = [], False
        for h in held:
            anchor = None if claimed or start is None else self._start_of(h, [start])
            claimed = claimed or anchor is not None
            out.append(self._timed(h, before, anchor))
        return out, claimed

    def _emit(self, h: Held) -> list[dict]:
        """A Ray line's event: a group line at its group's start when the
        trainer said it already, else held for its start; another line
        stamped now when the log is read live, else held for its bound."""
        if h.event["kind"] in E.GROUP_LINES:
            anchor = self._start_of(h, self.starts)
            self.starts = []
            if anchor is None:
                self.held.append(h)
                return []
            return self._release()[0] + [self._timed(h, anchor=anchor)]
        self.starts = []  # a failure or resize: the starts before it were another group's
        if h.live and not self.held:
            return [self._timed(h)]
        self.held.append(h)
        return []

    def _close_failure(self) -> list[dict]:
        f, self._failure = self._failure, None
        return self._emit(f) if f is not None else []

    def _trainer(self, e: dict) -> list[dict]:
        t = float(e["t"])
        self.live = self.clock() - t <= LIVE_S
        start = e["kind"] in E.GROUP_START
        out, claimed = self._release(before=t, start=e if start else None)
        if start and not claimed:
            self.starts.append(e)
        self.latest = t if self.latest is None else max(self.latest, t)
        return out + [e]

    def feed(self, raw: str) -> list[dict]:
        line = clean(raw)
        out: list[dict] = []
        body = PREFIX.sub("", line, count=1)
        if self._failure is not None:
            self._after_failure += 1
            f = self._failure.event
            if (m := FAILURE_SOURCE.match(body)):
                f["origin"] = m.group(1)
                return out
            if (m := FAILURE_COUNT.match(body)):
                f["count"] = int(m.group(1))
                return out
            if (m := FAILURE_ERROR.match(body)):
                f["error"] = m.group(1)[:300]
                return self._close_failure()
            if self._after_failure > 6:
                out += self._close_failure()
        i = line.find(TRAINER)
        if i >= 0:
            try:
                e = json.loads(line[i + len(TRAINER):])
            except json.JSONDecodeError:
                return out
            if not valid(e):
                return out
            e.setdefault("step", None)
            e.update(source="trainer", job=self.job)
            if e["kind"] == "step" and isinstance(e.get("step"), int):
                self.last_step = e["step"]
            elif e["kind"] == "peer_step" and isinstance(e.get("step"), int) and e["step"] > (self.last_step or -1):
                self.last_step = e["step"]  # rank 0's host may be the one lost before logging it
            return out + self._trainer(e)
        if (m := E.GROUP_LINE.search(line)):
            kind = E.WORKERS_RESTARTED if self.disrupted else E.WORKERS_STARTED
            out += self._emit(self._ray(kind, "ray_train", workers=int(m.group(1))))
        elif (m := FAILURE.search(line)):
            out += self._close_failure()
            self.disrupted = True
            self._failure, self._after_failure = self._ray(E.FAILURE, "ray_train", decision=m.group(1)), 0
        elif (m := RESIZE.search(line)):
            self.disrupted = True
            out += self._emit(self._ray(E.RESIZE, "ray_train", workers_from=int(m.group(1)), workers=int(m.group(2))))
        elif (m := NODE_DEAD.search(line)):
            out += self._emit(self._ray(E.WORKER_LOST, "ray", by="node", node=m.group(3),
                                        cause=f"Ray marked node {m.group(3)} dead: {m.group(4)}"))
        return out

    def flush(self, now: float) -> list[dict]:
        """The held lines, timed, once the oldest has waited ``HOLD_S``
        seconds for a trainer event after it (the follower's watch asks)."""
        if self.held and now - self.held[0].read >= HOLD_S:
            return self._release()[0]
        return []

    def end(self) -> list[dict]:
        """What is still pending at the log's end."""
        return self._close_failure() + self._release()[0]


class Writer:
    """A run's events file as a follower of job ``job`` adds to it: only what
    it does not hold yet (a log read again from its start adds nothing
    twice), and what others appended meanwhile (a chaos task), read back.
    A job id comes again on a new cluster (``<run>-1``): the events of that
    id from before ``since`` (the job's start; None: a job just submitted)
    are another job's."""

    def __init__(self, env: Any, run: str, job: str, since: float | None = None, write: bool = True):
        self.env, self.run, self.write = env, run, write
        self.file = path(env, run)
        self.events = [e for e in read(env, run)
                       if e.get("job") != job or (since is not None and float(e["t"]) >= since - 1)]
        self.keys = {key(e) for e in self.events}
        self.offset = self.file.stat().st_size if self.file.is_file() else 0

    def add(self, events: Iterable[dict]) -> list[dict]:
        new = [e for e in events if key(e) not in self.keys]
        for e in new:
            self.keys.add(key(e))
        self.events.extend(new)
        if new and self.write:
            append(self.env, self.run, new)
        return new

    def others(self) -> list[dict]:
        """Events another process appended since the last look."""
        data = (connectors.this_machine().read(str(self.file)) or b"")[self.offset:]
        whole = data[:data.rfind(b"\n") + 1]
        self.offset += len(whole)
        new = [e for e in parse_lines(whole.splitlines()).events if key(e) not in self.keys]
        for e in new:
            self.keys.add(key(e))
        self.events.extend(new)
        return new


def running_runs(env: Any) -> list[tuple[str, str]]:
    """(run, job) of this environment's RUNNING jobs, from the Jobs API
    (none when no dashboard answers)."""
    fact = jobs_fact(dashboard(env), connectors.connector(env))
    assert fact.python is not None
    listed = fact.python()
    if listed is ABSENT:
        return []
    return [(run_of(str(j["submission_id"])), str(j["submission_id"])) for j in ours(None, listed)
            if j.get("status") == "RUNNING"]


def record(env: Any, kind: str, source: str = "chaos", **fields: Any) -> list[str]:
    """An event of ours (a chaos task's) in the timeline of each running
    job's run, where its follower (and `invoke goodput`) finds it. Returns
    the runs it went to."""
    out = []
    for run, job in running_runs(env):
        append(env, run, [event(kind, source, job=job, **fields)])
        out.append(run)
    return out


def set_aside(events: list[dict], host: str) -> dict | None:
    """The ``quarantined`` event by which a run's ledger has ``host`` set
    aside now: its last one of the host while the run's job runs (after its
    last ``priced``: a new job's chips start the ledger's slices afresh; no
    ``job_end`` since: nothing is billed between jobs), with no ``released``
    of it since; None when the run does not have it set aside."""
    for e in reversed(events):
        kind = e.get("kind")
        if kind in (E.PRICED, E.JOB_END):
            return None
        if kind in (E.QUARANTINED, E.RELEASED) and e.get("host") == host:
            return e if kind == E.QUARANTINED else None
    return None


def record_release(env: Any, host: str, by: str = "hosts.release") -> list[str]:
    """A ``released`` event of ``host`` (the slice its ``quarantined``
    said) in the timeline of each run of this environment whose running job
    has it set aside (``set_aside``), on this machine: cost counts the slice
    as set aside until then. Returns those runs."""
    entries = connectors.this_machine().list_dir(str(paths.here(paths.training(env.name))))
    out = []
    for run, is_dir in entries or []:
        if is_dir and (q := set_aside(read(env, run), host)) is not None:
            append(env, run, [event(E.RELEASED, "hosts", host=host, slice=q.get("slice"), by=by)])
            out.append(run)
    return out


def release_line(env: Any, host: str) -> str:
    return (f"# released: an event in the timeline of each run that has {host} set aside "
            f"({events_shown(env)})")


def events_shown(env: Any) -> str:
    """Where a run's timeline is, as shown (``<run>`` for the run)."""
    return paths.shown(paths.here(paths.events(env.name, "<run>")))


def record_line(env: Any, kind: str) -> str:
    return (f"# {kind}: an event in the timeline of the running job's run "
            f"({events_shown(env)})")
