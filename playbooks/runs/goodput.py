"""Goodput: a run's wall time, each second given to exactly one cause, from
its timeline (``timeline.py``). A pure function of the events: no I/O.

The wall time runs from the run's first submission to its last job's end
(to now, or the last event, while a job runs). Each second is:

- ``productive``: a step that counts, the first time it runs (MaxText's
  step: from the previous step of its worker group, or, for a group's first
  step, the step's own seconds back from its end); or one of these badputs:
- ``scheduling``: waiting for capacity and scheduling (a job submitted,
  until its worker group starts);
- ``startup``: the first worker group starting (JAX, MaxText's setup);
- ``compile``: jax.monitoring's compile spans (trace, lower, XLA);
- ``checkpoint``: checkpoint saves, as long as they hold the training;
- ``detection``: from a worker lost until Ray Train sees the failure;
- ``restart``: from the failure (or a resize) until the new worker group
  has restored and compiled;
- ``restore``: restoring a checkpoint;
- ``replayed``: steps run again after a restore (at or below the step
  lost at), and the step in progress when a worker was lost;
- ``stall``: a stall, from the last step to the next one (or the failure,
  or the host the follower set aside: ``stall_action: restart``, after
  which the incident goes on as a lost host's: detection, restart);
- ``between_jobs``: from a job's end until the next job is submitted (no
  job running: nothing waits for capacity then);
- ``other``: after the last step until the job's end.

Where two overlap, the more specific wins, in the order stall, restore,
checkpoint, compile, replayed, productive, then the phase (the rest), so
the parts add up to the wall time exactly.

An incident is a worker lost, a failure, a resize or a stall: lost at step
N (the last step its worker group finished), restored from step K, N - K
steps replayed, and the time to recover (from the loss to the first step of
a new worker group); what else goes wrong before that first step belongs to
the same incident. An incident its job's end ends first (a stall the
follower stopped, ``stall_action: stop``; a job that failed) is not
recovered: it says how it ended, and when a later job of the run resumes,
the step that job restored, the steps it replays and how long after the
incident its first step came (``resumed_s``). A step the old group still
finishes after the loss (a survivor logs the step it was in when its peer
was killed) is that group's last work: it moves N, it does not end the
incident.

Ray's lines carry no time: an event given one within bounds
(``timeline.py``: ``t_uncertain_s``) is listed with them (``uncertain``),
and the seconds its window covers may belong to the cause beside it.

Rank 0 says each step it finishes (``step``); the first host of every other
slice says them too (``peer_step``), so that a step is known when rank 0's
host is lost before logging it. A step counts once per worker group, when
the first host says it; a host saying a step again is a new group running
it again.

The report also carries the run's saves (``saves.py``): each save due, and
whether it was finalized ("saves: N of M finalized", the missing named).
"""
from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

from playbooks.runs import cost, saves
from playbooks.runs import events as E
from playbooks.runs.timeline import who

CAUSES = ("scheduling", "startup", "compile", "checkpoint", "detection", "restart", "restore", "replayed", "stall",
          "between_jobs", "other")
PRODUCTIVE = "productive"
# Which cause a second gets when several intervals cover it (higher wins).
RANK = {"stall": 9, "restore": 8, "checkpoint": 7, "compile": 6, "replayed": 5, PRODUCTIVE: 4}
LOSSES = E.LOSSES
# Events of a new worker group: after one of these, a step is the recovery's.
REGROUP = E.REGROUP
# The trainer's own events of a worker group's start (its time, not when a line was read).
GROUP_START = E.GROUP_START
WHAT = {"scheduling": "waiting for capacity and scheduling", "startup": "start-up", "compile": "compile",
        "checkpoint": "checkpoint saves", "detection": "failure detection", "restart": "restart",
        "restore": "restore", "replayed": "replayed steps", "stall": "stalls",
        "between_jobs": "between jobs (none running)", "other": "other"}


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _step(e: dict) -> int | None:
    s = e.get("step")
    return s if isinstance(s, int) and not isinstance(s, bool) else None


def account(events: Iterable[dict], run: str | None = None, now: float | None = None,
            on_disk: Collection[int] | None = None) -> dict:
    """The goodput report of a run's events (see the module); ``on_disk``:
    the steps Orbax counts finalized in its checkpoints folder, for its
    saves (``saves.account``; None: not looked at)."""
    return _account(events, run, now, on_disk)[0]


def account_with_segments(events: Iterable[dict], run: str | None = None, now: float | None = None,
                          on_disk: Collection[int] | None = None) -> tuple[dict, list[tuple[float, float, str]]]:
    """The report and its (start, end, cause) segments, from one sweep (what
    a run's cost is counted on: ``cost.py``)."""
    return _account(events, run, now, on_disk)


def segments(events: Iterable[dict], now: float | None = None) -> list[tuple[float, float, str]]:
    """The wall time as (start, end, cause) segments in time order (the
    same carving as the report's parts), for the plot's band."""
    return _account(events, None, now)[1]


def _account(events: Iterable[dict], run: str | None, now: float | None,
             on_disk: Collection[int] | None = None) -> tuple[dict, list]:
    evs = sorted((e for e in events if _num(e.get("t")) is not None), key=lambda e: float(e["t"]))
    if not evs:
        return empty(run), []
    jobs = list(dict.fromkeys(str(e["job"]) for e in evs if e.get("job")))
    start = next((float(e["t"]) for e in evs if e.get("kind") == E.SUBMITTED), float(evs[0]["t"]))
    # A release (`invoke hosts.release`) is the ledger's, not the run's: one
    # written after the job's end (its end not yet read back) does not make
    # the run longer.
    tail = next((e for e in reversed(evs) if e.get("kind") != E.RELEASED), evs[-1])
    last = float(tail["t"])
    ended = tail.get("kind") == E.JOB_END or (
        bool(jobs) and any(e.get("kind") == E.JOB_END and e.get("job") == jobs[-1] for e in evs))
    end = last if ended or now is None else max(last, now)
    sweep = Sweep([e for e in evs if start <= float(e["t"]) <= end], start, end)
    sweep.run()
    segs = _sweep(sweep.base, sweep.intervals, start, end)
    return _report(run, jobs, start, end, ended, segs, sweep) | {"saves": saves.account(evs, on_disk)}, segs


def _report(run: str | None, jobs: list[str], start: float, end: float, ended: bool,
            segs: list[tuple[float, float, str]], sweep: Sweep) -> dict:
    parts: dict[str, float] = {}
    for a, b, c in segs:
        parts[c] = parts.get(c, 0.0) + (b - a)
    wall = end - start
    productive = parts.pop(PRODUCTIVE, 0.0)
    return {
        "run": run, "jobs": jobs, "start": start, "end": end, "running": not ended,
        "wall_s": round(wall, 3), "productive_s": round(productive, 3),
        "goodput_pct": round(100 * productive / wall, 2) if wall > 0 else 0.0,
        "badput_s": {c: round(parts.get(c, 0.0), 3) for c in CAUSES},
        "steps": {"counted": sweep.counted, "replayed": sweep.replayed},
        "incidents": [i.report() for i in sorted(sweep.incidents, key=lambda i: i.t)],
        "uncertain": uncertain(sweep.evs, start, end),
    }


def uncertain(evs: list[dict], start: float, end: float) -> dict:
    """The events whose time is known only within bounds (Ray's lines read
    after the log's stream dropped): each with its ``within_s`` either way
    (None: at or before its time, by how much unknown), and the seconds
    their windows cover, which may belong to a cause beside theirs."""
    out, windows = [], []
    for e in evs:
        u = _num(e.get("t_uncertain_s"))
        if (u is None or u <= 0) and e.get("t_from") != "before":
            continue
        t = float(e["t"])
        out.append({"kind": e.get("kind"), "at": round(t, 3), "within_s": u})
        if u:
            windows.append((max(start, t - u), min(end, t + u)))
    merged: list[list[float]] = []
    for a, b in sorted(windows):
        if b <= a:
            continue
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    # The windows, merged, are the cost report's too (cost.windows).
    return {"events": out, "seconds": round(sum(b - a for a, b in merged), 3),
            "windows": [[round(a, 3), round(b, 3)] for a, b in merged]}


@dataclass
class Incident:
    """A worker lost, a failure, a resize or a stall, and what it cost: the
    step it was lost at (N), the checkpoint step restored (K), N - K steps
    replayed, the time to recover (the loss to the first step after it)."""

    kind: str
    t: float
    by: str
    lost_at_step: int | None
    restored_from_step: int | None = None
    replayed_steps: int | None = None
    recover_s: float | None = None
    failures: int = 0
    detect_s: float | None = None
    first_step: int | None = None
    ended: str | None = None  # how its job ended before it was recovered from
    resumed_s: float | None = None  # the incident to the first step of the job that resumed the run
    hang: str | None = None  # a stall's hang as the follower named it (hang_diagnosis.py)
    quarantined: list[str] | None = None  # the hosts the follower set aside for it (runs/restart.py)
    notice: str | None = None  # the notice it came with (a preemption's grace; trainer/notice.py)

    def report(self) -> dict:
        out: dict[str, Any] = {"kind": self.kind, "at": round(self.t, 3), "by": self.by,
                               "lost_at_step": self.lost_at_step, "restored_from_step": self.restored_from_step,
                               "replayed_steps": self.replayed_steps, "recover_s": self.recover_s}
        if self.detect_s is not None:
            out["detect_s"] = self.detect_s
        if self.first_step is not None:
            out["first_step"] = self.first_step
        if self.failures:
            out["failures"] = self.failures
        if self.ended is not None:
            out["ended"] = self.ended
        if self.resumed_s is not None:
            out["resumed_s"] = self.resumed_s
        if self.hang is not None:
            out["hang"] = self.hang
        if self.quarantined:
            out["quarantined"] = self.quarantined
        if self.notice is not None:
            out["notice"] = self.notice
        return out


@dataclass
class OpenStall:
    since: float
    incident: Incident


class Sweep:
    """The events in time order, each claiming its seconds: the phase it
    starts (``base``: the phases tile the wall time), the intervals it
    overlays (compile, checkpoint, restore, stall, a step), and the
    incidents. One small handler per kind of event (``HANDLERS``)."""

    def __init__(self, evs: list[dict], start: float, end: float):
        self.evs, self.end = evs, end
        self.intervals: list[tuple[float, float, str]] = []  # (start, end, cause) of the overlays and steps
        self.base: list[tuple[float, float, str]] = []  # the phases: they tile [start, end]
        self.incidents: list[Incident] = []
        self.open: Incident | None = None  # the incident not recovered from yet
        self.noticed: str | None = None  # a notice taken, until the loss it announces
        self.phase, self.prev = "other", start
        self.max_done: int | None = None
        self.last_step: int | None = None
        self.last_step_t: float | None = None  # of the current worker group
        self.stall: OpenStall | None = None
        self.counted = self.replayed = 0
        self.regrouped = False  # a new worker group seen since the open incident's loss
        self.reported: dict[int, set[str]] = {}  # this worker group's steps: which hosts said each

    def run(self) -> None:
        for i, e in enumerate(self.evs):
            t, kind = float(e["t"]), e.get("kind")
            if kind in REGROUP:
                self.regrouped = True
            if kind in GROUP_START:
                self.reported = {}
            self.tile(i, t)
            handler = HANDLERS.get(str(kind))
            if handler is not None:
                handler(self, e, t, i)
        if self.end > self.prev:
            self.base.append((self.prev, self.end, "other" if self.phase == "running" else self.phase))
        self.close_stall(self.end)
        if self.open is not None and not self.listed(self.open):
            self.incidents.append(self.open)  # not recovered (yet)

    def listed(self, inc: Incident) -> bool:
        return any(i is inc for i in self.incidents)

    # -- the phases ----------------------------------------------------------
    def tile(self, i: int, t: float) -> None:
        """The phase so far claims the time up to this event; after a step,
        that time is lost work if a loss comes next, else the job's end."""
        if t <= self.prev:
            return
        cause = self.phase
        if self.phase == "running":
            cause = "replayed" if self.next_kind(i) in LOSSES else "other"
        self.base.append((self.prev, t, cause))
        self.prev = t

    def next_kind(self, i: int) -> str | None:
        for e in self.evs[i:]:
            if e.get("kind") in (E.STEP, E.JOB_END, E.SUBMITTED, *LOSSES):
                return str(e["kind"])
        return None

    def regroup_phase(self) -> str:
        return "startup" if self.open is None else "restart"

    def close_stall(self, t: float, ended: str | None = None) -> None:
        """The stall's end: by progress (or a loss: its own incident), or,
        ``ended``, by its job's end: then not recovered, and open until a
        later job resumes the run."""
        if self.stall is None:
            return
        self.intervals.append((self.stall.since, t, "stall"))
        inc = self.stall.incident
        self.stall = None
        if ended is None and inc.ended is None:
            inc.recover_s = round(t - inc.t, 3)
            return
        inc.ended = inc.ended or ended
        inc.replayed_steps = None  # until a job resumes the run
        if self.open is None:
            self.open, self.regrouped = inc, False

    # -- the handlers ----------------------------------------------------------
    def submitted(self, e: dict, t: float, i: int) -> None:
        self.phase, self.last_step_t = "scheduling", None

    def workers(self, e: dict, t: float, i: int) -> None:
        self.phase, self.last_step_t = self.regroup_phase(), None

    def group_started(self, e: dict, t: float, i: int) -> None:
        # The trainer's own time of a group's start (Ray's line may come after it, or be timed within bounds).
        if self.phase == "scheduling":
            self.phase = self.regroup_phase()

    def loss(self, e: dict, t: float, i: int) -> None:
        kind = str(e["kind"])
        if self.stall is not None and kind != E.RESIZE:
            self.close_stall(t)
        if self.open is None:
            self.open = Incident(kind, t, who(e), self.last_step, notice=self.noticed)
            self.noticed = None
            self.regrouped = False
            self.phase = "detection" if kind == E.WORKER_LOST else "restart"
        elif kind != E.WORKER_LOST:
            self.phase = "restart"
        if kind == E.FAILURE:
            self.open.failures += 1
            if self.open.kind == E.WORKER_LOST and self.open.detect_s is None:
                self.open.detect_s = round(t - self.open.t, 3)
        self.last_step_t = None

    def restore_started(self, e: dict, t: float, i: int) -> None:
        self.phase = "restore"
        if self.open is not None and _step(e) is not None:
            self.open.restored_from_step = _step(e)

    def restored(self, e: dict, t: float, i: int) -> None:
        self.phase = self.regroup_phase()
        self.overlay(e, t, "restore")
        if self.open is not None and _step(e) is not None:
            self.open.restored_from_step = _step(e)

    def overlay(self, e: dict, t: float, cause: str) -> None:
        """The ``seconds`` before this event were ``cause``'s."""
        s = _num(e.get("seconds"))
        if s:
            self.intervals.append((t - s, t, cause))

    def stall_started(self, e: dict, t: float, i: int) -> None:
        since = _num(e.get("since")) or t
        if self.stall is not None:
            return
        inc = Incident("stall", since, "no cause recorded", self.last_step, replayed_steps=0)
        hung = [h for h in self.evs[:i] if h.get("kind") == E.WORKER_HUNG and since - 60 <= float(h["t"]) <= t]
        if hung:
            inc.by = who(hung[-1])
        self.incidents.append(inc)
        self.stall = OpenStall(since, inc)

    def notice_received(self, e: dict, t: float, i: int) -> None:
        """The trainer took a notice (a host Ray drains): the loss it
        announces opens the next incident, which says so, with the step its
        save was asked at (the notice's; where it said none, the run's step
        before it in the timeline)."""
        grace = E.number(e.get("grace_s"))
        n, known = _step(e), self.step_before(i)
        at = f"at step {n}" if n is not None else f"at step {known} (the timeline's; the notice said none)" \
            if known is not None else "before any step"
        asked = f"its save asked {at}" if e.get("save_asked") else f"no save asked: {e.get('why') or '?'}"
        self.noticed = ("a notice to go" + (f", {grace:.0f} s ahead" if grace is not None else "")
                        + f" (ranks {', '.join(str(r) for r in e.get('ranks') or []) or '?'}); {asked}")

    def step_before(self, i: int) -> int | None:
        """The step the run was at before event ``i``: the last a host said
        it finished, or a worker group restored from since."""
        kinds = (E.STEP, E.PEER_STEP, E.RESTORE_STARTED, E.RESTORED)
        return next((_step(e) for e in reversed(self.evs[:i]) if e.get("kind") in kinds and _step(e) is not None),
                    None)

    def hang_diagnosed(self, e: dict, t: float, i: int) -> None:
        """The follower's naming of the open stall's hang: its line, kept on the stall."""
        if self.stall is not None and isinstance(e.get("line"), str):
            self.stall.incident.hang = e["line"]

    def quarantined(self, e: dict, t: float, i: int) -> None:
        """A host the follower set aside (``stall_action: restart``, a failed
        health gate): during a stall, the stall's seconds end there, and its
        incident goes on as a lost host's (detection until Ray Train fails
        the group, then restart) until a new group's first step. A gate's:
        named on the incident its failure opened, if any."""
        inc = self.stall.incident if self.stall is not None else self.open
        if inc is not None and isinstance(e.get("host"), str):
            inc.quarantined = (inc.quarantined or []) + [e["host"]]
        if self.stall is None:
            return
        self.intervals.append((self.stall.since, t, "stall"))
        self.stall = None
        if self.open is None:
            self.open, self.regrouped, self.phase = inc, False, "detection"
        self.last_step_t = None

    def stopped(self, e: dict, t: float, i: int) -> None:
        """The follower stopped the job (``stall_action: stop``): what it
        stalled in is not recovered from."""
        how = f"stopped ({e.get('by') or 'by the follower'})"
        for inc in (self.stall.incident if self.stall else None, self.open):
            if inc is not None and inc.ended is None:
                inc.ended = how

    def job_end(self, e: dict, t: float, i: int) -> None:
        how = f"job ended ({e.get('status') or 'status unknown'})"
        self.close_stall(t, ended=how)
        if self.open is not None and self.open.ended is None:
            self.open.ended = how
        self.phase, self.last_step_t = "between_jobs", None

    def step(self, e: dict, t: float, i: int) -> None:
        n = _step(e)
        if n is None or not self.first_said(e, n):
            return
        self.close_stall(t)
        secs = _num(e.get("seconds")) or 0.0
        begin = self.last_step_t if self.last_step_t is not None else t - secs
        if self.max_done is None or n > self.max_done:
            self.intervals.append((begin, t, PRODUCTIVE))
            self.max_done, self.counted = n, self.counted + 1
        else:
            self.intervals.append((begin, t, "replayed"))
            self.replayed += 1
        if self.open is not None and self.old_groups_last_work(n):
            return
        if self.open is not None:
            self.recovered(n, t)
        self.last_step, self.last_step_t, self.phase = n, t, "running"

    def first_said(self, e: dict, n: int) -> bool:
        """A step counts once per worker group, when its first host says it;
        the same host saying it again is a new group running it again."""
        reporter = f"peer {e.get('rank')!r}" if e.get("kind") == E.PEER_STEP else "rank 0"
        if reporter in self.reported.get(n, ()):
            self.reported = {}
        elif n in self.reported:  # another host of this group said it first
            self.reported[n].add(reporter)
            return False
        self.reported.setdefault(n, set()).add(reporter)
        return True

    def old_groups_last_work(self, n: int) -> bool:
        """A step the old group finished after the loss (a survivor logs the
        step it was in): the incident was lost at it, and is not over."""
        assert self.open is not None
        lost = self.open.lost_at_step
        if not self.regrouped and (lost is None or n > lost):
            self.open.lost_at_step = self.last_step = n
            return True
        return False

    def recovered(self, n: int, t: float) -> None:
        """The first step of a new group after the incident: MaxText resumes
        at the step after the one restored."""
        inc = self.open
        assert inc is not None
        lost, k = inc.lost_at_step, inc.restored_from_step
        if k is None:
            k = inc.restored_from_step = n - 1 if lost is not None and n - 1 <= lost else None
        inc.replayed_steps = max(0, lost - k) if k is not None and lost is not None else 0
        inc.first_step = n
        if inc.ended is None:
            inc.recover_s = round(t - inc.t, 3)
        else:  # its job ended first: a later job resumed the run
            inc.resumed_s = round(t - inc.t, 3)
        if not self.listed(inc):
            self.incidents.append(inc)
        self.open = None


HANDLERS: dict[str, Callable[[Sweep, dict, float, int], None]] = {
    E.SUBMITTED: Sweep.submitted,
    **dict.fromkeys(E.GROUP_LINES, Sweep.workers),
    **dict.fromkeys(E.GROUP_START, Sweep.group_started),
    **dict.fromkeys(LOSSES, Sweep.loss),
    E.RESTORE_STARTED: Sweep.restore_started, E.RESTORED: Sweep.restored,
    E.COMPILE_ENDED: lambda s, e, t, i: s.overlay(e, t, "compile"),
    E.CHECKPOINT_SAVED: lambda s, e, t, i: s.overlay(e, t, "checkpoint"),
    E.STALL_STARTED: Sweep.stall_started, E.STALL_ENDED: lambda s, e, t, i: s.close_stall(t),
    E.STOPPED: Sweep.stopped, E.JOB_END: Sweep.job_end, E.HANG_DIAGNOSED: Sweep.hang_diagnosed,
    E.QUARANTINED: Sweep.quarantined, E.NOTICE_RECEIVED: Sweep.notice_received,
    **dict.fromkeys(E.STEPS, Sweep.step),
}


def empty(run: str | None) -> dict:
    return {"run": run, "jobs": [], "start": None, "end": None, "running": False, "wall_s": 0.0, "productive_s": 0.0,
            "goodput_pct": 0.0, "badput_s": dict.fromkeys(CAUSES, 0.0), "steps": {"counted": 0, "replayed": 0},
            "incidents": [], "saves": saves.account([])}


def _sweep(base: list[tuple[float, float, str]], intervals: list[tuple[float, float, str]], start: float,
           end: float) -> list[tuple[float, float, str]]:
    """Elementary segments of [start, end], each with the cause that wins it."""
    marks: list[tuple[float, int, str, bool]] = []  # (time, order, cause, is_base)
    for a, b, c in intervals:
        a, b = max(a, start), min(b, end)
        if b > a:
            marks += [(a, 1, c, False), (b, 0, c, False)]
    bounds = sorted({start, end, *(m[0] for m in marks), *(a for a, _, _ in base)})
    marks.sort()
    active: dict[str, int] = {}
    out: list[tuple[float, float, str]] = []
    bi, mi = 0, 0
    for lo, hi in itertools.pairwise(bounds):
        while mi < len(marks) and marks[mi][0] <= lo:
            _, opening, c, _ = marks[mi]
            active[c] = active.get(c, 0) + (1 if opening else -1)
            mi += 1
        while bi < len(base) and base[bi][1] <= lo:
            bi += 1
        top = max((c for c, n in active.items() if n > 0), key=lambda c: RANK[c], default=None)
        cause = top if top is not None else (base[bi][2] if bi < len(base) else "other")
        if out and out[-1][2] == cause and out[-1][1] == lo:
            out[-1] = (out[-1][0], hi, cause)
        else:
            out.append((lo, hi, cause))
    return out


def _library_line(lib: dict | None) -> list[str]:
    """The second opinion's headline (goodput_reference.py), if it was asked."""
    if not lib:
        return []
    if lib.get("error"):
        return [f"  {lib['library']} on the same steps: not computed ({lib['error']})"]
    return [f"  {lib['library']} {lib.get('version', '')} on the same steps: {lib['goodput_pct']:.1f}% "
            f"(its badput types beside ours: --json)"]


def _cost_lines(c: dict | None) -> list[str]:
    """The run's chips, chip-hours and cost (``cost.py``), if counted."""
    return cost.header_lines(c) if c else []


def _spent(c: dict | None, hours_key: str | tuple[str, str], cost_key: str | tuple[str, str]) -> str:
    """A part's chip-hours (and dollars), for its line."""
    if not c:
        return ""

    def get(k: str | tuple[str, str]) -> Any:
        return c.get(k) if isinstance(k, str) else (c.get(k[0]) or {}).get(k[1])

    h, d = get(hours_key), get(cost_key)
    return f"  {h:9.3g} chip-h" + (f"  {cost.money_text(d)}" if d is not None else "") if h is not None else ""


def lines(r: dict) -> list[str]:
    """The report for a person."""
    note = [f"note: {r['note']}"] if r.get("note") else []
    if not r["wall_s"]:
        return [f"run {r['run']}: no events yet", *note]
    jobs = ", ".join(r["jobs"]) or "?"
    c = r.get("cost")
    out = [f"goodput of run {r['run']} ({'job' if len(r['jobs']) == 1 else 'jobs'} {jobs}"
           f"{', still running' if r['running'] else ''}): {r['goodput_pct']:.1f}% of {r['wall_s']:.1f} s",
           f"  from {E.when(r['start'])} to {'now, ' if r['running'] else ''}{E.when(r['end'])}",
           *_library_line(r.get("library")), *_cost_lines(c),
           f"  {'productive':<40} {r['productive_s']:9.1f} s  {r['steps']['counted']} steps"
           + _spent(c, "productive_chip_hours", "productive_cost"),
           f"  {'badput':<40} {r['wall_s'] - r['productive_s']:9.1f} s"
           + (f"  ({r['steps']['replayed']} steps replayed)" if r["steps"]["replayed"] else "")]
    for cause in CAUSES:
        s = r["badput_s"][cause]
        if s:
            out.append(f"    {WHAT[cause]:<38} {s:9.1f} s  {100 * s / r['wall_s']:5.1f}%"
                       + _spent(c, ("badput_chip_hours", cause), ("badput_cost", cause)))
    if c and (c.get("badput_chip_hours") or {}).get(cost.HELD):
        out.append(f"  {cost.HELD_WHAT + ' (billed, not in the worker group)':<54}"
                   + _spent(c, ("badput_chip_hours", cost.HELD), ("badput_cost", cost.HELD)))
    if c and (c.get("badput_chip_hours") or {}).get(cost.QUARANTINED):
        out.append(f"  {cost.QUARANTINED_WHAT:<54}"
                   + _spent(c, ("badput_chip_hours", cost.QUARANTINED), ("badput_cost", cost.QUARANTINED)))
    out += [f"  {line}" for line in saves.lines(r["saves"])] if r.get("saves") else []
    if r["incidents"]:
        out.append("  incidents")
    for i in r["incidents"]:
        when = E.when(i["at"])
        k = i["restored_from_step"]
        rec = f"recovered in {i['recover_s']:.1f} s" if i["recover_s"] is not None else "not recovered"
        if i.get("ended"):
            rec = f"not recovered: {i['ended']}" + (f"; the next job's first step {i['resumed_s']:.1f} s after it"
                                                    if i.get("resumed_s") is not None else "")
        lost = f"lost at step {i['lost_at_step']}" if i["lost_at_step"] is not None else "before any step"
        out.append(f"    {when} {i['kind']} ({i['by']}): {lost}, "
                   + (f"restored from step {k}, " if k is not None else "no restore, ")
                   + f"{i['replayed_steps'] if i['replayed_steps'] is not None else '?'} steps replayed, {rec}")
        if i.get("notice"):
            out.append(f"      after {i['notice']}")
        if i.get("hang"):
            out.append(f"      {i['hang']}")
        if i.get("quarantined"):
            out.append(f"      set aside: {', '.join(i['quarantined'])} (`invoke hosts`)")
    return out + _uncertain_lines(r.get("uncertain")) + note


def _uncertain_lines(u: dict | None) -> list[str]:
    """How far the parts may be off: Ray's lines timed within bounds."""
    if not u or not u.get("events"):
        return []
    known = [e["within_s"] for e in u["events"] if e["within_s"] is not None]
    unknown = len(u["events"]) - len(known)
    out = [f"  times not exact: {len(u['events'])} of Ray's lines read after the log's stream dropped "
           f"(Ray's lines carry no time)"]
    if known:
        out.append(f"    {len(known)} within +/-{max(known):.1f} s of their time here: up to {u['seconds']:.1f} s "
                   f"of the parts above may belong to the cause beside theirs")
    if unknown:
        out.append(f"    {unknown} at or before their time here, by how much unknown (no trainer event before them)")
    return out
