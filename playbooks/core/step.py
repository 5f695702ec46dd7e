"""Steps: probe -> decide -> act -> verify.

A step's ``decide`` looks at facts (through ``look``) and returns a Decision:

- ``ok(reason)``: the world already is as asked; nothing runs. Its
  ``note`` says what is as asked for now but not whole yet (slices still
  to come): the recap shows it.
- ``change(*actions, reason=..., would=..., found=...)``: these commands
  (and waits) bring it there. ``reason`` says what the change did,
  ``would`` what it would do (for check mode and a dry run: "start the Ray
  head"; without it, "would change: <reason>"), ``found`` what is there now
  ("missing", "not running"): a report (``invoke status``) says what is,
  never what it would do.
- ``drift(reason)``: it exists with another shape than asked; a failure,
  never silently passed or overwritten.
- ``fail(reason)``: it cannot go on (a broken resource, a missing parent),
  with what to do about it.
- ``wait(reason)``: it is being made by someone else (an operation still
  running); nothing runs, the verify step waits for it.
- ``skip(reason)``: the step does not apply here (Autopilot has no node
  pools of ours).
- ``unchecked(reason)``: a read-only check that could not look: neither
  proven nor refuted, and the run goes on (a capacity check whose API
  answered 403).

After a change (or a wait) the ``verify`` fact is looked up again, fresh,
until its check passes or the timeout ends; after a wait that passed, the
step decides again on what the verify saw, so its outcome says what is
(not what it waited for). A change may also hold an
``Await``: a wait the engine polls between two of its commands.

A change may name what to do ``instead`` when it fails (a command exits
non-zero, or the verify meets a final state): ``instead(look, why)``, with
fresh looks, returns the next change to try (a node pool of the next
capacity option) or None (the failure stands). Each next change is a new
attempt, bounded by what the step offers; its ``notes`` say why it came.

A change whose command is refused because what it makes is there already
(the runner's injected ``RetryPolicy.already_exists`` says so: another run
made it between the look and the change) is not a failure at once: the step
looks again, fresh, and decides again, once. As asked: ``ok``, "made
meanwhile by another run"; being made: it waits for it; another shape:
drift; still to make: the first failure stands. This comes before
``instead`` (what exists is not a reason to try another capacity option).

Any decision may carry ``notes``: lines printed with the step and kept
under its line in the recap (a plan, one line per slice; the attempts of a
change).

The engine, not the step, words the modes: in check mode and a dry run a
change says ``would change: ...`` and a decision made on assumed answers
says ``would check: ...`` (a dry run looks at nothing).

Most steps are ``decide`` steps. A step may instead have a ``run`` body (it
looks, acts and verifies through its StepContext and returns an Outcome)
only when it streams as it goes: it follows a job's log to its end, or
searches by compiling candidates one after another and reports each. Such a
step asks its context, never the runner, what the mode allows
(``ctx.acting``, ``ctx.probing``, ``ctx.dry``).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .command import Command
from .facts import ABSENT, Action, Fact

OK, CHANGE, DRIFT, FAIL, WAIT, SKIP, UNCHECKED = "ok", "change", "drift", "fail", "wait", "skip", "unchecked"


@dataclass(frozen=True)
class Await:
    """A wait inside a change: the engine looks at ``fact`` (fresh) until
    ``check(value)`` is None or ``timeout`` passes, with its heartbeat. Shown
    in a transcript as one ``wait`` line; ``what`` says what it waits for."""

    fact: Fact
    check: Callable[[Any], str | None]
    what: str
    timeout: float = 60.0
    interval: float = 2.0


Act = Command | Action | Await
Look = Callable[[Fact], Any]


@dataclass(frozen=True)
class Decision:
    kind: str
    reason: str = ""
    commands: tuple[Act, ...] = ()
    found: str = ""
    data: Any = None
    would: str = ""
    notes: tuple[str, ...] = ()
    instead: Callable[[Look, str], Decision | None] | None = field(default=None, repr=False)


def ok(reason: str = "", data: Any = None, notes: Sequence[str] = ()) -> Decision:
    """As asked. ``data``: what the step hands on (read from the recap)."""
    return Decision(OK, reason, data=data, notes=tuple(n for n in notes if n))


def change(*commands: Act, reason: str = "", would: str = "", found: str = "missing", notes: Sequence[str] = (),
           instead: Callable[[Look, str], Decision | None] | None = None) -> Decision:
    return Decision(CHANGE, reason, tuple(commands), found=found, would=would, notes=tuple(notes), instead=instead)


def drift(reason: str, notes: Sequence[str] = ()) -> Decision:
    return Decision(DRIFT, reason, notes=tuple(notes))


def fail(reason: str, notes: Sequence[str] = ()) -> Decision:
    return Decision(FAIL, reason, notes=tuple(notes))


def wait(reason: str) -> Decision:
    return Decision(WAIT, reason)


def skip(reason: str) -> Decision:
    return Decision(SKIP, reason)


def unchecked(reason: str, data: Any = None, notes: Sequence[str] = ()) -> Decision:
    return Decision(UNCHECKED, reason, data=data, notes=tuple(notes))


class Broken(Exception):
    """Raised by a verify check when the state is final and wrong (a node pool
    in ERROR, a process that exited): waiting longer cannot help."""


@dataclass(frozen=True)
class Verify:
    """Proof that a change took: ``check(value)`` returns None when satisfied,
    else a short text saying what is not yet right."""

    fact: Fact
    check: Callable[[Any], str | None]
    timeout: float = 0.0
    interval: float = 5.0


def gone(what: str) -> Callable[[Any], str | None]:
    """A delete's ``Verify.check``: satisfied once the probe reads ABSENT."""
    return lambda v: None if v is ABSENT else f"{what} still exists"


@dataclass
class Step:
    """One checked change, with one body: either ``decide`` (probe -> decide
    -> act -> verify, done by the engine) or ``run`` (a step that streams as
    it goes: see the module's docstring). ``after``: ids of the steps it
    needs (for parallel runs). ``skip``: why it does not run at all here."""

    play: str
    name: str
    decide: Callable[[Look], Decision] | None = field(default=None, repr=False)
    verify: Verify | None = None
    skip: str | None = None
    after: tuple[str, ...] = ()
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
        if self.skip is None and (self.decide is None) == (self.run is None):
            raise TypeError(f"step {self.play} : {self.name}: give it either decide or run, not "
                            f"{'both' if self.decide else 'neither'}")
        if self.skip is not None and (self.decide is not None or self.run is not None):
            raise TypeError(f"step {self.play} : {self.name}: a skipped step has no body")
        if self.run is not None and self.verify is not None:
            raise TypeError(f"step {self.play} : {self.name}: a run step verifies in its run")
        if not self.id:
            self.id = f"{self.play}:{self.name}"

    @property
    def title(self) -> str:
        return f"{self.play} : {self.name}"


def skipped(play: str, name: str, why: str, id: str = "", after: tuple[str, ...] = ()) -> Step:
    """A step that does not apply here, said with its reason."""
    return Step(play, name, skip=why, id=id, after=after)


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
