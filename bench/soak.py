"""A chaos soak of elastic training on the local twin: each scenario is its
own elastic run, driven by the tasks a user types (`invoke train --elastic
--fresh`, `invoke chaos.delete-worker`, `invoke chaos.hang-worker`, `invoke
up`, `invoke goodput --json`), and a table of how each came out.

    .venv/bin/python bench/soak.py [--repeat 3] [--load] [--only back-20s,...] [--write]

Scenarios (a host is a simulated TPU host: one slice of the twin; the
kills aimed with `chaos.delete-worker --target`, see soak_checks.SPECS):

- back-never: a peer's host lost after step 12, never back by itself;
  `invoke up` brings it back once the job goes on with one slice;
- back-5s, back-20s, back-60s: a host (rank 0's, rank 0's, a peer's) lost
  after step 12 and back after 5, 20 or 60 s (`--restore-after`), as
  KubeRay recreates a deleted pod;
- in-compile: a host lost during the job's first compile (before any step;
  the run's compilation cache empty), back after 20 s;
- in-save: a peer's host lost while a checkpoint is being written (its
  `<step>.orbax-checkpoint-tmp-*` folder there), back after 20 s;
- two-lost: rank 0's host lost after step 12 (back after 60 s), and the
  other as soon as the job starts again on it (back after 20 s): for a
  while no slice is left;
- hung-resumed: a host's training worker frozen (SIGSTOP) after step 12,
  resumed after 10 s, `stall_after: 5`: the stall must be seen;
- hang-stop: `stall_after: 15`, `stall_action: stop`: a worker frozen for
  good; the follower stops the job; `invoke train --elastic` (no --fresh)
  resumes the run from its checkpoint and finishes it.

Each run must first prove its fault happened as described (else it is run
again, at most ATTEMPTS times, then counted "not exercised": a failure);
then pass each criterion of bench/soak_checks.py (each shown failing on a
bad run by tests/test_soak_checks.py; a never-resuming hang's bound is
stall_after plus the median time to recover of the newest soak table in
docs/, which its check names). The table gives each run's outcome,
its goodput (ours, and Google's ml-goodput-measurement on the same steps),
and each incident: the step it was lost at, the checkpoint restored, the
steps replayed, the time to recover (the loss to the first step after it);
then the median and p90 of the time to recover over the lost hosts.

`--load` runs a CPU hog on one core meanwhile. `--write` writes the table,
dated, into docs/elastic.md (between its markers), and its summary (a row
per scenario) into the README; `--summary` writes only that summary again. Each run's timeline is
kept: .state/soak/kept/<rep>-<scenario>.jsonl, the soak's facts beside it
(.json); `--rescore` judges the kept runs again with this tree's code. Uses its own environment
(soak: ray_ip 127.0.0.12, gcs_port 7400, dashboard_port 8305, its own
.state folder) and stops its cluster at the end.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import doc_table, soak_checks  # noqa: E402
from bench.soak_checks import SPECS  # noqa: E402
from playbooks.runs.events import GROUP_LINE  # noqa: E402

INVOKE = str(Path(sys.executable).parent / "invoke")
ENV = "soak"
STATE = ROOT / ".state" / ENV
RUN = "rayjob-elastic-8b"
STEP = re.compile(r"completed step: (\d+),")
OUTCOME = re.compile(r"^(?:changed|ok|skipped): \[train : job [^\]]+\] (.+)$")
FAILED_STEP = re.compile(r"^failed: \[train : job [^\]]+\]$")
LOSSES = ("worker_lost", "failure")


def one_host_group(line: str) -> bool:
    """Ray Train started a worker group of one host (the job goes on with one slice)."""
    m = GROUP_LINE.search(line)
    return m is not None and m.group(1) == "1"


def soak_env(**extra) -> dict:
    base = yaml.safe_load((ROOT / "inventory.yaml").read_text())["environments"]["local"]
    return {**base, "ray_ip": "127.0.0.12", "gcs_port": 7400, "dashboard_port": 8305, **extra}


@dataclass
class Result:
    scenario: str
    rep: int
    ok: bool = False
    outcome: str = ""
    why: list[str] = field(default_factory=list)
    goodput: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    # The soak's own observations, kept with the timeline (soak_checks.py's ``facts``).
    facts: dict = field(default_factory=dict)
    attempts: list[str] = field(default_factory=list)  # why each earlier attempt was run again
    not_exercised: list[str] = field(default_factory=list)

    def trains(self, job: Train) -> Train:
        """A `invoke train` of this run: the stopwatch runs from the first's start to the last's end."""
        self.facts.setdefault("t_before", job.t_start)
        self.facts["jobs"] = self.facts.get("jobs", 0) + 1
        self.last = job
        return job


class Soak:
    """The soak's environment: an inventory of one local environment, and
    the tasks, run as a user runs them."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.inventory = tmp / "inventory.yaml"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("INVOKE_")}
        self.env.update({"INVOKE_PLAYBOOK_INVENTORY": str(self.inventory), "RAY_USAGE_STATS_ENABLED": "0",
                         "PYTHONUNBUFFERED": "1"})
        self.configure()

    def configure(self, **extra) -> None:
        self.inventory.write_text(yaml.safe_dump({"default": ENV, "environments": {ENV: soak_env(**extra)}}))

    def invoke(self, *args: str, timeout: float = 900) -> tuple[int, str]:
        r = subprocess.run([INVOKE, *args], cwd=ROOT, env=self.env, capture_output=True, text=True,
                           timeout=timeout)
        return r.returncode, r.stdout + r.stderr

    def must(self, *args: str, timeout: float = 300, what: str = "") -> str:
        """A task that must work: its output, else Failed naming it and its last line."""
        rc, out = self.invoke(*args, timeout=timeout)
        if rc != 0:
            raise Failed(f"{what or args[0]} failed: {out.strip().splitlines()[-1:]}")
        return out

    def background(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen([INVOKE, *args], cwd=ROOT, env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)

    def events(self) -> list[dict]:
        p = STATE / "training" / RUN / "events.jsonl"
        out = []
        for line in (p.read_bytes().decode(errors="replace").splitlines() if p.is_file() else []):
            try:
                e = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(e, dict):
                out.append(e)
        return out

    def checkpoints(self) -> Path:
        return STATE / "data" / RUN / "checkpoints"

    def dashboard(self) -> str:
        e = soak_env()
        return f"http://{e['ray_ip']}:{e['dashboard_port']}"

    def stop_jobs(self) -> list[str]:
        """A job of the run left running (a scenario that failed, an
        interrupted follow): stopped as a user does (`ray job stop`), so the
        next scenario's `--fresh` run is its own."""
        import urllib.request
        try:
            jobs = json.loads(urllib.request.urlopen(f"{self.dashboard()}/api/jobs/", timeout=10).read())
        except OSError:
            return []
        active = [j["submission_id"] for j in jobs if str(j.get("submission_id", "")).startswith(RUN + "-")
                  and j.get("status") in ("PENDING", "RUNNING")]
        for sid in active:
            subprocess.run([str(Path(INVOKE).parent / "ray"), "job", "stop", "--address", self.dashboard(), sid],
                           env=self.env, capture_output=True, timeout=120)
        return active


# A train's job id in its output: its submit's, never its watch's (`<job>-watch`,
# submitted first by the watch in the cluster), or the job it follows.
JOB_ID = re.compile(r"--submission-id=(\S+?)(?<!-watch)(?:\s|$)|job (\S+) of run .* is already RUNNING: following it")


def job_id(line: str) -> str | None:
    m = JOB_ID.search(line)
    return (m.group(1) or m.group(2)) if m else None


class Train:
    """`invoke train` in the background, its output kept line by line."""

    def __init__(self, soak: Soak, *args: str):
        self.t_start = time.time()
        self.t_end: float | None = None
        self.p = soak.background("train", "--elastic", *args)
        self.lines: list[str] = []
        self.cv = threading.Condition()
        self.rc: int | None = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            with self.cv:
                self.lines.append(line.rstrip("\n"))
                self.cv.notify_all()
        rc = self.p.wait()
        with self.cv:
            self.t_end = time.time()
            self.rc = rc
            self.cv.notify_all()

    def wait_for(self, test: Callable[[str], bool], minutes: float = 15, after: int = 0) -> int:
        """The index of the first line from ``after`` on that passes ``test``."""
        deadline = time.monotonic() + minutes * 60
        with self.cv:
            i = after
            while True:
                while i < len(self.lines):
                    if test(self.lines[i]):
                        return i
                    i += 1
                if self.rc is not None:
                    raise Failed(f"the job ended (exit {self.rc}) first: {self.last()}")
                if time.monotonic() > deadline:
                    raise Failed(f"not within {minutes:g} minutes")
                self.cv.wait(timeout=5)

    def sid(self) -> str:
        """The submission id of the job this train submitted (or follows)."""
        i = self.wait_for(lambda ln: job_id(ln) is not None)
        found = job_id(self.lines[i])
        assert found
        return found

    def step_at_least(self, n: int, after: int = 0) -> int:
        return self.wait_for(lambda ln: bool((m := STEP.search(ln)) and int(m.group(1)) >= n), after=after)

    def end(self, minutes: float = 30) -> int:
        deadline = time.monotonic() + minutes * 60
        with self.cv:
            while self.rc is None:
                if time.monotonic() > deadline:
                    self.p.terminate()
                    raise Failed(f"`invoke train` did not end within {minutes:g} minutes")
                self.cv.wait(timeout=5)
        return self.rc

    def outcome(self) -> str:
        """The job step's line: its reason on the line (ok, changed) or under it (failed)."""
        for i in range(len(self.lines) - 1, -1, -1):
            if (m := OUTCOME.match(self.lines[i])):
                return m.group(1)
            if FAILED_STEP.match(self.lines[i]) and i + 1 < len(self.lines):
                return self.lines[i + 1].strip()
        return self.last()

    def last(self) -> str:
        return next((ln for ln in reversed(self.lines) if ln.strip()), "no output")[:300]

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.terminate()
            self.p.wait(60)


def followers(inventory: Path) -> int:
    """`invoke train` and `invoke logs` processes of the soak's inventory
    on this machine now (the watch in the cluster, `python -m invoke
    watch`, is not one; another checkout's tests are not the soak's)."""
    n = 0
    mine = f"INVOKE_PLAYBOOK_INVENTORY={inventory}".encode()
    for d in Path("/proc").glob("[0-9]*"):
        try:
            argv = (d / "cmdline").read_bytes().decode(errors="replace").split("\0")
            if mine not in (d / "environ").read_bytes().split(b"\0"):
                continue
        except OSError:
            continue
        at = next((i for i, a in enumerate(argv) if a.endswith("/invoke") or
                   (a == "invoke" and i > 0 and argv[i - 1] == "-m")), None)
        if at is not None and any(a in ("train", "logs") for a in argv[at + 1:]):
            n += 1
    return n


class Detached:
    """`invoke train --detach`: the job submitted and nobody following it
    (the watch in the cluster acts); its steps read from the run's timeline
    (the watch writes it), its end from the Jobs API. Every look counts the
    `invoke` follows on this machine (``seen``: the most at once)."""

    def __init__(self, soak: Soak, *args: str):
        self.soak = soak
        self.t_start = time.time()
        self.t_end: float | None = None
        self.rc: int | None = None
        self.status = ""
        rc, out = soak.invoke("train", "--detach", *args, timeout=600)
        self.lines = out.splitlines()
        m = re.search(r"job (\S+) submitted, not followed", out)
        if rc != 0 or not m:
            raise Failed(f"`invoke train --detach` failed (exit {rc}): {self.last()}")
        self.sid = m.group(1)
        self.seen = 0

    def events(self) -> list[dict]:
        self.seen = max(self.seen, followers(self.soak.inventory))
        return [e for e in self.soak.events() if e.get("job") == self.sid]

    def job(self, sid: str | None = None) -> dict:
        import urllib.request
        try:
            return json.loads(urllib.request.urlopen(f"{self.soak.dashboard()}/api/jobs/{sid or self.sid}",
                                                     timeout=10).read())
        except OSError:
            return {}

    def wait_event(self, test: Callable[[dict], bool], what: str, minutes: float = 15) -> dict:
        deadline = time.monotonic() + minutes * 60
        while True:
            found = [e for e in self.events() if test(e)]
            if found:
                return min(found, key=lambda e: float(e["t"]))
            if self.job().get("status") in ("SUCCEEDED", "FAILED", "STOPPED"):
                raise Failed(f"the job ended ({self.job().get('status')}) before {what}")
            if time.monotonic() > deadline:
                raise Failed(f"no {what} within {minutes:g} minutes")
            time.sleep(1)

    def step_at_least(self, n: int) -> dict:
        return self.wait_event(lambda e: e.get("kind") == "step" and isinstance(e.get("step"), int)
                               and e["step"] >= n, f"step {n}")

    def end(self, minutes: float = 30) -> int:
        deadline = time.monotonic() + minutes * 60
        while True:
            j = self.job()
            self.seen = max(self.seen, followers(self.soak.inventory))
            if j.get("status") in ("SUCCEEDED", "FAILED", "STOPPED"):
                self.status, self.t_end = str(j["status"]), time.time()
                self.rc = 0 if self.status == "SUCCEEDED" else 1
                self.message = str(j.get("message") or "")
                # The watch writes the job's end, then ends: waited for (a minute at most).
                until = time.monotonic() + 60
                while self.job(f"{self.sid}-watch").get("status") in ("PENDING", "RUNNING") and \
                        time.monotonic() < until:
                    time.sleep(1)
                return self.rc
            if time.monotonic() > deadline:
                raise Failed(f"job {self.sid} did not end within {minutes:g} minutes")
            time.sleep(2)

    def outcome(self) -> str:
        return f"job {self.sid} {self.status or 'not ended'} (detached; the watch in the cluster acted)"

    def last(self) -> str:
        return next((ln for ln in reversed(self.lines) if ln.strip()), "no output")[:300]

    def stop(self) -> None:
        pass  # nothing of ours follows it; a job left running is stopped by Soak.stop_jobs


class Failed(Exception):
    pass


class NotExercised(Failed):
    """The scenario's fault could not be made to happen as described this time."""


# -- the scenarios: each drives one run ------------------------------------------
def chaos_kill(soak: Soak, restore_after: float, target: str) -> subprocess.Popen:
    """`invoke chaos.delete-worker --restore-after S --target T`, in the
    background (it returns when the host is back); the kill is done when it
    prints it."""
    return soak.background("chaos.delete-worker", f"--restore-after={restore_after:g}", f"--target={target}")


def target(name: str, i: int = 0) -> str:
    """The --target of the scenario's i-th kill (soak_checks.SPECS)."""
    return SPECS[name].targets[i]


def chaos_done(p: subprocess.Popen, what: str, timeout: float = 600) -> str:
    out, _ = p.communicate(timeout=timeout)
    if p.returncode != 0:
        raise Failed(f"{what} failed (exit {p.returncode}): {out.strip().splitlines()[-1:] or ['no output']}")
    return out


def lost_and_back(restore_after: float, steps: int) -> Callable[[Soak, Result], Train]:
    def go(soak: Soak, r: Result) -> Train:
        r.facts["target_steps"] = steps
        job = r.trains(Train(soak, "--fresh", f"--steps={steps}"))
        at = job.step_at_least(12)
        kill = chaos_kill(soak, restore_after, target(r.scenario))
        if restore_after == 0:
            chaos_done(kill, "chaos.delete-worker")
            shrunk = job.wait_for(one_host_group, after=at)
            job.wait_for(STEP.search, after=shrunk)
            soak.must("up", timeout=600, what="`invoke up`")
        job.end()
        if restore_after:
            chaos_done(kill, "chaos.delete-worker")
        return job
    return go


def in_compile(soak: Soak, r: Result) -> Train:
    """The host killed once the job's first compile starts. The run gets a
    compilation cache of its own, empty: with the twin's warm cache (every
    executable kept, the earlier scenarios' and repetitions') there is no
    compile to kill in, and the first step comes first (reps 2 and 3 of
    the soak of 2026-12-03)."""
    cache = soak.tmp / f"jax-cache-{r.rep}"
    shutil.rmtree(cache, ignore_errors=True)
    r.facts["target_steps"] = 60
    job = r.trains(Train(soak, "--fresh", "--steps=60", "--set", f"jax_cache_dir={cache}"))
    sid = job.sid()
    deadline = time.monotonic() + 600
    while True:
        evs = [e for e in soak.events() if e.get("job") == sid]
        if any(e.get("kind") in ("step", "peer_step") for e in evs):
            raise NotExercised("the first step came before a compile was seen")
        if any(e.get("kind") == "compile_started" for e in evs):
            break
        if job.rc is not None or time.monotonic() > deadline:
            raise Failed("no compile seen")
        time.sleep(0.05)
    kill = chaos_kill(soak, 20, target(r.scenario))
    job.end()
    chaos_done(kill, "chaos.delete-worker")
    return job


TMP = re.compile(r"^(\d+)\.orbax-checkpoint-tmp")


# in-save: a model whose checkpoint takes ~2 s to write here (a ~40M-parameter
# llama3 shape: its step ~2.5 s), so that the chaos task (~1 s to start)
# lands inside the save it was started for.
SAVE_MODEL = ("base_emb_dim=512", "base_mlp_dim=2048", "vocab_size=32768", "head_dim=128", "checkpoint_period=5")


def in_save(soak: Soak, r: Result) -> Train:
    """The host killed once a save's temporary folder appears (a save of
    step 10 or later): the save it cuts short stays a
    `<step>.orbax-checkpoint-tmp-*` folder (Orbax leaves it), which the
    restore must not take."""
    r.facts["target_steps"] = 40
    job = r.trains(Train(soak, "--fresh", "--steps=40", *(a for kv in SAVE_MODEL for a in ("--set", kv))))
    folder = soak.checkpoints()
    deadline = time.monotonic() + 900
    while True:
        names = [n for n in (os.listdir(folder) if folder.is_dir() else []) if (m := TMP.match(n))
                 and int(m.group(1)) >= 10]
        if names:
            break
        if job.rc is not None or time.monotonic() > deadline:
            raise Failed("no checkpoint save of step 10 or later seen")
        time.sleep(0.01)
    kill = chaos_kill(soak, 20, target(r.scenario))
    job.end()
    chaos_done(kill, "chaos.delete-worker")
    saving = int(TMP.match(names[0]).group(1))  # type: ignore[union-attr]
    restored = [e.get("step") for e in soak.events() if e.get("kind") == "restore_started"]
    r.facts["saving_step"] = saving
    r.facts["restored_from"] = restored[0] if restored else None
    if not restored:
        pass  # soak_checks.exercised says so
    elif restored[0] < saving:
        # The save of that step never finalized: the restore took the one before
        # (Orbax's rule; the next group's checkpoint manager cleans up its folder).
        r.notes.append(f"the kill cut the save of step {saving} short: restored from {restored[0]}")
    else:
        r.notes.append(f"the save of step {saving} finished before the kill (restored from {restored[0]})")
    return job


def two_lost(soak: Soak, r: Result) -> Train:
    """The second host killed as soon as the job has started again on it
    (the first is still down: back after 60 s), itself back after 20 s."""
    r.facts["target_steps"] = 120
    job = r.trains(Train(soak, "--fresh", "--steps=120"))
    at = job.step_at_least(12)
    first = chaos_kill(soak, 60, target(r.scenario, 0))
    job.wait_for(one_host_group, after=at)
    second = chaos_kill(soak, 20, target(r.scenario, 1))
    job.end()
    chaos_done(first, "the first chaos.delete-worker")
    chaos_done(second, "the second chaos.delete-worker")
    return job


def hung_resumed(soak: Soak, r: Result) -> Train:
    """A worker frozen 10 s; ``stall_after: 5`` (report): the follower must
    see the hang as a stall, and the stall end when the steps come again."""
    soak.configure(stall_after=5, stall_action="report")
    try:
        r.facts["target_steps"] = 60
        job = r.trains(Train(soak, "--fresh", "--steps=60"))
        job.step_at_least(12)
        soak.must("chaos.hang-worker", "--restore-after=10")
        job.end()
    finally:
        soak.configure()
    return job


def hang_stop(soak: Soak, r: Result) -> Train:
    soak.configure(stall_after=15, stall_action="stop")
    r.facts["target_steps"] = 60
    try:
        job = r.trains(Train(soak, "--fresh", "--steps=60"))
        job.step_at_least(12)
        soak.must("chaos.hang-worker", "--restore-after=0")
        if job.end() == 0 or "STOPPED after a stall" not in job.outcome():
            raise Failed(f"the stalled job was not stopped: {job.outcome()}")
        r.notes.append(f"first job: {job.outcome()[:120]}")
    finally:
        soak.configure()
    again = r.trains(Train(soak, "--steps=60"))
    again.end()
    restored = [e.get("step") for e in soak.events() if e.get("kind") == "restore_started"]
    r.notes.append(f"resumed from checkpoint {restored[-1] if restored else 'none'}")
    if not restored:
        r.why.append("the resumed job restored no checkpoint")
    return again


def quarantined(soak: Soak) -> list[str]:
    """The hosts set aside now (the environment's quarantine record)."""
    p = STATE / "quarantine.json"
    try:
        return list((json.loads(p.read_text()).get("hosts") or {}).keys()) if p.is_file() else []
    except (OSError, ValueError, AttributeError):
        return []


def release_all(soak: Soak) -> list[str]:
    """Every host set aside given back (`invoke hosts.release`), for the next run."""
    hosts = quarantined(soak)
    for h in hosts:
        soak.must("hosts.release", h, what=f"`invoke hosts.release {h}`")
    return hosts


def hang_never(soak: Soak, r: Result) -> Detached:
    """A worker frozen for good after step 12, nobody following the job:
    the watch in the cluster (stall_action: restart) names the culprit,
    sets its host aside, and the job goes on on the slice left."""
    soak.configure(stall_after=soak_checks.HANG_STALL_AFTER, stall_action="restart")
    try:
        r.facts["target_steps"] = 100
        job = r.trains(Detached(soak, "--elastic", "--fresh", "--steps=100"))
        job.step_at_least(12)
        soak.must("chaos.hang-worker", "--restore-after=0")
        job.end()
        r.facts["followers"] = job.seen
    finally:
        soak.configure()
        r.notes += [f"released {h}" for h in release_all(soak)]
    return job


def sick_back(soak: Soak, r: Result) -> Detached:
    """A peer's host started again sick after step 12 (chaos.sicken-worker:
    killed, back with fewer devices), nobody following: the health gate
    fails it, the watch sets it aside, the job goes on on one slice; then
    released (`invoke hosts.release`: started whole), it is taken back."""
    soak.configure(stall_action="restart")
    try:
        r.facts["target_steps"] = 400
        job = r.trains(Detached(soak, "--elastic", "--fresh", "--steps=400"))
        job.step_at_least(12)
        soak.must("chaos.sicken-worker", "--target=peer")
        sick = job.wait_event(lambda e: e.get("kind") == "host_sickened", "the host made sick", 2)
        host = r.facts["sick_host"] = sick.get("host")
        set_aside = job.wait_event(lambda e: e.get("kind") == "quarantined" and e.get("host") == host,
                                   f"{host} set aside", 10)
        job.wait_event(lambda e: e.get("kind") == "step" and float(e["t"]) > float(set_aside["t"]),
                       "a step after the host was set aside", 10)
        r.facts["released_at"] = time.time()
        release_all(soak)
        job.end()
        r.facts["followers"] = job.seen
    finally:
        soak.configure()
        r.notes += [f"released {h}" for h in release_all(soak)]
        soak.invoke("chaos.heal-worker", timeout=300)  # a sick host not set aside is not the next run's
    return job


def sick_start(soak: Soak, r: Result) -> Detached:
    """A host sick before any job (chaos.sicken-worker --target=first): a
    job that is not elastic is refused in one line naming it (its own
    `invoke train`, followed); an elastic job, nobody following, starts,
    its gate sets the host aside, and it finishes on the healthy slice."""
    soak.configure(stall_action="restart")
    try:
        out = soak.must("chaos.sicken-worker", "--target=first")
        m = re.search(r"TPU host (\S+) started again with", out)
        r.facts["sick_host"] = m.group(1) if m else None
        r.facts["sick_before_job"] = bool(m)
        rc, out = soak.invoke("train", "--fresh", "--steps=20", timeout=900)
        failed = [ln for ln in out.splitlines() if ln.startswith("failed: [train : job")]
        at = out.splitlines().index(failed[-1]) if failed else -1
        r.facts["refusal_rc"] = rc
        r.facts["refusal"] = out.splitlines()[at + 1].strip() if failed else next(
            (ln for ln in reversed(out.splitlines()) if ln.strip()), "")
        r.facts["target_steps"] = 60
        job = r.trains(Detached(soak, "--elastic", "--fresh", "--steps=60"))
        job.end()
        r.facts["followers"] = job.seen
    finally:
        soak.configure()
        r.notes += [f"released {h}" for h in release_all(soak)]
        soak.invoke("chaos.heal-worker", timeout=300)
    return job


def chaos_preempt(soak: Soak, grace: int, restore_after: float, target: str) -> subprocess.Popen:
    """`invoke chaos.preempt-worker --grace G --restore-after S --target T`
    in the background: a notice of G s, then the host killed; back after S s."""
    return soak.background("chaos.preempt-worker", f"--grace={grace}", f"--restore-after={restore_after:g}",
                           f"--target={target}")


def noticed(soak: Soak, r: Result) -> Train:
    """A peer's host given a Spot-like notice of 30 s after step 12, then
    killed, back after 40 s: the job saves at its next step, goes on with
    one slice from that save (no step replayed), and grows back."""
    spec = SPECS[r.scenario]
    r.facts["target_steps"] = 240
    job = r.trains(Train(soak, "--elastic", "--fresh", "--steps=240"))
    job.step_at_least(12)
    chaos = chaos_preempt(soak, int(spec.notice or 0), 40, target(r.scenario))
    job.end()
    chaos_done(chaos, "chaos.preempt-worker")
    return job


def notice_short(soak: Soak, r: Result) -> Train:
    """A notice of 1 s, shorter than a save of the in-save model (~2 s), to
    a peer's host after step 12: the save it asks cannot finish; the run
    goes back at most one checkpoint period, and the save is reported not
    finalized, never restored."""
    spec = SPECS[r.scenario]
    r.facts["target_steps"] = 40
    job = r.trains(Train(soak, "--elastic", "--fresh", "--steps=40",
                         *(a for kv in SAVE_MODEL for a in ("--set", kv))))
    job.step_at_least(12)
    chaos = chaos_preempt(soak, int(spec.notice or 0), 20, target(r.scenario))
    job.end()
    said = chaos_done(chaos, "chaos.preempt-worker")
    r.facts["checkpoint_period"] = 5  # SAVE_MODEL's
    # What chaos.preempt-worker said before it gave the notice (plays/chaos.py grace_words).
    r.facts["said_before"] = next((ln.strip() for ln in said.splitlines() if "a notice of" in ln and "save" in ln), "")
    return job


def maintenance(soak: Soak, r: Result) -> Detached:
    """A host maintenance scheduled for a peer's slice in 45 s
    (chaos.maintenance), nobody following (`maintenance_lead: 20`): the
    watch in the cluster gives the slice its notice 20 s before, the job
    saves and goes on with one slice from that save; the slice's host is
    killed at the maintenance's time and back 30 s later, taken in again."""
    soak.configure(maintenance_lead=20, stall_after=60)
    try:
        r.facts["target_steps"] = 240
        job = r.trains(Detached(soak, "--elastic", "--fresh", "--steps=240"))
        job.step_at_least(12)
        chaos = soak.background("chaos.maintenance", "--in=45", "--restore-after=30", f"--target={target(r.scenario)}")
        job.end()
        chaos_done(chaos, "chaos.maintenance")
        r.facts["followers"] = job.seen
    finally:
        soak.configure()
    return job


def many_lost(soak: Soak, r: Result) -> Detached:
    """A peer's host lost four times in one job (back after 5 s), each loss
    a failure window after the last (`failure_window: 60`, max_failures
    3): one more than the old budget over a job's life, never more than one
    in a window; the job must go on to its end, and train on between
    losses: each next loss comes after the restarted group finalized a
    save past the checkpoint it restored, as in a days-long run."""
    soak.configure(failure_window=60)
    try:
        r.facts["target_steps"] = 300
        job = r.trains(Detached(soak, "--elastic", "--fresh", "--steps=300"))
        job.step_at_least(12)
        last = 0.0
        for _ in SPECS[r.scenario].targets:
            if last:
                job.wait_event(lambda e, t=last: e.get("kind") in ("workers_started", "workers_restarted")
                               and e.get("workers") == 2 and float(e["t"]) > t, "two slices again", 10)
                restore = job.wait_event(lambda e, t=last: e.get("kind") == "restore_started" and float(e["t"]) > t,
                                         "a restore", 10)
                job.wait_event(lambda e, t=last, s=int(restore.get("step") or 0):
                               e.get("kind") == "checkpoint_finalized" and e.get("finalized") is True
                               and float(e["t"]) > t and int(e.get("step") or 0) > s, "a save past the restore", 10)
                time.sleep(max(0.0, last + 65 - time.time()))
            chaos_done(chaos_kill(soak, 5, "peer"), "chaos.delete-worker")
            lost = [e for e in job.events() if e.get("kind") == "worker_lost" and e.get("by") == "chaos"]
            last = max(float(e["t"]) for e in lost) if lost else time.time()
        job.end()
        r.facts["followers"] = job.seen
    finally:
        soak.configure()
    return job


SCENARIOS: dict[str, Callable[[Soak, Result], Train | Detached]] = {
    "back-never": lost_and_back(0, 100),
    "back-5s": lost_and_back(5, 80),
    "back-20s": lost_and_back(20, 100),
    "back-60s": lost_and_back(60, 240),
    "in-compile": in_compile,
    "in-save": in_save,
    "two-lost": two_lost,
    "hung-resumed": hung_resumed,
    "hang-stop": hang_stop,
    "hang-never": hang_never,
    "sick-back": sick_back,
    "sick-start": sick_start,
    "many-lost": many_lost,
    "notice": noticed,
    "notice-short": notice_short,
    "maintenance": maintenance,
}


# The scenarios that no `invoke` follows (the watch in the cluster acts):
# `--write` of these alone writes their table into docs/quarantine.md.
WATCHED = tuple(n for n in SCENARIOS if SPECS[n].detached)


# -- checks -------------------------------------------------------------------------
# A run whose fault did not happen as described is run again, at most this
# many times in all; then it counts as "not exercised": a failure.
ATTEMPTS = 3


def goodput_of(soak: Soak) -> tuple[dict, str]:
    """`invoke goodput --json` of the run's timeline ({} and why when it fails)."""
    rc, out = soak.invoke("goodput", "--json", f"--run={RUN}", timeout=300)
    try:
        return (json.loads(out.strip().splitlines()[-1]) if rc == 0 else {}), out.strip()[-200:]
    except (json.JSONDecodeError, IndexError):
        return {}, out.strip()[-200:]


def commit_time(commit: str) -> float:
    """A commit's time (git's committer date), 0 where git does not know it
    (a stamp's "abc1234 + changes" is its commit)."""
    name = commit.split()[0] if commit.split() else ""
    try:
        out = subprocess.run(["git", "show", "-s", "--format=%ct", name, "--"], cwd=ROOT, capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return 0.0
    first = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""
    return float(first) if first.isdigit() else 0.0


def latest_recovery() -> soak_checks.Recovery | None:
    """The newest soak table's median time to recover in the pages of docs/
    (the bound of a hang's time to its first step: soak_checks.latest_recovery)."""
    pages = {p.name: p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))}
    return soak_checks.latest_recovery(pages, commit_time)


def judge(r: Result, events: list[dict]) -> None:
    """The run's verdict (soak_checks.py) from its facts, report and events."""
    v = soak_checks.verdict(r.scenario, r.facts, r.goodput, events, latest_recovery())
    r.not_exercised = v.exercised
    r.why += v.failures()
    r.notes += v.not_applied()
    # The measure issue 36 asks for, on every run that has it: the hang to the first step after the restart.
    r.notes += [c.text() for c in v.checks if c.ok and c.name.startswith("hang to the first step")]
    r.ok = not r.why


def check(r: Result, job: Train, soak: Soak) -> None:
    r.outcome = job.outcome()
    r.facts.update(rc=job.rc, outcome=r.outcome, t_after=job.t_end)
    r.goodput, why = goodput_of(soak)
    if not r.goodput:
        r.why.append(f"invoke goodput failed: {why}")
    judge(r, soak.events())


def keep(r: Result) -> None:
    """The run's timeline and the soak's facts, kept past the next
    scenario's --fresh: .state/soak/kept/<rep>-<scenario>.jsonl and .json
    (``--rescore`` judges them again)."""
    src = STATE / "training" / RUN / "events.jsonl"
    (STATE / "kept").mkdir(parents=True, exist_ok=True)
    if src.is_file():
        shutil.copy(src, STATE / "kept" / f"{r.rep}-{r.scenario}.jsonl")
    (STATE / "kept" / f"{r.rep}-{r.scenario}.json").write_text(json.dumps(
        {"scenario": r.scenario, "rep": r.rep, "facts": r.facts, "notes": r.notes, "attempts": r.attempts,
         "harness": [w for w in r.why if not w.startswith("not exercised") and ": FAILED" not in w],
         "seconds": r.seconds}, default=str))


def attempt(soak: Soak, name: str, rep: int) -> Result:
    r = Result(name, rep)
    start = time.monotonic()
    rc, out = soak.invoke("up", timeout=600)
    if rc != 0:
        r.why.append(f"`invoke up` failed: {out.strip().splitlines()[-1:]}")
        return r
    job = None
    try:
        job = SCENARIOS[name](soak, r)
        check(r, job, soak)
    except NotExercised as e:
        r.not_exercised.append(str(e))
        r.why.append(f"not exercised: {e}")
        r.outcome = job.outcome() if job else ""
    except (Failed, subprocess.TimeoutExpired) as e:
        r.why.append(str(e))
        r.outcome = job.outcome() if job else ""
    finally:
        if job is not None:
            job.stop()
        if left := soak.stop_jobs():
            r.notes.append(f"stopped job(s) left running: {', '.join(left)}")
    r.seconds = time.monotonic() - start
    return r


def one(soak: Soak, name: str, rep: int) -> Result:
    """A scenario's run, again while its fault did not happen as described
    (at most ATTEMPTS in all); the last attempt's result, with why the
    others were run again."""
    earlier: list[str] = []
    for n in range(1, ATTEMPTS + 1):
        r = attempt(soak, name, rep)
        r.attempts = earlier
        keep(r)
        if not r.not_exercised:
            break
        earlier = [*earlier, f"attempt {n}: {'; '.join(r.not_exercised)}"]
        if n < ATTEMPTS:
            print(f"  not exercised ({'; '.join(r.not_exercised)}): again", flush=True)
    return r


def rescored(soak: Soak, f: Path) -> Result:
    """One kept run judged again (its timeline put back where `invoke
    goodput` reads it)."""
    kept = json.loads(f.read_text())
    r = Result(kept["scenario"], kept["rep"], facts=kept["facts"], seconds=kept.get("seconds", 0.0),
               attempts=kept.get("attempts", []))
    r.outcome = str(r.facts.get("outcome", ""))
    r.why += kept.get("harness", [])
    r.notes += [n for n in kept.get("notes", []) if ": n/a" not in n]
    timeline = f.with_suffix(".jsonl")
    dest = STATE / "training" / RUN / "events.jsonl"
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(timeline, dest) if timeline.is_file() else dest.unlink(missing_ok=True)
    r.goodput, why = goodput_of(soak)
    if not r.goodput:
        r.why.append(f"invoke goodput failed: {why}")
    judge(r, soak.events())
    return r


def kept_runs(folder: Path) -> list[Path]:
    return sorted(folder.glob("*-*.json"), key=lambda f: (int(f.stem.split("-", 1)[0]),
                                                          list(SCENARIOS).index(f.stem.split("-", 1)[1])))


def rescore() -> tuple[list[Result], list[dict]]:
    """The kept runs judged again, with this tree's goodput and checks: the
    soak's (.state/soak/kept), each scenario of a later soak kept beside it
    (.state/soak/kept-<name>: a scenario run again after a fix) in place of
    the first soak's runs of it, which the table still names. Returns the
    results and the later soaks' records."""
    soak = Soak(Path(tempfile.mkdtemp(prefix="soak-")))
    out = {(r.rep, r.scenario): r for r in (rescored(soak, f) for f in kept_runs(STATE / "kept"))}
    later = []
    for folder in sorted(p for p in STATE.glob("kept-*") if (p / "soak.json").is_file()):
        meta = json.loads((folder / "soak.json").read_text())
        later.append(meta)
        for f in kept_runs(folder):
            r = rescored(soak, f)
            first = out.get((r.rep, r.scenario))
            if first is not None:
                verdict = "passed" if first.ok else "FAILED: " + "; ".join(first.why)
                r.notes.append(f"run again by `{meta['command']}` at commit `{meta['commit']}`; the first soak's "
                               f"run: {verdict}")
            out[(r.rep, r.scenario)] = r
    return [out[k] for k in sorted(out, key=lambda k: (k[0], list(SCENARIOS).index(k[1])))], later


# -- the table --------------------------------------------------------------------
def incident_text(i: dict) -> str:
    lost = i["lost_at_step"] if i["lost_at_step"] is not None else "-"
    k = i["restored_from_step"] if i["restored_from_step"] is not None else "-"
    rec = (f"{i['recover_s']:.1f} s" if i["recover_s"] is not None else
           f"{i['ended']}, resumed by the next job" if i.get("resumed_s") is not None else "not recovered")
    return f"{i['kind']}: lost {lost}, restored {k}, replayed {i['replayed_steps']}, {rec}"


def table(results: list[Result]) -> list[str]:
    out = ["| rep | scenario | outcome | goodput (ours / library) | incidents (lost at, restored from, replayed, "
           "time to recover) |", "| --- | --- | --- | --- | --- |"]
    for r in results:
        g = r.goodput
        lib = (g.get("library") or {}).get("goodput_pct")
        gp = f"{g['goodput_pct']:.1f}% / {lib:.1f}%" if g and lib is not None else (
            f"{g['goodput_pct']:.1f}% / n/a" if g else "n/a")
        incidents = "; ".join(incident_text(i) for i in g.get("incidents", [])) if g else ""
        again = [f"run again ({a})" for a in r.attempts]
        said = list(dict.fromkeys(again + r.notes))  # a run judged again keeps its notes: each said once
        notes = ("; " + "; ".join(said)) if said else ""
        verdict = ("passed" if r.ok else f"NOT EXERCISED in {len(r.attempts) + 1} attempts: " + "; ".join(
            r.not_exercised) if r.not_exercised else "FAILED: " + "; ".join(r.why))
        out.append(f"| {r.rep} | {r.scenario} | {verdict} | {gp} | {incidents}{notes} |")
    return out


def recovery(results: list[Result]) -> str:
    times = sorted(i["recover_s"] for r in results for i in (r.goodput or {}).get("incidents", [])
                   if i["kind"] in LOSSES and i["recover_s"] is not None)
    if not times:
        return "time to recover: no lost host recovered"
    p90 = times[min(len(times) - 1, int(0.9 * len(times)))]
    return (f"time to recover from a lost host (the loss to the first step after it), {len(times)} incidents: "
            f"median {statistics.median(times):.1f} s, p90 {p90:.1f} s, range {times[0]:.1f}-{times[-1]:.1f} s")


# What a restart after a lost host is made of, each part from one event of
# the run's timeline to the next: Ray Train's failure, the retry's cluster
# view, the new group's first worker, MaxText's model check (its import and
# config), the restore, the first step.
PARTS = (("failure seen", "failure"), ("cluster view", "cluster_view"), ("new worker group", "worker_started"),
         ("MaxText import and config", "model_check"), ("restore", "restored"), ("compile (cache) and first step",
                                                                                  "step"))
SIMPLE = ("back-never", "back-20s", "back-60s")  # a host lost while training, nothing else before the first step


def restart_parts(kept: Path) -> list[str]:
    """The median of each part of a restart over the kept timelines of the
    scenarios whose restart nothing else interrupts (``SIMPLE``)."""
    got: dict[str, list[float]] = {name: [] for name, _ in PARTS}
    totals: list[float] = []
    for f in sorted(kept.glob("*.jsonl")):
        if f.stem.split("-", 1)[1] not in SIMPLE:
            continue
        evs = sorted((e for e in (json.loads(x) for x in f.read_text().splitlines() if x.strip())
                      if isinstance(e, dict) and isinstance(e.get("t"), (int, float))), key=lambda e: e["t"])
        lost = next((e for e in evs if e.get("kind") == "worker_lost" and e.get("by") == "chaos"), None)
        if lost is None:
            continue
        t, times = lost["t"], []
        for _, kind in PARTS:
            nxt = next((e["t"] for e in evs if e.get("kind") == kind and e["t"] >= t - 2), None)
            if nxt is None:
                break
            times.append(max(0.0, nxt - t))
            t = max(t, nxt)
        if len(times) == len(PARTS):
            for (name, _), x in zip(PARTS, times):
                got[name].append(x)
            totals.append(sum(times))
    if not totals:
        return ["no restart of a simple loss in the kept timelines"]
    rows = [f"| {name} | {statistics.median(xs):.1f} s |" for name, xs in got.items()]
    return [f"What a restart after a lost host is made of ({len(totals)} restarts of {', '.join(SIMPLE)}: the median "
            f"of each part; the total's median {statistics.median(totals):.1f} s):", "",
            "| part (from the one before) | median |", "| --- | --- |", *rows]


# The README's summary: one row per scenario, read from the soak's table in
# docs/elastic.md (the record: a summary of a soak that ran before this
# script could summarise is the same numbers).
INCIDENT = re.compile(r"(\w+): lost ([\d-]+), restored ([\d-]+), replayed (\d+), "
                      r"(?:([\d.]+) s|[^;|]*?resumed by the next job)")


def summary(block: str) -> list[str]:
    """Per scenario: its runs passed, its goodput's range, the steps replayed
    at a loss and at a grow, the median time to recover from a lost host;
    headed by the soak's own line and date."""
    stamp = re.search(r"Written by `([^`]+)`.*? on (\d{4}-\d{2}-\d{2})", block)
    if stamp is None:
        raise SystemExit("docs/elastic.md: the soak's table has no 'Written by' line: run bench/soak.py --write")
    rows: dict[str, dict[str, list]] = {}
    for line in block.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or not cells[0].isdigit():
            continue
        r = rows.setdefault(cells[1], {"ok": [], "goodput": [], "lost": [], "grow": [], "recover": []})
        r["ok"].append(cells[2] == "passed")
        if m := re.match(r"([\d.]+)%", cells[3]):
            r["goodput"].append(float(m.group(1)))
        for kind, _, _, replayed, secs in INCIDENT.findall(cells[4]):
            r["grow" if kind == "resize" else "lost"].append(int(replayed))
            if kind in LOSSES and secs:
                r["recover"].append(float(secs))
    head = next((ln for ln in block.splitlines() if " runs passed in " in ln), "")
    out = [f"`{stamp.group(1)}`, {stamp.group(2)}: {head} Each scenario, over its runs "
           "([every run, every incident](docs/elastic.md#the-soaks-table)):", "",
           "| scenario | passed | goodput | steps replayed at a loss | at a grow | time to recover (median) |",
           "| --- | --- | --- | --- | --- | --- |"]
    for name, r in rows.items():
        gp = f"{min(r['goodput']):.0f}-{max(r['goodput']):.0f} %" if r["goodput"] else "n/a"
        rec = f"{statistics.median(r['recover']):.1f} s" if r["recover"] else "-"
        out.append(f"| {name} | {sum(r['ok'])} of {len(r['ok'])} | {gp} | {', '.join(map(str, r['lost'])) or '-'} "
                   f"| {', '.join(map(str, r['grow'])) or '-'} | {rec} |")
    return out + ["", *(ln for ln in block.splitlines() if ln.startswith("time to recover"))]


def write_summary() -> None:
    begin, end = doc_table.markers("soak")
    text = (ROOT / "docs" / "elastic.md").read_text()
    block = text.split(begin, 1)[1].split(end, 1)[0] if begin in text and end in text else ""
    doc_table.write("../README.md", "soak-summary", "bench/soak.py --summary", summary(block),
                    stamp="Summarised by `bench/soak.py --summary` from the soak's table in docs/elastic.md.")


def judged_again(write: bool) -> None:
    """--rescore: the kept runs' table again, from this tree's judgement."""
    meta_file = STATE / "kept" / "soak.json"
    if not meta_file.is_file():
        raise SystemExit(f"{meta_file.relative_to(ROOT)}: no soak kept here: run bench/soak.py first")
    meta = json.loads(meta_file.read_text())
    results, later = rescore()
    passed = sum(r.ok for r in results)
    minutes = meta["minutes"] + sum(m["minutes"] for m in later)
    head = f"{passed} of {len(results)} runs passed in {minutes} min (judged again by this tree)."
    m = re.search(r"--repeat (\d+)", meta["command"])
    names = list(meta.get("scenarios") or SCENARIOS)
    reps = int(m.group(1)) if m else 1
    planned = reps * len(names)
    if len(results) < planned:
        done = {(r.rep, r.scenario) for r in results}
        missing = [f"{rep}-{name}" for rep in range(1, reps + 1) for name in names if (rep, name) not in done]
        head += f" Not run: {len(missing)} of the {planned} planned ({', '.join(missing)})."
    lines = [head, "", *table(results), "", recovery(results)]
    print("\n".join(lines))
    also = "".join(f"; with the runs of `{m['command']}` (on {m['date']} at commit `{m['commit']}`, {m['minutes']} "
                   f"min)" for m in later)
    stamp = (f"Written by `{meta['command']}` (run on {meta['date']} at commit `{meta['commit']}`, {meta['machine']}, "
             f"{meta['minutes']} min){also}, judged again by `bench/soak.py --rescore`")
    if write:
        write_tables("", names, "bench/soak.py --rescore", lines, stamp=stamp, kept_by=meta["command"])


def hog() -> subprocess.Popen:
    """A CPU hog on one core (the first this process may use)."""
    core = min(os.sched_getaffinity(0))
    return subprocess.Popen([sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{core}}})\n"
                                                   "while True:\n    pass\n"])


def interrupted(signum, frame) -> None:
    raise KeyboardInterrupt


def rewrite(parts: bool, write: bool) -> None:
    """No soak: the README's summary again, or a restart's parts from the
    timelines the last soak kept (printed; with ``write``, its table)."""
    if not parts:
        write_summary()
        return
    lines = restart_parts(STATE / "kept")
    print("\n".join(lines))
    if write:
        doc_table.write("elastic.md", "restart-parts", "bench/soak.py --parts (the timelines of the soak above)", lines)


def matrix(names: list[str], repeat: int, load: bool, first: int = 1) -> tuple[list[Result], bool]:
    """Every scenario, ``repeat`` times: the results, and whether a Ctrl-C
    or SIGTERM stopped it (the runs that ended are still a table)."""
    tmp = Path(tempfile.mkdtemp(prefix="soak-"))
    soak = Soak(tmp)
    shutil.rmtree(STATE, ignore_errors=True)  # each run's timeline is kept in .state/soak/kept/
    hogging = hog() if load else None
    results: list[Result] = []
    stopped = False
    try:
        for rep in range(first, repeat + 1):
            for name in names:
                print(f"[{rep}/{repeat}] {name} ...", flush=True)
                r = one(soak, name, rep)
                results.append(r)
                print(f"  {'passed' if r.ok else 'FAILED'} in {r.seconds:.0f} s: " + "; ".join(
                    [incident_text(i) for i in (r.goodput or {}).get("incidents", [])] + r.notes + r.why), flush=True)
    except KeyboardInterrupt:
        stopped = True
    finally:
        if hogging is not None:
            hogging.kill()
        subprocess.run([INVOKE, "teardown", "--yes"], cwd=ROOT, env=soak.env, capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    return results, stopped


def write_tables(table: str, names: list[str], command: str, lines: list[str], stamp: str | None = None,
                 kept_by: str | None = None) -> None:
    """The soak's table where it belongs: between ``table``'s markers
    (PAGE:NAME) when given; the watch in the cluster's scenarios alone in
    docs/quarantine.md (issue 36); else elastic.md's soak, its restart
    parts (of the timelines ``kept_by`` that command, by default this one)
    and the README's summary."""
    if table:
        page, _, marker = table.partition(":")
        doc_table.write(page, marker, command, lines, stamp=stamp)
    elif set(names) <= set(WATCHED):
        doc_table.write("quarantine.md", "watch-soak", command, lines, stamp=stamp)
    else:
        doc_table.write("elastic.md", "soak", command, lines, stamp=stamp)
        doc_table.write("elastic.md", "restart-parts", f"{kept_by or command} (its kept timelines)",
                        restart_parts(STATE / "kept"))
        write_summary()


def main() -> None:
    # A SIGTERM (a CI timeout, `kill`) ends the soak as Ctrl-C does: its
    # cluster torn down, the hog stopped.
    signal.signal(signal.SIGTERM, interrupted)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=1, help="how many times the whole matrix runs")
    ap.add_argument("--first-rep", type=int, default=1,
                    help="start at this repetition (the rest of a soak that stopped: its runs kept beside the first's "
                         "in .state/soak/kept-<name>, `--rescore` joins them)")
    ap.add_argument("--load", action="store_true", help="a CPU hog on one core meanwhile")
    ap.add_argument("--only", default="", help=f"some scenarios, comma-separated (of {', '.join(SCENARIOS)})")
    ap.add_argument("--write", action="store_true", help="write the table, dated, into docs/elastic.md")
    ap.add_argument("--table", default="",
                    help="with --write: write the table between these markers instead, PAGE:NAME (docs/PAGE, "
                         "<!-- bench:NAME -->), e.g. a matrix run again beside the one elastic.md keeps")
    ap.add_argument("--parts", action="store_true",
                    help="only the parts of a restart, from the timelines the last soak kept (with --write: its table)")
    ap.add_argument("--summary", action="store_true",
                    help="only the README's summary, from the soak's table in docs/elastic.md")
    ap.add_argument("--rescore", action="store_true",
                    help="no soak: the last soak's kept runs judged again with this tree's goodput and checks "
                         "(with --write: its table)")
    a = ap.parse_args()
    if a.table and (":" not in a.table or not a.write):
        sys.exit("--table takes PAGE:NAME (a page of docs/ and its bench:NAME markers), with --write")
    if a.summary or a.parts:
        rewrite(a.parts, a.write)
        return
    if a.rescore:
        judged_again(a.write)
        return
    names = [n for n in a.only.split(",") if n] or list(SCENARIOS)
    if bad := [n for n in names if n not in SCENARIOS]:
        sys.exit(f"--only: no scenario {', '.join(bad)} (scenarios: {', '.join(SCENARIOS)})")
    if a.repeat < 1:
        sys.exit("--repeat must be at least 1")
    started = datetime.datetime.now()
    if not 1 <= a.first_rep <= a.repeat:
        sys.exit("--first-rep must be between 1 and --repeat")
    results, stopped = matrix(names, a.repeat, a.load, a.first_rep)
    passed = sum(r.ok for r in results)
    took = (datetime.datetime.now() - started).total_seconds() / 60
    command = (f"bench/soak.py --repeat {a.repeat}{' --load' if a.load else ''}{' --only ' + a.only if a.only else ''}"
               + (f" --first-rep {a.first_rep}" if a.first_rep > 1 else ""))
    planned = (a.repeat - a.first_rep + 1) * len(names)
    head = f"{passed} of {len(results)} runs passed in {took:.0f} min."
    if stopped:
        head += f" Interrupted: {len(results)} of the {planned} runs planned ended before the stop."
    lines = [head, "", *table(results), "", recovery(results)]
    print("\n" + "\n".join(lines))
    (STATE / "kept").mkdir(parents=True, exist_ok=True)
    (STATE / "kept" / "soak.json").write_text(json.dumps(
        {"command": command, "scenarios": names, "date": started.date().isoformat(), "commit": doc_table.commit(),
         "machine": doc_table.machine(), "minutes": round(took), "head": head}))
    if a.write:
        write_tables(a.table, names, command, lines)
    sys.exit(130 if stopped else 0 if passed == len(results) else 1)


if __name__ == "__main__":
    main()
