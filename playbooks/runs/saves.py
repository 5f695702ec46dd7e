"""Every save a run should have made, and whether it was finalized: a pure
function of its timeline (``timeline.py``), no I/O. What `invoke goodput`,
`invoke status` and `invoke runs` say as "saves: N of M finalized".

A save is due:

- at each step a worker group trained (``step``, ``peer_step``) that
  MaxText's schedule saves (``periodic``), under the schedule in force: the
  trainer's latest ``save_schedule`` (rank 0's, once per worker group);
- where a worker's node was told to go (``notice_received``): the job saves
  at its next step (MaxText's ``enable_autocheckpoint``). Several notices
  before one save ask that one save;
- before a resize (the elastic trainer's ``save_before_resize``), unless it
  was "not needed" (nothing new since the last save). "not asked" and "no
  save" are due and missing, in the outcome's own words;
- wherever a save was begun (``checkpoint_saved``): MaxText begins one only
  where one is due (a ``local_checkpoint_period``'s, say).

A save is finalized when a ``checkpoint_finalized`` of its step says so
(``finalized: true``), or, whatever the lines said, when the checkpoint
itself shows it: a later worker group restored from its step (``restore_started``
or ``restored``: Orbax's restore sees only a step it counts finalized,
orbax/checkpoint/_src/path/step.py, ``_build_metadata``), or its step
directory is finalized on disk by Orbax's own marker (``on_disk``: the
steps ``job/spec.py``'s ``Checkpoints`` counts by Orbax's rule: a
``<step>/`` renamed from its ``.orbax-checkpoint-tmp`` folder, or holding
``commit_success.txt`` on GCS; orbax/checkpoint/_src/path/atomicity.py,
``validate_atomic_rename_final_path`` and
``CommitFileTemporaryPath.validate_final``). A save's log line may never
come out before its process goes: the checkpoint decides, and the save
says which (``proof``). One that is not finalized is missing, and says why:

- "not finalized: <why>": Orbax's finalization failed (``finalized: false``);
- "not finalized: none said before the save of step M began": Orbax begins
  one save only once the one before is finished (orbax/checkpoint/
  experimental/v1/_src/training/checkpointer.py, ``Checkpointer.save``), so
  its finalization is overdue;
- "cut: the worker group went N s after the save began": begun, and its
  worker group went (a worker lost, a failure, a resize, its job's end, a
  new group) before any finalization was said;
- "skipped: step N trained, no save begun";
- "the worker went before it: ...": a notice's save never begun before
  the group went (which notice), a resize's with its outcome ("before a
  resize, no save: ...", "before a resize, not asked: ..."), or a periodic
  step a survivor finished after a loss.

A save begun whose group is still going, and nothing after it, is being
written, not missing; so is a save asked (or a periodic step trained, with
no later step yet) not begun yet by a group still going.

A step trained again after a restore (the steps replayed) is the same save
due: counted once, finalized when any group's save of it was finalized,
else it says why its last attempt was not (``attempts``: how many groups
saved or should have saved it).

A run with no ``save_schedule`` (its trainer older than that event) says
the schedule is unknown and how many saves were begun, never a guess; in a
run that has one, what came before the first is not counted (said).
"""
from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from playbooks.runs import events as E

# What ends the worker group a save was begun in: a loss, its job's end, a
# new group (``era``: the stretch of the timeline between two of these).
BOUNDARIES = frozenset((*E.LOSSES, E.JOB_END, E.SUBMITTED, *E.GROUP_LINES, *E.GROUP_START))
FINALIZED, MISSING, PENDING = "finalized", "missing", "in progress"
# How a save with no finalization line said was shown finalized (``proof``).
RESTORED_PROOF = "a later worker group restored from it"
DISK_PROOF = "its step directory is finalized on disk (Orbax's marker)"
UNKNOWN_LINE = "saves: schedule unknown (no save_schedule event: the run's trainer is older than it)"
OFF_LINE = "saves: none due (checkpointing off: enable_checkpointing=false)"


@dataclass(frozen=True)
class Schedule:
    """A worker group's save schedule, as the trainer said it; the first and
    last steps' saves as MaxText's defaults have them unless it said
    otherwise (``save_checkpoint_on_start``, ``save_checkpoint_on_completion``)."""

    period: int
    enabled: bool
    steps: int | None
    on_start: bool = True
    on_completion: bool = True

    @classmethod
    def of(cls, e: dict) -> Schedule | None:
        """The schedule of a ``save_schedule`` event; None when it cannot be read."""
        period, steps = E.number(e.get("checkpoint_period")), E.number(e.get("steps"))
        enabled = e.get("enabled")
        if not isinstance(enabled, bool) or (enabled and (period is None or period < 1)):
            return None
        return cls(int(period or 1), enabled, int(steps) if steps is not None else None,
                   e.get("save_checkpoint_on_start") is not False, e.get("save_checkpoint_on_completion") is not False)

    def doc(self) -> dict:
        return {"checkpoint_period": self.period, "enabled": self.enabled, "steps": self.steps}


def periodic(step: int, s: Schedule) -> bool:
    """Whether MaxText saves after training ``step`` (the pinned MaxText's
    maxtext/common/checkpointing.py: ``maybe_save_checkpoint`` and
    ``_should_save_checkpoint_at_step``; maxtext/trainers/pre_train/train.py
    calls it after each step, and once more after its loop with
    ``save_checkpoint_on_completion``): never with ``enable_checkpointing``
    false (``create_orbax_checkpoint_manager`` makes no manager); step 0 only
    with ``save_checkpoint_on_start`` (true by default); else each step with
    ``step % checkpoint_period == 0``, and the last step (``steps - 1``),
    forced, with ``save_checkpoint_on_completion`` (true by default)."""
    if not s.enabled:
        return False
    if step == 0:
        return s.on_start
    return step % s.period == 0 or (s.on_completion and s.steps is not None and step == s.steps - 1)


@dataclass
class Attempt:
    """One worker group's save of a step: when it began (the save's start:
    ``checkpoint_saved``'s time less its blocking seconds; None: never
    begun), when MaxText said it began, and its finalization."""

    era: int
    began: float | None = None
    said: float | None = None
    finalized: dict | None = None


@dataclass
class Due:
    """A save the run should have made: its step (None: asked, never begun;
    ``after``: the step it was asked after), what made it due, and each
    group's attempt."""

    step: int | None
    after: int | None = None
    by: list[str] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)

    def name(self) -> str:
        if self.step is not None:
            return f"step {self.step}"
        return f"after step {self.after}" if self.after is not None else "before any step"

    def because(self, why: str) -> None:
        if why not in self.by:
            self.by.append(why)

    def attempt(self, era: int) -> Attempt:
        """This group's attempt (made when it has none yet)."""
        if not self.attempts or self.attempts[-1].era != era:
            self.attempts.append(Attempt(era))
        return self.attempts[-1]


@dataclass
class Ask:
    """A save asked (by a notice, before a resize): when, in which group,
    after which step, by what; ``step``: the step it was said saved at;
    ``outcome``: a resize's save that did not come, in its words
    (``answerable``: whether a save begun after it can still answer it:
    "not asked" cannot)."""

    t: float
    era: int
    after: int | None
    by: str
    step: int | None = None
    outcome: str | None = None
    answerable: bool = True
    answered: bool = False


class Ledger:
    """The events in time order, into the saves due: one small handler per
    kind (``HANDLERS``), then the finalizations and the asks matched to the
    saves begun. ``era``: a worker group's stretch of the timeline, from
    its start (a submit, Ray Train's group line, the trainer's start of a
    group) to the next; ``ends``: what first ended each (a loss, its job's
    end, a new group)."""

    def __init__(self, evs: list[dict], on_disk: Collection[int] | None = None):
        self.evs, self.on_disk = evs, set(on_disk or ())
        self.era = 0
        self.ends: dict[int, dict] = {}
        self.bounds: list[float] = []  # the time of each event that ends a group
        self.schedule: Schedule | None = None
        self.schedules: list[Schedule] = []
        self.counting = False  # a save_schedule seen: what comes after it is counted
        self.not_counted = 0  # saves begun before it
        self.dues: dict[Any, Due] = {}
        self.asks: list[Ask] = []
        self.finals: list[tuple[int, dict]] = []  # (era, checkpoint_finalized)
        self.restores: list[tuple[int, float, int]] = []  # (era, t, step) of each restore a group began
        self.begun: list[tuple[int, float, int]] = []  # (era, said, step) of each save begun
        self.trained: dict[int, int] = {}  # era -> the latest step it trained
        self.trained_at: dict[tuple[int, int], float] = {}  # (era, step) -> when first said

    def run(self) -> None:
        for e in self.evs:
            kind = e.get("kind")
            if kind in BOUNDARIES:
                self.ends.setdefault(self.era, e)
                self.bounds.append(float(e["t"]))
                if kind not in (*E.LOSSES, E.JOB_END):
                    self.era += 1
            handler = HANDLERS.get(str(kind))
            if handler is not None:
                handler(self, e, float(e["t"]))
        for era, f in self.finals:
            self.finalize(era, f)
        self.proven()
        for ask in self.asks:
            self.answer(ask)
        self.unanswered()

    def due(self, step: int) -> Due:
        return self.dues.setdefault(step, Due(step))

    # -- the handlers ----------------------------------------------------------
    def save_schedule(self, e: dict, t: float) -> None:
        self.counting, self.schedule = True, Schedule.of(e)
        if self.schedule is not None:
            self.schedules.append(self.schedule)

    def step(self, e: dict, t: float) -> None:
        n = E.step_of(e)
        if n is None or not self.counting:
            return
        self.trained[self.era] = max(n, self.trained.get(self.era, n))
        self.trained_at.setdefault((self.era, n), t)
        if self.schedule is not None and periodic(n, self.schedule):
            d = self.due(n)
            d.because("its schedule")
            d.attempt(self.era)

    def saved(self, e: dict, t: float) -> None:
        n = E.step_of(e)
        if n is None:
            return
        if not self.counting:
            self.not_counted += 1
            return
        d = self.due(n)
        d.because("a save begun")
        a = d.attempt(self.era)
        a.began, a.said = t - (E.number(e.get("seconds")) or 0.0), t
        self.begun.append((self.era, t, n))

    def finalized(self, e: dict, t: float) -> None:
        if self.counting and E.step_of(e) is not None:
            self.finals.append((self.era, e))

    def restore(self, e: dict, t: float) -> None:
        n = E.step_of(e)
        if n is not None:
            self.restores.append((self.era, t, n))

    def notice(self, e: dict, t: float) -> None:
        if self.counting:
            who = e.get("host") or e.get("node") or "a host"
            self.asks.append(Ask(t, self.era, E.step_of(e), f"asked by a notice to {who}"))

    def resize_save(self, e: dict, t: float) -> None:
        """The elastic trainer's save before a resize: "saved" at its step;
        "not needed" asks none; "not asked" and "no save" are due, never
        begun, in the outcome's words."""
        outcome = str(e.get("outcome") or "no outcome said")
        if not self.counting or outcome.startswith("not needed"):
            return
        asked = E.step_of({"step": e.get("asked_after")})
        at = t - (E.number(e.get("seconds")) or 0.0)
        if outcome == "saved":
            self.asks.append(Ask(at, self.era, asked, "before a resize", step=E.step_of(e)))
            return
        self.asks.append(Ask(at, self.era, asked if asked is not None else E.step_of(e), "before a resize",
                             outcome=outcome, answerable=not outcome.startswith("not asked")))

    # -- after the walk ----------------------------------------------------------
    def finalize(self, era: int, f: dict) -> None:
        """A finalization, to the attempt of its step that began last before
        it (a synchronous save is finalized before MaxText says it began);
        else its group's; else one of its own (a save begun unsaid)."""
        n = E.step_of(f)
        assert n is not None  # kept only with its step (``finalized``)
        t, d = float(f["t"]), self.due(n)
        before = [a for a in d.attempts if a.began is not None and a.began <= t]
        ours = [a for a in d.attempts if a.era == era]
        a = before[-1] if before else ours[-1] if ours else d.attempt(era)
        d.because("a save begun")
        if a.finalized is None or f.get("finalized") is True:
            a.finalized = f

    def proven(self) -> None:
        """The saves the checkpoint shows finalized, whatever their lines
        said: one a later group restored from (the attempt of its step begun
        last before the restore, in an earlier group), else one whose step
        directory Orbax counts finalized on disk (the attempt begun last)."""
        for era, t, n in self.restores:
            d = self.dues.get(n)
            if d is None or self.done(d):
                continue
            before = [a for a in d.attempts if a.era < era and (a.began is None or a.began <= t)]
            if before:
                before[-1].finalized = {"finalized": True, "proof": RESTORED_PROOF}
        for n in sorted(self.on_disk):
            d = self.dues.get(n)
            if d is None or self.done(d) or not d.attempts:
                continue
            begun = [a for a in d.attempts if a.began is not None]
            (begun or d.attempts)[-1].finalized = {"finalized": True, "proof": DISK_PROOF}

    @staticmethod
    def done(d: Due) -> bool:
        return any(a.finalized is not None and a.finalized.get("finalized") is True for a in d.attempts)

    @staticmethod
    def proof(d: Due) -> str | None:
        """How a finalized save was shown finalized when no line said so (None: a line said so)."""
        done = [a.finalized for a in d.attempts if a.finalized is not None and a.finalized.get("finalized") is True]
        return None if any("proof" not in f for f in done) else str(done[-1]["proof"]) if done else None

    def answer(self, ask: Ask) -> None:
        """The save that answered an ask: the step said saved; else the
        first save its group began after it, at or after the step it was
        asked after."""
        if ask.step is not None and ask.step in self.dues:
            self.dues[ask.step].because(ask.by)
            ask.answered = True
            return
        for era, said, n in self.begun if ask.answerable else ():
            if era == ask.era and said >= ask.t and (ask.after is None or n >= ask.after):
                self.dues[n].because(ask.by)
                ask.answered = True
                return

    def unanswered(self) -> None:
        """The asks no save answered: one save due per group (its notices
        ask one save), never begun (``step`` None)."""
        for ask in self.asks:
            if ask.answered:
                continue
            d = self.dues.setdefault(("asked", ask.era), Due(None, ask.after))
            d.because(f"{ask.by}, {ask.outcome}" if ask.outcome else ask.by)
            d.attempt(ask.era)

    def went(self, t: float) -> float | None:
        """When the worker group first went after ``t`` (None: not yet)."""
        return next((b for b in self.bounds if b >= t), None)

    def judge(self, d: Due) -> tuple[str, str | None]:
        """A save due: finalized, missing and why, or in progress and what it waits for."""
        if self.done(d):
            return FINALIZED, None
        a = d.attempts[-1]
        if a.finalized is not None or a.began is not None:
            return self.judge_attempt(a)
        ended = self.ends.get(a.era)
        if d.step is None:
            return (MISSING, f"the worker went before it: {'; '.join(d.by)}") if ended else (PENDING, "asked")
        trained = self.trained_at.get((a.era, d.step))
        if ended is not None and ended.get("kind") in E.LOSSES and trained is not None and trained > float(ended["t"]):
            return MISSING, f"the worker went before it: step {d.step} trained as its group went"
        if ended is not None or self.trained.get(a.era, d.step) > d.step:
            return MISSING, f"skipped: step {d.step} trained, no save begun"
        return PENDING, "not begun yet"

    def cut_attempts(self) -> list[dict]:
        """Each save begun and never finalized by its own group, also one a
        later group made again after a restore (the due save may then be
        finalized: this one was still lost, and a restore never took it)."""
        out = []
        for d in sorted((d for d in self.dues.values() if d.step is not None), key=lambda d: d.step or 0):
            done = [a for a in d.attempts if a.finalized is not None and a.finalized.get("finalized") is True]
            for a in d.attempts:
                if a.began is None or a in done:
                    continue
                state, why = self.judge_attempt(a)
                if state == MISSING:
                    out.append({"step": d.step, "name": d.name(), "why": why, "due_by": list(d.by),
                                "saved_again": bool(done)})
        return out

    def judge_attempt(self, a: Attempt) -> tuple[str, str | None]:
        """One attempt that was begun or said finalized, not finalized: why (or still being written)."""
        if a.finalized is not None:
            return MISSING, f"not finalized: {a.finalized.get('why') or 'no cause said'}"
        return self.judge_begun(a)

    def judge_begun(self, a: Attempt) -> tuple[str, str | None]:
        """A save begun, with no finalization said: the next save began
        (Orbax finishes one before it begins the next), its group went, or
        it is being written."""
        assert a.began is not None and a.said is not None
        nxt = next((n for era, said, n in self.begun if era == a.era and said > a.said), None)
        if nxt is not None:
            return MISSING, f"not finalized: none said before the save of step {nxt} began"
        went = self.went(a.began)
        if went is not None:
            return MISSING, f"cut: the worker group went {went - a.began:.1f} s after the save began"
        return PENDING, "being written"


HANDLERS = {
    E.SAVE_SCHEDULE: Ledger.save_schedule,
    **dict.fromkeys(E.STEPS, Ledger.step),
    E.CHECKPOINT_SAVED: Ledger.saved,
    E.CHECKPOINT_FINALIZED: Ledger.finalized,
    E.NOTICE_RECEIVED: Ledger.notice,
    E.RESTORE_STARTED: Ledger.restore,
    E.RESTORED: Ledger.restore,
    E.SAVE_BEFORE_RESIZE: Ledger.resize_save,
}


def account(events: Iterable[dict], on_disk: Collection[int] | None = None) -> dict:
    """The saves of a run's events (see the module), ``on_disk``: the steps
    whose directory Orbax counts finalized in the run's checkpoints folder
    (None: not looked at). ``known`` (a schedule said), ``due``,
    ``finalized``, each save (``saves``: its ``step`` or the step it was
    asked ``after``, what made it due, its ``state`` and ``why``, its
    ``attempts``, and the ``proof`` of one finalized with no line said), the
    ``missing``, ``in_progress`` and ``proven`` ones, the steps looked at
    ``on_disk`` (None: not looked), the ``schedule`` last in force,
    ``off`` (checkpointing off in every schedule said), its ``headline``
    and its ``line``."""
    evs = sorted((e for e in events if E.number(e.get("t")) is not None), key=lambda e: float(e["t"]))
    led = Ledger(evs, on_disk)
    led.run()
    if not led.counting:
        begun = sum(1 for e in evs if e.get("kind") == E.CHECKPOINT_SAVED)
        said = f"{UNKNOWN_LINE}; {begun} begun"
        return {"known": False, "begun": begun, "headline": said, "line": said}
    saves = []
    for d in sorted(led.dues.values(), key=lambda d: (d.attempts[0].era, d.step if d.step is not None else -1)):
        state, why = led.judge(d)
        proof = led.proof(d) if state == FINALIZED else None
        saves.append({"step": d.step, "after_step": d.after, "name": d.name(), "due_by": d.by, "state": state,
                      "why": why, "attempts": len(d.attempts), **({"proof": proof} if proof else {})})
    cut = led.cut_attempts()
    done = sum(1 for s in saves if s["state"] == FINALIZED)
    r: dict[str, Any] = {"known": True, "due": len(saves), "finalized": done, "saves": saves,
                         "missing": [s for s in saves if s["state"] == MISSING],
                         "in_progress": [s for s in saves if s["state"] == PENDING],
                         "schedule": led.schedules[-1].doc() if led.schedules else None,
                         "not_counted": led.not_counted, "cut": cut, "proven": [s for s in saves if s.get("proof")],
                         "on_disk": sorted(led.on_disk) if on_disk is not None else None}
    r["off"] = bool(led.schedules) and not any(s.enabled for s in led.schedules)
    r["headline"] = headline(r)
    missing = "; ".join(f"{s['name']} ({s['why']})" for s in r["missing"])
    again = "; ".join(f"{c['name']} ({c['why']})" for c in cut if c["saved_again"])
    proven = "; ".join(f"{s['name']} ({s['proof']})" for s in r["proven"])
    return r | {"line": r["headline"] + (f"; missing: {missing}" if missing else "")
                + (f"; cut, then saved again by a later group: {again}" if again else "")
                + (f"; finalized with no line said so: {proven}" if proven else "")}


def headline(r: dict) -> str:
    """"saves: N of M finalized", the saves still in progress named
    (``off``: every schedule said had checkpointing off)."""
    if r["off"] and not r["due"]:
        return OFF_LINE
    out = f"saves: {r['finalized']} of {r['due']} finalized" if r["due"] else "saves: none due yet"
    if r["in_progress"]:
        out += f" ({len(r['in_progress'])} in progress: " + ", ".join(
            f"{s['name']} {s['why']}" for s in r["in_progress"]) + ")"
    if r["not_counted"]:
        out += f" ({r['not_counted']} begun before the trainer said its schedule, not counted)"
    return out


def lines(r: dict) -> list[str]:
    """`invoke goodput`'s: the headline, then each missing save and why,
    each cut and saved again, each finalized with no line said and what
    shows it (`invoke status` says ``line``: the same, on one line)."""
    return [str(r.get("headline") or UNKNOWN_LINE)] + [f"  {s['name']}: {s['why']}" for s in r.get("missing") or []] \
        + [f"  {c['name']}: {c['why']}; saved again by a later group" for c in r.get("cut") or [] if c["saved_again"]] \
        + [f"  {s['name']}: finalized, no line said so: {s['proof']}" for s in r.get("proven") or []]
