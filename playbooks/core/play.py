"""Runs steps: in list order, or concurrently along their ``after`` edges.

A failure stops new work: steps already running finish (their operations are
not abandoned half-way), the rest are named in the recap as not run.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from .command import Command, shown
from .errors import CommandFailed, PlaybookError, ProbeFailed, Unreachable, cause_of
from .facts import Action, Completed, Fact
from .recap import (
    CHANGED,
    FAILED,
    FAILING,
    NOT_READY,
    OK,
    SKIPPED,
    UNKNOWN,
    UNREACHABLE,
    Recap,
    Reporter,
    StepResult,
    banner,
    same_failure,
)
from .runner import Mode, Runner, StepLog
from .step import CHANGE, DRIFT, FAIL, SKIP, UNCHECKED, WAIT, Await, Broken, Decision, Step, Verify, poll
from .step import OK as D_OK


class StepContext:
    """What a step may do: look at facts, act, stream, note; and what the
    mode allows (``acting``, ``probing``, ``dry``): a step asks these, never
    the runner."""

    def __init__(self, runner: Runner, step: Step, log: StepLog, sleep: Callable[[float], None] = time.sleep,
                 heartbeat: float = 30.0, clock: Callable[[], float] = time.monotonic):
        self.runner, self.step, self.log, self.sleep, self.clock = runner, step, log, sleep, clock
        self.heartbeat = heartbeat  # a wait says what it waits for at least this often (seconds)
        self.looked = 0  # facts looked at by this step (a dry run's are all assumed)

    @property
    def mode(self) -> Mode:
        return self.runner.mode

    @property
    def acting(self) -> bool:
        """Actions really run (apply mode, not a fixture)."""
        return self.runner.acting

    @property
    def probing(self) -> bool:
        """Probes really run (apply or check mode, not a fixture)."""
        return self.runner.probing

    @property
    def dry(self) -> bool:
        """A dry run: nothing starts, every probe answers its assumption."""
        return self.runner.mode is Mode.DRY and self.runner.declared is None

    def look(self, fact: Fact, fresh: bool = False) -> Any:
        self.looked += 1
        return self.runner.look(fact, self.log, self.step.title, fresh=fresh)

    def peek(self, fact: Fact) -> Any:
        """A fresh look that prints no probe line (for a heartbeat)."""
        return self.runner.look(fact, _Quiet(self.log), self.step.title, fresh=True)

    def act(self, what: Command | Action, recheck: Callable[[], bool] | None = None) -> Completed | None:
        if not self.acting or isinstance(what, Action) or what.background:
            return self.runner.act(what, self.log, self.step.title, recheck)
        with _Beat(self, f"`{' '.join(what.argv[:4])} ...`", self.state):
            return self.runner.act(what, self.log, self.step.title, recheck)

    def beating(self, words: str, state: Callable[[], str]) -> _Beat:
        """A sign of life while ``words`` runs quietly (see _Beat)."""
        return _Beat(self, words, state)

    def state(self) -> str:
        """What the step's verify fact says now (for a heartbeat), looked up
        fresh; "" when it has none or cannot look."""
        v = self.step.verify
        if v is None:
            return ""
        try:
            value = self.runner.look(v.fact, _Quiet(self.log), self.step.title, fresh=True, label="verify")
            return f"{v.fact.name}: {v.fact.summary(value)}" + (f", {why}" if (why := _check(v, value)) else "")
        except PlaybookError as e:
            return f"{v.fact.name}: cannot look ({str(e).splitlines()[0][:100]})"

    def made(self) -> bool:
        """A fresh look at the step's verify fact: is the change there?
        (after a change that failed transiently, before trying it again)"""
        v = self.step.verify
        assert v is not None
        value = self.runner.look(v.fact, _Quiet(self.log), self.step.title, fresh=True, label="verify")
        try:
            return v.check(value) is None
        except Broken:
            return False

    def stream(self, command: Command, on_line: Callable[[str], None]) -> Completed | None:
        return self.runner.stream(command, self.log, self.step.title, on_line)

    def spawn(self, command: Command) -> int | None:
        return self.runner.spawn(command, self.log, self.step.title)

    def note(self, text: str) -> None:
        self.log.emit("note", text)

    def echo(self, line: str) -> None:
        self.log.raw(line)


@dataclass
class Outcome:
    outcome: str
    reason: str = ""
    cause: str = ""  # what failed, without where (the same cause met by several steps is one)
    found: str = ""  # a change's "what is there now" (missing, not running), for reports
    data: Any = None  # what the step hands on (Ansible's register), in its StepResult
    notes: tuple[str, ...] = ()  # lines kept under the step in the recap (a plan, the attempts of a change)


def verify(ctx: StepContext, step: Step) -> str | None:
    """Look at the verify fact until its check passes; None means proven."""
    v = step.verify
    if v is None:
        return None
    return watch(ctx, step, v.fact, v.check, v.timeout, v.interval, "verify")


def wait_for(ctx: StepContext, step: Step, a: Await) -> str | None:
    """A wait inside a change; None when it ended as asked."""
    why = watch(ctx, step, a.fact, a.check, a.timeout, a.interval, "wait", a.what)
    return None if why is None else f"waited {a.timeout:.0f}s for {a.what}: {why}"


def watch(ctx: StepContext, step: Step, fact: Fact, check: Callable[[Any], str | None], timeout: float,
          interval: float, label: str, what: str = "") -> str | None:
    """The engine's one polling loop: fresh looks at ``fact`` until
    ``check`` passes (None) or ``timeout`` ends, a line per change of what
    it says and a heartbeat in between; a check that raises Broken ends it
    at once. Printed, not run, in a dry run; skipped in check mode."""
    shown = fact.line() + (f"  (until {what})" if what else "")
    if ctx.mode is Mode.DRY:
        ctx.log.emit(label, shown + ctx.runner.in_process_mark(fact.command))
        return None
    if ctx.mode is Mode.CHECK:
        return None
    last: list = [_UNSEEN]
    start = beat = ctx.clock()

    def once() -> str | None:
        nonlocal beat
        value = ctx.runner.look(fact, _Quiet(ctx.log), step.title, fresh=True, label=label)
        try:
            why = check(value)
        except Broken as e:
            ctx.log.emit(label, f"{shown}  => {e}")
            raise _Stop(str(e)) from None
        if why != last[0]:
            ctx.log.emit(label, f"{shown}  => {why or 'ok'}")
            last[0] = why
        elif why and ctx.clock() - beat >= ctx.heartbeat:
            beat = ctx.clock()
            ctx.log.heartbeat(f"{ctx.clock() - start:.0f}s of at most {timeout:.0f}s: {why}")
        return why

    try:
        return poll(once, timeout, interval, sleep=ctx.sleep, clock=ctx.clock)
    except _Stop as e:
        return str(e)


def _check(v: Verify, value: Any) -> str | None:
    try:
        return v.check(value)
    except Broken as e:
        return str(e)


class _Beat:
    """While something long runs (a cluster create: minutes; a job that
    compiles), say every ``heartbeat`` seconds of silence how long it has
    run and what ``state()`` shows now (for a command: a fresh look at the
    step's verify fact). ``touch()``: the step just printed a line."""

    def __init__(self, ctx: StepContext, words: str, state: Callable[[], str]):
        self.ctx, self.words, self.state = ctx, words, state
        self._stop = threading.Event()
        self._start = self._last = time.monotonic()

    def __enter__(self) -> _Beat:
        threading.Thread(target=self._beat, daemon=True, name="heartbeat").start()
        return self

    def touch(self) -> None:
        self._last = time.monotonic()

    def _beat(self) -> None:
        while not self._stop.wait(max(0.05, self._last + self.ctx.heartbeat - time.monotonic())):
            if time.monotonic() - self._last < self.ctx.heartbeat:
                continue
            try:
                state = self.state()
            except Exception as e:  # a sign of life must not end the step
                state = f"cannot look ({str(e).splitlines()[0][:100] if str(e) else type(e).__name__})"
            if self._stop.is_set():
                return
            self.ctx.log.heartbeat(f"{time.monotonic() - self._start:.0f}s: {self.words} still running"
                                   + (f"; {state}" if state else ""))
            self._last = time.monotonic()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()


class _Stop(Exception):
    pass


_UNSEEN = object()


class _Quiet(StepLog):
    """Swallows the runner's own probe line during polling (the verify loop
    prints one line per change of state instead)."""

    def __init__(self, log: StepLog):
        super().__init__(None, True)
        self._log = log
        self.look_once = log.look_once

    def emit(self, kind: str, text: str) -> None:
        if kind == "retry":
            self._log.emit(kind, text)


def execute(step: Step, ctx: StepContext) -> Outcome:
    if step.skip:
        return Outcome(SKIPPED, step.skip)
    if step.run is not None:
        out = step.run(ctx)
        assert isinstance(out, Outcome), f"step {step.title}: a run returns an Outcome"
        return out
    assert step.decide is not None
    decision = step.decide(ctx.look)
    for note in decision.notes:
        ctx.note(note)
    if decision.kind == CHANGE:
        return _change(ctx, step, decision)
    return _decided(ctx, step, decision)


def run_within(ctx: StepContext, steps: Sequence[Step]) -> list[tuple[Step, Outcome]]:
    """Steps run from inside a running step (an action it takes while it
    runs: the follow's quarantine of a host), one after another through the
    same runner and mode, so each is printed, recorded, and only printed in
    check mode and a dry run; their lines go to the running step's log, a
    line per step's outcome. A failure stops the rest (not run). Returns
    each step run, with its outcome."""
    done: list[tuple[Step, Outcome]] = []
    for step in steps:
        ctx.log.emit("step", f"[{step.title}]")
        inner = StepContext(ctx.runner, step, ctx.log, ctx.sleep, ctx.heartbeat, ctx.clock)
        try:
            out = execute(step, inner)
        except PlaybookError as e:
            out = Outcome(FAILED, str(e).splitlines()[0] if str(e) else type(e).__name__)
        if out.outcome == CHANGED and not ctx.acting and not out.reason.startswith("would "):
            out = Outcome(CHANGED, f"would change: {out.reason}", out.cause, out.found, out.data, out.notes)
        ctx.log.raw(f"  {out.outcome}: [{step.title}]" + (f" {shown(out.reason)}" if out.reason else ""))
        done.append((step, out))
        if out.outcome in FAILING:
            break
    return done


def _decided(ctx: StepContext, step: Step, decision: Decision) -> Outcome:
    """The outcome of a decision that is not a change: as it is, or after
    the wait it asks for."""
    notes = decision.notes
    # A dry run answers every probe with an assumption: what it decided on
    # them is what it would check, never a finding.
    assumed = ctx.dry and ctx.looked > 0
    if decision.kind == D_OK:
        return Outcome(OK, f"would check: {decision.reason}" if assumed and decision.reason else decision.reason,
                       data=decision.data, notes=notes)
    if decision.kind == DRIFT:
        return Outcome(FAILED, f"drift: {decision.reason}", notes=notes)
    if decision.kind == FAIL:
        return Outcome(FAILED, decision.reason, notes=notes)
    if decision.kind == SKIP:
        return Outcome(SKIPPED, decision.reason, notes=notes)
    if decision.kind == UNCHECKED:
        return Outcome(SKIPPED, f"would check: {decision.reason}" if assumed else f"not checked: {decision.reason}",
                       found=UNKNOWN, data=decision.data, notes=notes)
    if decision.kind == WAIT:
        ctx.note(decision.reason)
        if ctx.mode is Mode.CHECK:
            # Check mode waits for nothing: what is, is not ready yet, and a
            # run would wait for it (counted with the changes: not converged).
            return Outcome(CHANGED, f"would wait: {decision.reason}", found=NOT_READY, notes=notes)
        why = verify(ctx, step)
        if why is not None:
            return Outcome(FAILED, f"{decision.reason}; still not ready: {why}", notes=notes)
        return _after_wait(ctx, step, decision)
    raise AssertionError(f"unknown decision {decision.kind}")


def _after_wait(ctx: StepContext, step: Step, waited: Decision) -> Outcome:
    """A wait passed: the step decides again, on what its verify saw (the
    runner's latest answers, no new probe lines), to say what is now; the
    wait's own reason if that decision is not ok."""
    quiet = _Quiet(ctx.log)
    assert step.decide is not None
    try:
        again = step.decide(lambda f: ctx.runner.look(f, quiet, step.title))
    except PlaybookError:
        again = waited
    if again.kind == D_OK:
        return Outcome(OK, again.reason or waited.reason, data=again.data, notes=waited.notes + again.notes)
    return Outcome(OK, waited.reason, notes=waited.notes)


def _change(ctx: StepContext, step: Step, decision: Decision) -> Outcome:
    """A change, then its verify; when it fails and the decision says what
    to do instead, that next change (a new attempt, its notes said), until
    one holds or the step offers no other."""
    notes = decision.notes
    looked_again = False
    while True:
        why, failed = _attempt(ctx, step, decision)
        if why is None:
            # Check mode and dry runs never say that something happened.
            said = decision.reason if ctx.acting else\
                f"would {decision.would}" if decision.would else f"would change: {decision.reason}".rstrip(": ")
            return Outcome(CHANGED, said, found=decision.found, notes=notes)
        if failed is not None and not looked_again and _already_exists(ctx, failed):
            looked_again = True  # once: a second "already exists" is the failure
            out = _made_meanwhile(ctx, step, decision, failed)
            if out is not None:
                return Outcome(out.outcome, out.reason, out.cause, out.found, out.data, notes + out.notes)
        if failed is not None and decision.instead is None:
            raise failed
        nxt = decision.instead(lambda f: ctx.look(f, fresh=True), why) \
            if decision.instead is not None and ctx.acting else None
        if nxt is None or nxt.kind != CHANGE:
            cause = (failed.cause or cause_of(why)) if failed is not None else ""
            return Outcome(FAILED, why, cause=cause, found=decision.found, notes=notes)
        for note in nxt.notes:
            ctx.note(note)
        notes += nxt.notes
        decision = nxt


MADE_MEANWHILE = "made meanwhile by another run"


def _already_exists(ctx: StepContext, failed: CommandFailed) -> bool:
    """The command was refused because what it makes is there already (the
    runner's injected classifier says so)."""
    if not ctx.acting or failed.rc is None:
        return False
    return ctx.runner.retry.already_exists(Completed(failed.line, failed.rc, failed.stdout, failed.stderr))


def _made_meanwhile(ctx: StepContext, step: Step, decision: Decision, failed: CommandFailed) -> Outcome | None:
    """A change answered "already exists": another run made it between this
    step's look and its change. The step looks again, fresh, and decides
    again: as asked (ok), being made (it waits for it, then ok), with
    another shape (drift) or broken (fail), each saying it was made
    meanwhile; still to make (the same change again): None, the failure
    stands."""
    ctx.note(f"{failed.first_error_line() or 'already exists'}: looking again")
    assert step.decide is not None
    again = step.decide(lambda f: ctx.look(f, fresh=True))
    for note in again.notes:
        ctx.note(note)
    if again.kind == CHANGE:
        ctx.note("a fresh look still finds it to make: the failure stands")
        return None
    out = _decided(ctx, step, again)
    if out.outcome == OK:
        return Outcome(OK, f"{MADE_MEANWHILE}: {out.reason}" if out.reason else MADE_MEANWHILE, data=out.data,
                       notes=out.notes)
    if out.outcome == FAILED:
        return Outcome(FAILED, f"{out.reason} ({MADE_MEANWHILE})", out.cause, out.found, notes=out.notes)
    return out


def _attempt(ctx: StepContext, step: Step, decision: Decision) -> tuple[str | None, CommandFailed | None]:
    """One change's commands and waits, then its verify: (None, None) when
    it holds, else why not (and the command that failed, if one did)."""
    # One change with a verify: if it fails transiently, a fresh look
    # decides whether trying it again is safe (nothing was made).
    acts = [c for c in decision.commands if not isinstance(c, Await)]
    recheck = ctx.made if len(acts) == 1 and step.verify is not None else None
    for c in decision.commands:
        if isinstance(c, Await):
            why = wait_for(ctx, step, c)
            if why is not None:
                return why, None
        else:
            try:
                ctx.act(c, recheck)
            except ProbeFailed:
                raise
            except CommandFailed as e:
                return str(e), e
    if ctx.mode is Mode.CHECK:
        return None, None
    why = verify(ctx, step)
    return (None, None) if why is None else (f"not verified after the change: {why}", None)


def _of_after(table: dict[str, list[str]], step: Step) -> list[str]:
    """What ``table`` holds for the steps ``step`` comes after, each once,
    in order."""
    out: list[str] = []
    for d in step.after:
        out += [t for t in table.get(d, ()) if t not in out]
    return out


class Playbook:
    """Runs a list of steps against a runner and returns the recap."""

    def __init__(self, runner: Runner, reporter: Reporter | None = None, workers: int = 1,
                 sleep: Callable[[float], None] = time.sleep, timed: bool | None = None,
                 heartbeat: float = 30.0, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.runner = runner
        self.heartbeat = heartbeat
        self.reporter = reporter or Reporter()
        self.workers = max(1, workers if runner.mode is not Mode.DRY else 1)
        self.sleep = sleep
        self.timed = (runner.mode is not Mode.DRY) if timed is None else timed
        self._causes: dict[str, str] = {}  # a failure's cause -> the step that met it first
        self._lock = threading.Lock()

    def _one(self, step: Step, buffered: bool, announce: bool = False) -> StepResult:
        """Run one step. ``buffered``: others run at once, so its lines are
        printed whole when it ends (``announce``: a line says it started)."""
        log = StepLog(self.reporter.line, buffered, step.title)
        head = banner("TASK", step.title)
        if not buffered:
            self.reporter.line(head)
        elif announce:
            self.reporter.line(f"{head.split(' *')[0]} started")
        # Check mode: a step after one that would change cannot look yet;
        # its probe fails for that reason, so it is not retried.
        log.look_once = self.runner.mode is Mode.CHECK and any(self._pending.get(d) for d in step.after)
        ctx = StepContext(self.runner, step, log, self.sleep, self.heartbeat, self.clock)
        start = time.monotonic()
        try:
            out = execute(step, ctx)
        except Unreachable as e:
            out = Outcome(UNREACHABLE, str(e), cause=str(e))
        except ProbeFailed as e:  # could not look: what is there is unknown, not wrong
            out = Outcome(FAILED, str(e), cause=e.cause, found=UNKNOWN)
        except PlaybookError as e:
            out = Outcome(FAILED, str(e), cause=getattr(e, "cause", "") or cause_of(str(e)))
        except KeyboardInterrupt:
            raise
        except Exception as e:  # a bug, or an error nobody foresaw: this step fails, the recap still prints
            out = Outcome(FAILED, f"internal error: {type(e).__name__}: {' '.join(str(e).split())[:300]}"
                                  f"{self._keep_traceback(step)}")
        if out.outcome == FAILED and step.explain is not None and self.runner.acting:
            try:
                why = step.explain(lambda f: ctx.look(f, fresh=True), out.reason)
            except PlaybookError:
                why = None
            if why:
                out = Outcome(FAILED, f"{why}\n{out.reason}", out.cause, out.found, notes=out.notes)
        seconds = time.monotonic() - start
        out = self._check_mode_dependents(step, Outcome(out.outcome, shown(out.reason), out.cause, out.found,
                                                        out.data, out.notes))
        if out.outcome == CHANGED and not self.runner.acting and not out.reason.startswith("would "):
            # Check mode and dry runs never say that something happened.
            out.reason = f"would change: {out.reason}" if out.reason else "would change"
        end = f"{out.outcome}: [{step.title}]" + (f" {out.reason}" if out.reason else "")
        cause, first = "", None
        if out.outcome in FAILING:
            cause = out.cause
            with self._lock:
                first = self._causes.setdefault(cause, step.title) if cause else None
            if first is not None and first != step.title:
                # Printed once, in full, by the first step that met it.
                out.reason = same_failure(first)
            end = f"{out.outcome}: [{step.title}]\n" + "\n".join("  " + ln for ln in out.reason.splitlines())
        if buffered:
            self.reporter.block([head] + log.lines + [end])
        else:
            self.reporter.line(end)
        return StepResult(step.id, step.title, out.outcome, out.reason.splitlines()[0] if out.reason else "",
                          seconds, log.lines, cause, out.found, out.data, list(out.notes))

    def _keep_traceback(self, step: Step) -> str:
        """The traceback, kept in the run's log folder: where it is."""
        import traceback
        if self.runner.log is None:
            return ""
        path = self.runner.log.traceback(step.id, traceback.format_exc())
        return f" (traceback in {path})" if path else ""

    def _check_mode_dependents(self, step: Step, out: Outcome) -> Outcome:
        """Check mode changes nothing, so a step that needs (directly or not)
        one which would change cannot look at what it needs: its failure
        then means "not checkable yet", a skip with the reason, not a
        failure."""
        if self.runner.mode is not Mode.CHECK:
            return out
        roots, unread = _of_after(self._pending, step), _of_after(self._unread, step)
        if out.outcome == FAILED and roots:
            verb = "changes" if len(roots) == 1 else "change"
            out = Outcome(SKIPPED, f"cannot be checked before {', '.join(roots)} {verb} (check mode changes "
                                   f"nothing): {out.reason.splitlines()[0]}", found=UNKNOWN,
                          data={"waits_on": roots}, notes=out.notes)
        elif out.outcome == FAILED and unread:
            # It needs what could not be read: unknown, whatever its own look said.
            out = Outcome(FAILED, out.reason, out.cause, found=UNKNOWN, data={"needs_unread": unread},
                          notes=out.notes)
        if out.outcome == FAILED and out.found == UNKNOWN:
            self._unread[step.id] = unread or [step.title]
        if out.outcome == CHANGED and out.found != NOT_READY:
            # (What is there but not ready can be looked at: a failure that
            # needs it stays one, and may say why it is not ready.)
            roots = [step.title]
        if roots:
            self._pending[step.id] = roots
        return out

    def run(self, name: str, steps: Sequence[Step], workers: int | None = None,
            keep_going: bool = False, ended: Callable[[str], None] | None = None) -> Recap:
        """Run the steps; ``workers`` lowers the playbook's for this run
        (1: one at a time, in order). ``keep_going``: a failure does not
        stop the steps after it (independent checks, a status: every
        problem is listed, not only the first); a step still starts only
        after the steps it comes after have ended, whatever their outcome.
        ``ended``: told each step's id as it ends (a lock held up to a step)."""
        self._pending: dict[str, list[str]] = {}  # check mode: step id -> the changes it waits on
        self._unread: dict[str, list[str]] = {}   # check mode: step id -> the steps that could not look it needs
        self._causes = {}
        recap = Recap(name, timed=self.timed)
        start = time.monotonic()
        workers = self.workers if workers is None else max(1, min(workers, self.workers))
        if workers > 1:
            self.prefetch(steps, workers)
        if workers == 1:
            for i, step in enumerate(steps):
                r = self._one(step, buffered=False)
                recap.results.append(r)
                if ended is not None:
                    ended(step.id)
                if r.outcome in FAILING and not keep_going:
                    recap.not_run = [s.title for s in steps[i + 1:]]
                    break
        else:
            self._run_parallel(steps, recap, workers, keep_going, ended)
        recap.wall = time.monotonic() - start
        self.reporter.block([""] + recap.render())
        return recap

    def prefetch(self, steps: Sequence[Step], workers: int) -> float:
        """Look up every step's first facts at once, before the steps run:
        probes are read-only, so a converged run's answers are all there
        when each step asks (the cache is cleared by any change). What a
        look cannot answer is left to the step, which reports it. Returns
        the seconds it took."""
        if not self.runner.probing:
            return 0.0
        facts: dict[str, Fact] = {}
        for s in steps:
            if s.skip is None:
                for f in s.first_facts():
                    facts.setdefault(f.key, f)
        start = time.monotonic()
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(self.runner.prefetch, facts.values()))
        return time.monotonic() - start

    def _run_parallel(self, steps: Sequence[Step], recap: Recap, workers: int, keep_going: bool = False,
                      ended: Callable[[str], None] | None = None) -> None:
        ids = {s.id for s in steps}
        pending = list(steps)
        done: dict[str, str] = {}
        running: dict[Future, Step] = {}
        stopped = False
        with ThreadPoolExecutor(max_workers=workers) as pool:
            while pending or running:
                if not stopped:
                    ready = [s for s in pending if all(d in done for d in s.after if d in ids)]
                    # A step that runs alone prints its lines as they come;
                    # nothing else can start before it ends.
                    together = len(running) + len(ready) > 1
                    for s in ready:
                        pending.remove(s)
                        running[pool.submit(self._one, s, together, together)] = s
                if not running:
                    break
                finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
                for f in finished:
                    s = running.pop(f)
                    r = f.result()
                    recap.results.append(r)
                    done[s.id] = r.outcome
                    if ended is not None:
                        ended(s.id)
                    if r.outcome in FAILING and not keep_going:
                        stopped = True
        order = {s.id: i for i, s in enumerate(steps)}
        recap.results.sort(key=lambda r: order[r.step_id])
        recap.not_run = [s.title for s in pending]
