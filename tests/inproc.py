"""`invoke` run in this process, through Invoke's own Program, as the
`invoke` script runs it: the same command line (sys.argv too), environment
variables, working directory, HOME, config files and tasks.py, with stdin
not a terminal, stdout and stderr captured, and process creation refused and
logged (what tests/noproc does in a child). A new interpreter per run costs
~0.5 s of imports; here a run costs what its own work does. Used by the
bad-input corpus and the golden dry runs; each also runs a sample through
the real `invoke` executable."""
from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

CHILDREN = threading.local()  # set in the threads that start the real CLI: they may start processes


class NoProcesses:
    """While a case runs in this process, starting a process fails and is
    logged (as tests/noproc does in a child): subprocess's fork_exec (every
    Popen, however it was imported), posix_spawn, fork, exec*, system; and so
    does signalling one (kill, killpg: a case must not stop anything of this
    machine's, such as a running local cluster), a liveness probe (signal 0)
    aside. The threads that run the real CLI are let through."""

    NAMES = ("posix_spawn", "posix_spawnp", "fork", "forkpty", "system", "execv", "execve", "execvp", "execvpe",
             "execl", "execle", "execlp", "execlpe", "kill", "killpg")

    def __init__(self) -> None:
        self.log: list[str] = []
        self._saved: list[tuple[object, str, object]] = []

    def _guard(self, what: str, real):
        def refuse(*args, **kwargs):
            if getattr(CHILDREN, "allowed", False) or (what in ("kill", "killpg") and args[1:2] == (0,)):
                return real(*args, **kwargs)
            self.log.append(f"{what}: {args[:1]!r}")
            raise RuntimeError(f"a case under test called {what}: {args[:1]!r}")
        return refuse

    def __enter__(self) -> NoProcesses:
        targets = [(subprocess, "_fork_exec")] + [(os, n) for n in self.NAMES if hasattr(os, n)]
        for owner, name in targets:
            real = getattr(owner, name)
            self._saved.append((owner, name, real))
            setattr(owner, name, self._guard(name, real))
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, real in reversed(self._saved):
            setattr(owner, name, real)


class Timeout(BaseException):
    """Not an Exception: no handler of the code under test takes it."""


def _timed_out(signum, frame):
    raise Timeout()


@contextlib.contextmanager
def as_the_cli_runs(argv: list[str], env: dict[str, str], cwd: Path, tmp: Path, limit: float = 5.0):
    """This process as `invoke` would start: its argv, environment, working
    directory, temporary folder (``tmp``/t, made here) and stdin; what
    tasks.py sets at import (sys.excepthook) put back
    afterwards."""
    (tmp / "t").mkdir(exist_ok=True)
    saved_env, saved_cwd, saved_argv, saved_stdin = dict(os.environ), os.getcwd(), sys.argv, sys.stdin
    saved_hook, saved_tmp = sys.excepthook, tempfile.tempdir
    saved_alarm = signal.signal(signal.SIGALRM, _timed_out)
    devnull = open(os.devnull)  # noqa: SIM115 - closed in finally
    try:
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        sys.argv, sys.stdin, tempfile.tempdir = argv, devnull, str(tmp / "t")
        signal.setitimer(signal.ITIMER_REAL, 4 * limit)  # a case that blocks (a fifo) fails, not hangs
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, saved_alarm)
        os.environ.clear()
        os.environ.update(saved_env)
        os.chdir(saved_cwd)
        sys.argv, sys.stdin, tempfile.tempdir, sys.excepthook = saved_argv, saved_stdin, saved_tmp, saved_hook
        devnull.close()


@dataclass
class Ran:
    rc: int
    out: str
    err: str
    seconds: float
    started: str          # the processes it tried to start, a line each
    outside: bool         # refused outside every task (the CLI's last resort line)


def run_invoke(argv: list[str], env: dict[str, str], cwd: Path, tmp: Path, limit: float = 5.0) -> Ran:
    """``argv`` (``[invoke, ...]``) through Invoke's Program in this process
    (what .venv/bin/invoke runs); its temporary folder is ``tmp``/t."""
    from invoke import Program
    from invoke.main import program as cli  # what .venv/bin/invoke runs, built anew (a Program keeps state)

    from playbooks.cli import session

    out, err = io.StringIO(), io.StringIO()
    rc, outside = 0, False
    start = time.monotonic()
    with NoProcesses() as procs, as_the_cli_runs(argv, env, cwd, tmp, limit), \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            Program(name=cli._name, binary=cli._binary, binary_names=cli._binary_names, version=cli.version,
                    namespace=cli.namespace, loader_class=cli.loader_class, executor_class=cli.executor_class,
                    config_class=cli.config_class).run(argv)
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except Timeout:
            rc = -1
            err.write(f"blocked for {4 * limit:.0f}s\n")
        except Exception as e:  # raised outside every task: what sys.excepthook would print
            if sys.excepthook is session._last_resort:
                line, rc = session.last_resort_line(type(e), e, e.__traceback__)
                err.write(line + "\n")
                outside = True
            else:
                rc = 1
                err.write("".join(traceback.format_exception(e)))
    return Ran(rc, out.getvalue(), err.getvalue(), time.monotonic() - start, "".join(f"{x}\n" for x in procs.log),
               outside)
