"""What the soak asks of each run, as pure functions of what it kept: the
run's timeline (its events), its goodput report (``invoke goodput --json``)
and the soak's own observations (``facts``: the train's exit and outcome
line, the steps asked, its own stopwatch around the `invoke train`s, the
chaos targets, the save a kill aimed at). No I/O: tests/test_soak_checks.py
feeds each a bad run and shows it fail.

Two questions, asked in this order:

1. ``exercised``: did the scenario's fault happen as described (the host
   killed after step 12, the aimed rank's, the save cut short, the hang
   seen...)? A run whose fault did not happen proves nothing: the soak runs
   it again (a bounded number of times) and then counts it "not exercised",
   a failure.
2. ``criteria``: did the run come through? Each criterion passes, fails, or
   does not apply to this run (said, never counted as a pass).
"""
from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from playbooks.runs.restart import failed_hosts

LOSS_KINDS = ("worker_lost", "failure")
# A lost host's incident and the kinds of event that start one.
INCIDENT_LOSSES = ("worker_lost", "failure", "resize")
STEP_KINDS = ("step", "peer_step")
# The soak's stopwatch runs around each `invoke train`: its set-up (the
# preflight's static checks, the submit) and wrap-up (the summary, the
# metrics picture) are outside the timeline's wall. This much per job.
WRAP_S = 90.0
# The wall of a run's timeline may start this much before the soak's
# stopwatch: the Jobs API's start_time is Ray's clock, on this machine too.
CLOCK_SLACK_S = 2.0


@dataclass(frozen=True)
class Spec:
    """What a scenario does, as its checks need it."""

    targets: tuple[str, ...] = ()     # the chaos.delete-worker --target of each kill, in order
    after_step: int | None = None     # the kill (or hang) after this step
    grow: bool = False                # the job must go on with one slice and grow back
    in_compile: bool = False          # the kill during the first compile, before any step
    cut_save: bool = False            # the kill cuts a save short
    second_while_first_down: float | None = None  # the second kill within this many s of the first
    hang_s: float | None = None       # a worker frozen this long, the stall seen and recovered
    stop: bool = False                # a stall stopped by the follower, then resumed by a second job
    never_resumes: bool = False       # a worker frozen for good: the watch in the cluster sets its host aside
    sick: str | None = None           # "back": a host back sick after step 12; "start": sick before the job
    detached: bool = False            # no `invoke` process follows the job: the watch in the cluster acts
    budget: bool = False              # more hosts lost in one job than the old lifetime budget (max_failures)
    notice: int | None = None         # chaos.preempt-worker's grace: a notice, then the kill
    notice_holds: bool = True         # the grace holds a save (else: shorter than one)
    maintenance: bool = False         # chaos.maintenance: the watch gives the notice before the window


SPECS: dict[str, Spec] = {
    "back-never": Spec(("peer",), after_step=12, grow=True),
    "back-5s": Spec(("rank0",), after_step=12),
    "back-20s": Spec(("rank0",), after_step=12),
    "back-60s": Spec(("peer",), after_step=12, grow=True),
    "in-compile": Spec(("first",), in_compile=True),
    "in-save": Spec(("peer",), cut_save=True),
    "two-lost": Spec(("rank0", "first"), after_step=12, second_while_first_down=60),
    "hung-resumed": Spec(after_step=12, hang_s=10),
    "hang-stop": Spec(after_step=12, stop=True),
    "hang-never": Spec(after_step=12, never_resumes=True, detached=True),
    "sick-back": Spec(after_step=12, sick="back", detached=True),
    "sick-start": Spec(sick="start", detached=True),
    "many-lost": Spec(("peer",) * 4, after_step=12, detached=True, budget=True),
    "notice": Spec(("peer",), after_step=12, grow=True, notice=30),
    "notice-short": Spec(("peer",), after_step=12, notice=1, notice_holds=False),
    "maintenance": Spec(("peer",), after_step=12, grow=True, detached=True, maintenance=True),
}
# Ray Train's max_failures, which it counted over a job's whole life (and
# the inventory's default): many-lost loses one host more than this in one job.
OLD_BUDGET = 3
# The source of the events the watch in the cluster writes (`invoke watch`).
WATCH = "watch"
# The bound on a never-resuming hang's time to its first step after the
# restart: stall_after (the soak's, HANG_STALL_AFTER) plus the median time
# to recover from a lost host of the newest soak table in the docs
# (``latest_recovery``). Issue 36's goal.
HANG_STALL_AFTER = 15
# A soak's table in a page of docs/ (docs/elastic.md, docs/quarantine.md,
# or any page `--table PAGE:NAME` names): between ``<!-- bench:NAME -->``
# markers, headed by "Written by `bench/soak.py ...` ... on DATE at commit
# `C`" (a table judged again: "(run on DATE at commit `C`, ...)": the
# run's date comes first), ending with bench/soak.py's ``recovery`` line.
TABLE = re.compile(r"<!-- bench:([\w-]+) -->\n(.*?)<!-- /bench:\1 -->", re.S)
STAMP = re.compile(r"^Written by `bench/soak\.py[^`]*`.*? on (\d{4}-\d{2}-\d{2}) at commit `([^`]+)`", re.M)
MEDIAN = re.compile(r"^time to recover from a lost host .*?: median ([\d.]+) s", re.M)


@dataclass(frozen=True)
class Recovery:
    """A soak table's median time to recover from a lost host: the table
    (its page and marker), the date its runs were run and their commit."""

    median_s: float
    table: str
    date: str
    commit: str

    def text(self) -> str:
        return f"the median {self.median_s:g} s of {self.table}, {self.date} at commit {self.commit}"


def soak_tables(page: str, text: str) -> list[Recovery]:
    """The soak's tables of a page of docs/ with a median time to recover, in the page's order."""
    out = []
    for name, block in TABLE.findall(text):
        stamp, median = STAMP.search(block), MEDIAN.search(block)
        if stamp and median:
            out.append(Recovery(float(median.group(1)), f"docs/{page} bench:{name}", stamp.group(1), stamp.group(2)))
    return out


def latest_recovery(pages: dict[str, str], order: Callable[[str], float] = lambda commit: 0.0) -> Recovery | None:
    """The newest soak table's (None: no table has a median): the latest
    date; of one date, the later commit (``order``: a commit's time, 0 where
    unknown), then the later in the pages (``pages``: page name to text)."""
    tables = [r for page, text in pages.items() for r in soak_tables(page, text)]
    if not tables:
        return None
    return max(enumerate(tables), key=lambda it: (it[1].date, order(it[1].commit), it[0]))[1]


@dataclass
class Check:
    name: str
    ok: bool | None  # None: does not apply to this run
    detail: str = ""

    def text(self) -> str:
        verdict = "n/a" if self.ok is None else "ok" if self.ok else "FAILED"
        return f"{self.name}: {verdict}" + (f" ({self.detail})" if self.detail else "")


@dataclass
class Verdict:
    exercised: list[str] = field(default_factory=list)  # what did not happen as described
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.exercised and all(c.ok is not False for c in self.checks)

    def failures(self) -> list[str]:
        if self.exercised:
            return ["not exercised: " + "; ".join(self.exercised)]
        return [c.text() for c in self.checks if c.ok is False]

    def not_applied(self) -> list[str]:
        return [c.text() for c in self.checks if c.ok is None]


def _t(e: dict) -> float:
    return float(e["t"])


def _chaos(events: list[dict], kind: str) -> list[dict]:
    return sorted((e for e in events if e.get("kind") == kind and e.get("by") == "chaos"), key=_t)


def _steps_before(events: list[dict], t: float, job: str | None = None) -> list[int]:
    return [e["step"] for e in events if e.get("kind") in STEP_KINDS and isinstance(e.get("step"), int)
            and _t(e) < t and (job is None or e.get("job") == job)]


def rank_held(events: list[dict], host: str | None, t: float) -> int | None:
    """The rank the twin's host ``host`` held at ``t`` (its latest
    worker_started before then: ``<slice>-<host id>``)."""
    best = None
    for e in events:
        if e.get("kind") != "worker_started" or _t(e) > t:
            continue
        if f"{e.get('slice')}-{e.get('host')}" == host and (best is None or _t(e) > _t(best)):
            best = e
    r = best.get("rank") if best else None
    return r if isinstance(r, int) and not isinstance(r, bool) else None


def _groups(events: list[dict]) -> list[tuple[float, int]]:
    """(time, size) of each worker group Ray Train started or resized to."""
    out = []
    for e in events:
        if e.get("kind") in ("workers_started", "workers_restarted") and isinstance(e.get("workers"), int):
            out.append((_t(e), e["workers"]))
    return sorted(out)


def exercised(scenario: str, facts: dict, events: list[dict]) -> list[str]:
    """What of the scenario did not happen as described ([]: all of it)."""
    spec = SPECS[scenario]
    kills = _chaos(events, "worker_lost")
    if len(kills) < len(spec.targets):
        return [f"{len(kills)} host(s) killed by chaos, {len(spec.targets)} planned"]
    return _aimed(spec, kills, events) + _when(spec, facts, kills, events)


def _aimed(spec: Spec, kills: list[dict], events: list[dict]) -> list[str]:
    """Each kill on the rank its --target aimed at (the rank its host held then)."""
    out = []
    for want, kill in zip(spec.targets, kills):
        if want == "first":
            continue
        rank = rank_held(events, kill.get("host"), _t(kill))
        if rank is None:
            out.append(f"the rank of killed host {kill.get('host')} is not known")
        elif (want == "rank0") != (rank == 0):
            out.append(f"--target={want} killed {kill.get('host')}, which held rank {rank}")
    return out


def _when(spec: Spec, facts: dict, kills: list[dict], events: list[dict]) -> list[str]:
    """The fault at the moment the scenario describes, and what it leads to."""
    out: list[str] = []
    first_hit = kills[0] if kills else None
    hangs = _chaos(events, "worker_hung")
    sickened = _chaos(events, "host_sickened") if spec.sick else []
    hit = first_hit or (hangs[0] if hangs else None) or (sickened[0] if sickened else None)
    if spec.after_step is not None:
        if hit is None:
            out.append("no host killed, frozen or made sick")
        else:
            before = _steps_before(events, _t(hit))
            if not before or max(before) < spec.after_step:
                out.append(f"the fault came at step {max(before) if before else '-'}, not after step "
                           f"{spec.after_step}")
    if spec.in_compile and first_hit is not None:
        compiles = [e for e in events if e.get("kind") == "compile_started" and _t(e) <= _t(first_hit)]
        if not compiles:
            out.append("the kill came before any compile started")
        if (before := _steps_before(events, _t(first_hit))):
            out.append(f"the kill came after step {max(before)}: not in the first compile")
    if spec.grow and not any(e.get("kind") == "resize" and (e.get("workers") or 0) > (e.get("workers_from") or 0)
                             for e in events):
        out.append("the job never grew back to more slices")
    if spec.grow and not any(size == 1 for _, size in _groups(events)):
        out.append("the job never went on with one slice")
    if spec.cut_save:
        saving, restored = facts.get("saving_step"), facts.get("restored_from")
        if saving is None:
            out.append("no save was being written at the kill")
        elif restored is None:
            out.append("no restore after the kill")
        elif restored >= saving:
            out.append(f"the save of step {saving} finished before the kill (restored from {restored})")
    if spec.second_while_first_down is not None and len(kills) >= 2:
        a, b = kills[0], kills[1]
        if a.get("host") == b.get("host"):
            out.append(f"both kills hit {a.get('host')}")
        elif _t(b) - _t(a) >= spec.second_while_first_down:
            out.append(f"the second kill came {_t(b) - _t(a):.0f} s after the first: the first host was back")
    return out + _hangs(spec, facts, events) + _sick(spec, facts, events) + _notice(spec, kills, events)


def _notice_by(spec: Spec) -> str | None:
    """Who gives the scenario's notice: chaos.preempt-worker, or the watch
    before a maintenance chaos.maintenance scheduled (None: no notice)."""
    return "chaos" if spec.notice is not None else "maintenance" if spec.maintenance else None


def _notice_taken(events: list[dict], kill: dict, by: str = "chaos") -> tuple[dict | None, dict | None]:
    """The notice (given by ``by``) before ``kill`` on its host, and the
    trainer's taking of a notice between the two (None where there is none)."""
    given = sorted((e for e in events if e.get("kind") == "notice_given" and e.get("by") == by
                    and e.get("host") == kill.get("host") and _t(e) <= _t(kill)), key=_t)
    if not given:
        return None, None
    taken = [e for e in events if e.get("kind") == "notice_received" and _t(given[-1]) <= _t(e) <= _t(kill)]
    return given[-1], (taken[0] if taken else None)


def _notice_save(events: list[dict], taken: dict, kill: dict) -> dict | None:
    """The save the notice asked, finalized before the kill (None: none):
    said finalized, or begun and restored from by a later group after the
    kill (a restore proves its checkpoint finalized, playbooks/runs/saves.py;
    ``proof`` says so)."""
    at = taken.get("step") if isinstance(taken.get("step"), int) else -1

    def after_notice(e: dict) -> bool:
        return isinstance(e.get("step"), int) and e["step"] > at and _t(taken) <= _t(e) <= _t(kill)
    done = [e for e in events if e.get("kind") == "checkpoint_finalized" and e.get("finalized") is True
            and after_notice(e)]
    if done:
        return done[0]
    restored = {e.get("step") for e in events if e.get("kind") in ("restore_started", "restored") and _t(e) > _t(kill)}
    begun = [e for e in events if e.get("kind") == "checkpoint_saved" and after_notice(e) and e["step"] in restored]
    return dict(begun[0], proof="no finalization said: a later group restored from it") if begun else None


def _notice(spec: Spec, kills: list[dict], events: list[dict]) -> list[str]:
    """The notice given to the host killed, taken by the trainer before the
    kill; a notice shorter than a save: its save not finished by the kill."""
    by = _notice_by(spec)
    if by is None or not kills:
        return []
    out = []
    if spec.maintenance and not [e for e in _chaos(events, "maintenance_scheduled") if _t(e) <= _t(kills[0])]:
        out.append("no maintenance scheduled by chaos before the kill")
    given, taken = _notice_taken(events, kills[0], by)
    if given is None:
        return out + [f"no notice given to {kills[0].get('host')} before its kill (by {by})"]
    if spec.notice is not None and abs(float(given.get("grace_s") or 0) - spec.notice) > 0.5:
        return out + [f"the notice gave {given.get('grace_s')} s, not {spec.notice}"]
    if taken is None:
        return out + ["the trainer took no notice before the kill"]
    if not spec.notice_holds and _notice_save(events, taken, kills[0]) is not None:
        return out + ["the notice's save finished before the kill: the notice was not shorter than a save"]
    return out


def _quarantines(events: list[dict], by: str) -> list[dict]:
    return sorted((e for e in events if e.get("kind") == "quarantined" and e.get("by") == by), key=_t)


def gate_failed_on(events: list[dict], host: str | None) -> list[dict]:
    """The health gates that failed ``host`` (its "<slice>-<host id>"), as
    the watch reads them (``restart.failed_hosts``): rank 0's verdict naming
    it, or the host's own checks failing (when the hosts' verdicts could not
    be gathered, only its own event names it)."""
    return sorted((e for e in events if any(f"{u.get('slice')}-{u.get('host')}" == host
                                            for u in failed_hosts(e))), key=_t)


def _sick(spec: Spec, facts: dict, events: list[dict]) -> list[str]:
    """The host made sick when described, and found sick by the gate's own
    checks (never by what chaos recorded)."""
    if spec.sick is None:
        return []
    sickened = _chaos(events, "host_sickened")
    host = facts.get("sick_host") or (sickened[0].get("host") if sickened else None)
    out: list[str] = []
    if spec.sick == "back":
        if not sickened:
            return ["no host made sick by chaos"]
    elif not facts.get("sick_before_job"):
        out.append("no host was sick before the job was submitted")
    if not gate_failed_on(events, host):
        out.append(f"no health gate found host {host} sick")
    return out


def _hangs(spec: Spec, facts: dict, events: list[dict]) -> list[str]:
    """The worker frozen as long as described; the stalled job stopped and resumed."""
    out: list[str] = []
    hangs = _chaos(events, "worker_hung")
    if spec.hang_s is not None:
        resumed = _chaos(events, "worker_resumed")
        if not hangs or not resumed:
            out.append("no worker frozen and resumed")
        elif _t(resumed[0]) - _t(hangs[0]) < spec.hang_s:
            out.append(f"the worker was frozen {_t(resumed[0]) - _t(hangs[0]):.1f} s, not {spec.hang_s:g}")
    if spec.never_resumes:
        if not hangs:
            out.append("no worker frozen")
        elif _chaos(events, "worker_resumed"):
            out.append("the frozen worker was resumed")
    if spec.stop:
        if not hangs:
            out.append("no worker frozen")
        if not any(e.get("kind") == "stopped" for e in events):
            out.append("the follower did not stop the stalled job")
        if facts.get("jobs", 1) < 2:
            out.append("no second job resumed the run")
    return out


def _restored_after(events: list[dict], kills: list[dict]) -> list[int | None]:
    """The step each loss's job restored from: the first restore after it
    and before the next loss (None: none)."""
    ends = [_t(k) for k in kills[1:]] + [float("inf")]
    out: list[int | None] = []
    for kill, end in zip(kills, ends):
        r = [e for e in events if e.get("kind") == "restore_started" and _t(kill) < _t(e) < end]
        out.append(min(r, key=_t).get("step") if r else None)
    return out


def _incidents(g: dict) -> list[dict]:
    return list(g.get("incidents") or [])


def _ended(i: dict) -> bool:
    """An incident its job's end ended before any recovery (the goodput
    report's ``ended``: a stalled job stopped by the follower)."""
    return bool(i.get("ended"))


def criteria(scenario: str, facts: dict, g: dict, events: list[dict],
             recovery: Recovery | None = None) -> list[Check]:
    """Each pass criterion of a run; every one of them can fail
    (``recovery``: the newest soak table's median, for a hang's bound)."""
    spec = SPECS[scenario]
    out: list[Check] = []
    outcome = str(facts.get("outcome", ""))
    out.append(Check("SUCCEEDED", facts.get("rc") == 0 and "SUCCEEDED" in outcome,
                     "" if facts.get("rc") == 0 and "SUCCEEDED" in outcome else
                     f"exit {facts.get('rc')}: {outcome[:160]}"))
    counted, want = (g.get("steps") or {}).get("counted"), facts.get("target_steps")
    out.append(Check("every step counted once", counted == want, f"{counted} counted of {want} asked"))
    incidents = _incidents(g)
    # An incident its job's end ended is over when the next job resumes the run (``resumed_s``).
    unrecovered = [i for i in incidents if i.get("recover_s") is None
                   and not (_ended(i) and spec.stop and i.get("resumed_s") is not None)]
    if unrecovered:
        out.append(Check("every incident recovered", False, "; ".join(
            f"{i['kind']} at step {i.get('lost_at_step')} not recovered" for i in unrecovered)))
    elif not incidents:
        out.append(Check("every incident recovered", False, "no incident in the report: the fault left no trace"))
    else:
        out.append(Check("every incident recovered", True, f"{len(incidents)} incident(s)"))
    if spec.hang_s is not None:
        stalls = [i for i in incidents if i.get("kind") == "stall"]
        out.append(Check("the hang seen as a stall", bool(stalls) and all(i.get("recover_s") is not None
                                                                           for i in stalls),
                         f"{len(stalls)} stall(s)" if stalls else "no stall in the report"))
    if spec.stop:
        stopped = [i for i in incidents if i.get("kind") == "stall" and _ended(i)]
        if not stopped:
            out.append(Check("the stopped stall's steps replayed", False,
                             "no stall reported as ended by its job's stop (it was counted recovered)"))
        else:
            i = stopped[0]
            lost, k, n = i.get("lost_at_step"), i.get("restored_from_step"), i.get("replayed_steps")
            right = lost is not None and k is not None and n == lost - k and i.get("resumed_s") is not None
            out.append(Check("the stopped stall's steps replayed", right,
                             f"lost at {lost}, the next job resumed from {k}, {n} replayed"))
    grows = [i for i in incidents if i.get("kind") == "resize"]
    if grows:
        bad = [i for i in grows if i.get("replayed_steps")]
        out.append(Check("no step replayed at a grow", not bad, "; ".join(
            f"the grow at step {i.get('lost_at_step')} replayed {i.get('replayed_steps')}" for i in bad)
            or f"{len(grows)} grow(s), 0 replayed"))
    else:
        out.append(Check("no step replayed at a grow", None,
                         "no grow: the host was back before the restart" if spec.targets else "no grow"))
    told = sum(i.get("replayed_steps") or 0 for i in incidents)
    ran = (g.get("steps") or {}).get("replayed")
    out.append(Check("the incidents' replayed steps were run again", told == ran,
                     f"incidents say {told}, steps run again {ran}"))
    return out + _acted(spec, facts, events, recovery) + _saves(spec, facts, g, events) + [_wall(facts, g)]


def _saves(spec: Spec, facts: dict, g: dict, events: list[dict]) -> list[Check]:
    """Every run: its saves accounted, made against due (goodput's
    ``saves``). A notice: its save finalized and nothing replayed, or, too
    short, at most one checkpoint period replayed and its save reported
    missing, never restored. A save cut by a kill: reported missing."""
    s = g.get("saves") or {}
    # A save lost: missing, or cut and made again by a later group (its step replayed).
    lost = [m for m in [*(s.get("missing") or []), *(s.get("cut") or [])] if isinstance(m, dict)]
    missing = {m.get("step"): m for m in lost}
    out = [accounted(s)]
    kills = _chaos(events, "worker_lost")
    if _notice_by(spec) is not None and kills:
        _given, taken = _notice_taken(events, kills[0], str(_notice_by(spec)))
        noticed = [i for i in _incidents(g) if i.get("notice")]
        replayed = [i.get("replayed_steps") for i in noticed]
        if spec.notice_holds:
            saved = _notice_save(events, taken, kills[0]) if taken else None
            out.append(Check("the notice's save finalized before the host went", saved is not None,
                             "no save finalized" if saved is None else f"step {saved.get('step')}: {saved['proof']}"
                             if saved.get("proof") else f"step {saved.get('step')} in {saved.get('seconds')} s"))
            out.append(Check("no step replayed after the notice", bool(noticed) and replayed == [0],
                             f"replayed {replayed}" if noticed else "no incident says its notice"))
        else:
            period = int(facts.get("checkpoint_period") or 0)
            said = str(facts.get("said_before") or "")
            out.append(Check("said before the notice that it cannot hold a save", "shorter than a save" in said,
                             said[:200] or "nothing said"))
            out.append(Check("at most one checkpoint period replayed", bool(noticed) and all(
                r is not None and r <= period for r in replayed),
                f"replayed {replayed} (period {period})" if noticed else "no incident says its notice"))
            restored = [e.get("step") for e in events if e.get("kind") == "restore_started"]
            finalized = {e.get("step") for e in events if e.get("kind") == "checkpoint_finalized"
                         and e.get("finalized") is True}
            asked = [m for m in lost if any("notice" in str(b) for b in m.get("due_by") or [])]
            out.append(Check("the notice's save reported not finalized", bool(asked),
                             "; ".join(f"{m.get('name')}: {m.get('why')}" for m in asked) or
                             f"no save asked by the notice among those lost: {s.get('line')}"))
            out.append(Check("restored only from a finalized save", bool(restored) and all(
                r in finalized for r in restored), f"restored from {restored}, finalized {sorted(finalized)[-3:]}"))
    if spec.cut_save:
        cut = facts.get("saving_step")
        m = missing.get(cut)
        out.append(Check("the cut save reported not finalized", m is not None,
                         f"step {cut}: {m.get('why')}" if m else f"step {cut} not among the saves lost "
                                                                 f"({sorted(k for k in missing if k is not None)})"))
    return out


def accounted(s: dict) -> Check:
    """The saves made equal the saves due, or each one not made is named
    with its cause (goodput's ``saves``: ``finalized`` of ``due``, each of
    the ``missing`` with its ``name`` and ``why``); a line alone, a count
    that does not add up, a save still in progress at the end or one
    missing with no cause fails."""
    line = str(s.get("line") or "no saves in the report")
    due, done = s.get("due"), s.get("finalized")
    if not s.get("known") or not isinstance(due, int) or due <= 0 or not isinstance(done, int):
        return Check("saves accounted", False, line)
    missing = [m for m in s.get("missing") or [] if isinstance(m, dict)]
    unnamed = [m for m in missing if not (m.get("name") and m.get("why"))]
    unsaid = due - done - len(missing)
    if not unnamed and unsaid == 0:
        return Check("saves accounted", True, line)
    why = [f"{unsaid} of the {due - done} not finalized not named with a cause"] if unsaid else []
    why += [f"{m.get('name') or 'a save'} missing with no cause said" for m in unnamed]
    return Check("saves accounted", False, f"{line}: " + "; ".join(why))


def _budget(events: list[dict]) -> list[Check]:
    """More hosts lost in one job than the old lifetime budget, each failure
    window within its own; and the job trained on between the losses."""
    out: list[Check] = []
    kills = _chaos(events, "worker_lost")
    counted = [e for e in events if e.get("kind") == "failure_counted"]
    most = max((int(e.get("failures") or 0) for e in counted), default=None)
    budget = counted[0].get("budget") if counted else None
    out.append(Check("more hosts lost than the old budget, each window within its own",
                     len(kills) > OLD_BUDGET and most is not None and budget is not None and most <= budget,
                     f"{len(kills)} lost (old budget {OLD_BUDGET}); at most {most} failure(s) in a window of "
                     f"{counted[0].get('window_s') if counted else '-'} s (budget {budget})" if counted else
                     f"{len(kills)} lost; no failure counted in a window (no failure_window?)"))
    restored = _restored_after(events, kills)
    steps = [r for r in restored if r is not None]
    out.append(Check("trained on between losses: each restored a later checkpoint",
                     len(steps) == len(kills) > 1 and all(b > a for a, b in itertools.pairwise(steps)),
                     f"restored from steps {restored}"))
    return out


def _acted(spec: Spec, facts: dict, events: list[dict], recovery: Recovery | None) -> list[Check]:
    """What the watch in the cluster did, nobody following: the hang's
    culprit named and set aside; a sick host set aside by the gate, and
    taken back once released; a job that is not elastic refused naming it."""
    out: list[Check] = []
    if spec.detached:
        by_us = [e for e in events if e.get("kind") in ("quarantined", "stopped", "stall_started", "hang_diagnosed")
                 and e.get("source") not in (WATCH, "chaos")]
        followers = facts.get("followers")
        sources = ", ".join(sorted({str(e.get("source")) for e in by_us}))
        out.append(Check("acted by the watch in the cluster, nobody following",
                         not by_us and followers == 0,
                         f"{len(by_us)} action(s) recorded by a follow ({sources})" if by_us else
                         f"{followers} `invoke` follow(s) of the job seen" if followers != 0 else
                         "every action the watch's"))
    if spec.budget:
        out += _budget(events)
    if spec.never_resumes:
        hung = _chaos(events, "worker_hung")
        host = hung[0].get("host") if hung else None
        named = [e for e in events if e.get("kind") == "hang_diagnosed"]
        culprits = [list(e.get("culprits") or []) for e in named]
        out.append(Check("the culprit named right", bool(named) and all(c == [host] for c in culprits),
                         f"hung {host}, named {culprits or 'none'}"))
        set_aside = [e for e in _quarantines(events, "stall_action: restart") if e.get("source") == WATCH]
        out.append(Check("the culprit set aside", [e.get("host") for e in set_aside] == [host],
                         f"set aside {[e.get('host') for e in set_aside] or 'none'}"))
        t_hang = _t(hung[0]) if hung else None
        after = [e for e in events if e.get("kind") == "step" and set_aside and _t(e) > _t(set_aside[0])]
        took = _t(min(after, key=_t)) - t_hang if after and t_hang is not None else None
        out.append(_hang_bound(took, recovery))
    if spec.sick is not None:
        host = facts.get("sick_host")
        set_aside = [e for e in _quarantines(events, "health gate") if e.get("source") == WATCH]
        out.append(Check("the sick host set aside by the gate", [e.get("host") for e in set_aside] == [host],
                         f"sick {host}, set aside {[e.get('host') for e in set_aside] or 'none'}"))
        if spec.sick == "back":
            released = facts.get("released_at")
            back = [e for e in events if e.get("kind") == "worker_started" and released is not None
                    and _t(e) > released and f"{e.get('slice')}-{e.get('host')}" == host]
            out.append(Check("released and healthy, taken back", bool(back),
                             f"a worker on {host} {_t(back[0]) - released:.0f} s after its release" if back else
                             f"no worker on {host} after its release"))
        else:
            line, rc = str(facts.get("refusal") or ""), facts.get("refusal_rc")
            out.append(Check("a job that is not elastic refused, naming the host",
                             rc not in (0, None) and bool(host) and str(host) in line and "\n" not in line.strip(),
                             f"exit {rc}: {line[:200]}"))
    return out


def _hang_bound(took: float | None, recovery: Recovery | None) -> Check:
    """The hang's time to the first step after the restart within
    stall_after plus the newest soak table's median time to recover, which
    it names."""
    name = "hang to the first step after the restart within stall_after + the median recovery"
    if recovery is None:
        return Check(name, False, "no soak table with a median time to recover in docs/")
    bound = round(HANG_STALL_AFTER + recovery.median_s, 1)
    said = f"bound {bound:g} s: stall_after {HANG_STALL_AFTER} s plus {recovery.text()}"
    if took is None:
        return Check(name, False, f"no step after the restart ({said})")
    return Check(name, took <= bound, f"{took:.1f} s ({said})")


def _wall(facts: dict, g: dict) -> Check:
    """The timeline's wall inside the soak's own stopwatch, and most of it."""
    t0, t1, jobs = facts.get("t_before"), facts.get("t_after"), int(facts.get("jobs") or 1)
    start, end, wall = g.get("start"), g.get("end"), g.get("wall_s")
    if None in (t0, t1, start, end, wall):
        return Check("wall within the soak's stopwatch", False, "no stopwatch or no wall")
    inside = start >= t0 - CLOCK_SLACK_S and end <= t1 + CLOCK_SLACK_S
    covers = (t1 - t0) - wall <= WRAP_S * jobs
    return Check("wall within the soak's stopwatch", inside and covers,
                 f"timeline {wall:.1f} s of the stopwatch's {t1 - t0:.1f} s" + (
                     "" if inside else ": it runs outside the stopwatch") + (
                     "" if covers else f": over {WRAP_S * jobs:g} s of it uncounted"))


def verdict(scenario: str, facts: dict, g: dict, events: list[dict], recovery: Recovery | None = None) -> Verdict:
    v = Verdict(exercised(scenario, facts, events))
    if g:
        v.checks = criteria(scenario, facts, g, events, recovery)
    else:
        v.checks = [Check("goodput report", False, "no report")]
    return v
