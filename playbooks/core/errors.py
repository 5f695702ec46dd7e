"""Expected errors: each renders as a clean message, never a traceback."""
from __future__ import annotations


class PlaybookError(Exception):
    """An expected failure with a message meant for the user."""

    exit_code = 1


class InputError(PlaybookError):
    """Invalid inventory or task arguments, found before any command runs."""

    exit_code = 2


def first_line(*texts: str) -> str:
    """The first non-blank line of the first text that has one."""
    for text in texts:
        for line in (text or "").splitlines():
            if line.strip():
                return line.strip()
    return ""


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
        return first_line(self.stderr, self.stdout)

    def render(self) -> str:
        parts = [f"step {self.step!r} failed: {self.why}", f"  command: {self.line}"]
        if self.stdout.strip():
            parts += ["  stdout:", indent(self.stdout)]
        if self.stderr.strip():
            parts += ["  stderr:", indent(self.stderr)]
        return "\n".join(parts)


class ProbeFailed(CommandFailed):
    """A read-only probe could not tell whether a resource exists."""
