"""Where commands run: through a connector (``connector.py``: the only code
in the project that touches ``subprocess`` or SSH), each one logged in the
run's log folder."""
from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Callable

from .command import Command
from .connector import Connector
from .facts import Completed


def file_name(label: str) -> str:
    """A label made safe as a file name in the run's log folder."""
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in label)[:60]


class Executor:
    """Runs commands through a connector (this machine, or a controller host
    over SSH), with pipes, stdin files and a log of every command. A command
    marked ``local`` runs on this machine whatever the connector (Ansible's
    ``delegate_to: localhost``)."""

    def __init__(self, connector: Connector, local: Connector | None = None, logdir: Path | None = None):
        self.connector = connector
        self.local = local or connector
        self.logdir = logdir
        self._n = 0
        self._lock = threading.Lock()

    def where(self, command: Command) -> Connector:
        return self.local if command.local else self.connector

    def _log(self, label: str, c: Completed, where: Connector) -> None:
        if not self.logdir:
            return
        with self._lock:
            self._n += 1
            n = self._n
        path = self.logdir / f"{n:03d}-{file_name(label)}.log"
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
        """Start a background process in its own session; return its pid."""
        return self.where(command).spawn(command.argv, env=command.env, cwd=command.cwd, log=command.log)


def shown_part(c: Completed, command: Command) -> Completed:
    """What is shown of a completed command (its log keeps all of it)."""
    if command.stderr_filter is None:
        return c
    return dataclasses.replace(c, stderr=command.stderr_filter(c.stderr))
