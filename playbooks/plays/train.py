"""§8-9 Training jobs: the tutorial's `ray job submit`, followed to the end,
its final status read from the Ray Jobs API, and a summary. What the job is
(its arguments, its checkpoints) is ``playbooks/job/spec.py``."""
from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from playbooks.access import connectors
from playbooks.access.ray_api import (
    ACTIVE,
    job_fact,
    job_logs_command,
    jobs_fact,
    nodes_fact,
    ours,
    submission_number,
)
from playbooks.cloud import maintenance, node_shutdown, prices
from playbooks.cloud.capacity_options import pool_option, preemptible
from playbooks.cloud.gke import clusters_fact, nodepool_name, nodepools_list_fact, running_cluster
from playbooks.cloud.slices import from_ray, ray_nodes_as_asked
from playbooks.config import paths
from playbooks.config.choices import preemption_grace_s
from playbooks.config.schema import Environment, capacities, capacity_text
from playbooks.core.command import Command
from playbooks.core.errors import InputError
from playbooks.core.facts import ABSENT, Action, Completed, Fact, assume
from playbooks.core.play import Outcome, StepContext
from playbooks.core.recap import CHANGED, FAILED, OK, SKIPPED
from playbooks.core.step import Step, Verify, change, fail, ok, skipped
from playbooks.job import save_period, save_plan
from playbooks.job.spec import (
    Checkpoints,
    Job,
    checkpoints_fact,
    checkpoints_place,
    remove_checkpoints,
    restores_unfinished,
    submit_command,
)
from playbooks.runs import cluster_watch, cost, goodput, metrics, restart, timeline
from playbooks.runs import events as E
from playbooks.runs.follow import Followed, Follower, follow
from playbooks.runs.job_log import clean
from playbooks.runs.train_summary import Summary
from playbooks.twin.nodes import slice_names

PLAY = "train"
SUBMIT_ATTEMPTS = 5
SUBMIT_DELAY = 5.0
NOT_READY = re.compile(r"No available agent to submit job|please try again later")


def trained(job: Job, have: Any) -> int | None:
    """The last finalized checkpoint step when the run is already trained to
    its end (a step directory Orbax did not finalize never counts)."""
    last = have.last if isinstance(have, Checkpoints) else None
    return last if last is not None and last >= job.steps - 1 else None


def checkpoint_step(job: Job) -> Step:
    kind, where = checkpoints_place(job)
    title = f"checkpoints of {job.run_name}"
    if kind == "unseen":
        if job.fresh:
            raise InputError(f"--fresh cannot delete the checkpoints of run {job.run_name}: {where}")
        return skipped(PLAY, title, f"not checked: {where}", id="train:checkpoints")
    probe = checkpoints_fact(job)
    # --fresh starts the run over: its timeline too (goodput counts from the
    # new start).
    kept = timeline.path(job.env, job.run_name)
    events = Fact(name="timeline", python=kept.is_file, display=f"ls {paths.shown(kept)}", assumed=True,
                  describe=lambda b: "kept" if b else "none")

    # --fresh never deletes what a running job of the run writes to.
    listing = assume(jobs_fact(job.address, connectors.connector(job.env)), []) if job.fresh else None

    def decide(look):
        if listing is not None:
            listed = look(listing)
            active = [j for j in (ours(job.run_name, listed) if listed is not ABSENT else [])
                      if j.get("status") in ACTIVE]
            if active:
                sid = active[-1]["submission_id"]
                return fail(f"job {sid} of run {job.run_name} is {active[-1]['status']}: --fresh would delete the "
                            f"checkpoints it writes; stop it first (`ray job stop --address {job.address} {sid}`), "
                            f"or follow it (`invoke logs --run {job.run_name} --follow`)")
        have = look(probe)
        old = look(events) if job.fresh else False
        if job.fresh and (have or old):
            drop = Action(f"rm {paths.shown(kept)}", lambda: connectors.this_machine().remove(str(kept)))
            what = " and ".join(w for w, c in (("checkpoints", have), ("timeline", old)) if c)
            return change(*([remove_checkpoints(job)] if have else []), *([drop] if old else []),
                          reason=f"removed the {what} of run {job.run_name} (--fresh)",
                          found=have.describe() if have else "a timeline")
        ignored = f"; ignored, not finalized: {have.ignored()}" if have and have.partial else ""
        if (last := trained(job, have)) is not None:
            return ok(f"run {job.run_name} already trained to step {last} of {job.steps}: nothing to do "
                      f"(--fresh starts it over, --set run_name=NAME starts another){ignored}")
        if have and (why := restores_unfinished(job, have)):
            return fail(why)
        if have and have.last is not None:
            return ok(f"run {job.run_name} resumes from checkpoint step {have.last}{ignored}")
        return ok(f"run {job.run_name} starts from step 0{ignored}")

    verify = Verify(probe, lambda have: None if not have else f"{have.describe()} still there",
                    timeout=60, interval=5) if job.fresh else None
    return Step(PLAY, title, decide, id="train:checkpoints", verify=verify)


def fresh_summary(job: Job) -> str:
    """What --fresh deletes, for the question before it does (``cli/confirm.py``)."""
    where = checkpoints_place(job)[1]
    return (f"every checkpoint of run {job.run_name} ({where}) and its timeline "
            f"({paths.shown(timeline.path(job.env, job.run_name))}), so that it starts over from step 0")


def preemption_note(env: Environment, job: Job) -> list[Step]:
    """On Spot or flex-start capacity, a job that is not elastic ends with
    its first lost slice: say so, once, before it starts, and from where it
    resumes when run again at its checkpoint period (``job.save_plan``;
    ``save_period.preemption_text``): never a checkpoint it will not save."""
    taken = preemptible(env)
    if not taken or job.elastic:
        return []
    whose = "" if len(capacities(env)) == 1 else f" (of a {' or '.join(taken)} slice)"
    plan = job.save_plan if job.save_plan is not None else save_plan.plan(env, job, None)
    options = tuple(o for o in env.options if o.preemptible)
    # The Spot pools as made decide the notice (a gcloud too old to send
    # their kubeletConfig made them with GKE's default 15 s).
    planned = preemption_grace_s(env)
    as_made = node_shutdown.pools_grace(env, planned)

    def decide(look):
        given, said = as_made(look) if as_made is not None else (None, "")
        real = tuple(replace(o, notice_s=given) if o.kubelet_config and given is not None else o for o in options)
        then = save_period.preemption_text(plan, real)
        differs = f" ({said})" if given is not None and given != planned else ""
        return ok(f"capacity: {capacity_text(env)}: a preemption{whose}{then}; `invoke train --elastic` goes on "
                  f"with the slices left and grows back{differs}")
    return [Step(PLAY, "preemption", decide, id="train:preemption")]


# -- maintenance held off while the run trains (GKE) ----------------------------
def hold_step(job: Job) -> Step:
    """Before the job: the run's maintenance exclusion in force (added, or
    renewed when it ends within a day). A run already trained holds nothing
    (and a hold left from its job, unfollowed to its end, is removed). What
    an exclusion is: ``playbooks/cloud/maintenance.py``."""
    env, run = job.env, job.run_name
    title = "hold off GKE maintenance"
    if not env.hold_maintenance:
        return skipped(PLAY, title, "hold_maintenance: false: GKE may upgrade the TPU nodes during the run",
                       id="train:hold")
    exclusion = maintenance.name(run)
    probe = assume(clusters_fact(env), running_cluster(env))
    checkpoints = checkpoints_fact(job) if checkpoints_place(job)[0] != "unseen" and not job.fresh else None
    want = {"held": True}  # what the verify checks: held, or released (a run already trained)

    def decide(look):
        cluster = look(probe)
        if cluster is ABSENT:
            return fail(f"cluster {env.cluster_name} does not exist: `invoke up` makes it")
        window = maintenance.exclusions(cluster).get(exclusion)
        if checkpoints is not None and trained(job, look(checkpoints)) is not None:
            want["held"] = False
            if window is None:
                return ok(f"run {run} is already trained: nothing to hold")
            return change(maintenance.remove_command(env, exclusion), found=maintenance.describe(exclusion, window),
                          reason=f"removed maintenance exclusion {exclusion}: run {run} is already trained")
        add = maintenance.add_command(env, run)
        hold = f"no node or minor upgrades for {maintenance.HOLD.days} days, or until the job ends"
        if window is not None:
            why = maintenance.short_of(window)
            if why is None:
                return ok(f"maintenance exclusion {maintenance.describe(exclusion, window)} holds off node and "
                          f"minor upgrades")
            return change(maintenance.remove_command(env, exclusion), add, found=why,
                          reason=f"renewed maintenance exclusion {exclusion} ({why}): {hold}")
        return change(add, found="no exclusion", reason=f"added maintenance exclusion {exclusion}: {hold}",
                      would=f"add maintenance exclusion {exclusion} ({hold})")

    def check(cluster: Any) -> str | None:
        window = maintenance.exclusions(cluster).get(exclusion)
        if not want["held"]:
            return None if window is None else f"exclusion {exclusion} still there"
        return maintenance.short_of(window)

    return Step(PLAY, title, decide, id="train:hold", after=("train:checkpoints",),
                verify=Verify(probe, check, timeout=300, interval=5))


def renew_hold_step(env: Environment, run: str) -> Step:
    """While the job runs (its follow's watch, every few hours): the run's
    maintenance exclusion renewed when it ends within a day; one absent
    (released, or never set) is left so. The watch in a head pod has no
    gcloud: it renews nothing."""
    exclusion = maintenance.name(run)
    probe = assume(clusters_fact(env), maintenance.held(env, run))

    def decide(look):
        cluster = look(probe)
        if cluster is ABSENT:
            return fail(f"cluster {env.cluster_name} does not exist")
        window = maintenance.exclusions(cluster).get(exclusion)
        if window is None:
            return ok(f"no maintenance exclusion {exclusion}: nothing to renew")
        why = maintenance.short_of(window)
        if why is None:
            return ok(f"maintenance exclusion {maintenance.describe(exclusion, window)} holds")
        return change(maintenance.remove_command(env, exclusion), maintenance.add_command(env, run), found=why,
                      reason=f"renewed maintenance exclusion {exclusion} ({why}) while the job runs: no node or "
                             f"minor upgrades for {maintenance.HOLD.days} more days")

    return Step(PLAY, "renew the hold off GKE maintenance", decide, id="train:renew-hold")


def ray_nodes(job: Job) -> Fact:
    """Ray's nodes, where the job is submitted (a dry run assumes every slice)."""
    return assume(nodes_fact(job.address, connectors.connector(job.env)), ray_nodes_as_asked(job.env))


def slices_step(env: Environment, job: Job) -> Step:
    """A job starts on whole slices, as Ray sees them: an elastic one on
    those ready (it grows when the rest arrive); one that is not elastic
    only on every slice, else it is refused before it is submitted."""
    probe = ray_nodes(job)

    def decide(look):
        nodes = look(probe)
        if nodes is ABSENT:
            return fail(f"no Ray dashboard answers at {job.address}: run `invoke up` (or `invoke dashboard`)")
        s = from_ray(env, nodes)
        if s.complete:
            return ok(f"every slice is whole in Ray ({s.count} of {s.want})")
        if job.elastic and s.count >= 1:
            return ok(f"{s.text()}: the elastic job starts on {s.count} and grows when the rest arrive",
                      notes=[s.waiting_text()])
        if job.elastic:
            return fail(f"{s.text()}: no whole slice to start on yet (`invoke up` waits for min_slices of them)")
        return fail(f"{s.text()}: a job that is not elastic needs every slice; `invoke train --elastic` would start "
                    f"on the {s.count} ready and grow when the rest arrive")

    return Step(PLAY, "slices in Ray", decide, id="train:slices", probes=(probe,))


# -- what the run will cost -------------------------------------------------------
def slice_pools(env: Environment) -> list[str] | None:
    """Each slice's node pool, index = slice (Standard); None on Autopilot,
    which makes its own nodes."""
    return [nodepool_name(env, i) for i in range(env.slices)] if env.cluster_mode.our_node_pools else None


def slice_options(env: Environment, look: Any) -> list[str] | None:
    """Each slice's capacity option: its node pool's (Standard), else the
    first of ``capacity:`` (a pool not made yet); None on Autopilot, whose
    ComputeClass picks each node's among ``capacity:`` (not known here)."""
    names = slice_pools(env)
    if names is None:
        return None
    first = capacities(env)[0]
    pools: dict[str, Any] = {}
    if look(clusters_fact(env)) is not ABSENT:
        pools = {p.get("name"): p for p in look(nodepools_list_fact(env))}
    return [pool_option(pools[n]) if n in pools else first for n in names]


def basis_fact(job: Job) -> Fact:
    """The chips the run holds and their price (``runs/cost.py``), derived
    once per run: the estimate says it, the submit records it in the run's
    timeline (what `invoke goodput` and `invoke runs` price the run by)."""
    env = job.env
    catalog = prices.catalog_fact(env) if env.platform.cloud and prices.needs_catalog(env) else None

    def derive(look: Any) -> cost.Basis:
        if env.platform.simulated:  # the twin's slice i is its hosts' TPU_NAME
            return cost.env_basis(env, None, None, names=slice_names(env))
        return cost.env_basis(env, slice_options(env, look), look(catalog) if catalog else None,
                              pools=slice_pools(env))

    return Fact(name="price basis", display=f"the chips of {env.slices} slice(s) and their price per chip-hour",
                derive=derive, describe=basis_text)


def basis_text(b: cost.Basis) -> str:
    """The basis in a probe's line: its price, or that it has none (why and
    how to get one is the cost estimate's line, said once)."""
    if b.simulated or b.hourly() is not None:
        return f"{b.chips} chips, {b.price_text()}"
    return f"{b.chips} chips, no price (the cost estimate says why)"


NOT_MEASURED = "no step time measured yet for this model here (the preflight compiles, it does not time a step)"
NOT_READ = "the timelines are not read in a dry run (`invoke train` with playbook.mode=check reads them)"


def measured_step(job: Job) -> tuple[cost.StepTime, cost.Overhead | None] | None:
    """The step time the run's (or the newest run of its model's) timeline
    measured here (this project's own files), and that run's start-up,
    compile and checkpoint seconds (its goodput report)."""
    root = paths.here(paths.training(job.env.name))
    files = sorted(root.glob(f"*/{timeline.FILE}"), key=lambda p: p.stat().st_mtime, reverse=True)
    runs = [(f.parent.name, timeline.read(job.env, f.parent.name)) for f in files]
    step = cost.measured(runs, job.run_name, job.model, job.env.slices * job.env.hosts_per_slice)
    if step is None:
        return None
    evs = next(e for name, e in runs if name == step.run)
    return step, cost.overhead_of(goodput.account(evs, step.run), step.run)


def estimate_step(job: Job) -> Step:
    """One line before the submit: the steps left x the step time measured
    (else the checkpoint period's estimate of it: ``save_plan.estimate``,
    said so) x the chips x the price, and its basis. Never a stop."""
    basis = basis_fact(job)
    kind, _ = checkpoints_place(job)
    have = checkpoints_fact(job) if kind != "unseen" and not job.fresh else None
    when = Fact(name="step time", python=lambda: measured_step(job) or NOT_MEASURED,
                display=f"# the step time of {paths.training(job.env.name)}/*/{timeline.FILE}", assumed=NOT_READ,
                describe=lambda s: s[0].basis if isinstance(s, tuple) else str(s))

    def decide(look):
        last = look(have).last if have is not None and isinstance(look(have), Checkpoints) else None
        left = job.steps - (last + 1 if last is not None else 0)
        got = look(when)
        step, overhead = got if isinstance(got, tuple) else (None, None)
        guess = save_plan.estimate(job.env, job) if step is None else None
        if guess is not None and not isinstance(guess, str):
            step = cost.estimated_step(guess.step_s, str(got))
        return ok(cost.estimate(left, step, look(basis), why=None if step else str(got), overhead=overhead))

    return Step(PLAY, "cost estimate", decide, id="train:estimate", probes=(basis, when),
                after=("train:checkpoints",))


def save_step(job: Job) -> Step:
    """One line before the submit: the checkpoint period and why, what a
    loss replays at it (steps, seconds, chip-hours, dollars), and what each
    capacity option's notice gives a save (``job/save_period.py``)."""
    basis = basis_fact(job)
    plan = job.save_plan
    sent = node_shutdown.sender(job.env)   # the options as this gcloud makes their pools

    def decide(look):
        b = look(basis)
        hourly = None if b.simulated else b.hourly()
        return ok(save_period.line(plan, sent(look) or (None,), b.chips, hourly))

    return Step(PLAY, "checkpoint period", decide, id="train:save-period", probes=(basis,),
                after=("train:checkpoints",))


def priced_event(job: Job, basis: cost.Basis) -> Action:
    """The run's chips and price, into its timeline, as it is submitted."""
    event = timeline.event(E.PRICED, PLAY, **basis.event_fields())
    return Action(f"# record the run's chips and price in {paths.shown(timeline.path(job.env, job.run_name))}",
                  lambda: timeline.append(job.env, job.run_name, [event]))


# -- the job ----------------------------------------------------------------
def _follow_or_submit(ctx: StepContext, job: Job, sid: str, attach: bool, f: Follower) -> Completed | None:
    """Follow the job's log to its end: a job already running through `ray
    job logs --follow`, a new one through `ray job submit` (tried again
    while the head's job agent is not up yet: no job was made)."""
    if attach:
        return ctx.stream(job_logs_command(job.address, sid, follow=True), f.line)
    return _submit(ctx, submit_command(job, sid), f.line)


def _submit(ctx: StepContext, command: Command, on_line: Callable[[str], None] | None = None) -> Completed | None:
    """A `ray job submit`, its lines to ``on_line`` (else to the step's
    log), tried again while the head's job agent is not up yet (no job was
    made)."""
    done = None
    for attempt in range(1, SUBMIT_ATTEMPTS + 1):
        done = ctx.stream(command, on_line or ctx.note)
        if done is None or done.ok or not NOT_READY.search(done.stdout) or attempt == SUBMIT_ATTEMPTS:
            break
        ctx.log.emit("retry", f"the Ray head is not ready for jobs yet; submitting again in {SUBMIT_DELAY:.0f}s "
                              f"({attempt}/{SUBMIT_ATTEMPTS})")
        ctx.sleep(SUBMIT_DELAY)
    return done


def _last_line(done: Completed) -> str:
    """A failed command's last line of output, as the console shows it."""
    return clean(([line for line in done.stdout.splitlines() if line.strip()][-1:] or ["no output"])[0])


def _keep_metrics(ctx: StepContext, job: Job, summary: Summary, sid: str) -> None:
    if not summary.records and job.local_data is None:
        return
    kept = metrics.run_dir(job.env, job.run_name) / metrics.FILE
    ctx.act(Action(f"# keep the run's step metrics in {paths.shown(kept)}",
                   lambda: metrics.keep(job.env, job.run_name, summary, sid)))
    ctx.echo(f"  metrics: {paths.shown(kept)} (`invoke metrics` draws them)")


def _verdict(job: Job, sid: str, final: Any, summary: Summary, log_file: Path | None) -> Outcome:
    status = final.get("status") if isinstance(final, dict) else "UNKNOWN"
    if status != "SUCCEEDED":
        msg = final.get("message") if isinstance(final, dict) else ""
        return Outcome(FAILED, f"job {sid} {status}: {msg or 'see the log'}"
                       + (f" (log: {log_file})" if log_file else ""))
    if (mismatch := summary.params_mismatch()):
        return Outcome(FAILED, f"job {sid} SUCCEEDED, but {mismatch}")
    if not summary.steps:
        return Outcome(FAILED, f"job {sid} SUCCEEDED without a single training step in its log")
    steps = entrypoint_steps(str(final.get("entrypoint") or "")) or job.steps
    if steps and summary.last_step is not None and summary.last_step < steps - 1:
        # MaxText returns as if done when it stops early (a preemption notice
        # the trainer did not see, data that ran out): the run is not trained
        # to its end.
        return Outcome(FAILED, f"job {sid} SUCCEEDED, but its last step is {summary.last_step}, not "
                               f"{steps - 1}: MaxText stopped early (see the log); `invoke train` resumes run "
                               f"{job.run_name} from its last checkpoint")
    return Outcome(CHANGED, f"job {sid} SUCCEEDED: {len(summary.done_steps)} steps, final loss "
                            f"{summary.final_loss:.3f}")


def entrypoint_steps(entrypoint: str) -> int | None:
    """The steps=N of a job's entrypoint (the job's own, which a job
    followed, not submitted, may have other than the flags)."""
    try:
        words = shlex.split(entrypoint)
    except ValueError:
        return None
    found = [w.split("=", 1)[1] for w in words if w.startswith("steps=")]
    return int(found[-1]) if found and found[-1].isdigit() else None


def job_step(job: Job, log_file: Path | None = None, quarantine: restart.Quarantine | None = None,
             detach: bool = False) -> Step:
    """A run step: it follows the job's log as it comes, to the job's end
    (``quarantine``: how its follow sets a host aside, stall_action: restart;
    with ``stall_watch: cluster`` the watch on the Ray head does, and this
    follow views it; ``detach``: submitted, not followed)."""
    run = JobRun(job, log_file, quarantine, detach)
    return Step(PLAY, f"job {job.run_name} ({job.model}{', elastic' if job.elastic else ''})", run=run.run,
                id="train:job", after=("train:checkpoints",))


class JobRun:
    """The job step's parts: which job (one running of the run is followed,
    else a new one submitted), the follow, what it came to."""

    def __init__(self, job: Job, log_file: Path | None, quarantine: restart.Quarantine | None = None,
                 detach: bool = False):
        self.job, self.log_file, self.quarantine, self.detach = job, log_file, quarantine, detach
        self.in_cluster = cluster_watch.in_cluster(job.env)
        if cluster_watch.in_head_pod(job.env):
            cluster_watch.shipped_inventory()  # up front: an inventory the head cannot read, refused in one line
        self.via = connectors.connector(job.env)
        self.listing, self.checkpoints = jobs_fact(job.address, self.via), checkpoints_fact(job)

    def run(self, ctx: StepContext) -> Outcome:
        job = self.job
        if checkpoints_place(job)[0] != "unseen" and not job.fresh and \
                trained(job, ctx.look(self.checkpoints)) is not None:
            return Outcome(SKIPPED, f"run {job.run_name} is already complete")
        listed = ctx.look(self.listing)
        if listed is ABSENT:
            return Outcome(FAILED, f"no Ray dashboard answers at {job.address}: run `invoke up` (or `invoke "
                                   f"dashboard`)")
        sid, active = self.which(ctx, listed)
        if active is None:
            ctx.act(priced_event(job, ctx.look(basis_fact(job))))
        if self.in_cluster and (failed := self.watched(ctx, sid, listed)):
            return failed
        if self.detach:
            return self.submitted(ctx, sid, active)
        f = follow(ctx, job.env, sid, job.address, self.via,
                   lambda fl: _follow_or_submit(ctx, job, sid, active is not None, fl), run=job.run_name, job=active,
                   log_file=self.log_file, heartbeat=lambda fl: self.now(ctx, sid, fl),
                   interrupted=f"interrupted: job {sid} goes on in the cluster; `invoke train` again follows it, "
                               f"`ray job stop --address {job.address} {sid}` stops it", quarantine=self.quarantine,
                   viewer=self.in_cluster)
        return self.outcome(ctx, sid, f)

    def watched(self, ctx: StepContext, sid: str, listed: Any) -> Outcome | None:
        """The job's watch on the Ray head (``stall_watch: cluster``),
        submitted first unless it runs already: it waits for the job to be
        listed. A watch that cannot be submitted fails the step before the
        job is (no job runs unwatched)."""
        job = self.job
        if cluster_watch.watching(listed, sid) is not None:
            ctx.note(f"job {sid}'s watch {cluster_watch.watch_id(sid)} runs already")
            return None
        done = _submit(ctx, cluster_watch.submit_command(job.env, job.address, job.run_name, sid, job.elastic))
        if done is not None and not done.ok:
            return Outcome(FAILED, f"the watch of job {sid} could not be submitted (exit code {done.rc}): "
                                   f"{_last_line(done)}; no job was submitted")
        return None if done is None else self.watch_started(ctx, sid)

    def watch_started(self, ctx: StepContext, sid: str) -> Outcome | None:
        """The watch submitted runs before its job is submitted: one whose
        runtime env cannot be made (on GKE a head that cannot reach PyPI for
        its packages) fails the step, with Ray's reason, and no job runs
        unwatched. None: it runs."""
        job, watch = self.job, cluster_watch.watch_id(sid)
        waited, looks = 0.0, 0
        while True:
            w = ctx.look(job_fact(job.address, watch, self.via), fresh=True)
            status = w.get("status") if isinstance(w, dict) else None
            if status == "RUNNING":
                return None
            if status is not None and status not in ACTIVE:
                why = " ".join(str(w.get("message") or "").split())[-300:] or "no message"
                return Outcome(FAILED, f"the watch of job {sid} ({watch}) is {status} before its job was submitted: "
                                       f"{why}; no job was submitted" + cluster_watch.unstarted_hint(job.env))
            if waited >= cluster_watch.START_WITHIN:
                return Outcome(FAILED, f"the watch of job {sid} ({watch}) was not RUNNING within "
                                       f"{cluster_watch.START_WITHIN:.0f} s (it is {status or 'not listed'}); no job "
                                       f"was submitted" + cluster_watch.unstarted_hint(job.env))
            pause = cluster_watch.look_after(looks)
            ctx.sleep(pause)
            waited, looks = waited + pause, looks + 1

    def submitted(self, ctx: StepContext, sid: str, active: dict | None) -> Outcome:
        """``--detach``: the job submitted (``--no-wait``), not followed."""
        job = self.job
        view = f"`invoke logs --run {job.run_name} --follow` views it"
        back = (f" (`invoke watch --run {job.run_name} --job {sid}` brings its records here)"
                if cluster_watch.in_head_pod(job.env) else "")
        watch = (f"its watch {cluster_watch.watch_id(sid)} acts on the Ray head{back}" if self.in_cluster else
                 f"nothing watches it (stall_watch: follow): {view.split('` ')[0]}` watches it")
        if active is not None:
            return Outcome(OK, f"job {sid} of run {job.run_name} is already {active.get('status')}; {watch}; {view}")
        done = _submit(ctx, submit_command(job, sid, wait=False))
        if done is None:
            return Outcome(CHANGED, f"would submit job {sid}, not followed")
        if not done.ok:
            return Outcome(FAILED, f"`ray job submit` failed (exit code {done.rc}): {_last_line(done)}")
        return Outcome(CHANGED, f"job {sid} submitted, not followed (--detach); {watch}; {view}")

    def which(self, ctx: StepContext, listed: Any) -> tuple[str, dict | None]:
        """The job to follow: the run's job still running, or a new one's id."""
        job = self.job
        mine = ours(job.run_name, listed)
        active = [j for j in mine if j.get("status") in ACTIVE]
        if active:
            sid = str(active[-1]["submission_id"])
            ctx.note(f"job {sid} of run {job.run_name} is already {active[-1]['status']}: following it, "
                     f"not submitting another")
            return sid, active[-1]
        return f"{job.run_name}-{max((submission_number(j) for j in mine), default=0) + 1}", None

    def now(self, ctx: StepContext, sid: str, f: Follower) -> str:
        """What a heartbeat says of the job: its status, its last step, and
        the slices not (yet) whole in Ray."""
        j = ctx.peek(job_fact(self.job.address, sid, self.via))
        status = j.get("status", "?") if isinstance(j, dict) else "not listed yet"
        step = f"last step {f.summary.last_step}" if f.summary.last_step is not None else "no step yet"
        s = from_ray(self.job.env, ctx.peek(ray_nodes(self.job)))
        return f"status {status}, {step}" + ("" if s.complete else f"; {s.text()}")

    def outcome(self, ctx: StepContext, sid: str, followed: Followed) -> Outcome:
        job, done, final, f = self.job, followed.done, followed.final, followed.follower
        if done is None:  # not acting: nothing ran
            maintenance.release(ctx, job.env, job.run_name)
            return Outcome(CHANGED, f"would run job {sid}")
        if followed.lost:  # not seen to end: the job may still run (its hold stays)
            for said in f.summary.lines():
                ctx.echo(f"  {said}")
            return Outcome(FAILED, followed.lost)
        # The job ended (or was never made): the hold goes with it.
        ended = not (isinstance(final, dict) and final.get("status") in ACTIVE)
        if ended and (line := maintenance.release(ctx, job.env, job.run_name)):
            ctx.echo(f"  {line}")
        if not done.ok and not isinstance(final, dict):
            return Outcome(FAILED, f"`ray job submit` failed (exit code {done.rc}) and no job {sid} exists: "
                                   f"{_last_line(done)}")
        for line in f.summary.lines():
            ctx.echo(f"  {line}")
        _keep_metrics(ctx, job, f.summary, sid)
        if isinstance(final, dict) and final.get("status") == "FAILED" and \
                (gate := restart.gate_refusal(f.job_events(), job.env.platform.simulated, job.elastic,
                                              str(final.get("message") or ""))):
            return Outcome(FAILED, f"job {sid} FAILED: {gate}" + (f" (log: {self.log_file})" if self.log_file else ""))
        if f.stopped and isinstance(final, dict) and final.get("status") == "STOPPED":
            return Outcome(FAILED, f"job {sid} STOPPED after a stall (stall_action: {job.env.stall_action}): `invoke "
                                   f"train` resumes run {job.run_name} from its last checkpoint")
        return _verdict(job, sid, final, f.summary, self.log_file)
