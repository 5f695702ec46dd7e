"""A Ray cluster's dashboard: facts read from its REST API (version, nodes,
jobs), shown in transcripts as the equivalent curl line; which jobs are a
run's (submission ids <run>-<n>); and the command that reads a job's driver
log (`ray job logs`, which the local connector may answer through the Ray
Jobs SDK instead: the same lines, no process). A job's outcome is read from
the Jobs API (its status), never from a CLI's exit code."""
from __future__ import annotations

from typing import Any

from playbooks.core.command import Command, quote
from playbooks.core.connector import Connector
from playbooks.core.facts import ABSENT, Fact

# A job's states before its end (the Jobs API's JobStatus).
ACTIVE = ("PENDING", "RUNNING")
UNSUCCESSFUL = ("FAILED", "STOPPED")  # a job that ended without its work done
# `ray job submit` prints its own lines (the job submitted, the next steps),
# then this one, then the job's log (ray/dashboard/modules/job/cli.py).
SUBMIT_TAILS = "Tailing logs until the job exits"


def _get(via: Connector, url: str, timeout: float) -> Any:
    """Read where the dashboard's port is: this machine, or the controller
    host that runs the port-forward."""
    return via.get_json(url, timeout=timeout)


def version_fact(address: str, via: Connector) -> Fact:
    url = f"{address}/api/version"
    return Fact(name="ray dashboard", python=lambda: _get(via, url, 5), display=f"curl -fsS {url}",
                describe=lambda v: f"Ray {v.get('ray_version')} answering" if isinstance(v, dict) else str(v))


def nodes_url(address: str) -> str:
    return f"{address}/api/v0/nodes?limit=10000&detail=true"


def list_nodes(address: str, via: Connector) -> Any:
    d = _get(via, nodes_url(address), 10)
    if d is ABSENT:
        return ABSENT
    return ((d or {}).get("data") or {}).get("result", {}).get("result", [])


def nodes_fact(address: str, via: Connector) -> Fact:
    return Fact(name="ray nodes", python=lambda: list_nodes(address, via), assumed=[],
                display=f"curl -fsS {quote(nodes_url(address))}  # what `ray list nodes --address {address}` reads",
                describe=lambda ns: f"{len(alive(ns))} alive node(s)" if isinstance(ns, list) else "no cluster")


def alive(nodes: Any) -> list[dict]:
    return [n for n in nodes or [] if n.get("state") == "ALIVE"]


def labels(n: dict) -> dict:
    return n.get("labels") or {}


def jobs_fact(address: str, via: Connector) -> Fact:
    url = f"{address}/api/jobs/"
    return Fact(name="ray jobs", python=lambda: _get(via, url, 10), display=f"curl -fsS {url}",
                assumed=[], describe=lambda js: f"{len(js)} job(s)" if isinstance(js, list) else "no cluster")


def job_fact(address: str, submission_id: str, via: Connector) -> Fact:
    url = f"{address}/api/jobs/{submission_id}"
    return Fact(name=f"ray job {submission_id}", python=lambda: _get(via, url, 10),
                display=f"curl -fsS {url}", assumed=None,
                describe=lambda j: j.get("status", "?") if isinstance(j, dict) else "its final status")


# -- a run's jobs --------------------------------------------------------------------
def submission_number(job: dict) -> int:
    return int(str(job["submission_id"]).rpartition("-")[2])


def ours(run: str | None, jobs: Any) -> list[dict]:
    """The jobs of a run (submission ids <run>-<n>), oldest first; without a
    run, every job with a submission id of that form."""
    out = []
    for j in jobs or []:
        sid = str(j.get("submission_id") or "")
        head, _, n = sid.rpartition("-")
        if n.isdigit() and head and (run is None or head == run):
            out.append(j)
    return sorted(out, key=lambda j: (j.get("start_time") or 0, submission_number(j)))


def run_of(submission_id: str) -> str:
    return submission_id.rpartition("-")[0]


def job_log_fact(address: str, submission_id: str, via: Connector) -> Fact:
    """A job's whole driver log, as the Jobs API gives it (its text)."""
    url = f"{address}/api/jobs/{submission_id}/logs"

    def read() -> Any:
        d = _get(via, url, 60)
        return d if d is ABSENT else str((d or {}).get("logs") or "") if isinstance(d, dict) else ""

    return Fact(name=f"ray job {submission_id}'s log", python=read, display=f"curl -fsS {url}", assumed="",
                describe=lambda t: f"{len(t.splitlines())} line(s)" if isinstance(t, str) else "none")


def job_logs_command(address: str, submission_id: str, follow: bool) -> Command:
    """A job's driver log, whole or followed to the job's end."""
    return Command(("ray", "job", "logs", *(("--follow",) if follow else ()), "--address", address, submission_id))


class RayJobLogs:
    """``core.connector.base.Shortcut`` for `ray job logs [--follow]
    --address A ID` on this machine: the Ray Jobs SDK (JobSubmissionClient,
    the client the CLI itself uses) without starting the CLI (seconds of
    CPU), the same lines and, after a followed log, the same closing line
    the CLI prints for the job's status."""

    name = "Ray Jobs SDK"

    def answers(self, argv: list[str], env: dict[str, str], streamed: bool) -> str | None:
        """`ray job logs --address A ID`, and streamed with ``--follow``."""
        parsed = self._parse(argv)
        if parsed is None or (parsed[0] and not streamed):
            return None
        return "Ray Jobs SDK, no ray process"

    def _parse(self, argv: list[str]) -> tuple[bool, str, str] | None:
        if argv[:3] != ["ray", "job", "logs"]:
            return None
        follow, address, sid, rest = False, None, None, argv[3:]
        i = 0
        while i < len(rest):
            a = rest[i]
            if a == "--follow":
                follow = True
            elif a == "--address" and i + 1 < len(rest):
                address, i = rest[i + 1], i + 1
            elif a.startswith("-") or sid is not None:
                return None
            else:
                sid = a
            i += 1
        return (follow, address, sid) if address and sid else None

    def run(self, argv: list[str], env: dict[str, str], timeout: float | None) -> Any:
        parsed = self._parse(argv)
        if parsed is None or parsed[0]:
            return None
        return self._read(parsed, None)

    def stream(self, argv: list[str], env: dict[str, str], on_line: Any) -> Any:
        parsed = self._parse(argv)
        return None if parsed is None else self._read(parsed, on_line)

    def _read(self, parsed: tuple[bool, str, str], on_line: Any) -> Any:
        import asyncio
        import time

        from playbooks.core.connector import Ran
        follow, address, sid = parsed
        start = time.monotonic()
        lines: list[str] = []

        def say(line: str) -> None:
            lines.append(line)
            if on_line is not None:
                on_line(line)

        try:
            from ray.job_submission import JobStatus, JobSubmissionClient
            client = JobSubmissionClient(address)
            if not follow:
                for line in client.get_job_logs(sid).splitlines():
                    say(line)
            else:
                async def tail() -> None:
                    rest = ""
                    async for chunk in client.tail_job_logs(sid):
                        *whole, rest = (rest + chunk).split("\n")
                        for line in whole:
                            say(line)
                    if rest:
                        say(rest)

                asyncio.run(tail())
                info = client.get_job_info(sid)
                if info.status == JobStatus.SUCCEEDED:
                    say(f"Job '{sid}' succeeded")
                elif info.status == JobStatus.STOPPED:
                    say(f"Job '{sid}' was stopped")
                else:
                    say(f"Job '{sid}' failed" if info.status == JobStatus.FAILED else
                        f"Status for job '{sid}': {info.status}")
                    if info.message is not None:
                        say(f"Status message: {info.message}")
        except Exception as e:  # no dashboard, no such job: the CLI's exit 1 with its message
            text = " ".join(str(e).split())[:500] or type(e).__name__
            return Ran(1, "\n".join(lines), f"{type(e).__name__}: {text}", time.monotonic() - start)
        return Ran(0, "\n".join(lines), "", time.monotonic() - start)
