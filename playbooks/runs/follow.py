"""Following a job (``invoke train``, ``invoke logs --follow``): what its log
lines become (the summary, the run's log file, the lines shown, the run's
timeline), and the watch beside it while it runs: a stall said in one line
(and, with ``stall_action: stop``, the job stopped; with ``restart``, the
host the hang diagnosis names set aside: ``runs/restart.py``), a health
gate's failed hosts, on GKE the worker pods (scheduled, lost and why), and
what the chaos tasks recorded."""
from __future__ import annotations

import contextlib
import threading
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from playbooks.access import connectors
from playbooks.access.ray_api import ACTIVE, SUBMIT_TAILS, job_fact, job_logs_command
from playbooks.cloud import kube_objects
from playbooks.cloud import pods as P
from playbooks.cloud.endpoints import forward_command, forward_pidfile
from playbooks.config import paths
from playbooks.config.schema import Environment
from playbooks.core.command import Command
from playbooks.core.errors import PlaybookError, ProbeFailed
from playbooks.core.facts import Completed
from playbooks.core.play import StepContext, run_within
from playbooks.core.recap import FAILING
from playbooks.runs import (
    cluster_watch,
    hang_evidence,
    maintenance_watch,
    pod_watch,
    quarantine_record,
    restart,
    stall,
    timeline,
)
from playbooks.runs import events as E
from playbooks.runs.cli_traceback import TracebackHold
from playbooks.runs.hang_diagnosis import Diagnosis
from playbooks.runs.job_log import clean, shown
from playbooks.runs.train_summary import Summary
from playbooks.runs.watch_records import Importer


def stop_command(address: str, sid: str) -> Command:
    """`ray job stop`: the job ends, its run resumes from its checkpoint on
    the next `invoke train`."""
    return Command(("ray", "job", "stop", "--address", address, sid))


def sets_aside(env: Environment, q: restart.Quarantine | None) -> bool:
    """Whether this follow sets hosts aside by itself (``stall_action:
    restart``, an elastic job, hosts that can be)."""
    return env.stall_action == "restart" and q is not None and q.elastic and not q.refused


def watch_note(env: Environment, address: str, sid: str, run: str, q: restart.Quarantine | None = None,
               viewer: bool = False) -> str:
    """What the watch does while the job runs, said before it starts."""
    if viewer:
        return (f"watch: in the cluster, Ray job {cluster_watch.watch_id(sid)} (`invoke watch`, stall_watch: "
                f"cluster), acts on stalls (stall_action: {env.stall_action}) and health gates and writes the run's "
                f"timeline ({paths.shown(timeline.path(env, run))}); this follow shows what it records, and the job "
                f"goes on watched if this follow ends")
    after = (f"{env.stall_after} s (stall_after; looked for every {stall.look_every(1e9, env.stall_after):g} s or "
             f"heartbeat, whichever is sooner)" if env.stall_after else
             f"the larger of {stall.P90_FACTOR:g} x the run's p90 step time and {stall.DEFAULT_FLOOR / 60:g} min")
    stop = f"`{stop_command(address, sid).line()}`"
    if env.stall_action == "restart" and sets_aside(env, q):
        act = (f"the host(s) the hang diagnosis names quarantined as `invoke hosts.quarantine NAME` does (the "
               f"elastic job goes on on the slices left; its steps below), else stopped: {stop}; a host the health "
               f"gate fails, quarantined too")
    elif env.stall_action == "restart":
        why = (q.refused if q is not None and q.refused else "the job is not elastic" if q is not None else
               "this follow sets no host aside: `invoke train` does")
        act = f"stopped: {stop}, the host the hang diagnosis names said ({why})"
    else:
        act = f"stopped: {stop}" if env.stall_action == "stop" else "reported"
    pods = (f"; the worker pods looked at every {'look' if env.stall_after else 'heartbeat'} "
            f"(`{P.list_command(env).line()}`, and the events)"
            if env.platform.cloud else "")
    return (f"watch: no new step for {after} is a stall (before a worker group's first step, its compile is allowed "
            f"for too), {act}{pods}; the run's timeline: {paths.shown(timeline.path(env, run))}")


@dataclass
class Followed:
    """What a follow came to: the command's result (None when not acting:
    nothing ran), the Jobs API's last word on the job, and the follower
    (its summary, whether the watch stopped the job)."""

    done: Completed | None
    final: Any
    follower: Follower
    lost: str | None = None  # the job was not seen to end: why, and how to follow it again


def follow(ctx: StepContext, env: Environment, sid: str, address: str, via: Any,
           stream: Callable[[Follower], Completed | None], *, run: str, job: Any = None, log_file: Path | None = None,
           show_all: bool = False, source: str = "train", heartbeat: Callable[[Follower], str] | None = None,
           interrupted: str = "", quarantine: restart.Quarantine | None = None, viewer: bool = False) -> Followed:
    """Follow job ``sid`` to its end, the one way both ``train`` and ``logs
    --follow`` do: the follower (its lines, summary, log file, timeline), the
    watch note, a running job's submission time, the heartbeat (``heartbeat``
    says the job's state) and the watch beside ``stream`` (which runs the
    command that streams the log into the follower), then the Jobs API's
    final word and the job's end in the timeline. ``interrupted``: said on
    Ctrl-C (the job goes on). ``quarantine``: how hosts are set aside
    (``stall_action: restart``; its steps shown, not run, when not acting).
    ``viewer``: the watch in the cluster acts and writes the timeline
    (``runs/cluster_watch.py``); this follow writes nothing of the run's and
    shows what the watch records."""
    f = Follower(ctx, env, run, sid, log_file, show_all=show_all, source=source, job=job, quarantine=quarantine,
                 viewer=viewer)
    ctx.note(watch_note(env, address, sid, run, quarantine, viewer))
    if not ctx.acting and quarantine is not None and sets_aside(env, quarantine):
        first = next(iter(quarantine.hosts))
        ctx.note(f"watch{' in the cluster' if viewer else ''}: a host set aside by {restart.BY_STALL}, e.g. "
                 f"{first}:")
        run_within(ctx, quarantine.steps(first, "(the hang diagnosis's line)", restart.BY_STALL))
    lost: str | None = None
    if job is not None:
        f.started(job)
    records = None
    if viewer and ctx.acting:
        unwatched(ctx, address, sid, run, via)
        if env.platform.cloud:  # the watch runs in the head pod: its records come back through its log
            records = WatchLog(ctx, env, run, sid, address, via).start()
    try:
        if ctx.acting:
            beating = ctx.beating(f"job {sid}", lambda: heartbeat(f)) if heartbeat else contextlib.nullcontext()
            with beating as f.beat, Watch(f, address, via, stall.look_every(ctx.heartbeat, env.stall_after)):
                done = stream(f)
                f.stream_ended(done)
                # On GKE, every end of the stream while the job runs (a drop, a
                # clean close); locally (no link to make again), a clean close.
                if env.platform.cloud or (done is not None and done.ok):
                    done, lost = Relink(ctx, env, f, address, via).until_end(done)
        else:
            done = stream(f)
    except KeyboardInterrupt:
        if interrupted:
            ctx.echo(interrupted)
        raise
    finally:
        f.close()
    if done is None:
        return Followed(None, None, f)
    if lost:
        return Followed(done, None, f, lost)
    final = ctx.look(job_fact(address, sid, via), fresh=True)
    if viewer and ctx.acting:
        last_of_watch(ctx, f, address, via, records)
    f.ended(final)
    return Followed(done, final, f)


# How long a viewer waits, once the job ended, for the watch in the cluster
# to end too (it writes the job's end, and its last action, then ends).
WATCH_END_WAIT = 30.0


def unwatched(ctx: StepContext, address: str, sid: str, run: str, via: Any) -> None:
    """A viewer's job that no watch follows (one submitted before, or a
    watch that failed): said, with how to watch it."""
    w = ctx.peek(job_fact(address, cluster_watch.watch_id(sid), via))
    if not (isinstance(w, dict) and w.get("status") in ACTIVE):
        state = w.get("status") if isinstance(w, dict) else "not there"
        ctx.echo(f"watch: job {sid}'s watch {cluster_watch.watch_id(sid)} is {state}: nothing acts on a stall; "
                 f"`invoke watch --run {run} --job {sid}` watches it")


class WatchLog:
    """A viewer's copy of what the watch in a GKE head pod records: its Ray
    job's log followed in a thread, each event taken back into this
    machine's timeline (``runs/watch_records.py``), where the viewer's look
    finds it as it finds the twin's watch's. A stream that ends while the
    watch runs (a port-forward that dropped) is followed again: an event
    read twice comes in once."""

    AGAIN_AFTER = 2.0

    def __init__(self, ctx: StepContext, env: Environment, run: str, sid: str, address: str, via: Any):
        self.ctx, self.address, self.via = ctx, address, via
        self.watch = cluster_watch.watch_id(sid)
        self.importer = Importer(env, (run,))
        self.thread = threading.Thread(target=self._run, daemon=True, name="watch-log")

    def start(self) -> WatchLog:
        self.thread.start()
        return self

    def _run(self) -> None:
        while True:
            try:
                self.ctx.stream(job_logs_command(self.address, self.watch, True), self.importer.line)
            except Exception as e:  # never in the way of the follow
                self.ctx.note(f"watch's log: {type(e).__name__}: {str(e)[:200]}")
            w = self.ctx.peek(job_fact(self.address, self.watch, self.via))
            if not (isinstance(w, dict) and w.get("status") in ACTIVE):
                return
            time.sleep(self.AGAIN_AFTER)

    def join(self, timeout: float) -> None:
        self.thread.join(timeout=max(0.0, timeout))


def last_of_watch(ctx: StepContext, f: Follower, address: str, via: Any, records: WatchLog | None = None) -> None:
    """The job ended: the watch's last records shown (it ends soon after
    its job, at most WATCH_END_WAIT seconds waited for)."""
    waited = 0.0
    while waited < WATCH_END_WAIT:
        w = ctx.peek(job_fact(address, cluster_watch.watch_id(f.sid), via))
        if not (isinstance(w, dict) and w.get("status") in ACTIVE):
            break
        ctx.sleep(1.0)
        waited += 1.0
    if records is not None:  # its log's last lines read
        records.join(WATCH_END_WAIT - waited + 5.0)
    if f.timeline is not None:
        with f.lock:
            others = f.timeline.others()
        Watch.show_to(f, others)


class Follower:
    """What a followed job's log lines become: the summary (a fold over
    their events), the run's log file, the lines shown (``show_all``: every
    line; else the ones that matter, the rest only in the file), the run's
    timeline; ``beat``: a heartbeat told of each line shown."""

    def __init__(self, ctx: StepContext, env: Environment, run: str, sid: str, log_file: Path | None = None,
                 show_all: bool = False, source: str = "train", job: Any = None,
                 quarantine: restart.Quarantine | None = None, viewer: bool = False):
        self.ctx, self.env, self.run, self.sid, self.source = ctx, env, run, sid, source
        self.viewer = viewer  # the watch in the cluster writes the timeline and acts; this one shows it
        self.quarantine = None if viewer else quarantine
        self.quarantined: list[str] = []  # hosts this follow quarantined (stall_action: restart)
        self.summary = Summary(chip=env.tpu, simulated=env.platform.simulated)
        self.show_all = show_all
        self.log_file = str(log_file) if (log_file and ctx.acting) else None  # written through the connector
        self.kept = self.log_file  # named in the job's end in the timeline: `invoke logs` shows it when Ray cannot
        self.beat: Any = None
        self.lock = threading.RLock()
        self.reader = timeline.Reader(sid)
        # ``job``: the Jobs API's listing of a job already running (None: one
        # about to be submitted).
        start = job.get("start_time") if isinstance(job, dict) else None
        since = float(start) / 1000 if isinstance(start, (int, float)) and start else None
        self.timeline = timeline.Writer(env, run, sid, since if job is not None else None,
                                        write=not viewer) if ctx.acting else None
        self.stall = StallTracker(self)
        self.heartbeats = hang_evidence.Heartbeats()  # each worker's last beat: the hang diagnosis reads them
        self.stopped = False  # by stall_action: stop (or restart, with no host to set aside)
        # Set when a health gate failed hosts: the watch looks at once, not at
        # its next beat (Ray Train's next worker group may take them again).
        self.wake = threading.Event()
        self.read = array("q")  # each line read, hashed: a log read again from its start skips them (Relink)
        # Where the job's own log begins among the lines read: a job already
        # there is followed through `ray job logs --follow` (its log from
        # the first line); a submit prints its own lines first, then
        # SUBMIT_TAILS, then the log. None: none of the log read yet.
        self.log_from: int | None = 0 if job is not None else None
        self.hold = TracebackHold(self._take)  # the streaming CLI's own dying traceback kept out

    def line(self, line: str) -> None:
        """A line of the stream (the CLI's own traceback held back)."""
        self.hold(line)

    def stream_ended(self, done: Completed | None) -> None:
        """A stream of the log ended: lines held back go on as the job's,
        unless they are the CLI's own traceback (its command failed with it
        as its last lines): said in the run's log (which has the command's
        whole output), never in the job's kept log or its timeline."""
        cli = self.hold.end(failed=done is not None and not done.ok)
        if cli:
            self.ctx.note(f"the log's stream ended with its CLI's own error (not the job's: kept out of its log): "
                          f"{cli[-1][:200]}")

    def _take(self, line: str) -> None:
        self.read.append(hash(line))
        if self.log_from is None and SUBMIT_TAILS in clean(line):
            self.log_from = len(self.read)
        with self.lock:  # the watch's thread gives the reader's held lines their time (``held``)
            events = self.heartbeats.take(self.reader.feed(line))
            for e in events:
                self.summary.add(e)
        if self.log_file:
            connectors.this_machine().append(self.log_file, (line + "\n").encode())
        if self.show_all or shown(clean(line)):
            self.ctx.echo(line)  # as Ray printed it: the reporter drops its colours off a terminal or with NO_COLOR
            if self.beat is not None:
                self.beat.touch()
        if self.timeline is not None:
            self.add(events)

    def add(self, events: list[dict]) -> list[dict]:
        """New events, into the timeline; each told to the stall tracker."""
        if self.timeline is None or not events:
            return []
        with self.lock:
            new = self.timeline.add(events)
            for e in new:
                self.stall.progress(e)
                if restart.failed_hosts(e):
                    self.wake.set()
            return new

    def held(self, now: float) -> None:
        """Ray's lines the reader holds for a bound on their time (no
        trainer event after them yet), timed once they have waited long
        enough: the watch's look."""
        with self.lock:
            events = self.reader.flush(now)
            for e in events:
                self.summary.add(e)
            self.add(events)

    def job_events(self) -> list[dict]:
        with self.lock:
            return [e for e in self.timeline.events if e.get("job") == self.sid] if self.timeline else []

    def started(self, job: Any) -> None:
        """The job's submission, at the time the Jobs API gives it (its
        ``start_time``: when Ray made the job), once."""
        start = job.get("start_time") if isinstance(job, dict) else None
        if self.timeline is None or not isinstance(start, (int, float)) or not start:
            return
        if any(e.get("kind") == E.SUBMITTED for e in self.job_events()):
            return
        self.add([timeline.event(E.SUBMITTED, self.source, t=float(start) / 1000, job=self.sid, run=self.run, n=1)])

    def ended(self, final: Any) -> None:
        if self.timeline is None:
            return
        self.started(final)
        with self.lock:
            rest = self.reader.end()
            for e in rest:
                self.summary.add(e)
            self.add(rest)
        status = final.get("status") if isinstance(final, dict) else "UNKNOWN"
        end = final.get("end_time") if isinstance(final, dict) else None
        t = float(end) / 1000 if isinstance(end, (int, float)) and end else None
        kept = {"log": paths.shown(self.kept)} if self.kept and self._written(self.kept) else {}
        self.add([timeline.event(E.JOB_END, self.source, self.summary.last_step, t=t, job=self.sid, status=status,
                                 n=1, **kept)])

    def close(self) -> None:
        self.hold.release()  # a traceback still held (Ctrl-C mid-stream): the job's, for all that is known
        self.log_file = None

    @staticmethod
    def _written(path: str) -> bool:
        """The driver log's file was made (a line was read)."""
        folder, _, name = path.rpartition("/")
        try:
            return any(n == name for n, _ in connectors.this_machine().list_dir(folder) or [])
        except OSError:
            return False


class StallTracker:
    """A followed job's stall, its one owner: started by the watch's look
    (a RUNNING job with no progress for the threshold: said once, with its
    cause, into the timeline; with ``stall_action: stop`` the job stopped),
    ended by the next progress the follower reads (``E.STALL_ENDS``). One
    lock, the follower's: the two threads never write a stall's two ends at
    once."""

    def __init__(self, f: Follower):
        self.f = f
        self.current: stall.Stall | None = None

    def look(self, now: float, running: Callable[[], bool], cause: Callable[[], str | None],
             stop: Callable[[], object], diagnose: Callable[[], Diagnosis | None] = lambda: None,
             on_restart: Callable[[Diagnosis | None], object] = lambda d: None) -> None:
        f = self.f
        if self.current is not None:
            return
        s = stall.check(f.job_events(), now, f.env.stall_after)
        if s is None or not running():
            return
        with f.lock:
            if self.current is not None:
                return
            self.current = s
        why = cause()
        # The stall and its cause in one write: the job's own lines, streamed
        # at the same time, never come between them.
        f.ctx.echo(s.line() + (f"\n  why: {why}" if why else ""))
        f.add([timeline.event(E.STALL_STARTED, f.source, s.last_step, t=s.now, job=f.sid, since=s.since,
                              p90=s.p90, limit=s.limit, line=s.line(), **({"cause": why} if why else {}))])
        found = diagnose()  # the hang named by its evidence, before any stop ends the workers
        if f.beat is not None:
            f.beat.touch()
        if f.env.stall_action == "stop":
            stop()
            f.stopped = True
            f.add([timeline.event(E.STOPPED, f.source, s.last_step, job=f.sid, by="stall_action: stop")])
            f.ctx.echo(f"stall_action: stop: job {f.sid} stopped; `invoke train` resumes run {f.run} from its "
                       f"last checkpoint")
        elif f.env.stall_action == "restart":
            on_restart(found)

    def progress(self, e: dict) -> None:
        """An event the follower added (under its lock): progress ends the stall."""
        f = self.f
        if self.current is None or e.get("kind") not in E.STALL_ENDS:
            return
        s, self.current = self.current, None
        took = float(e["t"]) - s.since
        f.timeline.add([timeline.event(E.STALL_ENDED, f.source, e.get("step"), job=f.sid,  # type: ignore[union-attr]
                                       since=s.since, seconds=round(took, 3), by=e["kind"])])
        what = f"step {e.get('step')}" if e["kind"] in E.STEPS else e["kind"].replace("_", " ")
        f.ctx.echo(f"stall ended: {what} after {stall.duration(took)} without a step")


class Watch:
    """Beside a followed job, every ``interval`` seconds: what others
    appended to the run's timeline (a chaos task), the worker pods on GKE,
    and the stall tracker's look."""

    def __init__(self, f: Follower, address: str, via: Any, interval: float,
                 clock: Callable[[], float] = time.time):
        self.f, self.address, self.via, self.interval, self.clock = f, address, via, interval, clock
        self.env = f.env
        self._stop = threading.Event()
        self._pods: dict[str, dict] | None = None
        self._pools = pod_watch.NodePools(lambda node: kube_objects.node(self.env, node),
                                          lambda why: self.f.ctx.note(f"watch: {why}"))
        self._gates: set[tuple] = set()  # the health gates' failures acted on (their times and ranks)
        self._noticed: set[tuple[str, float]] | None = None  # the maintenance notices given (host, time)
        self._to_start: dict[str, float] = {}  # host -> when its notice was given: its maintenance to start
        self._coming_t = 0.0
        self._renewed: float | None = None  # when the maintenance hold was last looked at
        self._aside: set[str] = set()  # the hosts this watch set aside for their maintenance (GKE)
        self.thread = threading.Thread(target=self._run, daemon=True, name="job-watch")

    def __enter__(self) -> Watch:
        if self.f.timeline is not None:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.f.wake.set()
        if self.thread.is_alive():
            self.thread.join(timeout=self.interval + 30)

    def _run(self) -> None:
        # At a fixed rate: a look that takes a while does not push the next
        # one back; a failed health gate read wakes it at once.
        beat = time.monotonic()
        while True:
            beat += self.interval
            if self.f.wake.wait(max(0.0, beat - time.monotonic())):
                self.f.wake.clear()
                beat = time.monotonic()
            if self._stop.is_set():
                return
            try:
                self.tick()
            except PlaybookError as e:  # a look that failed: said, and tried again next time
                self.f.ctx.note(f"watch: {str(e).splitlines()[0][:200]}")
            except Exception as e:  # the watch must never end the follow
                self.f.ctx.note(f"watch: {type(e).__name__}: {str(e)[:200]}")

    def status(self) -> str | None:
        j = self.f.ctx.peek(job_fact(self.address, self.f.sid, self.via))
        self.f.started(j)
        return j.get("status") if isinstance(j, dict) else None

    def tick(self) -> None:
        f = self.f
        assert f.timeline is not None
        with f.lock:
            others = f.timeline.others()
        if f.viewer:
            Watch.show_to(f, others)
            return
        f.held(self.clock())
        if self.env.platform.cloud:
            self.pods()
        if not any(e.get("kind") == E.SUBMITTED for e in f.job_events()):
            self.status()  # its start time, once the job is listed
        self.gate()
        self.maintenance()
        self.renew_hold()
        f.stall.look(self.clock(), lambda: self.status() == "RUNNING", self.cause, self.stop, self.diagnose,
                     self.restart)

    def stop(self) -> None:
        self.f.ctx.act(stop_command(self.address, self.f.sid))

    @staticmethod
    def show_to(f: Follower, events: list[dict]) -> None:
        """A viewer's look: what the watch in the cluster recorded of this
        job since the last, each said as the watch said it."""
        for e in events:
            if e.get("job") != f.sid or e.get("source") != WATCH_SOURCE:
                continue
            if (line := watch_line(e)) is not None:
                f.ctx.echo(line)
            if e.get("kind") == E.STOPPED:
                f.stopped = True
            elif e.get("kind") == E.QUARANTINED and e.get("host"):
                f.quarantined.append(str(e["host"]))

    # -- stall_action: restart, and the health gate's failures (runs/restart.py decides) --
    def gone(self) -> list[str]:
        """The hosts this follow set aside that are still set aside: one
        given back since (out of the record: `invoke hosts.release`) is a
        slice the job may take again, and set aside again if named again."""
        f = self.f
        held = f.quarantine.held if f.quarantine is not None else None
        if held is None:
            return list(f.quarantined)
        try:
            now = set(held())
        except (ProbeFailed, OSError):  # could not look: as this follow left them
            return list(f.quarantined)
        f.quarantined[:] = [h for h in f.quarantined if h in now]
        return list(f.quarantined)

    def host_of(self, name: str) -> str | None:
        """The host a worker's name maps to: on the twin the simulated host
        of that name; on GKE the node pool of the node its pod (by name or
        hostname) runs on. None: no host of the environment's."""
        q = self.f.quarantine
        if q is None:
            return None
        if self.env.platform.simulated:
            return name if name in q.hosts else None
        if self._pods is None or not _pod_named(self._pods, name):
            self.pods()
        pod = _pod_named(self._pods or {}, name)
        node = (pod.get("spec") or {}).get("nodeName") if pod else None
        pool = self._pools(node) if node else None
        return pool if pool in q.hosts else None

    def restart(self, found: Diagnosis | None) -> None:
        """A stall with ``stall_action: restart``: the culprit host(s) set
        aside (an elastic job), else the job stopped; said in one line."""
        f = self.f
        if not f.ctx.acting:
            return
        last = f.stall.current.last_step if f.stall.current is not None else None
        if f.quarantine is None:
            plan = restart.Plan((), True, f"{restart.BY_STALL}: job {f.sid} stopped: this follow sets no host aside "
                                          f"(`invoke train` does); `invoke train` resumes run {f.run} from its last "
                                          f"checkpoint")
        else:
            plan = restart.for_stall(f.quarantine, None if found is None else found.culprits, self.host_of, f.sid,
                                     f.run, gone=self.gone())
        if plan.hosts and self.set_aside(plan.hosts, found.line if found is not None else "a hang", restart.BY_STALL):
            f.ctx.echo(plan.line)
            return
        if not plan.stop:  # a host could not be set aside: the job stopped instead (said by set_aside)
            plan = restart.Plan((), True, f"{restart.BY_STALL}: job {f.sid} stopped; `invoke train` resumes run "
                                          f"{f.run} from its last checkpoint")
        self.stop()
        f.stopped = True
        f.add([timeline.event(E.STOPPED, f.source, last, job=f.sid, by=restart.BY_STALL)])
        f.ctx.echo(plan.line)

    def gate(self) -> None:
        """A health gate that failed hosts, once each: set aside for an
        elastic job with ``stall_action: restart``, else a line naming them."""
        f = self.f
        if not f.ctx.acting:
            return
        for e in f.job_events():
            bad = restart.failed_hosts(e)
            if not bad or (e["t"], e.get("rank")) in self._gates:
                continue
            self._gates.add((e["t"], e.get("rank")))
            # A host set aside already (named again by another host's event, or a later gate) is not again.
            gone = self.gone()
            names = [n for n in restart.gate_names(bad, self.env.platform.simulated)
                     if (h := self.host_of(n)) is None or h not in gone]
            if not names:
                continue
            q = f.quarantine if f.env.stall_action == "restart" else None
            plan = restart.for_gate(q, names, self.host_of, f.sid, gone=gone)
            if plan is None:
                continue
            failed = sorted({str(c) for u in bad for c in (u.get("failed") or [])})
            why = "failed its health checks" + (f": {', '.join(failed)}" if failed else "")
            if not plan.hosts or self.set_aside(plan.hosts, why, restart.BY_GATE):
                f.ctx.echo(plan.line)

    def set_aside(self, hosts: tuple[str, ...], why: str, by: str) -> bool:
        """Each host quarantined through the engine (its steps printed and
        recorded as every step's are), then in the timeline; False when one
        could not be (said)."""
        f = self.f
        q = f.quarantine
        assert q is not None
        for h in hosts:
            # The event at the quarantine's start: its node's end (the twin)
            # fails the worker group before the steps' verify has seen it.
            began = self.clock()
            failed = first_failure(run_within(f.ctx, q.steps(h, why, by)))
            if failed is not None:
                f.ctx.echo(f"{by}: host {h} could not be set aside: {failed}")
                return False
            f.quarantined.append(h)
            # On GKE, the slice's nodes as recorded: the watch in a head pod's
            # record comes back to this machine through this event (runs/watch_records.py).
            nodes = (quarantine_record.read(self.env).get(h) or {}).get("nodes") if self.env.platform.cloud else None
            f.add([timeline.event(E.QUARANTINED, f.source, f.summary.last_step, t=began, job=f.sid, host=h,
                                  slice=q.hosts.get(h), why=why, by=by, **({"nodes": nodes} if nodes else {}))])
        return True

    # -- a slice's announced end: notice, save, and (after_save) its maintenance started --
    def maintenance(self) -> None:
        """Every ``MAINTENANCE_LOOK_S`` (a quarter of the lead when that is
        sooner), at the watch's looks: each host whose maintenance (or
        flex-start end) comes within ``maintenance_lead`` given its notice
        once (runs/maintenance_watch.py); with ``maintenance_start:
        after_save``, its maintenance started once the notice's save is
        finalized."""
        f, q = self.f, self.f.quarantine
        if not f.ctx.acting or q is None or q.coming is None or q.notice is None:
            return
        now = self.clock()
        if self._noticed is None:
            self._noticed = maintenance_watch.noticed_in(f.job_events())
        self.start_maintenance(q)
        if now - self._coming_t < min(MAINTENANCE_LOOK_S, self.env.maintenance_lead / 4):
            return
        self._coming_t = now
        coming = q.coming()
        self.give_back(q, coming)
        for c in maintenance_watch.due(coming, now, self.env.maintenance_lead, self._noticed):
            self._noticed.add((c.host, c.at))
            grace = max(1.0, c.at - now)
            failed = first_failure(run_within(f.ctx, q.notice(c.host, c.at, c.why)))
            if failed is not None:
                f.ctx.echo(f"maintenance: host {c.host} could not be given its notice: {failed}")
                continue
            f.add([timeline.event(E.NOTICE_GIVEN, f.source, f.summary.last_step, t=now, job=f.sid, host=c.host,
                                  slice=q.hosts.get(c.host), grace_s=round(grace, 1), at=c.at, why=c.why,
                                  by=maintenance_watch.BY)])
            f.ctx.echo(f"maintenance: host {c.host} given its notice {grace:.0f} s before its {c.why}: the job saves "
                       f"and goes on without it")
            if self.env.maintenance_start == "after_save" and q.start is not None:
                self._to_start[c.host] = now
            if q.release is not None:
                self._aside.add(c.host)

    def give_back(self, q: Any, coming: Any) -> None:
        """Each slice this watch set aside for its maintenance, given back
        once its maintenance is no longer announced (done): its nodes
        uncordoned and untainted, KubeRay's pods land there again, the
        elastic job grows back."""
        for host in maintenance_watch.over(self._aside, coming):
            self._aside.discard(host)
            if first_failure(run_within(self.f.ctx, q.release(host))) is not None:
                self.f.ctx.echo(f"maintenance: host {host} could not be given back: `invoke hosts.release {host}`")
                continue
            self.f.ctx.echo(f"maintenance: host {host} given back: its maintenance is over")

    def renew_hold(self) -> None:
        """Every ``RENEW_EVERY_S`` while the job runs: the run's hold off
        GKE maintenance renewed when it ends within a day (a run longer
        than the hold's 7 days stays held)."""
        f, q = self.f, self.f.quarantine
        if not f.ctx.acting or q is None or q.renew is None:
            return
        now = self.clock()
        if self._renewed is None:
            self._renewed = now  # `train` has just set it
        if now - self._renewed < RENEW_EVERY_S:
            return
        self._renewed = now
        if first_failure(run_within(f.ctx, q.renew(f.run))) is not None:
            f.ctx.echo("maintenance hold: could not be renewed; `invoke train` renews it (it follows the running job)")

    def start_maintenance(self, q: Any) -> None:
        """Each host noticed with ``maintenance_start: after_save``: once a
        save is finalized after its notice, its maintenance started."""
        f = self.f
        for host, given in list(self._to_start.items()):
            step = maintenance_watch.saved_after(f.job_events(), given)
            if step is None:
                continue
            del self._to_start[host]
            if first_failure(run_within(f.ctx, q.start(host))) is not None:
                f.ctx.echo(f"maintenance: the maintenance of host {host} could not be started: it starts at its "
                           "scheduled time")
                continue
            f.add([timeline.event(E.MAINTENANCE_STARTED, f.source, step, job=f.sid, host=host,
                                  by=maintenance_watch.BY)])
            f.ctx.echo(f"maintenance: host {host}'s maintenance started after the save of step {step}")

    def diagnose(self) -> Diagnosis | None:
        """The stall's hang named (once per stall): the workers' stacks and
        heartbeats, kept under the run's folder; said and in the timeline."""
        f = self.f
        beats = f.heartbeats.since(hang_evidence.group_start(f.job_events()))
        try:
            found = hang_evidence.collect(self.env, f.run, self.address, self.via, beats, self.clock())
        except Exception as e:  # never in the way of the stall's own report and stop
            f.ctx.note(f"hang diagnosis: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
            return None
        d = found.diagnosis
        f.ctx.echo(f"  {d.line} (evidence: {found.folder})")
        f.add([timeline.event(E.HANG_DIAGNOSED, f.source, f.summary.last_step, job=f.sid, cause=d.cause,
                              culprits=list(d.culprits), line=d.line, evidence=found.folder)])
        return d

    def cause(self) -> str | None:
        """The first Kubernetes cause found (GKE), or what a chaos task did
        to a worker that is still so (the local twin)."""
        if self.env.platform.cloud:
            causes = kube_objects.causes(self.env)
            if causes:
                return causes[0]
        hung = None
        for e in self.f.job_events():
            if e.get("kind") in E.CHAOS:
                hung = e
            elif e.get("kind") == E.WORKER_RESUMED:
                hung = None
        return timeline.who(hung) if hung is not None else None

    def pods(self) -> None:
        """The worker pods now, against the last look: new ones scheduled,
        ones gone or failing, with their Kubernetes cause. The first look
        records the pods already placed, each at the time it was placed and
        of no job (the cluster's, not the job's: a follow again adds none
        twice). Each new node is read once, for its node pool."""
        pods, events = kube_objects.pods_and_events(self.env)
        now = {p["metadata"]["name"]: p for p in pods if P.is_worker(p)}
        found = pod_watch.pod_changes(self._pods or {}, now, events, self.clock(), self.env.capacity, self._pools)
        if self._pods is None:  # the cluster's placements as found, no job's (a pod gone wrong before: not lost now)
            self.f.add([e for e in found if e["kind"] == E.SCHEDULED])
        else:
            chaos = {e.get("pod") for e in self.f.job_events() if e.get("source") == "chaos"}
            self.f.add([dict(e, job=self.f.sid) for e in found
                        if not (e["kind"] == E.WORKER_LOST and e.get("pod") in chaos)])
        self._pods = now


def first_failure(done: list[tuple[Any, Any]]) -> str | None:
    """The first line of the first failed step's reason among ``run_within``'s
    results (None: none failed)."""
    failed = [o for _, o in done if o.outcome in FAILING]
    return failed[0].reason.splitlines()[0][:300] if failed else None


# How often the follow's watch looks at the run's hold off GKE maintenance
# (renewed when it ends within a day: cloud/maintenance.py).
RENEW_EVERY_S = 6 * 3600.0

# How often the watch reads the slices' announced ends (a node list on GKE;
# the watch looks every heartbeat, or a fifth of stall_after: a notice may
# come that much late, so the lead must be larger).
MAINTENANCE_LOOK_S = 30.0

# The source of the events the watch in the cluster (`invoke watch`) writes.
WATCH_SOURCE = "watch"


def watch_line(e: dict) -> str | None:
    """One of the watch's events as a line (None: not one it says)."""
    kind = e.get("kind")
    if kind == E.STALL_STARTED:
        return str(e.get("line") or "stalled") + (f"\n  why: {e['cause']}" if e.get("cause") else "")
    if kind == E.STALL_ENDED:
        by, secs = str(e.get("by") or "progress"), e.get("seconds")
        what = f"step {e.get('step')}" if by in E.STEPS else by.replace("_", " ")
        return (f"stall ended: {what}"
                + (f" after {stall.duration(float(secs))} without a step" if isinstance(secs, (int, float)) else ""))
    if kind == E.HANG_DIAGNOSED:
        return f"  {e.get('line') or 'hang diagnosed'}" + (f" (evidence: {e['evidence']})" if e.get("evidence") else "")
    if kind == E.QUARANTINED:
        return f"watch in the cluster: host {e.get('host')} quarantined by {e.get('by')}: {e.get('why')}"
    if kind == E.STOPPED:
        return f"watch in the cluster: job {e.get('job')} stopped by {e.get('by')}"
    return None


def _pod_named(pods: dict[str, dict], name: str) -> dict | None:
    """The pod a worker's name is: its pod's name, or its hostname."""
    return pods.get(name) or next((p for p in pods.values() if (p.get("spec") or {}).get("hostname") == name), None)


class Replay:
    """A followed log read again from its start (`ray job logs --follow`
    after the link dropped): the lines of the log already read (those from
    ``log_from``, where the log began among the lines read: `ray job submit`
    printed its own lines first) are skipped, matched one by one by their
    place, so none comes twice; from the first line that differs (or the
    first past them), every line goes on to the follower. Nothing of the
    log read yet: every line is new."""

    def __init__(self, f: Follower):
        start = f.log_from if f.log_from is not None else len(f.read)
        self.f, self.read = f, array("q", f.read[start:])
        self.at = 0  # where the next line should stand among the log's lines read
        self.new = False
        self.skipped = 0

    def __call__(self, line: str) -> None:
        if not self.new:
            h = hash(line)
            if self.at < len(self.read) and self.read[self.at] == h:
                self.at += 1
                self.skipped += 1
                return
            self.new = True
        self.f.line(line)


class Relink:
    """A follow that outlives its link to the Ray dashboard (on GKE, `kubectl
    port-forward`, the link users see drop most: an idle timeout, a
    restarted head pod, a laptop that slept). When the log's stream ends
    while the job is still running (dropped, or closed cleanly: the Jobs API
    says whether the job runs, never the stream's end), or the dashboard no
    longer answers, the port-forward is started again (a stale one stopped
    first) and the log followed on from where it was (``Replay``: no line
    twice, none lost, the timeline whole), said in one line. After
    ``reconnect_timeout`` seconds without reaching the job, the follow gives
    up with the job not seen to end, and how to follow it again. Locally
    (``link`` false: no port-forward) only a clean close of a running job's
    stream is followed on; a dashboard that does not answer ends the follow
    as before."""

    WAIT = 1.0  # between looks for the dashboard, while it does not answer
    TRIES = 5   # streams in a row that end early with no new line before the follow gives up

    def __init__(self, ctx: StepContext, env: Environment, f: Follower, address: str, via: Any):
        self.ctx, self.env, self.f, self.address, self.via = ctx, env, f, address, via
        self.link = env.platform.cloud
        self.timeout = float(env.reconnect_timeout) if self.link else 0.0

    def reach(self) -> tuple[bool, dict | None]:
        """Whether the dashboard answers, and the job as the Jobs API says
        it now (None: not reached, or no such job)."""
        try:
            up = isinstance(self.via.get_json(f"{self.address}/api/version", timeout=10), dict)
            j = self.via.get_json(f"{self.address}/api/jobs/{self.f.sid}", timeout=10) if up else None
        except PlaybookError:
            return False, None
        return up, j if isinstance(j, dict) else None

    def until_end(self, done: Completed | None) -> tuple[Completed | None, str | None]:
        if done is None or not self.ctx.acting:
            return done, None
        fruitless = 0  # streams in a row that ended early with no new line
        looked_again = False  # after a stream that ended cleanly, the Jobs API asked once more
        while True:
            up, j = self.reach()
            ended_ok = done is not None and done.ok
            if j is not None and j.get("status") not in ACTIVE:
                if ended_ok:
                    return done, None
                # It ended while the stream was down: the rest of its log, once.
                self.f.reader.reconnected()
                rest = self.ctx.stream(job_logs_command(self.address, self.f.sid, follow=False), Replay(self.f))
                self.f.stream_ended(rest)
                return rest, None
            if up and j is None:
                return done, None  # the dashboard has no such job: nothing to follow (the submit says why)
            if j is not None and ended_ok and not looked_again:
                # A clean end of the stream while the Jobs API says the job
                # runs: it may lag the job's end by a moment; asked again once.
                looked_again = True
                self.ctx.sleep(self.WAIT)
                continue
            if not self.link and not up:
                return done, None  # locally nothing to make again: the final look says what the job is
            if fruitless >= self.TRIES:
                return done, self.gave_up(f"{self.TRIES} streams of its log in a row ended with no new line")
            if self.relink(up) is None:
                return done, self.gave_up(f"the job could not be reached again within {self.timeout:.0f} s "
                                          f"(reconnect_timeout)" if self.link else "the job could not be reached")
            self.f.reader.reconnected()  # what comes first was written while the stream was down
            taken = len(self.f.read)
            done = self.ctx.stream(job_logs_command(self.address, self.f.sid, follow=True), Replay(self.f))
            self.f.stream_ended(done)
            fruitless = 0 if len(self.f.read) > taken else fruitless + 1
            looked_again = False

    def relink(self, up: bool) -> dict | None:
        """The link made again (the port-forward started anew unless the
        dashboard answers), until the job answers or the time is up: the
        job, or None. Said in one line."""
        line, start, restarted = len(self.f.read), self.ctx.clock(), not up and self.link
        pf = forward_pidfile(self.env)
        if restarted:
            if pf.alive():
                pf.stop()  # a port-forward that no longer forwards (its pod gone): a new one finds the new pod
            self.ctx.act(forward_command(self.env))
        while True:
            up, j = self.reach()
            if j is not None:
                why = (f"the port-forward to the Ray dashboard dropped; started again in "
                       f"{self.ctx.clock() - start:.0f} s" if restarted else "its stream ended, the job still running")
                self.ctx.echo(f"  job {self.f.sid}'s log stopped after line {line} ({why}): following the job on "
                              f"from there")
                return j
            if self.ctx.clock() - start >= self.timeout:
                return None
            if not up and self.link and not pf.alive():
                self.ctx.act(forward_command(self.env))  # it exited (the head pod not back yet): once more
            self.ctx.sleep(self.WAIT)

    def gave_up(self, why: str) -> str:
        log = f" (the port-forward's log: {paths.forward_log(self.env.name)})" if self.link else ""
        return (f"job {self.f.sid} was not seen to end: its log's stream from the Ray dashboard ({self.address}) "
                f"ended and {why}{log}; it may still be running: `invoke logs --run {self.f.run} --follow` "
                f"follows it again")
