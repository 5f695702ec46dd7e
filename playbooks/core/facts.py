"""The vocabulary of probes and actions: a Fact (a read-only question), the
answer ABSENT (proven not to exist), a Completed command, an Action (an
in-process change shown as a line)."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .command import Command, shown
from .errors import error_line


class _Absent:
    _inst = None

    def __new__(cls) -> _Absent:
        if cls._inst is None:
            cls._inst = super().__new__(cls)
        return cls._inst

    def __repr__(self) -> str:
        return "ABSENT"

    def __bool__(self) -> bool:
        return False


ABSENT = _Absent()


@dataclass
class Completed:
    line: str
    rc: int
    stdout: str
    stderr: str
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def first_error_line(self) -> str:
        return error_line(self.stderr, self.stdout)


@dataclass(frozen=True)
class Fact:
    """A read-only question about the world.

    Either ``command`` (a process, its output given to ``parse``), ``python``
    (an in-process look, e.g. an HTTP GET or a pid file, shown as ``display``)
    or ``derive`` (a decision made from other facts, looked at through the
    function it is given: ``derive(look)``). ``parse`` returns the value,
    ``ABSENT`` only when the output proves the thing does not exist, and
    raises ``ProbeFailed`` when it cannot tell. ``assumed`` is the answer in
    a dry run (a derived fact is derived from its facts' assumed answers).

    A derived fact is answered once per run and held: a change does not
    clear it, so a plan made before the first change stays the plan of the
    steps that act on it (each looks at the same answer).
    """

    name: str
    command: Command | None = None
    parse: Callable[[Completed], Any] | None = None
    python: Callable[[], Any] | None = None
    display: str | None = None
    assumed: Any = ABSENT
    describe: Callable[[Any], str] | None = None
    derive: Callable[[Callable[[Fact], Any]], Any] | None = None

    @property
    def key(self) -> str:
        """What identifies the probe: its command line (without a ``NAME=$()``
        binding), so facts on one command share one answer."""
        if self.command is not None:
            return dataclasses.replace(self.command, binds=None).line()
        return self.display or self.name

    def line(self) -> str:
        if self.command is not None:
            return self.command.line()
        return self.display or self.name

    def summary(self, value: Any) -> str:
        if value is ABSENT:
            return "absent"
        if self.describe:
            return self.describe(value)
        if isinstance(value, (list, tuple, dict)):
            return f"{len(value)} item(s)"
        text = shown(str(value))
        return text if len(text) < 80 else text[:77] + "..."


def assume(fact: Fact, value: Any) -> Fact:
    """The same fact, answering ``value`` in a dry run (teardown assumes
    everything exists, so its dry run shows every delete)."""
    return dataclasses.replace(fact, assumed=value)


@dataclass(frozen=True)
class Action:
    """An in-process change (kill a pid, write a state file), shown as ``line``."""

    line: str
    fn: Callable[[], Any]

    def __str__(self) -> str:
        return self.line
