"""The modes that decide whether processes start.

``Runner`` decides, per mode, what a probe answers and whether an action runs:

- apply: probes run for real; actions run; results are verified.
- check: probes run for real; actions are only printed.
- dry:   nothing starts at all; every probe answers its ``assumed`` value
         (by default: absent) and every action is printed.

A fixture mode (``Runner(facts=...)``, ``fixtures.py``) answers probes from
declared facts, for tests. The facts themselves are in ``facts.py``.

Commands run through the Runner's connector (this machine, or a controller
host), one marked ``here`` through this machine's: pipes and stdin files
are fed by the Runner, never a shell of ours; each command and in-process
fact is written to the run's log (``runlog.py``), a command that the
connector answered in-process (``Ran.by``) marked so there. A dry run marks
the lines of the commands the connector would answer in-process
(``in_process_mark``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import enum
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import fixtures
from .command import PLACEHOLDER, Command
from .connector import Connector
from .errors import CommandFailed, PlaybookError
from .facts import Action, Completed, Fact
from .fixtures import Value
from .runlog import RunLog


class Mode(enum.StrEnum):
    APPLY = "apply"
    CHECK = "check"
    DRY = "dry-run"


@dataclass
class RetryPolicy:
    """Bounded exponential backoff for transient failures.
    ``is_transient(completed, patient)``: ``patient`` for a command given
    patience (it may also wait out an operation of someone else).
    ``already_exists(completed)``: a change refused because what it makes
    is there already (another run made it meanwhile): not retried; the step
    looks again and decides again, once (``play._made_meanwhile``)."""

    attempts: int = 5
    base: float = 1.0
    cap: float = 30.0
    is_transient: Callable[[Completed, bool], bool] = lambda c, patient: False
    already_exists: Callable[[Completed], bool] = lambda c: False
    sleep: Callable[[float], None] = time.sleep


class StepLog:
    """The lines one step prints; buffered so parallel steps never interleave.
    A heartbeat is printed at once even when buffered (a sign of life in a
    long wait), named by the step's ``title``."""

    def __init__(self, sink: Callable[[str], None] | None, buffered: bool, title: str = ""):
        self.sink = sink
        self.buffered = buffered
        self.title = title
        self.lines: list[str] = []
        # A step whose probes may fail for a known reason (check mode: what
        # it needs would be made first) looks once: a failure is not retried.
        self.look_once = False

    def heartbeat(self, text: str) -> None:
        line = f"  waiting {text}"
        self.lines.append(line)
        if self.sink:
            self.sink(f"  [{self.title}] {text}" if self.buffered and self.title else line)

    def emit(self, kind: str, text: str) -> None:
        line = f"  {kind:<7}{text}"
        self.lines.append(line)
        if not self.buffered and self.sink:
            self.sink(line)

    def raw(self, line: str) -> None:
        """A line as it is (or several, joined by newlines: printed in one
        write, so that nothing printed at the same time comes between them)."""
        self.lines.extend(line.split("\n"))
        if not self.buffered and self.sink:
            self.sink(line)


class _Assumed:
    """The dry-run answer: the fact's own ``assumed`` value."""


@dataclass
class _Prefetched:
    """An answer looked up ahead: the step's first look shows it as its own."""
    raw: Any


@dataclass
class _Transient:
    """A prefetched answer that failed transiently: the step's first attempt."""
    completed: Completed


class Runner:
    """Answers probes and runs actions according to the mode."""

    def __init__(
        self,
        mode: Mode = Mode.APPLY,
        connector: Connector | None = None,
        retry: RetryPolicy | None = None,
        facts: dict[str, Any] | None = None,
        probe_timeout: float = 180.0,
        here: Connector | None = None,
        log: RunLog | None = None,
        stale: Callable[[Command | Action, Fact], bool] | None = None,
        in_process: Callable[[Command, bool], str | None] | None = None,
    ):
        """``in_process``: for a dry run, which has no connector, what the
        connector of a command would answer it with in-process instead of
        its process (``Connector.in_process``; the bool: streamed)."""
        self.mode = Mode(mode)
        self.in_process = in_process
        self.connector = connector
        self.here = here or connector
        self.log = log
        self.retry = retry or RetryPolicy()
        self.declared = facts  # fixture mode when not None
        self.probe_timeout = probe_timeout
        self._cache: dict[str, Any] = {}
        self._facts: dict[str, Fact] = {}  # a cached answer's fact (for ``stale``)
        self.stale = stale
        self._held: dict[str, Any] = {}  # derived facts: answered once per run, never cleared by a change
        self._locks: dict[str, threading.Lock] = {}
        self._cache_lock = threading.Lock()
        self.recorded: list[Command] = []  # every command probed or acted, in order

    # -- probes ---------------------------------------------------------
    def _fact_lock(self, key: str) -> threading.Lock:
        with self._cache_lock:
            return self._locks.setdefault(key, threading.Lock())

    def look(self, fact: Fact, log: StepLog, step: str, fresh: bool = False, label: str = "probe") -> Any:
        """Answer a fact. Outputs are cached per command line, so one list
        call answers every fact built on it; ``fresh`` looks again (but a
        derived fact is held for the run: see ``Fact``)."""
        if fact.derive is not None:
            return self._derived(fact, log, step, label)
        key = fact.key
        with self._fact_lock(key):
            held = self._cache.get(key)
            cached = not fresh and key in self._cache and not isinstance(held, _Transient)
            if cached and isinstance(held, _Prefetched):  # looked up ahead for this step: its first look
                raw = self._cache[key] = held.raw
                cached, note = False, ""
            elif cached:
                raw = held
                note = " (cached)"
            else:
                first = held.completed if isinstance(held, _Transient) and not fresh else None
                raw, note = self._answer(fact, log, step, first=first)
                self._cache[key], self._facts[key] = raw, fact
        value = self._parse(fact, raw)
        line = f"{fact.line()}  => {fact.summary(value)}{note}{self.in_process_mark(fact.command)}"
        if not (cached and f"  {label:<7}{line}" in log.lines):  # one list call, two facts: said once
            log.emit(label, line)
        return value

    def _derived(self, fact: Fact, log: StepLog, step: str, label: str) -> Any:
        """A derived fact: its facts looked at through this step's log (so
        their lines show where it was first derived), then its own line."""
        assert fact.derive is not None
        key = fact.key
        with self._fact_lock(key):
            held = key in self._held
            if held:
                value = self._held[key]
            else:
                value = self._held[key] = fact.derive(lambda f: self.look(f, log, step))
        line = f"{fact.line()}  => {fact.summary(value)}{' (cached)' if held else ''}"
        if not (held and f"  {label:<7}{line}" in log.lines):
            log.emit(label, line)
        return value

    @staticmethod
    def _parse(fact: Fact, raw: Any) -> Any:
        if isinstance(raw, _Assumed):
            return fact.assumed
        if isinstance(raw, Value):
            return raw.value
        assert isinstance(raw, Completed)
        assert fact.parse is not None
        return fact.parse(raw)

    def _record(self, command: Command | None) -> None:
        while command is not None:
            self.recorded.append(command)
            command = command.pipe_from

    def prefetch(self, fact: Fact) -> None:
        """Look once, ahead of the step that will ask, without retrying and
        without a log: a transient failure is kept as the step's first
        attempt (its retries are then the step's, and logged there)."""
        if self.declared is not None or self.mode is Mode.DRY or fact.derive is not None:
            return
        key = fact.key
        with self._fact_lock(key):
            if key in self._cache:
                return
            if fact.python is not None:
                with contextlib.suppress(PlaybookError):  # the step looks again, and says why
                    self._cache[key] = _Prefetched(Value(self._python(fact, "prefetch")))
                    self._facts[key] = fact
                return
            assert fact.command is not None
            self._record(fact.command)
            command = fact.command
            if command.timeout is None:
                command = dataclasses.replace(command, timeout=self.probe_timeout)
            try:
                c = self._run(command, label="prefetch")
            except PlaybookError:
                return  # a host that cannot be reached: the step looks again, and says so
            transient = not c.ok and self.retry.is_transient(c, command.patience is not None)
            self._cache[key] = _Transient(c) if transient else _Prefetched(shown_part(c, command))
            self._facts[key] = fact

    def _python(self, fact: Fact, label: str) -> Any:
        """An in-process fact (an HTTP read, a pid file): answered by its
        function, logged like a command, with its answer or its error."""
        assert fact.python is not None
        if self.log is None:
            return fact.python()
        where = self.connector.name if self.connector is not None else "this machine"
        start = time.monotonic()
        try:
            value = fact.python()
        except Exception as e:
            self.log.fact(label, fact.line(), where, time.monotonic() - start, f"error: {type(e).__name__}: {e}")
            raise
        self.log.fact(label, fact.line(), where, time.monotonic() - start, repr(value))
        return value

    # -- commands, through the connectors ----------------------------------------------
    def _where(self, command: Command) -> Connector:
        where = self.here if command.here else self.connector
        assert where is not None, "no process may start in a dry run"
        return where

    def _logged(self, label: str, command: Command, where: Connector, r: Any) -> Completed:
        c = Completed(command.line(), r.rc, r.stdout, r.stderr, r.seconds)
        if self.log is not None:
            self.log.command(label or command.program, c, where.name, by=getattr(r, "by", ""),
                             program=command.program)
        return c

    def in_process_mark(self, command: Command | None, streamed: bool = False) -> str:
        """A dry run's mark on the line of a command its connector would
        answer in-process, not as its process (``  # in-process: WORDS``,
        the connector's words): its stdin, pipe and working folder empty,
        as a connector offers it; a value a probe would look up (a
        ``${NAME}``) taken as a plain name, as the run would give one. ""
        otherwise, and in every other mode (the run's log says what
        answered each command that ran)."""
        if self.mode is not Mode.DRY or self.declared is not None or self.in_process is None or command is None:
            return ""
        if command.pipe_from is not None or command.stdin_file is not None or command.cwd or command.background:
            return ""
        named = dataclasses.replace(command, argv=tuple(PLACEHOLDER.sub("x1", a) for a in command.argv))
        words = self.in_process(named, streamed)
        return f"  # in-process: {words}" if words else ""

    def _run(self, command: Command, label: str = "") -> Completed:
        """Run a command to its end: its pipe's first command, then this one
        fed with its output (checked first), or with its stdin file."""
        where = self._where(command)
        data: str | None = None
        if command.pipe_from is not None:
            first = self._run(command.pipe_from, label)
            if not first.ok:
                return Completed(command.line(), first.rc, first.stdout, first.stderr, first.seconds)
            data = first.stdout
            if command.pipe_check is not None and (why := command.pipe_check(data)):
                return Completed(command.line(), 3, "", why, first.seconds)
        if command.stdin_file is not None:
            try:
                raw, err = where.read(command.stdin_file), "no such file"
            except OSError as e:
                raw, err = None, str(e)
            if raw is None:
                return Completed(command.line(), 127, "",
                                 f"cannot read {command.stdin_file} on {where.name}: {err}", 0.0)
            data = raw.decode()
        r = where.run(command.argv, env=command.env, input=data, cwd=command.cwd, timeout=command.timeout)
        return self._logged(label, command, where, r)

    def _start(self, command: Command) -> int:
        """Start a background command in its own session; its pid, written
        to the command's pid file when it has one."""
        pid = self._where(command).spawn(command.argv, env=command.env, cwd=command.cwd, log=command.log)
        if command.pid_file is not None:
            command.pid_file.write(pid)
        return pid

    def _answer(self, fact: Fact, log: StepLog, step: str, first: Completed | None = None) -> tuple[Any, str]:
        if first is None:
            self._record(fact.command)
        if self.declared is not None:
            return fixtures.answer(self.declared, fact, step), ""
        if self.mode is Mode.DRY:
            return _Assumed(), " (assumed)"
        if fact.python is not None:
            return Value(self._python(fact, step)), ""
        assert fact.command is not None and fact.parse is not None
        command = fact.command
        if command.timeout is None:
            command = dataclasses.replace(command, timeout=self.probe_timeout)
        return self._run_with_retry(command, log, step, first=first), ""

    def _run_with_retry(self, command: Command, log: StepLog, step: str,
                        recheck: Callable[[], bool] | None = None, first: Completed | None = None) -> Completed:
        """Run; a transient failure (the request turned away, or never
        answered) is tried again with bounded exponential backoff: the
        policy's attempts, or for ``command.patience`` seconds, each try
        logged. A change is tried again only after ``recheck`` (a fresh
        look at the world) shows it was not made after all; if it was, the
        failure was only in the answer."""
        start = time.monotonic()
        delay = self.retry.base
        attempt = 1
        while True:
            c, first = (first, None) if first is not None else (self._run(command, label=step), None)
            if c.ok or log.look_once or not self.retry.is_transient(c, command.patience is not None):
                return shown_part(c, command)
            if command.patience is not None:
                if time.monotonic() - start + delay > command.patience:
                    return shown_part(c, command)
                limit = "until " + f"{command.patience:.0f}s"
            else:
                if attempt >= self.retry.attempts:
                    return shown_part(c, command)
                limit = f"of {self.retry.attempts}"
            why = shown_part(c, command).first_error_line()
            if recheck is not None:
                try:
                    made = recheck()
                except PlaybookError as e:
                    log.emit("retry", f"attempt {attempt} failed ({why}); not tried again: a fresh look could "
                                      f"not tell whether it changed anything ({str(e).splitlines()[0]})")
                    return shown_part(c, command)
                if made:
                    log.emit("retry", f"attempt {attempt} failed ({why}), but a fresh look shows the change "
                                      f"was made")
                    return Completed(c.line, 0, c.stdout, shown_part(c, command).stderr, c.seconds)
                why += "; a fresh look shows nothing changed"
            log.emit("retry", f"attempt {attempt} {limit} failed ({why}); again in {delay:.1f}s")
            self.retry.sleep(delay)
            delay = min(delay * 2, self.retry.cap)
            attempt += 1

    # -- actions --------------------------------------------------------
    def changed(self, what: Command | Action) -> None:
        """``what`` is about to change the world: answers looked up before
        may be stale now. Which ones is the ``stale`` policy's to say (the
        Runner's caller knows the tools); without one, all of them."""
        with self._cache_lock:
            if self.stale is None:
                self._cache.clear()
                return
            for key in [k for k in self._cache if self.stale(what, self._facts[k])]:
                del self._cache[key]

    def act(self, what: Command | Action, log: StepLog, step: str,
            recheck: Callable[[], bool] | None = None) -> Completed | None:
        if isinstance(what, Action):
            log.emit("apply", what.line)
            if self.acting:
                self.changed(what)
                what.fn()
            return None
        self._record(what)
        if what.background:
            log.emit("apply", what.line())
            if self.acting:
                self.changed(what)
                self._start(what)
            return None
        log.emit("apply", what.line() + self.in_process_mark(what))
        if not self.acting:
            return None
        self.changed(what)
        c = self._run_with_retry(what, log, step, recheck)
        if not c.ok:
            raise CommandFailed(step, what.line(), c.rc, c.stdout, c.stderr)
        return c

    def stream(self, command: Command, log: StepLog, step: str, on_line: Callable[[str], None]) -> Completed | None:
        self._record(command)
        log.emit("apply", command.line() + self.in_process_mark(command, streamed=True))
        if not self.acting:
            return None
        self.changed(command)
        where = self._where(command)
        return self._logged(step, command, where, where.stream(command.argv, on_line, env=command.env,
                                                               cwd=command.cwd))

    def spawn(self, command: Command, log: StepLog, step: str) -> int | None:
        self._record(command)
        log.emit("apply", command.line())
        if not self.acting:
            return None
        self.changed(command)
        return self._start(command)

    @property
    def acting(self) -> bool:
        """True when actions really run (apply mode, not a fixture)."""
        return self.mode is Mode.APPLY and self.declared is None

    @property
    def probing(self) -> bool:
        """True when probes really run (apply or check mode, not a fixture)."""
        return self.mode is not Mode.DRY and self.declared is None


def shown_part(c: Completed, command: Command) -> Completed:
    """What is shown of a completed command (its log keeps all of it)."""
    if command.stderr_filter is None:
        return c
    return dataclasses.replace(c, stderr=command.stderr_filter(c.stderr))
