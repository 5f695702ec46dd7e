"""When a running job is stalled, and the one line that says so.

A RUNNING job is stalled when it has made no progress for ``stall_after``
seconds (the inventory's key; by default the larger of 10 x the run's p90
step time and 10 minutes). Progress is a step or a checkpoint saved; before the first step of a
worker group (its start-up, restore and compile), also each of those, and
the compile is allowed for on top: ``COMPILE_ALLOWANCE``, or 3 x the longest
compile the run has recorded, when that is longer. A worker lost, a failure
or a resize starts such a period again (the job is recovering, not hung).
After its last step (the trainer says how many) a job saves and ends: no
step is due. The line: ``stalled: no step since 14:03 (14 min; last step
340; p90 step 2.1 s)``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from playbooks.runs import events as E

DEFAULT_FLOOR = 600.0  # 10 minutes
P90_FACTOR = 10.0
COMPILE_ALLOWANCE = 600.0  # before a worker group's first step
# A worker group starting: Ray Train's line, or the trainer's own event (its
# rank 0, once per group, with the time it happened).
STARTS = E.STARTS
DISRUPTIONS = (*E.LOSSES, *STARTS)
PROGRESS = E.PROGRESS


@dataclass(frozen=True)
class Stall:
    since: float  # the last progress
    now: float
    last_step: int | None
    p90: float | None
    limit: float  # seconds without progress that make a stall here

    @property
    def seconds(self) -> float:
        return self.now - self.since

    def line(self) -> str:
        return (f"stalled: no step since {clock(self.since)} ({duration(self.seconds)}; "
                f"{'last step ' + str(self.last_step) if self.last_step is not None else 'no step yet'}; "
                f"p90 step {f'{self.p90:.1f} s' if self.p90 is not None else 'n/a'})")


def clock(t: float) -> str:
    return time.strftime("%H:%M", time.localtime(t))


def duration(s: float) -> str:
    if s >= 5400:
        return f"{s / 3600:.1f} h"
    return f"{s / 60:.0f} min" if s >= 60 else f"{s:.0f} s"


def steps(events: list[dict]) -> list[dict]:
    return [e for e in events if e.get("kind") == "step" and isinstance(e.get("step"), int)]


def p90(events: list[dict]) -> float | None:
    """The p90 of the step times MaxText measured, past each worker group's
    first two steps (those compile), as the summary counts them."""
    vals: list[float] = []
    seen = 0
    for e in sorted(events, key=lambda e: float(e["t"])):
        if e.get("kind") in STARTS:
            seen = 0
        elif e.get("kind") == E.STEP and isinstance(e.get("seconds"), (int, float)):
            seen += 1
            if seen > 2:
                vals.append(float(e["seconds"]))
    if not vals:
        return None
    vals.sort()
    return vals[min(len(vals) - 1, int(0.9 * len(vals)))]


def look_every(heartbeat: float, stall_after: int | None) -> float:
    """How often the watch beside a followed job looks: every heartbeat, or
    a fifth of ``stall_after`` (at least a second) when that is sooner, so
    that a stall is seen within 1.2 x ``stall_after`` (with the default
    30 s heartbeat, a 10 s hang under ``stall_after: 5`` was seen only when
    a look happened to fall inside it)."""
    return heartbeat if not stall_after else min(heartbeat, max(1.0, stall_after / 5))


def threshold(stall_after: int | None, p90_s: float | None) -> float:
    """Seconds without a step that make a stall: ``stall_after`` when the
    inventory sets it, else the larger of 10 x p90 and 10 minutes."""
    if stall_after:
        return float(stall_after)
    return max(P90_FACTOR * (p90_s or 0.0), DEFAULT_FLOOR)


def compile_allowance(events: list[dict]) -> float:
    longest = max((float(e.get("seconds") or 0) for e in events if e.get("kind") == E.COMPILE_ENDED), default=0.0)
    return max(COMPILE_ALLOWANCE, 3 * longest)


def check(events: list[dict], now: float, stall_after: int | None = None) -> Stall | None:
    """The stall of a RUNNING job whose events these are, or None."""
    ordered = sorted(events, key=lambda e: float(e["t"]))
    if not ordered:
        return None
    since = float(ordered[0]["t"])
    stepped = False  # a step since the last disruption
    last_step: int | None = None
    total: int | None = None  # the job's steps, as its trainer said
    for e in ordered:
        if e.get("kind") == E.JAX_INITIALIZED and isinstance(e.get("steps"), int):
            total = e["steps"]
        kind = e.get("kind")
        if kind == E.STEP:
            since, stepped = float(e["t"]), True
            last_step = e["step"] if isinstance(e.get("step"), int) else last_step
        elif kind in DISRUPTIONS:
            since, stepped = float(e["t"]), False
        elif kind in PROGRESS and (not stepped or kind == E.CHECKPOINT_SAVED):
            since = max(since, float(e["t"]))
    if stepped and total is not None and last_step is not None and last_step >= total - 1:
        return None  # the last step is done: the job saves and ends, no step is due
    q = p90(ordered)
    limit = threshold(stall_after, q) + (0.0 if stepped else compile_allowance(ordered))
    if now - since < limit:
        return None
    return Stall(since, now, last_step, q, limit)
