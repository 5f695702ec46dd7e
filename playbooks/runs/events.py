"""A run's event vocabulary: the kinds of event of a timeline, each named
once, the sets the readers share (the follower, the stall watch, goodput,
the summary, status, metrics), the shape of an event, and the line of Ray
Train's that starts a worker group. Where each kind comes from is in
``timeline.py``."""
from __future__ import annotations

import re
from datetime import datetime
from typing import Any, NotRequired, TypedDict

# -- the kinds -------------------------------------------------------------------
SUBMITTED = "submitted"
WORKERS_STARTED = "workers_started"        # Ray Train's "Started training worker group of size N"
WORKERS_RESTARTED = "workers_restarted"    # the same, after a failure or a resize
WORKER_STARTED = "worker_started"          # the trainer: each worker running
JAX_INITIALIZED = "jax_initialized"        # the trainer: rank 0, once per worker group
COMPILE_STARTED = "compile_started"
COMPILE_ENDED = "compile_ended"
STEP = "step"                              # rank 0's step (with its loss, tokens/s, TFLOP/s)
PEER_STEP = "peer_step"                    # the first host of another slice: a step it finished
FIRST_STEP = "first_step"
FIRST_STEP_AFTER_RESTORE = "first_step_after_restore"
CHECKPOINT_SAVED = "checkpoint_saved"          # the trainer: a save of step N begun (MaxText's; Orbax ends it async)
CHECKPOINT_FINALIZED = "checkpoint_finalized"  # the trainer: step N's save finalized (finalized: true) or not (why)
SAVE_SCHEDULE = "save_schedule"                # the trainer: rank 0, once per group: checkpoint_period, enabled, steps
NOTICE_GIVEN = "notice_given"                  # chaos or the cluster: a host told to go (host, slice, grace_s, why)
NOTICE_RECEIVED = "notice_received"            # the trainer: a worker's node draining, its save asked (node, deadline)
MAINTENANCE_SCHEDULED = "maintenance_scheduled"  # chaos.maintenance: a slice's host maintenance set for ``at``
MAINTENANCE_STARTED = "maintenance_started"    # the watch: a slice's maintenance started after its notice's save
RESTORE_STARTED = "restore_started"
RESTORED = "restored"
PARAMETERS = "parameters"                  # MaxText's count of the model's parameters
MODEL_CHECK = "model_check"                # the trainer: the model config applied, its parameters expected
HEALTH_CHECKED = "health_checked"          # the trainer: each host's health gate, its checks (health_check.py)
HEALTH_GATE = "health_gate"                # the trainer: rank 0, the gate's verdict over every host
WORKER_LOST = "worker_lost"
WORKER_HUNG = "worker_hung"
WORKER_RESUMED = "worker_resumed"
HOST_BACK = "host_back"                    # chaos: a twin's killed host started again (billed again: cost.py)
HOST_SICKENED = "host_sickened"            # chaos: a twin's host started again with fewer JAX devices than its chips
HOST_HEALED = "host_healed"                # chaos: a sick host started again whole
SCHEDULED = "scheduled"                    # a worker pod on its node (GKE)
FAILURE = "failure"                        # Ray Train's failure policy
RESIZE = "resize"                          # Ray Train's resize of a running group
CLUSTER_VIEW = "cluster_view"              # the elastic trainer: the retry's view of the nodes made afresh
SAVE_BEFORE_RESIZE = "save_before_resize"  # the elastic trainer: the save before a resize
START_FAILED = "start_failed"              # the elastic trainer: a worker that could not load the trainer
STALL_STARTED = "stall_started"
STALL_ENDED = "stall_ended"
STOPPED = "stopped"                        # stall_action: stop (or restart, no host to set aside)
QUARANTINED = "quarantined"                # the follower set a host aside: host, slice, why, by (runs/restart.py)
RELEASED = "released"                      # `invoke hosts.release`: a host set aside given back: host, slice, by
HANG_DIAGNOSED = "hang_diagnosed"          # the follower, once per stall: culprits, cause, evidence (hang_diagnosis.py)
HEARTBEAT = "heartbeat"                    # the trainer: each worker's beat (the follower keeps it, not the timeline)
JOB_END = "job_end"
PRICED = "priced"                          # `train`: the chips the run holds and their price, at its submit

# -- the sets ---------------------------------------------------------------------
# A step finished (by rank 0 or by another slice's first host).
STEPS = (STEP, PEER_STEP)
# What an incident starts with: a worker gone, Ray Train's failure, a resize.
LOSSES = (WORKER_LOST, FAILURE, RESIZE)
# A worker group starting, as Ray Train says it (its line, timed at the trainer's start of the group: timeline.py).
GROUP_LINES = (WORKERS_STARTED, WORKERS_RESTARTED)
# A worker group starting, as the trainer says it (its own time).
GROUP_START = (WORKER_STARTED, JAX_INITIALIZED)
# Events of a new worker group: after one of these, a step is the recovery's.
REGROUP = (*GROUP_LINES, *GROUP_START, RESTORE_STARTED, RESTORED, FIRST_STEP_AFTER_RESTORE)
# What ends a stall: progress, or the job's going down or ending.
STALL_ENDS = (*STEPS, FAILURE, WORKER_LOST, JOB_END)
# A worker group starting, for the stall watch (the compile allowance starts again).
STARTS = (*GROUP_LINES, JAX_INITIALIZED)
# Progress before a group's first step (start-up, restore, compile).
PROGRESS = (SUBMITTED, WORKER_STARTED, HEALTH_CHECKED, COMPILE_STARTED, COMPILE_ENDED, RESTORE_STARTED, RESTORED,
            CHECKPOINT_SAVED)
# A host started again after a loss: billed again (cost.py).
BACK = (HOST_BACK, HOST_SICKENED)
# What a chaos task does to a worker that is still so until resumed.
CHAOS = (WORKER_HUNG, WORKER_LOST)

# Ray Train's line that starts a worker group.
GROUP_LINE = re.compile(r"Started training worker group of size (\d+)")


class Event(TypedDict):
    """One line of events.jsonl: its time (seconds since the epoch), kind,
    step (None when it has none) and source; most also name their job. The
    other fields are each kind's (``timeline.py`` lists them)."""

    t: float
    kind: str
    step: int | None
    source: str
    job: NotRequired[str]


def step_of(e: dict[str, Any]) -> int | None:
    """An event's step, when it is a whole number (not a bool, not text)."""
    s = e.get("step")
    return s if isinstance(s, int) and not isinstance(s, bool) else None


def number(v: Any) -> float | None:
    """A field's value when it is a number (not a bool)."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def when(t: float) -> str:
    """An event's time as a person reads it (a run lasts days): its date,
    time and zone, '2026-12-03 12:35:36 UTC' or '2026-12-03 13:35:36 CET
    (UTC+01:00)'; --json keeps ``t``, seconds since the epoch."""
    d = datetime.fromtimestamp(t).astimezone()
    if not d.utcoffset():
        return d.strftime("%Y-%m-%d %H:%M:%S UTC")
    z = d.strftime("%z")
    offset = f"UTC{z[:3]}:{z[3:5]}"
    name = d.tzname() or ""
    return d.strftime("%Y-%m-%d %H:%M:%S ") + (f"{name} ({offset})" if name[:1].isalpha() else offset)
