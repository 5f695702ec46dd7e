"""Expected errors: each renders as a clean message, never a traceback."""
from __future__ import annotations

import re
import reprlib
from typing import Any


class PlaybookError(Exception):
    """An expected failure with a message meant for the user."""

    exit_code = 1


class InputError(PlaybookError):
    """Invalid inventory or task arguments, found before any command runs."""

    exit_code = 2


class Unreachable(PlaybookError):
    """The host that should run the commands cannot be reached, or is not
    the host it claims to be, or cannot take the project's files (Ansible's
    ``unreachable``)."""

    exit_code = 4


def first_line(*texts: str) -> str:
    """The first non-blank line of the first text that has one."""
    for text in texts:
        for line in (text or "").splitlines():
            if line.strip():
                return line.strip()
    return ""


# What a command-line tool's error looks like, best first: gcloud's and
# click's "ERROR:"/"Error:", kubectl's "error:"/"Error from server", the
# last line of a Python traceback ("FooError: ..."), gsutil's
# "AccessDeniedException: 403 ...". Usage banners and help hints are not.
_ERROR_LINES = (
    re.compile(r"^(ERROR|Error|error)( from server)?\b[:( ]"),
    re.compile(r"^(fatal|FATAL):"),
    re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit)\b: "),
)
_NOT_ERRORS = re.compile(r"^(Usage:|usage:|Try '|  |DEBUG: |INFO: )")


def error_line(*texts: str) -> str:
    """The line of a failed command's output that says what went wrong: the
    first line that looks like an error (by the forms above, in order), else
    the first line that is not a usage banner, else the first line."""
    raw = [line for text in texts for line in (text or "").splitlines() if line.strip()]
    lines = [line.strip() for line in raw]
    for form in _ERROR_LINES:
        hits = [i for i, line in enumerate(lines) if form.match(line)]
        if hits:
            # A traceback's own exception comes last; the others come first.
            i = hits[-1] if form is _ERROR_LINES[-1] else hits[0]
            # gcloud compute: "ERROR: (...) Could not fetch resource:" and the
            # server's message on the next line, as " - <message>".
            more = [line for line in lines[i + 1:i + 3] if line.startswith("- ")] if lines[i].endswith(":") else []
            return " ".join([lines[i], *more])
    for line, orig in zip(lines, raw):
        if not _NOT_ERRORS.match(orig):
            return line
    return lines[0] if lines else ""


_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 200
_repr.maxlevel, _repr.maxlist, _repr.maxdict, _repr.maxtuple, _repr.maxset = 2, 4, 4, 4, 4
SHOWN = 80


def shown_value(value: Any, limit: int = SHOWN) -> str:
    """A value as an error message names it: its repr, on one line, cut at
    ``limit`` characters, in time bounded whatever the value (a YAML alias
    bomb, a megabyte string)."""
    text = _repr.repr(value)
    if len(text) > limit:
        text = text[:limit - 3] + "..."
    return text


def indent(text: str, prefix: str = "    ") -> str:
    text = text.rstrip("\n")
    if not text:
        return prefix + "(empty)"
    return "\n".join(prefix + line for line in text.splitlines())


class CommandFailed(PlaybookError):
    """A command exited non-zero (or could not start)."""

    def __init__(self, step: str, line: str, rc: int | None, stdout: str = "", stderr: str = "", why: str = ""):
        self.step, self.line, self.rc, self.stdout, self.stderr = step, line, rc, stdout, stderr
        self.why = why or (f"exit code {rc}" if rc is not None else "could not start")
        super().__init__(self.render())

    def first_error_line(self) -> str:
        return error_line(self.stderr, self.stdout)

    @property
    def cause(self) -> str:
        """What went wrong, without where: the same cause met by several steps
        (no credentials, a project denied) is recognised as one."""
        return cause_of(self.stderr or self.stdout or self.why)

    def render(self) -> str:
        parts = [f"step {self.step!r} failed: {self.why}", f"  command: {self.line}"]
        if self.stdout.strip():
            parts += ["  stdout:", indent(self.stdout)]
        if self.stderr.strip():
            parts += ["  stderr:", indent(self.stderr)]
        return "\n".join(parts)


class ProbeFailed(CommandFailed):
    """A read-only probe could not tell whether a resource exists."""

    def render(self) -> str:
        # The step's own title heads its failure already; say what happened.
        parts = [self.why, f"  command: {self.line}"]
        if self.stdout.strip():
            parts += ["  stdout:", indent(self.stdout)]
        if self.stderr.strip():
            parts += ["  stderr:", indent(self.stderr)]
        return "\n".join(parts)


_WHERE = re.compile(r"\((gcloud|gsutil)[\w.-]*\)\s*")


def cause_of(text: str) -> str:
    """An error text with its command's name taken out (gcloud prints
    "(gcloud.compute.networks.list)" before the same message for every
    command), whitespace folded: equal causes compare equal."""
    return " ".join(_WHERE.sub("", text or "").split())
