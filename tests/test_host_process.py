"""A simulated TPU host's process (``playbooks/twin/host_process.py``): a
`ray start` that exits non-zero before it could have started (Ray's 30 s
for a node to register, run out on a loaded machine) is started again, up
to three times in all; one that ran longer is not; SIGTERM reaches the
command and ends both; a late host (rehearse_late_slice) waits, or joins at
once on SIGUSR1. Commands here are small Python programs standing for `ray
start`, counting their starts; the e2e (test_local_e2e.py) starts real
hosts through it, a late one joined by SIGUSR1."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from playbooks.config.schema import load_inventory
from playbooks.twin import host_process, nodes
from tests.conftest import ROOT, env

# Counts its starts in argv[1]; exits with argv[2]'s status while fewer
# than argv[3] starts were made, 0 after; sleeps argv[4] seconds first.
COUNTING = ("import pathlib, sys, time; p = pathlib.Path(sys.argv[1]); n = int(p.read_text()) + 1 if p.exists() "
            "else 1; p.write_text(str(n)); time.sleep(float(sys.argv[4])); "
            "sys.exit(int(sys.argv[2]) if n < int(sys.argv[3]) else 0)")


def counting(tmp_path: Path, rc: int, ok_from: int, sleep: float = 0.0) -> list[str]:
    return [sys.executable, "-c", COUNTING, str(tmp_path / "starts"), str(rc), str(ok_from), str(sleep)]


def starts(tmp_path: Path) -> int:
    return int((tmp_path / "starts").read_text())


def test_a_start_that_fails_at_once_is_made_again_until_it_runs(tmp_path, capfd):
    assert host_process.run(counting(tmp_path, 1, 3), again_after=0) == 0
    assert starts(tmp_path) == 3
    out = capfd.readouterr().out
    assert out.count("before its node started: starting it again") == 2, out
    assert "(3 of 3)" in out


def test_three_starts_that_fail_end_with_the_last_status(tmp_path):
    assert host_process.run(counting(tmp_path, 7, 99), again_after=0) == 7
    assert starts(tmp_path) == host_process.ATTEMPTS == 3


def test_a_host_that_ran_and_then_ended_is_not_started_again(tmp_path):
    assert host_process.run(counting(tmp_path, 1, 99, sleep=0.6), started_after=0.5, again_after=0) == 1
    assert starts(tmp_path) == 1


def waits_for_usr1(pid: int) -> bool:
    """In its sigtimedwait (the kernel's wait channel; during the wait the
    kernel takes the waited signal out of SigBlk), or with SIGUSR1 blocked
    just before it."""
    try:
        if "sigtimedwait" in Path(f"/proc/{pid}/wchan").read_text():
            return True
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigBlk:"):
                return bool(int(line.split()[1], 16) & (1 << (signal.SIGUSR1 - 1)))
    except OSError:
        pass
    return False


def test_as_a_process_it_joins_on_sigusr1_and_passes_sigterm_on(tmp_path):
    marker = tmp_path / "term"
    child = ("import pathlib, signal, sys, time; "
             f"signal.signal(signal.SIGTERM, lambda *a: (pathlib.Path({str(marker)!r}).write_text('term'), "
             "sys.exit(0))); "
             f"pathlib.Path({str(tmp_path / 'started')!r}).write_text('x'); time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-m", "playbooks.twin.host_process", "--join-after=600", sys.executable, "-c",
                          child],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # SIGUSR1 only once it waits for it; before, it would end the process
        deadline = time.monotonic() + 60
        while not waits_for_usr1(p.pid) and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.1)
        time.sleep(0.5)
        assert not (tmp_path / "started").exists(), "it waits its seconds"
        os.kill(p.pid, signal.SIGUSR1)
        deadline = time.monotonic() + 30
        while not (tmp_path / "started").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (tmp_path / "started").exists(), "SIGUSR1: it joins now"
        os.kill(p.pid, signal.SIGUSR1)   # again, once joined: ignored
        time.sleep(0.5)
        assert p.poll() is None
        os.kill(p.pid, signal.SIGTERM)
        assert p.wait(timeout=30) == 0
        assert marker.read_text() == "term", "the command was told, and stopped in its own way"
    finally:
        if p.poll() is None:
            p.kill()


def test_without_a_wait_it_starts_the_command_at_once(tmp_path):
    p = subprocess.run([sys.executable, "-m", "playbooks.twin.host_process", *counting(tmp_path, 0, 1)], cwd=ROOT,
                       timeout=60)
    assert p.returncode == 0 and starts(tmp_path) == 1
    assert subprocess.run([sys.executable, "-m", "playbooks.twin.host_process"], cwd=ROOT,
                          capture_output=True, timeout=60).returncode == 2


def test_every_hosts_command_is_this_module_before_ray_start_a_late_one_with_its_wait():
    e = env("local", min_slices=1, rehearse_late_slice=40)
    late = next(h for h in nodes.hosts_of(e) if h.slice == e.slices - 1)
    argv = nodes.host_command(e, late, nodes.late_seconds(e, late)).argv
    assert argv[:6] == ("python", "-m", "playbooks.twin.host_process", "--join-after=40", "ray", "start")
    assert nodes.pidfile(e, late.name).marker in " ".join(argv), "the pid file's marker is in its command line"
    first = next(h for h in nodes.hosts_of(e) if h.slice == 0)
    assert nodes.host_command(e, first).argv[:5] == ("python", "-m", "playbooks.twin.host_process", "ray", "start")
    assert nodes.host_command(e, first, devices=3).argv[:5] == nodes.host_command(e, first).argv[:5], \
        "a host started sick by chaos too"
    assert load_inventory().env("local").rehearse_late_slice is None


def test_a_host_started_again_sets_aside_the_logs_of_its_dead_workers_not_a_live_ones(tmp_path):
    """A host brought back rejoins its Ray session with the same temp
    folder: its new log monitor would send the old workers' output to the
    job again (the e2e saw a killed worker's steps twice). Those of workers
    no longer alive go to logs/old/ before `ray start`; a live worker's
    stay, and so does every other file."""
    session = tmp_path / "session_2026-12-06_17-03-40_062981_25893"
    (session / "logs").mkdir(parents=True)
    (tmp_path / "session_latest").symlink_to(session)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    dead_pid, live_pid = int(dead.stdout), os.getpid()
    names = {f"worker-4534df3cf07e-02000000-{dead_pid}.out": "dead", f"worker-4534df3cf07e-02000000-{dead_pid}.err": "dead",
             f"worker-907a86c4a9fe-02000000-{live_pid}.out": "live", "raylet.err": "raylet",
             f"python-core-worker-4534df3cf07e_{dead_pid}.log": "core"}
    for name, text in names.items():
        (session / "logs" / name).write_text(text)
    command = [*counting(tmp_path, 0, 1), f"--temp-dir={tmp_path}"]
    assert host_process.run(command, again_after=0) == 0 and starts(tmp_path) == 1
    assert sorted(p.name for p in (session / "logs" / "old").iterdir()) == sorted(
        n for n, t in names.items() if t == "dead")
    assert sorted(p.name for p in (session / "logs").iterdir() if p.is_file()) == sorted(
        n for n, t in names.items() if t != "dead")
    # No session yet (a host's first start), or no --temp-dir: nothing to do.
    assert host_process.set_aside_dead_workers_logs(["ray", "start", f"--temp-dir={tmp_path / 'new'}"]) == []
    assert host_process.set_aside_dead_workers_logs(["ray", "start"]) == []
