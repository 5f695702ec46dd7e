"""Ansible-like output: a banner per step, its probe/apply/verify lines, its
outcome, and a recap with disjoint counters (ok, changed, failed, skipped)."""
from __future__ import annotations

import os
import re
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

OK, CHANGED, FAILED, SKIPPED = "ok", "changed", "failed", "skipped"
# Ansible's word: the host that runs the commands could not be reached (or
# was not the host it claims to be). It stops the play like a failure.
UNREACHABLE = "unreachable"
FAILING = (FAILED, UNREACHABLE)
# What check mode found of a step that would wait (changed: not converged).
NOT_READY = "not ready"
# What is found of a step that could not look (its probe failed: could not
# tell), or that needs one that could not: neither as asked nor absent.
UNKNOWN = "unknown"


SAME_FAILURE = "the same failure as ["


def same_failure(first: str) -> str:
    """The reason of a step that met a failure another step met first
    (printed once, in full, by that step)."""
    return f"{SAME_FAILURE}{first}] (above)"


@dataclass
class StepResult:
    step_id: str
    title: str
    outcome: str
    reason: str = ""
    seconds: float = 0.0
    lines: list[str] = field(default_factory=list)
    cause: str = ""  # a failure's cause, without the step's own name or command
    found: str = ""  # a change's "what is there now", for reports
    data: Any = None  # what the step handed on (a decision's data)
    notes: list[str] = field(default_factory=list)  # lines kept under the step's line (a plan, attempts)


@dataclass
class Recap:
    name: str
    timed: bool = True
    results: list[StepResult] = field(default_factory=list)
    wall: float = 0.0
    not_run: list[str] = field(default_factory=list)

    def count(self, outcome: str) -> int:
        return sum(1 for r in self.results if r.outcome == outcome)

    @property
    def failed(self) -> bool:
        return self.count(FAILED) + self.count(UNREACHABLE) > 0

    def counters(self) -> str:
        gone = self.count(UNREACHABLE)
        return (f"ok={self.count(OK)} changed={self.count(CHANGED)} " + (f"unreachable={gone} " if gone else "")
                + f"failed={self.count(FAILED)} skipped={self.count(SKIPPED)}")

    def data(self, step_id: str) -> Any:
        """What a step handed on (None when it did not run or had none)."""
        return next((r.data for r in self.results if r.step_id == step_id), None)

    def full_reasons(self) -> dict[str, str]:
        """Each failure's cause -> its reason in full: that of the step that
        met it first (the others say ``same_failure``)."""
        full: dict[str, str] = {}
        for r in self.results:
            if r.outcome in FAILING and r.cause and not r.reason.startswith(SAME_FAILURE):
                full.setdefault(r.cause, r.reason)
        return full

    def render(self) -> list[str]:
        out = [f"PLAY RECAP [{self.name}] " + "*" * 20]
        width = max([len(r.title) for r in self.results] + [len(t) for t in self.not_run] + [10])
        for r in self.results:
            t = f"  {r.seconds:7.1f}s" if self.timed else ""
            why = f"  {r.reason}" if r.reason and r.outcome in (FAILED, SKIPPED, UNREACHABLE) else ""
            out.append(f"  {r.title:<{width}}  {r.outcome:<8}{t}{why}".rstrip())
            out += [f"      {note}" for note in r.notes]
        for title in self.not_run:
            out.append(f"  {title:<{width}}  not run (stopped after a failure)")
        by_cause: dict[str, list[StepResult]] = {}
        for r in self.results:
            if r.outcome in FAILING and r.cause:
                by_cause.setdefault(r.cause, []).append(r)
        full = self.full_reasons()
        for cause, rs in by_cause.items():
            if len(rs) > 1:
                out.append(f"  one failure stopped {len(rs)} steps ({', '.join(r.title for r in rs)}): "
                           f"{full.get(cause, rs[0].reason)}")
        wall = f"  wall {self.wall:.1f}s" if self.timed else ""
        out.append(f"{self.name}: {self.counters()}{wall}")
        return out


# A terminal's colour and cursor codes (the project draws none; a tool's
# lines passed through, Ray's, carry them).
ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def plain_output(stream: Any = None, environ: Any = None) -> bool:
    """Whether lines go out without colour: NO_COLOR set (no-color.org: any
    value), or not a terminal (a pipe, a file, CI)."""
    stream = sys.stdout if stream is None else stream
    environ = os.environ if environ is None else environ
    if environ.get("NO_COLOR"):
        return True
    try:
        return not stream.isatty()
    except (AttributeError, ValueError):
        return True


class Reporter:
    """Prints lines whole, one writer at a time; without colour codes where
    the output is plain (``plain_output``)."""

    def __init__(self, write: Callable[[str], None] | None = None, plain: bool | None = None):
        self._write = write or (lambda s: (sys.stdout.write(s + "\n"), sys.stdout.flush()))
        self._lock = threading.Lock()
        self.plain = plain_output() if plain is None else plain

    def _out(self, text: str) -> None:
        self._write(ESCAPES.sub("", text) if self.plain else text)

    def line(self, text: str) -> None:
        with self._lock:
            self._out(text)

    def block(self, lines: list[str]) -> None:
        with self._lock:
            for text in lines:
                self._out(text)


def banner(kind: str, title: str) -> str:
    head = f"{kind} [{title}] "
    return head + "*" * max(3, 72 - len(head))
