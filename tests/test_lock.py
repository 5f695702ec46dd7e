"""One TPU compile at a time on a machine: libtpu's own lock file makes a
second compile fail (and its message advises deleting the lock, which would
break the first). The preflight's lock makes the second wait, saying which
pid holds it; a holder that dies frees it."""
import getpass
import re
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from playbooks.core.lock import Busy, holder, machine_lock
from playbooks.job.fit import parse_compile

HOLD = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {root!r})
    from pathlib import Path
    from playbooks.core.lock import machine_lock
    with machine_lock(Path({path!r}), "test", lambda line: None, doing="invoke up"):
        print("held", flush=True)
        time.sleep(float(sys.argv[1]))
""")


WHO = f"{getpass.getuser()}@{socket.gethostname()}"


def hold(path, seconds):
    from tests.conftest import ROOT
    p = subprocess.Popen([sys.executable, "-c", HOLD.format(root=str(ROOT), path=str(path)), str(seconds)],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_second_compile_waits_for_the_first_and_names_its_pid(tmp_path):
    path = tmp_path / "compile.lock"
    first = hold(path, 1.5)
    told = []
    start = time.monotonic()
    with machine_lock(path, "one compile at a time", told.append, every=0.5, poll=0.05):
        waited = time.monotonic() - start
    first.wait(5)
    assert waited >= 1.0, waited
    assert told and re.match(rf"waiting for pid {first.pid} \({re.escape(WHO)}, `invoke up`, since "
                             rf"\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d \w+, \d+s ago\), which holds {path} "
                             rf"\(one compile at a time\): \ds$", told[0]), told
    assert len(told) >= 2  # a sign of life while it waits


def test_a_holder_that_dies_leaves_no_stale_lock(tmp_path):
    path = tmp_path / "compile.lock"
    first = hold(path, 60)
    first.kill()
    first.wait(5)
    told = []
    with machine_lock(path, "x", told.append, poll=0.05):
        pass
    assert told == []


def test_libtpus_advice_to_delete_its_lock_is_not_passed_on():
    text = ("RuntimeError: Unable to initialize backend 'tpu': ABORTED: The TPU is already in use by process with "
            "pid 4242. Not attempting to load libtpu.so in this process. If you still get this message, run "
            "\"$ sudo rm /tmp/libtpu_lockfile\".")
    fit = parse_compile(text)
    assert fit.error == ("libtpu is in use by pid 4242 on this machine: wait for it to end and run again (do not "
                         "delete /tmp/libtpu_lockfile while it runs)")


def test_the_preflight_compile_takes_the_lock(tmp_path, monkeypatch):
    from playbooks.core.connector import LocalConnector, Ran
    from playbooks.core.play import StepContext
    from playbooks.core.runner import Mode, Runner, StepLog
    from playbooks.core.step import Step
    from playbooks.job import fit as F
    from playbooks.job import spec
    from playbooks.plays import preflight
    from tests.conftest import env

    class Compiler(LocalConnector):  # stands in for the minutes-long compile: it does not fit
        def run(self, argv, env=(), input=None, cwd=None, timeout=None):
            return Ran(1, "", "jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: "
                       "CompileTimeHbmOom: Ran out of memory (40.00G) exceeds available HBM (31.24G)", 0.1)

    monkeypatch.setattr(F, "COMPILE_LOCK", tmp_path / "compile.lock")
    monkeypatch.setenv("PLAYBOOK_PREFLIGHT_CACHE", str(tmp_path / "cache"))
    lines: list[str] = []
    ctx = StepContext(Runner(Mode.APPLY, Compiler(str(tmp_path))), Step("preflight", "fit", run=lambda ctx: None),
                      StepLog(lines.append, False))
    dev = env("dev")
    job = spec.build_job(dev, "llama3-8b", sets=["per_device_batch_size=3"])
    # The holder keeps the lock until the compile has said it waits for it
    # (then it dies, which frees the lock): no race with a loaded machine.
    first = hold(tmp_path / "compile.lock", 60)
    waiting = f"waiting for pid {first.pid} ({WHO}, `invoke up`, since "
    done: list = []
    compile_ = threading.Thread(target=lambda: done.append(preflight.fit(ctx, dev, job)), daemon=True)
    compile_.start()
    deadline = time.monotonic() + 60
    while not any(waiting in line for line in lines) and time.monotonic() < deadline:
        time.sleep(0.05)
    first.kill()
    first.wait(5)
    compile_.join(60)
    assert any(waiting in line for line in lines), lines
    assert done and done[0] is not None and not done[0].fits and done[0].needed == 40.0, done


def test_a_waiter_is_refused_past_its_wait_limit_in_one_line_naming_the_holder(tmp_path):
    path = tmp_path / "lock"
    first = hold(path, 30)
    try:
        told = []
        start = time.monotonic()
        with pytest.raises(Busy) as e, machine_lock(path, "one changing run at a time", told.append, poll=0.05,
                                                    wait=0.6, shown="the/lock"):
            pass
        assert 0.6 <= time.monotonic() - start < 5
        line = str(e.value)
        assert "\n" not in line and e.value.exit_code == 75
        assert line.startswith(f"one changing run at a time: pid {first.pid} ({WHO}, `invoke up`, since "), line
        assert line.endswith("holds the/lock; waited 1s"), line
        assert told and told[0].endswith("which holds the/lock (one changing run at a time): 0s of at most 1s"), told
        with pytest.raises(Busy), machine_lock(path, "x", told.append, wait=0):   # 0: refused at once
            pass
    finally:
        first.kill()
        first.wait(5)


def test_the_lock_file_says_who_holds_it_and_since_when_and_is_emptied_after(tmp_path):
    path = tmp_path / "lock"
    before = time.time()
    with machine_lock(path, "x", lambda line: None, doing="invoke network cluster"):
        h = holder(path)
        assert (h.who, h.doing) == (WHO, "invoke network cluster") and before <= h.since <= time.time()
        assert h.pid == str(__import__("os").getpid())
    assert path.read_text() == ""
    path.write_text("4242\n")                  # an older holder's file: its pid only
    assert str(holder(path)) == "pid 4242"


def test_only_a_changing_task_in_apply_mode_takes_the_environments_lock_and_a_dry_run_nothing(monkeypatch):
    """A dry run and check mode take no lock (no file, nothing held), nor a
    task that only looks; a changing task in apply mode holds it, naming its
    command line, for its chain (a second task of the chain takes it again
    at once), until released."""
    from playbooks.cli import session
    from playbooks.config import paths

    monkeypatch.delenv("INVOKE_PLAYBOOK_ENV", raising=False)
    lock = paths.here(paths.env_lock("dev-autopilot"))
    existed = lock.exists()
    session.open_session({"playbook": {"env": "dev-autopilot"}, "run": {"dry": True}}, "up")
    assert session._HELD == {} and lock.exists() == existed
    opened = [session.open_session({"playbook": {"env": "dev-autopilot", "mode": "check"}}, "up"),
              session.open_session({"playbook": {"env": "dev-autopilot"}}, "capacity")]
    assert session._HELD == {}
    try:
        opened.append(session.open_session({"playbook": {"env": "dev-autopilot"}}, "network"))
        assert list(session._HELD) == ["dev-autopilot"] and holder(lock).doing == "invoke network"
        opened.append(session.open_session({"playbook": {"env": "dev-autopilot", "lock_wait": 0}}, "cluster"))
    finally:
        session.release_env_lock("dev-autopilot")
        for s in opened:   # their log folders, empty
            if s.logdir is not None:
                s.logdir.rmdir()
    assert session._HELD == {} and lock.read_text() == ""


def test_every_task_that_changes_the_environment_takes_its_lock_or_says_why_not():
    """Each session a task of tasks.py opens is one that only looks, one
    that takes the lock (for its chain, or up to a step: train --fresh), or
    one named in UNLOCKED with its reason. hosts.quarantine, hosts.release
    and hosts.maintenance take it: `up` beside a quarantine that makes the
    same pool again waits for it."""
    from playbooks.cli import session
    from tests.conftest import ROOT

    text = (ROOT / "tasks.py").read_text()
    opened = set(re.findall(r'_session\(c, "([a-z]+)"', text)) | set(re.findall(r'_report\(c, "([a-z]+)"', text))
    opened |= set(re.findall(r"^def (prereqs|network|cluster|nodepools|storage|raycluster|dashboard)\(", text, re.M))
    looks = set(session.READ_ONLY_TASKS) | set(session.LOCAL_ONLY) | {"capacity", "hosts"}
    assert {"quarantine", "release", "maintenance"} <= set(session.CHANGING)
    assert session.LOCKED_UNTIL == {"train": "train:checkpoints"}
    unplaced = opened - looks - set(session.CHANGING) - set(session.UNLOCKED)
    assert not unplaced, f"tasks that change the environment with no lock and no reason: {sorted(unplaced)}"
    assert all(len(why) > 40 for why in session.UNLOCKED.values())


def test_train_fresh_holds_the_lock_until_its_checkpoints_are_deleted_and_no_longer(monkeypatch):
    """`train --fresh` takes the environment's lock (its delete of the
    run's checkpoints waits for an `up`, and an `up` for it) and lets it go
    once that step has ended, before the hours of its follow; a train that
    is not fresh takes none; one in a chain that holds it already keeps it
    for the chain."""
    from playbooks.cli import session
    from playbooks.config import paths
    from playbooks.core.step import Step, ok

    monkeypatch.delenv("INVOKE_PLAYBOOK_ENV", raising=False)
    lock = paths.here(paths.env_lock("local"))
    held_at: dict[str, bool] = {}

    def step(sid: str) -> Step:
        def decide(look):
            held_at[sid] = "local" in session._HELD
            return ok("as asked")
        return Step("train", sid, decide, id=sid)

    opened = []
    try:
        plain = session.open_session({"playbook": {"env": "local"}}, "train")
        opened.append(plain)
        assert session._HELD == {} and plain.release_after is None
        fresh = session.open_session({"playbook": {"env": "local"}}, "train", changing=True)
        opened.append(fresh)
        assert list(session._HELD) == ["local"] and holder(lock).doing.startswith("invoke")
        fresh.run("train", [step("train:slices"), step("train:checkpoints"), step("train:job")], parallel=False)
        assert held_at == {"train:slices": True, "train:checkpoints": True, "train:job": False}, held_at
        assert session._HELD == {} and lock.read_text() == ""
        opened.append(session.open_session({"playbook": {"env": "local"}}, "up"))  # `invoke up train --fresh`
        chained = session.open_session({"playbook": {"env": "local"}}, "train", changing=True)
        opened.append(chained)
        assert chained.release_after is None, "the chain's lock is the chain's: not released by its train"
    finally:
        session.release_env_lock("local")
        for s in opened:
            if s.logdir is not None and s.logdir.exists() and not any(s.logdir.iterdir()):
                s.logdir.rmdir()
