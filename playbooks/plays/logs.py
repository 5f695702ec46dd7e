"""`invoke logs` (a run's driver log, whole or followed to the job's end;
the copy its follow kept when Ray has none),
`invoke metrics` (a run's kept step metrics drawn into metrics.png, its
timeline as a band under them) and `invoke goodput` (what each second of a
run went to, from its timeline)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from playbooks.access import connectors
from playbooks.access.ray_api import ACTIVE, UNSUCCESSFUL, job_fact, job_logs_command, jobs_fact, ours, run_of
from playbooks.cloud import env_cost, maintenance, prices
from playbooks.cloud.endpoints import dashboard
from playbooks.config import paths
from playbooks.config.schema import Environment
from playbooks.core.facts import ABSENT, Action, Fact
from playbooks.core.play import Outcome, StepContext
from playbooks.core.recap import FAILED, OK
from playbooks.core.step import Step, change, fail, ok
from playbooks.job.spec import finalized_steps
from playbooks.runs import cluster_watch, cost, goodput, goodput_reference, metrics, run_list, timeline
from playbooks.runs import events as E
from playbooks.runs.follow import follow as follow_job
from playbooks.runs.train_summary import Summary


def kept_log(env: Environment, run: str | None) -> dict | None:
    """The newest job's end (of the run, else of any run) whose follow kept
    its driver log (``job_end``'s ``log``, written by `train` and `logs
    --follow`): the run, the job, its status, when it ended, the file."""
    found = None
    for name in [run] if run else timelines(env):
        for e in timeline.read(env, name):
            if e.get("kind") == E.JOB_END and isinstance(e.get("log"), str) and (found is None or e["t"] >= found["t"]):
                found = {"run": name, "job": str(e.get("job")), "status": str(e.get("status")), "t": e["t"],
                         "log": e["log"]}
    return found


def kept_fact(env: Environment, run: str | None) -> Fact:
    return Fact(name="kept log", python=lambda: kept_log(env, run), assumed=None,
                display=f"grep -h '\"job_end\"' {paths.events(env.name, run or '*')}  # its kept driver log",
                describe=lambda k: f"job {k['job']}: {k['log']}" if k else "no driver log kept")


def show_kept(ctx: StepContext, env: Environment, run: str | None, why: str, otherwise: str) -> Outcome:
    """When Ray has no log to give (no dashboard answers, the job is gone: a
    head pod made again, a local cluster started afresh), the copy the
    follow kept, said to be it and from when."""
    k = ctx.look(kept_fact(env, run))
    if not k:
        return Outcome(FAILED, f"{otherwise} (and no copy of a driver log of {f'run {run}' if run else 'any run'} "
                               f"was kept: `invoke train` and `invoke logs --follow` keep one)")
    data = connectors.this_machine().read(str(paths.here(k["log"])))
    if data is None:
        return Outcome(FAILED, f"{otherwise} (and the kept copy of job {k['job']}'s driver log, {k['log']}, is gone)")
    when = E.when(k["t"])
    ctx.echo(f"  {why}: the kept copy of job {k['job']}'s driver log, as it was followed to the job's end "
             f"({k['status']} {when}): {k['log']}")
    for line in data.decode(errors="replace").splitlines():
        ctx.echo(line)
    said = f"job {k['job']} {k['status']} {when} (the kept copy of its driver log: {why})"
    return Outcome(FAILED if k["status"] in UNSUCCESSFUL else OK, said)


def logs_step(env: Environment, run: str | None, follow: bool, log_file: Path | None = None) -> Step:
    """A run step: the log streams as it comes. The outcome is the job's
    status, read from the Jobs API; when Ray has no log of the job, the
    copy its follow kept (``show_kept``)."""
    addr = dashboard(env)
    via = connectors.connector(env)
    listing = jobs_fact(addr, via)
    which = f"run {run}" if run else "this environment"

    def run_step(ctx: StepContext) -> Outcome:
        listed = ctx.look(listing)
        if listed is ABSENT:
            return show_kept(ctx, env, run, f"no Ray dashboard answers at {addr}",
                             f"no Ray dashboard answers at {addr}: run `invoke up` (or `invoke dashboard`)")
        mine = ours(run, listed)
        if not mine:
            if not ctx.probing:
                return Outcome(OK, f"would show the log of the newest job of {which}")
            gone = f"no job of {f'run {run}' if run else 'any run'} at {addr}"
            return show_kept(ctx, env, run, f"{gone} (Ray forgets its jobs when its head starts again)", gone)
        sid = str(mine[-1]["submission_id"])
        if not follow:
            done = ctx.stream(job_logs_command(addr, sid, follow), ctx.echo)
            final = ctx.look(job_fact(addr, sid, via), fresh=True)
        else:
            # Followed: the run's timeline and the stall watch, as `train` does.
            got = follow_job(ctx, env, sid, addr, via, lambda f: ctx.stream(job_logs_command(addr, sid, True), f.line),
                             run=run_of(sid), job=mine[-1], show_all=True, source="logs", log_file=log_file,
                             viewer=cluster_watch.in_cluster(env))
            if got.lost:
                return Outcome(FAILED, got.lost)
            done, final = got.done, got.final if got.done is not None else ctx.look(job_fact(addr, sid, via),
                                                                                    fresh=True)
        if done is not None and not done.ok:
            return Outcome(FAILED, f"could not read the log of job {sid}: `ray job logs` exited {done.rc}")
        status = final.get("status") if isinstance(final, dict) else "UNKNOWN"
        # Followed to its end: the run's maintenance hold goes with the job.
        if follow and status not in ACTIVE and \
                (line := maintenance.release(ctx, env, run_of(sid))):
            ctx.echo(f"  {line}")
        if status in UNSUCCESSFUL:
            return Outcome(FAILED, f"job {sid} {status}: {final.get('message') or 'see its log'}")
        return Outcome(OK, f"job {sid} {status}")

    return Step("logs", f"log of {f'run {run}' if run else 'the newest job'}", run=run_step, id="logs:job")


def plot_state(env: Environment, run: str | None) -> dict:
    """The run (the newest with metrics when none is named), its metrics
    file and whether its picture is newer than it and than its timeline."""
    name = run or metrics.newest_run(env)
    if name is None:
        return {"run": None}
    path = metrics.run_dir(env, name) / metrics.FILE
    png = path.with_name(metrics.PNG)
    events = timeline.path(env, name)
    newest = max([path.stat().st_mtime] + ([events.stat().st_mtime] if events.is_file() else [])) \
        if path.is_file() else 0.0
    return {"run": name, "metrics": path.is_file(), "current": path.is_file() and png.is_file()
            and png.stat().st_mtime >= newest}


def metrics_step(env: Environment, run: str | None) -> Step:
    """metrics.png from the run's metrics.jsonl (the newest run without one)."""
    where = paths.training(env.name)
    probe = Fact(name="metrics", python=lambda: plot_state(env, run),
                 display=f"ls -t {where}/{run or '*'}/{metrics.FILE} {where}/{run or '*'}/{metrics.PNG}",
                 assumed={"run": run or "RUN", "metrics": True, "current": False},
                 describe=lambda s: "no run" if not s.get("run") else
                 f"run {s['run']}: " + ("picture current" if s.get("current") else "picture missing or older"))

    def decide(look):
        s: dict[str, Any] = look(probe)
        name = s.get("run")
        if name is None:
            return fail(f"no run of environment {env.name} has kept metrics yet: `invoke train` first")
        path = metrics.run_dir(env, name) / metrics.FILE
        png = path.with_name(metrics.PNG)
        if not s.get("metrics"):
            return fail(f"run {name} has no metrics ({paths.shown(path)}): `invoke train` keeps them")
        if s.get("current"):
            return ok(f"{paths.shown(png)} is up to date with run {name}'s metrics")
        return change(Action(f"# draw {paths.shown(path)} into {paths.shown(png)}", lambda: metrics.plot(path)),
                      reason=f"wrote {paths.shown(png)}: loss, tokens/s per device and step time of run {name}"
                             + (", its timeline under them" if timeline.path(env, name).is_file() else ""),
                      would=f"write {paths.shown(png)}", found="no picture, or an older one")

    return Step("metrics", f"metrics of {run or 'the newest run'}", decide, id="metrics:png", probes=(probe,))


def timelines(env: Environment) -> list[str]:
    """The runs of this environment that have a timeline."""
    return sorted(p.parent.name for p in paths.here(paths.training(env.name)).glob(f"*/{timeline.FILE}"))


def runs_step(env: Environment) -> Step:
    """Every run with a timeline, newest first: state, jobs, steps, wall
    time, goodput, chip-hours and cost (``run_list.py``); and what the
    environment costs as it stands and since `up` (``env_cost.py``)."""
    shown = paths.events(env.name, "*")
    probe = Fact(name="timelines", python=lambda: {n: timeline.read_checked(env, n) for n in timelines(env)},
                 display=f"cat {shown}", assumed={}, describe=lambda d: f"{len(d)} run(s)")

    def decide(look):
        now, rows = time.time(), []
        for name, got in look(probe).items():
            if not got.events:
                continue
            report, segs = goodput.account_with_segments(got.events, name, now=now)
            report["cost"] = run_cost(env, got.events, segs, report.get("uncertain"))
            if got.skipped:
                report["skipped_lines"] = got.skipped
            rows.append(run_list.row(name, got.events, report, Summary(chip=env.tpu, simulated=env.platform.simulated)))
        rows = run_list.newest_first(rows)
        c = env_cost.read(env, look, now)
        return ok(f"{len(rows)} run(s) of environment {env.name}",
                  data={"runs": rows, "environment_cost": c.doc() | {"lines": env_cost.lines(c)}})

    return Step("runs", "runs of this environment", decide, id="runs:list",
                probes=(probe, *(env_cost.facts(env) if env.platform.cloud else ())))


def newest_timeline(env: Environment) -> str | None:
    runs = [p.parent for p in paths.here(paths.training(env.name)).glob(f"*/{timeline.FILE}")]
    return max(runs, key=lambda d: (d / timeline.FILE).stat().st_mtime).name if runs else None


def goodput_step(env: Environment, run: str | None) -> Step:
    """The goodput report of a run (the newest with a timeline when none is
    named), read from its events.jsonl; a running job's until now."""
    shown = paths.events(env.name, run or "*")
    probe = Fact(name="timeline", python=lambda: _timeline(env, run), display=f"cat {shown}",
                 assumed={"run": run or "RUN", "events": [], "assumed": True},
                 describe=lambda s: "no run" if not s.get("run") else f"run {s['run']}: {len(s['events'])} event(s)")

    def decide(look):
        s: dict[str, Any] = look(probe)
        name = s.get("run")
        if name is None:
            # No run named and none yet: nothing to report is not an error
            # (`invoke runs` says the same, exit 0); a run named that has no
            # timeline is (below: exit 1).
            none = run_list.no_timeline(env.name)
            return ok(none, data={"run": None, "none": none})
        if not s["events"]:
            if s.get("skipped"):
                return fail(f"run {name}: no event of its timeline could be read: "
                            f"{timeline.Read(skipped=s['skipped']).note(paths.events(env.name, name))}")
            if s.get("assumed"):
                return ok(f"the goodput of run {name}, from its timeline")
            return fail(f"run {name} has no events ({paths.events(env.name, name)}): `invoke train` (or `invoke "
                        f"logs --follow`) writes them while it follows a job")
        # Its saves against its checkpoints as Orbax counts them (the look `invoke status` makes).
        report, segs = goodput.account_with_segments(s["events"], name, now=time.time(),
                                                     on_disk=finalized_steps(env, name, look))
        report["cost"] = run_cost(env, s["events"], segs, report.get("uncertain"))
        report["library"] = goodput_reference.compute(s["events"], keep=paths.goodput_library(env.name, name))
        report["badput_library_type"] = dict(goodput_reference.LIBRARY_TYPE)
        if s.get("skipped"):
            report["skipped_lines"] = s["skipped"]
            report["note"] = timeline.Read(skipped=s["skipped"]).note(paths.events(env.name, name))
        return ok(f"run {name}: goodput {report['goodput_pct']:.1f}% of {report['wall_s']:.1f} s, "
                  f"{len(report['incidents'])} incident(s)", data=report)

    return Step("goodput", f"goodput of {f'run {run}' if run else 'the newest run'}", decide, id="goodput:report",
                probes=(probe,))


def run_cost(env: Environment, events: list[dict], segs: list[tuple[float, float, str]],
             uncertain: dict | None = None) -> dict:
    """A run's chip-hours and cost by cause, on the basis recorded when it
    was submitted (else the environment's now: its inventory prices and a
    fresh cached catalog, never a request); ``uncertain``: the goodput
    report's events timed within bounds."""
    recorded = cost.recorded_basis(events)
    basis = recorded or cost.env_basis(env, None, prices.cached(env) if env.platform.cloud else None)
    return cost.report(events, segs, goodput.CAUSES, basis, recorded is not None, uncertain)


def _timeline(env: Environment, run: str | None) -> dict:
    name = run or newest_timeline(env)
    got = timeline.read_checked(env, name) if name else timeline.Read()
    return {"run": name, "events": got.events, "skipped": got.skipped}
