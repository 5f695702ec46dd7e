"""`invoke watch`: one job followed to its end by the watch that acts
(``stall_action``, the health gate's failures), writing the run's
timeline: what `invoke train` runs on the Ray head beside each job when
``stall_watch: cluster`` (``runs/cluster_watch.py``). A person may run it
too, on a job nobody watches."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from playbooks.access import connectors
from playbooks.access.ray_api import ACTIVE, job_fact, job_log_fact, job_logs_command, jobs_fact
from playbooks.cloud.endpoints import dashboard
from playbooks.config.schema import Environment
from playbooks.core.facts import ABSENT
from playbooks.core.play import Outcome, StepContext
from playbooks.core.recap import FAILED, OK
from playbooks.core.step import Step
from playbooks.runs import cluster_watch, restart, watch_records
from playbooks.runs.follow import WATCH_SOURCE, follow

PLAY = "watch"
# How long the watch waits for its job to be listed: the watch is submitted
# first, the job right after it (a head that is slow to take jobs included).
LISTED_WITHIN = 300.0
LOOK_EVERY = 2.0


def listed(ctx: StepContext, address: str, sid: str, via: Any) -> dict | None:
    """The Jobs API's job ``sid``, waited for up to LISTED_WITHIN seconds
    (None: not listed by then)."""
    waited = 0.0
    while True:
        j = ctx.look(job_fact(address, sid, via), fresh=True)
        if isinstance(j, dict) and j.get("status"):
            return j
        if j is not ABSENT and not ctx.acting:
            return None
        if waited >= LISTED_WITHIN:
            return None
        ctx.sleep(LOOK_EVERY)
        waited += LOOK_EVERY


def brought_back(ctx: StepContext, env: Environment, run: str, sid: str, address: str, via: Any) -> str:
    """The records of job ``sid``'s watch in a GKE head pod, read from its
    whole log into this machine's timeline and record (``runs/
    watch_records.py``): said in a few words."""
    text = ctx.look(job_log_fact(address, cluster_watch.watch_id(sid), via), fresh=True)
    if not isinstance(text, str) or not text:
        return f"no log of its watch {cluster_watch.watch_id(sid)} to bring back"
    if not ctx.acting:
        return f"would bring back what its watch {cluster_watch.watch_id(sid)} recorded"
    n = watch_records.import_text(env, text, (run,))
    return f"{n} new event(s) brought back from its watch {cluster_watch.watch_id(sid)}"


def watch_step(env: Environment, run: str, sid: str, quarantine: restart.Quarantine,
               log_file: Path | None = None) -> Step:
    """The job ``sid`` of run ``run`` followed to its end, the watch acting.
    On GKE with ``stall_watch: cluster``, from this machine: what the
    watch in the head pod recorded brought back, and a job it still
    watches followed as its viewer (two watches never act on one job)."""
    address = dashboard(env)
    via = connectors.connector(env)
    remote = cluster_watch.in_head_pod(env) and not connectors.in_a_head_pod()

    def run_step(ctx: StepContext) -> Outcome:
        job = listed(ctx, address, sid, via) if ctx.probing else None
        if ctx.probing and job is None:
            return Outcome(FAILED, f"job {sid} was not listed by the Ray head at {address} within "
                                   f"{LISTED_WITHIN:.0f} s: nothing to watch")
        if job is not None and job.get("status") not in ACTIVE:
            back = f" ({brought_back(ctx, env, run, sid, address, via)})" if remote else ""
            return Outcome(OK, f"job {sid} is already {job.get('status')}: nothing to watch{back}")
        viewer = remote and ctx.probing and cluster_watch.watching(ctx.peek(jobs_fact(address, via)), sid) is not None
        got = follow(ctx, env, sid, address, via, lambda f: ctx.stream(job_logs_command(address, sid, True), f.line),
                     run=run, job=job, source=WATCH_SOURCE, log_file=log_file, quarantine=quarantine,
                     viewer=viewer,
                     interrupted=f"interrupted: job {sid} goes on unwatched; `invoke watch --run {run} --job {sid}` "
                                 f"watches it again")
        if got.done is None:
            return Outcome(OK, f"would watch job {sid} to its end")
        if got.lost:
            return Outcome(FAILED, got.lost)
        status = got.final.get("status") if isinstance(got.final, dict) else "UNKNOWN"
        did = ([f"quarantined {', '.join(got.follower.quarantined)}"] if got.follower.quarantined else []) + \
              (["stopped it"] if got.follower.stopped else [])
        return Outcome(OK, f"job {sid} {status}, watched to its end" + (f" ({'; '.join(did)})" if did else ""))

    return Step(PLAY, f"watch job {sid} (stall_action: {env.stall_action})", run=run_step, id="watch:job")
