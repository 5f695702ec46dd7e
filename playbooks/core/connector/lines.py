"""Line splitters for a remote command's output, which arrives in chunks cut
anywhere: whole lines handed over as they complete, and the shell's pid
taken out of stderr (the SSH connector's command line prints it first, so
Ctrl-C or a timeout can stop the command)."""
from __future__ import annotations

import io
import threading
from collections.abc import Callable

PID_MARK = "@playbook-pid "


class Lines(io.TextIOBase):
    """A writable text stream handing whole lines to ``on_line`` (and
    keeping them in ``lines``); ``flush_rest`` hands over a last line
    without a newline."""

    def __init__(self, on_line: Callable[[str], None]):
        self.on_line = on_line
        self.buf = ""
        self.lines: list[str] = []
        self.lock = threading.Lock()

    def write(self, s: str) -> int:
        with self.lock:
            self.buf += s
            while "\n" in self.buf:
                line, self.buf = self.buf.split("\n", 1)
                self._take(line)
        return len(s)

    def _take(self, line: str) -> None:
        self.lines.append(line)
        self.on_line(line)

    def flush_rest(self) -> None:
        with self.lock:
            if self.buf:
                line, self.buf = self.buf, ""
                self._take(line)


class PidStripper(Lines):
    """stderr of a remote command: its first line is the shell's pid
    (``PID_MARK`` and the number), kept in ``pid`` and not handed over."""

    def __init__(self, on_line: Callable[[str], None] | None = None):
        super().__init__(on_line or (lambda _l: None))
        self.pid: int | None = None

    def _take(self, line: str) -> None:
        if self.pid is None and line.startswith(PID_MARK):
            rest = line[len(PID_MARK):]
            self.pid = int(rest) if rest.isdigit() else None
            return
        super()._take(line)


def without_pid_lines(text: str) -> str:
    """A remote command's whole stderr without the pid line."""
    return "\n".join(line for line in text.split("\n") if not line.startswith(PID_MARK))
