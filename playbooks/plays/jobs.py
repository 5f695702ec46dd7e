"""A Ray job's driver log through the Ray Jobs SDK (JobSubmissionClient),
whole or followed to its end: `invoke logs`, and `invoke train` when it
re-attaches to a run already RUNNING. The job's outcome is read from the
Jobs API (its status), never from a CLI's exit code.

The SDK is imported only here, when a log is read (ray is a heavy import).
"""
from __future__ import annotations

import asyncio
from typing import Any, Callable

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


def _client(address: str):
    from ray.job_submission import JobSubmissionClient
    return JobSubmissionClient(address)


def _on_controller(via, address: str, submission_id: str, on_line: Callable[[str], None], follow: bool) -> None:
    """On a controller host the dashboard's port is there, not here: the
    same read with the Ray CLI on the controller (`ray job logs`, which
    calls the same Jobs API)."""
    argv = ["ray", "job", "logs", *(["--follow"] if follow else []), "--address", address, submission_id]
    r = via.stream(argv, on_line)
    if r.rc != 0:
        from ..core.errors import ProbeFailed
        raise ProbeFailed("ray job logs", " ".join(argv), r.rc, r.stdout, "",
                          why=f"could not read the log: ray job logs exited {r.rc}")


def follow(address: str, submission_id: str, on_line: Callable[[str], None], via=None) -> None:
    """Every line of the job's driver log, as it comes, until the job ends
    (JobSubmissionClient.tail_job_logs)."""
    if via is not None and via.remote:
        return _on_controller(via, address, submission_id, on_line, True)
    client = _client(address)

    async def tail() -> None:
        rest = ""
        async for chunk in client.tail_job_logs(submission_id):
            text = rest + chunk
            *lines, rest = text.split("\n")
            for line in lines:
                on_line(line)
        if rest:
            on_line(rest)

    asyncio.run(tail())


def logs(address: str, submission_id: str, on_line: Callable[[str], None], via=None) -> None:
    """The driver log so far (JobSubmissionClient.get_job_logs)."""
    if via is not None and via.remote:
        return _on_controller(via, address, submission_id, on_line, False)
    for line in _client(address).get_job_logs(submission_id).splitlines():
        on_line(line)


def log_line(address: str, submission_id: str, follow: bool) -> str:
    """How reading a job's log reads in a transcript: the CLI line that does
    the same as the SDK call."""
    how = "tail_job_logs" if follow else "get_job_logs"
    return (f"ray job logs {'--follow ' if follow else ''}--address {address} {submission_id}  "
            f"# through the Ray Jobs SDK: JobSubmissionClient.{how}")


def ours(run: str | None, jobs: Any) -> list[dict]:
    """The jobs of a run (submission ids <run>-<n>), oldest first; without a
    run, every job with a submission id of that form."""
    out = []
    for j in jobs or []:
        sid = str(j.get("submission_id") or "")
        head, _, n = sid.rpartition("-")
        if n.isdigit() and head and (run is None or head == run):
            out.append(j)
    return sorted(out, key=lambda j: (j.get("start_time") or 0, int(str(j["submission_id"]).rpartition("-")[2])))


def run_of(submission_id: str) -> str:
    return submission_id.rpartition("-")[0]


# -- `invoke logs` and `invoke metrics` -------------------------------------------------
def logs_step(env, run: str | None, follow_to_end: bool):
    """The driver log of the newest job of a run (or of any run of this
    environment), whole or followed to its end; the outcome is the job's."""
    from .. import hosts
    from ..core.facts import ABSENT, Fact
    from ..core.play import Outcome
    from ..core.recap import FAILED, OK
    from ..core.step import Step
    from ..rayapi import job_fact, jobs_fact
    from .dashboard import address
    addr = address(env)
    via = hosts.connector(env)
    listing = jobs_fact(addr, via)

    def run_step(ctx) -> Outcome:
        listed = ctx.look(listing)
        if listed is ABSENT:
            return Outcome(FAILED, f"no Ray dashboard answers at {addr}: run `invoke up` (or `invoke dashboard`)")
        mine = ours(run, listed)
        if not mine:
            if not ctx.runner.probing:
                return Outcome(OK, f"would show the log of the newest job of {f'run {run}' if run else 'this environment'}")
            return Outcome(FAILED, f"no job of {f'run {run}' if run else 'any run'} at {addr}")
        sid = str(mine[-1]["submission_id"])
        shown = log_line(addr, sid, follow_to_end)
        reader = follow if follow_to_end else logs
        ctx.look(Fact(name=f"log of {sid}", python=lambda: reader(addr, sid, ctx.echo, via), display=shown,
                      describe=lambda v: "read"))
        final = ctx.look(job_fact(addr, sid, via), fresh=True)
        status = final.get("status") if isinstance(final, dict) else "UNKNOWN"
        if status in ("FAILED", "STOPPED"):
            return Outcome(FAILED, f"job {sid} {status}: {final.get('message') or 'see its log'}")
        return Outcome(OK, f"job {sid} {status}")

    return Step("logs", f"log of {f'run {run}' if run else 'the newest job'}", run=run_step,
                id="logs:job")


def metrics_step(env, run: str | None):
    """metrics.png from the run's metrics.jsonl (the newest run without one)."""
    from .. import metrics
    from ..core.facts import Action
    from ..core.play import Outcome
    from ..core.recap import CHANGED, FAILED, OK
    from ..core.step import Step

    def run_step(ctx) -> Outcome:
        name = run or metrics.newest_run(env)
        if name is None:
            return Outcome(FAILED, f"no run of environment {env.name} has kept metrics yet: `invoke train` first")
        path = metrics.run_dir(env, name) / metrics.FILE
        if not path.is_file():
            return Outcome(FAILED, f"run {name} has no metrics ({path.relative_to(metrics.ROOT)}): `invoke train` "
                                   f"keeps them")
        png = path.with_name(metrics.PNG)
        if png.is_file() and png.stat().st_mtime >= path.stat().st_mtime:
            return Outcome(OK, f"{png.relative_to(metrics.ROOT)} is up to date with run {name}'s metrics")
        ctx.act(Action(f"# draw {path.relative_to(metrics.ROOT)} into {png.relative_to(metrics.ROOT)}",
                       lambda: metrics.plot(path)))
        if not ctx.acting:
            return Outcome(CHANGED, f"would write {png.relative_to(metrics.ROOT)}")
        ctx.echo(str(png.relative_to(metrics.ROOT)))
        return Outcome(CHANGED, f"wrote {png.relative_to(metrics.ROOT)}: loss, tokens/s per device and step time "
                                f"of run {name}")

    return Step("metrics", f"metrics of {run or 'the newest run'}", run=run_step,
                id="metrics:png")
