"""Where commands run: through a connector (``connector.py``: the only code
in the project that touches ``subprocess`` or SSH), each one logged in the
run's log folder."""
from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import Any, Callable

from .command import Command
from .connector import Connector
from .facts import Completed


def file_name(label: str) -> str:
    """A label made safe as a file name in the run's log folder."""
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in label)[:60]


class Executor:
    """Runs commands through a connector (this machine, or a controller host
    over SSH), with pipes, stdin files and a log of every command. A command
    marked ``here`` runs on this machine whatever the connector (Ansible's
    ``delegate_to: localhost``)."""

    def __init__(self, connector: Connector, here: Connector | None = None, logdir: Path | None = None):
        self.connector = connector
        self.here = here or connector
        self.logdir = logdir
        self._n = 0
        self._lock = threading.Lock()

    def where(self, command: Command) -> Connector:
        return self.here if command.here else self.connector

    def _next_log(self, label: str) -> Path | None:
        if not self.logdir:
            return None
        with self._lock:
            self._n += 1
            n = self._n
        return self.logdir / f"{n:03d}-{file_name(label)}.log"

    def look(self, label: str, line: str, look: Callable[[], Any]) -> Any:
        """An in-process fact (an HTTP read, a pid file, a kubernetes-client
        read): answered by ``look``, logged like a command, with its answer
        or its error."""
        start = time.monotonic()
        try:
            value = look()
        except Exception as e:
            self._write_fact(label, line, start, f"error: {type(e).__name__}: {e}")
            raise
        self._write_fact(label, line, start, repr(value))
        return value

    def _write_fact(self, label: str, line: str, start: float, answer: str) -> None:
        path = self._next_log(label)
        if path is not None:
            path.write_text(f"$ {line}\n# in-process fact, through {self.connector.name}; "
                            f"{time.monotonic() - start:.1f}s\n--- answer\n{answer[:100_000]}\n")

    def _log(self, label: str, c: Completed, where: Connector) -> None:
        path = self._next_log(label)
        if path is None:
            return
        path.write_text(
            f"$ {c.line}\n# on {where.name}; exit {c.rc} after {c.seconds:.1f}s\n"
            f"--- stdout\n{c.stdout}\n--- stderr\n{c.stderr}\n"
        )

    def run(self, command: Command, label: str = "", input: str | None = None) -> Completed:
        where = self.where(command)
        if command.pipe_from is not None:
            first = self.run(command.pipe_from, label)
            if not first.ok:
                return Completed(command.line(), first.rc, first.stdout, first.stderr, first.seconds)
            input = first.stdout
            if command.pipe_check is not None:
                why = command.pipe_check(input)
                if why:
                    return Completed(command.line(), 3, "", why, first.seconds)
        if command.stdin_file is not None:
            try:
                data = where.read(command.stdin_file)
            except OSError as e:
                data, err = None, str(e)
            else:
                err = "no such file"
            if data is None:
                return Completed(command.line(), 127, "", f"cannot read {command.stdin_file} on {where.name}: {err}", 0.0)
            input = data.decode()
        r = where.run(command.argv, env=command.env, input=input, cwd=command.cwd, timeout=command.timeout)
        c = Completed(command.line(), r.rc, r.stdout, r.stderr, r.seconds)
        self._log(label or command.program, c, where)
        return c

    def stream(self, command: Command, on_line: Callable[[str], None], label: str = "") -> Completed:
        """Run, handing each output line (stdout and stderr merged) to ``on_line``."""
        where = self.where(command)
        r = where.stream(command.argv, on_line, env=command.env, cwd=command.cwd)
        c = Completed(command.line(), r.rc, r.stdout, r.stderr, r.seconds)
        self._log(label or command.program, c, where)
        return c

    def spawn(self, command: Command) -> int:
        """Start a background process in its own session; return its pid,
        written to the command's pid file when it has one."""
        pid = self.where(command).spawn(command.argv, env=command.env, cwd=command.cwd, log=command.log)
        if command.pid_file is not None:
            command.pid_file.write(pid)
        return pid


def shown_part(c: Completed, command: Command) -> Completed:
    """What is shown of a completed command (its log keeps all of it)."""
    if command.stderr_filter is None:
        return c
    return dataclasses.replace(c, stderr=command.stderr_filter(c.stderr))
