"""The scheduler: independent steps at once, dependencies respected, whole
blocks of output, and a failure that stops new work and names what is left."""
import re
import threading
import time

from playbooks.core.play import Outcome, Playbook
from playbooks.core.recap import CHANGED, FAILED, Reporter
from playbooks.core.runner import Mode, Runner
from playbooks.core.step import Step


def step(name, seconds=0.2, after=(), outcome=CHANGED, log=None):
    def run(ctx):
        log.append(("start", name, time.monotonic()))
        ctx.log.emit("apply", f"work {name}")
        time.sleep(seconds)
        log.append(("end", name, time.monotonic()))
        return Outcome(outcome, name)
    return Step("t", name, run=run, id=name, after=after)


def book(workers, heartbeat=30.0):
    lines = []
    lock = threading.Lock()

    def write(ln):
        with lock:
            lines.append(ln)
    return Playbook(Runner(Mode.APPLY), Reporter(write), workers=workers, heartbeat=heartbeat), lines


def test_independent_steps_overlap_and_dependencies_wait():
    log = []
    steps = [step("net-1", 0.3, log=log), step("net-2", 0.3, log=log),
             step("subnet-1", 0.1, after=("net-1",), log=log), step("cluster", 0.3, log=log),
             step("pool", 0.1, after=("cluster", "subnet-1"), log=log)]
    b, lines = book(4)
    start = time.monotonic()
    recap = b.run("t", steps)
    wall = time.monotonic() - start
    assert recap.counters() == "ok=0 changed=5 failed=0 skipped=0"
    assert wall < 0.9  # sequential would be 1.1 s
    at = {(kind, name): t for kind, name, t in log}
    assert at[("start", "subnet-1")] >= at[("end", "net-1")]
    assert at[("start", "pool")] >= max(at[("end", "cluster")], at[("end", "subnet-1")])
    assert at[("start", "net-2")] < at[("end", "net-1")]  # ran together
    # Each step's lines come whole: banner, its lines, its outcome, together.
    for name in ("net-1", "net-2", "cluster"):
        i = lines.index(f"TASK [t : {name}] " + "*" * (72 - len(f"TASK [t : {name}] ")))
        assert lines[i + 1] == f"  apply  work {name}" and lines[i + 2].startswith(f"changed: [t : {name}]")
    assert [r.title for r in recap.results] == [f"t : {s.id}" for s in steps]  # recap in plan order


def test_a_failure_stops_new_work_and_names_what_is_left():
    log = []
    steps = [step("a", 0.1, outcome=FAILED, log=log), step("b", 0.4, log=log),
             step("c", 0.1, after=("a",), log=log), step("d", 0.1, after=("b",), log=log)]
    b, lines = book(4)
    recap = b.run("t", steps)
    started = {name for kind, name, _ in log if kind == "start"}
    assert started == {"a", "b"}            # b was running: it finished
    assert ("end", "b") in {(k, n) for k, n, _ in log}
    assert recap.counters() == "ok=0 changed=1 failed=1 skipped=0"
    assert recap.not_run == ["t : c", "t : d"]
    assert any("not run (stopped after a failure)" in ln for ln in lines)


def test_bounded_concurrency():
    log = []
    steps = [step(f"s{i}", 0.2, log=log) for i in range(6)]
    b, _ = book(2)
    b.run("t", steps)
    events = sorted((t, kind) for kind, _, t in log)
    running = peak = 0
    for _, kind in events:
        running += 1 if kind == "start" else -1
        peak = max(peak, running)
    assert peak == 2


def test_a_step_that_runs_alone_prints_its_banner_once_and_its_lines_as_they_come():
    log = []
    b, lines = book(4)
    b.run("t", [step("first", 0.1, log=log), step("second", 0.1, after=("first",), log=log)])
    for name in ("first", "second"):
        head = f"TASK [t : {name}] "
        assert len([ln for ln in lines if ln.startswith(head)]) == 1, lines
    assert not [ln for ln in lines if ln.endswith(" started")], lines


def test_the_same_failure_of_several_steps_is_printed_once_with_the_steps_it_stopped():
    from playbooks.core.errors import ProbeFailed

    message = ("ERROR: ({}) You do not currently have an active account selected.\nPlease run:\n\n"
               "  $ gcloud auth login\n\nto obtain new credentials.")

    def denied(name, group):
        def run(ctx):
            time.sleep(0.05)
            raise ProbeFailed(name, f"gcloud {group} list", 1, "", message.format(f"gcloud.{group}.list"),
                              why="could not look (exit code 1): no account")
        return Step("t", name, run=run, id=name)

    b, lines = book(4)
    recap = b.run("t", [denied("a", "services"), denied("b", "compute.networks"), denied("c", "container")])
    text = "\n".join(lines)
    assert text.count("to obtain new credentials") == 1, text       # the message, once
    # Which step's block comes first (and holds the message) is whichever ended first.
    first = re.search(r"^failed: \[t : (\w)\]\n  could not look", text, re.M)
    assert first, text
    assert text.count(f"]\n  the same failure as [t : {first[1]}] (above)") == 2, text   # the two other blocks
    assert "one failure stopped 3 steps (t : a, t : b, t : c): could not look (exit code 1): no account" in text
    assert recap.count(FAILED) == 3


def test_keep_going_runs_every_independent_check():
    log = []
    b, _ = book(4)
    recap = b.run("t", [step("a", 0.01, outcome=FAILED, log=log), step("b", 0.01, log=log),
                        step("c", 0.01, outcome=FAILED, log=log)], keep_going=True)
    assert [n for k, n, _ in log if k == "start"] == ["a", "b", "c"]
    assert recap.counters() == "ok=0 changed=1 failed=2 skipped=0" and recap.not_run == []


def test_check_mode_and_dry_runs_never_say_a_thing_happened():
    for mode in (Mode.CHECK, Mode.DRY):
        lines = []
        b = Playbook(Runner(mode), Reporter(lines.append), workers=1)
        b.run("t", [Step("t", "x", run=lambda ctx: Outcome(CHANGED, "port-forward started"),
                         id="x")])
        assert "changed: [t : x] would change: port-forward started" in lines, lines


def test_check_mode_looks_once_where_a_pending_change_explains_the_failure():
    """Check mode: a step after one that would change probes once (its
    failure is expected, a skip with the reason); a step that waits on no
    change retries a transient failure as apply mode does."""
    from playbooks.access.cli_clients import json_object
    from playbooks.core.command import Command
    from playbooks.core.connector import LocalConnector
    from playbooks.core.facts import Fact
    from playbooks.core.runner import RetryPolicy
    from playbooks.core.step import change, ok

    slept: list[float] = []
    busy = Command(("sh", "-c", "echo 'code=503 try again' >&2; exit 1"))
    probe = Fact(name="thing", command=busy, parse=json_object("thing"))

    def runner() -> Runner:
        return Runner(Mode.CHECK, LocalConnector("."), RetryPolicy(attempts=3, base=1.0,
                                                                   is_transient=lambda c, p: True, sleep=slept.append))

    lines: list[str] = []
    a = Step("t", "a", lambda look: change(Command(("true",)), reason="made"), id="a")
    b = Step("t", "b", lambda look: ok(look(probe)), id="b", after=("a",))
    recap = Playbook(runner(), Reporter(lines.append), workers=1).run("t", [a, b])
    assert recap.counters() == "ok=0 changed=1 failed=0 skipped=1", lines
    assert slept == [] and not any("retry" in ln for ln in lines), lines
    alone = Step("t", "c", lambda look: ok(look(probe)), id="c")
    recap = Playbook(runner(), Reporter(lines.append), workers=1).run("t", [alone])
    assert recap.counters() == "ok=0 changed=0 failed=1 skipped=0" and slept == [1.0, 2.0], lines


def test_a_long_wait_says_what_it_waits_for_even_while_others_run(monkeypatch):
    from playbooks.core.facts import Fact
    from playbooks.core.step import Verify, change

    left = iter(["0/8 workers"] * 6 + [None])
    fact = Fact(name="workers", python=lambda: next(left), display="kubectl get raycluster x")
    slow = Step("t", "slow", lambda look: change(reason="applied"), id="slow",
                verify=Verify(fact, lambda v: v, timeout=10, interval=0.05))
    b, lines = book(4, heartbeat=0.1)
    recap = b.run("t", [slow, step("other", 0.05, log=[])])
    beats = [ln for ln in lines if ln.startswith("  [t : slow] ") and "0/8 workers" in ln]
    assert beats and "s of at most 10s: 0/8 workers" in beats[0], lines
    # printed before the step's block (others ran at once: the block comes whole at the end)
    assert lines.index(beats[0]) < lines.index(next(ln for ln in lines if ln.startswith("TASK [t : slow] *")))
    assert recap.counters() == "ok=0 changed=2 failed=0 skipped=0"


def test_a_long_command_says_how_long_and_what_its_verify_fact_shows(monkeypatch):
    from playbooks.core.command import Command
    from playbooks.core.connector import LocalConnector
    from playbooks.core.facts import Fact
    from playbooks.core.step import Verify, change

    states = iter(["PROVISIONING"] * 20 + ["RUNNING"] * 100)
    fact = Fact(name="cluster c", python=lambda: next(states), display="gcloud container clusters list")
    create = Step("t", "cluster", lambda look: change(Command(("sleep", "0.7")), reason="created"), id="c",
                  verify=Verify(fact, lambda v: None if v == "RUNNING" else f"status {v}", timeout=5, interval=0.05))
    lines = []
    b = Playbook(Runner(Mode.APPLY, LocalConnector(".")), Reporter(lines.append), workers=1, heartbeat=0.15)
    recap = b.run("t", [create])
    beats = [ln for ln in lines if ln.startswith("  waiting")]
    assert beats, lines
    assert "s: `sleep 0.7 ...` still running; cluster c: PROVISIONING, status PROVISIONING" in beats[0], beats
    assert recap.counters() == "ok=0 changed=1 failed=0 skipped=0"
