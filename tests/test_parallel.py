"""The scheduler: independent steps at once, dependencies respected, whole
blocks of output, and a failure that stops new work and names what is left."""
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
    return Step("t", name, lambda look: None, run=run, id=name, after=after)


def book(workers):
    lines = []
    lock = threading.Lock()

    def write(l):
        with lock:
            lines.append(l)
    return Playbook(Runner(Mode.APPLY, executor=None), Reporter(write), workers=workers), lines


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
    assert any("not run (stopped after a failure)" in l for l in lines)


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
