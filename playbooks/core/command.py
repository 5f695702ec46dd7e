"""Commands: argv lists with a shell-pasteable rendering.

A command is never a shell string. ``line()`` renders it the way a person
would paste it into bash, quoting every argument. Values that are not known
before a run (a project number looked up by a probe, in a dry run) appear as
``${NAME}`` placeholders; an argument holding one is double-quoted so that the
shell expands it, after the probe's own line assigned it (``NAME=$(...)``).
"""
from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

PLACEHOLDER = re.compile("\x00([A-Z][A-Z0-9_]*)\x00")


def placeholder(name: str) -> str:
    """The dry-run stand-in for a value a probe would look up. It is marked
    (not a literal ``${NAME}``) so that a real ``${...}`` in an argument, such
    as envsubst's variable list, stays single-quoted."""
    return f"\x00{name}\x00"


def shown(text: str) -> str:
    """Text with placeholders written as ``${NAME}``."""
    return PLACEHOLDER.sub(lambda m: f"${{{m.group(1)}}}", text)


def quote(arg: str) -> str:
    """Quote one argument for bash; keep ``${NAME}`` placeholders expandable."""
    if not PLACEHOLDER.search(arg):
        return shlex.quote(arg)
    out = []
    pos = 0
    for m in PLACEHOLDER.finditer(arg):
        out.append(_dq_escape(arg[pos:m.start()]))
        out.append(f"${{{m.group(1)}}}")
        pos = m.end()
    out.append(_dq_escape(arg[pos:]))
    return '"' + "".join(out) + '"'


def _dq_escape(text: str) -> str:
    return re.sub(r'([\\"$`])', r"\\\1", text)


@dataclass(frozen=True)
class Command:
    """One process to start: argv plus how it is fed and where it runs.

    - ``env``: variables added to the process environment, shown as a
      ``VAR=value`` prefix.
    - ``stdin_file``: a file fed on stdin (``< path``).
    - ``pipe_from``: another command whose stdout feeds this one's stdin
      (``a | b``); the runner runs both, never a shell.
    - ``background``: started and left running (``nohup ... > log 2>&1 &``),
      its output going to ``log``; ``pid_file`` (a PidFile): where its pid
      is written once it started (``echo $! > <pid file>``).
    - ``pipe_check``: checks the piped text before it reaches this command;
      a returned complaint stops the pipe (this command never starts).
    - ``patience``: seconds a transient refusal may be retried for (an
      operation of another node pool still running), instead of the
      runner's default few attempts.
    - ``binds``: the name a probe's output is known by in a transcript
      (``NAME=$(...)``).
    - ``stderr_filter``: what of the process's stderr is shown (the whole of
      it is kept in the run's log), e.g. without a debug log.
    - ``here``: runs on this machine even when the plays run on a
      controller host (the AOT compile: Ansible's ``delegate_to: localhost``).
    """

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    stdin_file: str | None = None
    pipe_from: Command | None = None
    background: bool = False
    log: str | None = None
    binds: str | None = None
    timeout: float | None = None
    cwd: str | None = None
    secrets: tuple[str, ...] = field(default=(), compare=False)
    pipe_check: Callable[[str], str | None] | None = field(default=None, compare=False, repr=False)
    patience: float | None = field(default=None, compare=False)
    here: bool = False
    pid_file: Any = field(default=None, compare=False, repr=False)
    stderr_filter: Callable[[str], str] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.argv, list):
            object.__setattr__(self, "argv", tuple(self.argv))
        if isinstance(self.env, dict):
            object.__setattr__(self, "env", tuple(self.env.items()))
        for a in self.argv:
            if not isinstance(a, str):
                raise TypeError(f"argv items must be str, got {a!r} in {self.argv!r}")

    @property
    def program(self) -> str:
        return self.argv[0]

    def line(self) -> str:
        """The command as one shell-pasteable line (secrets masked)."""
        parts = []
        if self.cwd:
            parts.append(f"cd {quote(self.cwd)} &&")
        if self.pipe_from is not None:
            parts.append(self.pipe_from.line())
            parts.append("|")
        parts.extend(f"{k}={quote(v)}" for k, v in self.env)
        if self.background:
            parts.append("nohup")
        parts.extend(quote(a) for a in self.argv)
        if self.stdin_file:
            parts.append("<")
            parts.append(quote(self.stdin_file))
        text = " ".join(parts)
        if self.background:
            text = f"{text} > {quote(self.log or '/dev/null')} 2>&1 &"
            if self.pid_file is not None:
                text += f" echo $! > {quote(str(self.pid_file.path))}"
        if self.binds:
            text = f"{self.binds}=$({text})"
        for s in self.secrets:
            if s:
                text = text.replace(s, "****")
        return text

    def __str__(self) -> str:  # pragma: no cover - convenience
        return self.line()

