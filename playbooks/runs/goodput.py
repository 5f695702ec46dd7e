"""Goodput: a run's wall time, each second given to exactly one cause, from
its timeline (``timeline.py``). A pure function of the events: no I/O.

The wall time runs from the run's first submission to its last job's end
(to now, or the last event, while a job runs). Each second is:

- ``productive``: a step that counts, the first time it runs (MaxText's
  step: from the previous step of its worker group, or, for a group's first
  step, the step's own seconds back from its end); or one of these badputs:
- ``scheduling``: waiting for capacity and scheduling (submitted, until a
  worker group starts);
- ``startup``: the first worker group starting (JAX, MaxText's setup);
- ``compile``: jax.monitoring's compile spans (trace, lower, XLA);
- ``checkpoint``: checkpoint saves, as long as they hold the training;
- ``detection``: from a worker lost until Ray Train sees the failure;
- ``restart``: from the failure (or a resize) until the new worker group
  has restored and compiled;
- ``restore``: restoring a checkpoint;
- ``replayed``: steps run again after a restore (at or below the step
  lost at), and the step in progress when a worker was lost;
- ``stall``: a stall, from the last step to the next one (or the failure);
- ``other``: after the last step until the job's end, between jobs.

Where two overlap, the more specific wins, in the order stall, restore,
checkpoint, compile, replayed, productive, then the phase (the rest), so
the parts add up to the wall time exactly.

An incident is a worker lost, a failure, a resize or a stall: lost at step
N (the last step its worker group finished), restored from step K, N - K
steps replayed, and the time to recover (from the loss to the first step of
a new worker group); what else goes wrong before that first step belongs to
the same incident. A step the old group still finishes after the loss (a
survivor logs the step it was in when its peer was killed) is that group's
last work: it moves N, it does not end the incident.

Rank 0 says each step it finishes (``step``); the first host of every other
slice says them too (``peer_step``), so that a step is known when rank 0's
host is lost before logging it. A step counts once per worker group, when
the first host says it; a host saying a step again is a new group running
it again.
"""
from __future__ import annotations

import itertools
import time
from collections.abc import Iterable
from typing import Any

from playbooks.runs.timeline import who

CAUSES = ("scheduling", "startup", "compile", "checkpoint", "detection", "restart", "restore", "replayed", "stall",
          "other")
PRODUCTIVE = "productive"
# Which cause a second gets when several intervals cover it (higher wins).
RANK = {"stall": 9, "restore": 8, "checkpoint": 7, "compile": 6, "replayed": 5, PRODUCTIVE: 4}
LOSSES = ("worker_lost", "failure", "resize")
# Events of a new worker group: after one of these, a step is the recovery's.
REGROUP = ("workers_started", "workers_restarted", "worker_started", "jax_initialized", "restore_started",
           "restored", "first_step_after_restore")
# The trainer's own events of a worker group's start (its time, not when a line was read).
GROUP_START = ("worker_started", "jax_initialized")
WHAT = {"scheduling": "waiting for capacity and scheduling", "startup": "start-up", "compile": "compile",
        "checkpoint": "checkpoint saves", "detection": "failure detection", "restart": "restart",
        "restore": "restore", "replayed": "replayed steps", "stall": "stalls", "other": "other"}


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _step(e: dict) -> int | None:
    s = e.get("step")
    return s if isinstance(s, int) and not isinstance(s, bool) else None


def account(events: Iterable[dict], run: str | None = None, now: float | None = None) -> dict:
    """The goodput report of a run's events (see the module)."""
    return _account(events, run, now)[0]


def segments(events: Iterable[dict], now: float | None = None) -> list[tuple[float, float, str]]:
    """The wall time as (start, end, cause) segments in time order (the
    same carving as the report's parts), for the plot's band."""
    return _account(events, None, now)[1]


def _account(events: Iterable[dict], run: str | None, now: float | None) -> tuple[dict, list]:
    evs = sorted((e for e in events if _num(e.get("t")) is not None), key=lambda e: float(e["t"]))
    if not evs:
        return empty(run), []
    jobs = list(dict.fromkeys(str(e["job"]) for e in evs if e.get("job")))
    start = next((float(e["t"]) for e in evs if e.get("kind") == "submitted"), float(evs[0]["t"]))
    last = float(evs[-1]["t"])
    ended = evs[-1].get("kind") == "job_end" or (
        bool(jobs) and any(e.get("kind") == "job_end" and e.get("job") == jobs[-1] for e in evs))
    end = last if ended or now is None else max(last, now)
    evs = [e for e in evs if start <= float(e["t"]) <= end]

    intervals: list[tuple[float, float, str]] = []  # (start, end, cause) of the overlays and steps
    base: list[tuple[float, float, str]] = []  # the phases: they tile [start, end]
    incidents: list[dict] = []
    open_: dict | None = None
    phase, prev = "other", start
    max_done: int | None = None
    last_step: int | None = None
    last_step_t: float | None = None  # of the current worker group
    stall: dict | None = None
    counted = replayed = 0

    def next_kind(i: int) -> str | None:
        for e in evs[i:]:
            if e.get("kind") in ("step", "job_end", "submitted", *LOSSES):
                return str(e["kind"])
        return None

    def close_stall(t: float) -> None:
        nonlocal stall
        if stall is not None:
            intervals.append((stall["since"], t, "stall"))
            stall["incident"]["recover_s"] = round(t - stall["since"], 3)
            stall = None

    regrouped = False  # a new worker group seen since the open incident's loss
    reported: dict[int, set[str]] = {}  # this worker group's steps: which hosts said each
    for i, e in enumerate(evs):
        t, kind = float(e["t"]), e.get("kind")
        if kind in REGROUP:
            regrouped = True
        if kind in GROUP_START:
            reported = {}
        if t > prev:
            cause = phase
            if phase == "running":  # after a step: lost work if a loss comes next, else the job's end
                cause = "replayed" if next_kind(i) in LOSSES else "other"
            base.append((prev, t, cause))
            prev = t
        if kind == "submitted":
            phase, last_step_t = "scheduling", None
        elif kind in ("workers_started", "workers_restarted"):
            phase, last_step_t = ("startup" if open_ is None else "restart"), None
        elif kind in ("worker_started", "jax_initialized") and phase == "scheduling":
            # The trainer's own time of a group's start (Ray's line is stamped when read).
            phase = "startup" if open_ is None else "restart"
        elif kind in LOSSES:
            if stall is not None and kind != "resize":
                close_stall(t)
            if open_ is None:
                open_ = {"kind": kind, "t": t, "by": who(e), "lost_at_step": last_step, "restored_from_step": None,
                         "replayed_steps": None, "recover_s": None, "failures": 0}
                regrouped = False
                if kind == "worker_lost":
                    phase = "detection"
                else:
                    phase = "restart"
            elif kind != "worker_lost":
                phase = "restart"
            if kind == "failure":
                open_["failures"] += 1
                if open_["kind"] == "worker_lost" and "detect_s" not in open_:
                    open_["detect_s"] = round(t - open_["t"], 3)
            last_step_t = None
        elif kind == "restore_started":
            phase = "restore"
            if open_ is not None and _step(e) is not None:
                open_["restored_from_step"] = _step(e)
        elif kind == "restored":
            phase = "startup" if open_ is None else "restart"
            s = _num(e.get("seconds"))
            if s:
                intervals.append((t - s, t, "restore"))
            if open_ is not None and _step(e) is not None:
                open_["restored_from_step"] = _step(e)
        elif kind == "compile_ended":
            s = _num(e.get("seconds"))
            if s:
                intervals.append((t - s, t, "compile"))
        elif kind == "checkpoint_saved":
            s = _num(e.get("seconds"))
            if s:
                intervals.append((t - s, t, "checkpoint"))
        elif kind == "stall_started":
            since = _num(e.get("since")) or t
            if stall is None:
                inc = {"kind": "stall", "t": since, "by": "no cause recorded", "lost_at_step": last_step,
                       "restored_from_step": None, "replayed_steps": 0, "recover_s": None, "failures": 0}
                hung = [h for h in evs[:i] if h.get("kind") == "worker_hung" and since - 60 <= float(h["t"]) <= t]
                if hung:
                    inc["by"] = who(hung[-1])
                incidents.append(inc)
                stall = {"since": since, "incident": inc}
        elif kind == "stall_ended":
            close_stall(t)
        elif kind == "job_end":
            close_stall(t)
            phase, last_step_t = "other", None
        elif kind in ("step", "peer_step") and _step(e) is not None:
            n = _step(e)
            assert n is not None
            reporter = f"peer {e.get('rank')!r}" if kind == "peer_step" else "rank 0"
            if reporter in reported.get(n, ()):  # the same host again: a new group runs it again
                reported = {}
            elif n in reported:  # another host of this group said it first
                reported[n].add(reporter)
                continue
            reported.setdefault(n, set()).add(reporter)
            close_stall(t)
            secs = _num(e.get("seconds")) or 0.0
            begin = last_step_t if last_step_t is not None else t - secs
            if max_done is None or n > max_done:
                intervals.append((begin, t, PRODUCTIVE))
                max_done, counted = n, counted + 1
            else:
                intervals.append((begin, t, "replayed"))
                replayed += 1
            lost = open_["lost_at_step"] if open_ is not None else None
            if open_ is not None and not regrouped and (lost is None or n > lost):
                # The old group's last step, finished after the loss: the
                # incident was lost at it, and is not over.
                open_["lost_at_step"] = last_step = n
                continue
            if open_ is not None:
                # MaxText resumes at the step after the one restored.
                k = open_["restored_from_step"]
                if k is None:
                    k = open_["restored_from_step"] = n - 1 if lost is not None and n - 1 <= lost else None
                open_["replayed_steps"] = max(0, lost - k) if k is not None and lost is not None else 0
                open_["recover_s"] = round(t - open_["t"], 3)
                open_["first_step"] = n
                incidents.append(open_)
                open_ = None
            last_step, last_step_t, phase = n, t, "running"
    if end > prev:
        base.append((prev, end, "other" if phase == "running" else phase))
    close_stall(end)
    if open_ is not None:
        incidents.append(open_)  # not recovered (yet)
    segs = _sweep(base, intervals, start, end)
    parts: dict[str, float] = {}
    for a, b, c in segs:
        parts[c] = parts.get(c, 0.0) + (b - a)
    wall = end - start
    productive = parts.pop(PRODUCTIVE, 0.0)
    badput = {c: round(parts.get(c, 0.0), 3) for c in CAUSES}
    return {
        "run": run, "jobs": jobs, "start": start, "end": end, "running": not ended,
        "wall_s": round(wall, 3), "productive_s": round(productive, 3),
        "goodput_pct": round(100 * productive / wall, 2) if wall > 0 else 0.0,
        "badput_s": badput, "steps": {"counted": counted, "replayed": replayed},
        "incidents": [_incident(i) for i in sorted(incidents, key=lambda i: i["t"])],
    }, segs


def _incident(i: dict) -> dict:
    out = {"kind": i["kind"], "at": round(i["t"], 3), "by": i["by"], "lost_at_step": i["lost_at_step"],
           "restored_from_step": i["restored_from_step"], "replayed_steps": i["replayed_steps"],
           "recover_s": i["recover_s"]}
    for k in ("detect_s", "first_step"):
        if k in i:
            out[k] = i[k]
    if i.get("failures"):
        out["failures"] = i["failures"]
    return out


def empty(run: str | None) -> dict:
    return {"run": run, "jobs": [], "start": None, "end": None, "running": False, "wall_s": 0.0, "productive_s": 0.0,
            "goodput_pct": 0.0, "badput_s": dict.fromkeys(CAUSES, 0.0), "steps": {"counted": 0, "replayed": 0},
            "incidents": []}


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


def lines(r: dict) -> list[str]:
    """The report for a person."""
    note = [f"note: {r['note']}"] if r.get("note") else []
    if not r["wall_s"]:
        return [f"run {r['run']}: no events yet", *note]
    jobs = ", ".join(r["jobs"]) or "?"
    out = [f"goodput of run {r['run']} ({'job' if len(r['jobs']) == 1 else 'jobs'} {jobs}"
           f"{', still running' if r['running'] else ''}): {r['goodput_pct']:.1f}% of {r['wall_s']:.1f} s",
           *_library_line(r.get("library")),
           f"  {'productive':<40} {r['productive_s']:9.1f} s  {r['steps']['counted']} steps",
           f"  {'badput':<40} {r['wall_s'] - r['productive_s']:9.1f} s"
           + (f"  ({r['steps']['replayed']} steps replayed)" if r["steps"]["replayed"] else "")]
    for c in CAUSES:
        s = r["badput_s"][c]
        if s:
            out.append(f"    {WHAT[c]:<38} {s:9.1f} s  {100 * s / r['wall_s']:5.1f}%")
    if r["incidents"]:
        out.append("  incidents")
    for i in r["incidents"]:
        when = time.strftime("%H:%M:%S", time.localtime(i["at"]))
        k = i["restored_from_step"]
        rec = f"recovered in {i['recover_s']:.1f} s" if i["recover_s"] is not None else "not recovered"
        lost = f"lost at step {i['lost_at_step']}" if i["lost_at_step"] is not None else "before any step"
        out.append(f"    {when} {i['kind']} ({i['by']}): {lost}, "
                   + (f"restored from step {k}, " if k is not None else "no restore, ")
                   + f"{i['replayed_steps'] if i['replayed_steps'] is not None else '?'} steps replayed, {rec}")
    return out + note
