"""A followed log's stream and the CLI that streams it: when `ray job logs
--follow` (or `ray job submit`) dies with its link (a dropped port-forward,
a closed connection), Python prints the CLI's own traceback into the same
stream, after the job's lines. Those lines are not the job's: they stay out
of the job's kept log and its timeline (the run's log has the command's
whole output).

A traceback is told by its shape: a line ``Traceback (most recent call
last):`` at the start of a line, indented frames, blank lines and the lines
that chain one exception to the next, and one unindented line, the
exception. Its lines are held from its first line; they go on as the
job's as soon as a line comes that is not part of it (the job printed a
traceback and went on, or the CLI printed the job's status after the
job's own traceback), and, at the stream's end, unless the stream failed
with the traceback as its last lines: then they are the CLI's own.
A traceback whose message runs over several unindented lines is taken as
the job's from its second such line (shown, never lost)."""
from __future__ import annotations

from collections.abc import Callable

START = "Traceback (most recent call last):"
CHAINS = ("During handling of the above exception, another exception occurred:",
          "The above exception was the direct cause of the following exception:")
MAX_HELD = 500  # a "traceback" longer than this is not the CLI's dying words: the lines go on


class TracebackHold:
    """Between a stream and ``take`` (the follower's line): each line goes
    on at once, except a traceback's, held until its end tells whose it is."""

    def __init__(self, take: Callable[[str], None]):
        self.take = take
        self.held: list[str] = []
        self.ended = False  # the held traceback's exception line came

    def __call__(self, line: str) -> None:
        if not self.held:
            if line.startswith(START):
                self.held, self.ended = [line], False
            else:
                self.take(line)
            return
        if self._part_of(line) and len(self.held) < MAX_HELD:
            self.held.append(line)
            return
        self.release()
        self(line)  # not part of it: itself, perhaps a new traceback's start

    def _part_of(self, line: str) -> bool:
        if line.startswith(START):
            self.ended = False
            return True
        if not line.strip() or line[0] in " \t" or line in CHAINS:
            return True
        if not self.ended:
            self.ended = True  # the exception's own line
            return True
        return False

    def release(self) -> None:
        """The held lines go on as the job's."""
        held, self.held = self.held, []
        for line in held:
            self.take(line)

    def end(self, failed: bool) -> list[str]:
        """The stream ended (``failed``: its command failed): the CLI's own
        lines, kept back (a failed stream whose last lines are a whole
        traceback); any other held lines go on as the job's."""
        if failed and self.held and self.ended:
            cli, self.held = self.held, []
            return cli
        self.release()
        return []
