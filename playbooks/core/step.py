"""Steps: probe -> decide -> act -> verify.

A step's ``decide`` looks at facts (through ``look``) and returns a Decision:

- ``ok(reason)``: the world already is as asked; nothing runs.
- ``change(*commands, reason=...)``: these commands bring it there.
- ``drift(reason)``: it exists with another shape than asked; a failure,
  never silently passed or overwritten.
- ``fail(reason)``: it cannot go on (a broken resource, a missing parent),
  with what to do about it.
- ``wait(reason)``: it is being made by someone else (an operation still
  running); nothing runs, the verify step waits for it.

After a change (or a wait) the ``verify`` fact is looked up again, fresh,
until its check passes or the timeout ends.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from .command import Command
from .facts import Action, Fact

OK, CHANGE, DRIFT, FAIL, WAIT = "ok", "change", "drift", "fail", "wait"


@dataclass(frozen=True)
class Decision:
    kind: str
    reason: str = ""
    commands: tuple[Command | Action, ...] = ()


def ok(reason: str = "") -> Decision:
    return Decision(OK, reason)


def change(*commands: Command | Action, reason: str = "") -> Decision:
    return Decision(CHANGE, reason, tuple(commands))


def drift(reason: str) -> Decision:
    return Decision(DRIFT, reason)


def fail(reason: str) -> Decision:
    return Decision(FAIL, reason)


def wait(reason: str) -> Decision:
    return Decision(WAIT, reason)


Look = Callable[[Fact], Any]


class Broken(Exception):
    """Raised by a verify check when the state is final and wrong (a node pool
    in ERROR): waiting longer cannot help."""


@dataclass(frozen=True)
class Verify:
    """Proof that a change took: ``check(value)`` returns None when satisfied,
    else a short text saying what is not yet right."""

    fact: Fact
    check: Callable[[Any], str | None]
    timeout: float = 0.0
    interval: float = 5.0


@dataclass
class Step:
    """One checked change, with one body: either ``decide`` (probe -> decide
    -> act -> verify, done by the engine) or ``run`` (a step that must stream
    or wait in its own way; it looks, acts and verifies through its
    StepContext and returns an Outcome). ``after``: ids of the steps it needs
    (for parallel runs). ``idempotent=False`` declares a step that acts on
    every run (a training job, a chaos kill)."""

    play: str
    name: str
    decide: Callable[[Look], Decision] | None = field(default=None, repr=False)
    verify: Verify | None = None
    skip: str | None = None
    after: tuple[str, ...] = ()
    idempotent: bool = True
    id: str = ""
    run: Callable[..., Any] | None = field(default=None, repr=False)
    # After a failure in apply mode: (look, reason) -> one line that says
    # what it means and what to do (looks are fresh), or None.
    explain: Callable[[Look, str], str | None] | None = field(default=None, repr=False)
    # The facts it looks at first, besides its verify fact: looked up all at
    # once before the steps run (read-only, so order does not matter).
    probes: tuple[Fact, ...] = field(default=(), repr=False)

    def first_facts(self) -> tuple[Fact, ...]:
        return self.probes + ((self.verify.fact,) if self.verify is not None else ())

    def __post_init__(self) -> None:
        if (self.decide is None) == (self.run is None):
            raise TypeError(f"step {self.play} : {self.name}: give it either decide or run, not "
                            f"{'both' if self.decide else 'neither'}")
        if self.run is not None and self.verify is not None:
            raise TypeError(f"step {self.play} : {self.name}: a run step verifies in its run")
        if not self.id:
            self.id = f"{self.play}:{self.name}"

    @property
    def title(self) -> str:
        return f"{self.play} : {self.name}"


def poll(check_once: Callable[[], str | None], timeout: float, interval: float,
         sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> str | None:
    """Call ``check_once`` until it returns None or ``timeout`` passes; return
    the last complaint (None on success). Uses a monotonic clock."""
    deadline = clock() + timeout
    while True:
        why = check_once()
        if why is None:
            return None
        if clock() + interval > deadline:
            return why
        sleep(interval)


Steps = Sequence[Step]
