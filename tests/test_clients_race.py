"""Two changing runs on one environment at once: the second waits for the
first's lock, saying who holds it and since when, then changes nothing (or,
with playbook.lock_wait 0, is refused in one line); a create answered
"already exists" (another machine's run made it meanwhile) looks again and is
ok, or waits for what is being made, instead of failing.

Through `invoke` against the loopback fakes (tests/fakes/); which commands
run as their real processes and which are answered in-process, as for a
user, and where both ways are compared: tests/clients.py.
"""
from __future__ import annotations

import re
import subprocess
import threading
import time

import pytest

from tests.clients import CLUSTER, NET1, ROOT, Cloud, Run, ok_run, recap
from tests.fakes.cloud import INVOKE, STANDARD

pytestmark = pytest.mark.clients

CHAIN = ("prereqs", "network", "cluster", "nodepools")
LOCK = ROOT / ".state" / STANDARD / "lock"
WAITING = re.compile(r"^waiting for pid (\d+) \(\S+@\S+, `invoke prereqs network cluster nodepools`, since "
                     r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \w+, \d+s ago\), which holds \.state/" + STANDARD +
                     r"/lock \(one changing run at a time on environment " + STANDARD + r"\): \d+s of at most "
                     r"1800s$", re.M)


def _together(cloud: Cloud, *args: str, apart: float = 0.3) -> list[Run]:
    """Two `invoke` runs of ``args``, the second ``apart`` seconds after the first."""
    runs: list[Run] = []
    lock = threading.Lock()

    def one() -> None:
        run = cloud.invoke(*args)
        with lock:
            runs.append(run)

    threads = [threading.Thread(target=one) for _ in range(2)]
    threads[0].start()
    time.sleep(apart)
    threads[1].start()
    for t in threads:
        t.join(900)
    assert len(runs) == 2
    return runs


def test_two_changing_chains_at_once_both_end_converged_the_second_after_waiting(cloud: Cloud):
    """Both runs of `prereqs network cluster nodepools` end converged: one
    makes everything, the other waits for its lock (one line that says who
    and since when, then a sign of life every heartbeat) and changes
    nothing; no failure for a resource the other made."""
    cloud.gcp.latency.update({"network": 2.0, "cluster": 4.0, "nodepool": 2.0})
    runs = _together(cloud, *CHAIN)
    for run in runs:
        ok_run(run)
        assert "failed: [" not in run.out and "already exists" not in run.out, run.out
    [waited] = [r for r in runs if WAITING.search(r.out)]
    [made] = [r for r in runs if r is not waited]
    assert WAITING.search(waited.out).group(1) != "?"
    assert "waiting for" not in made.out
    assert sum(recap(made, p)["changed"] for p in CHAIN) >= 8, made.out   # 3 roles, 2 VPCs, 2 subnets, cluster, ...
    assert [recap(waited, p)["changed"] for p in CHAIN] == [0, 0, 0, 0], waited.out
    assert LOCK.read_text() == ""            # released at the end of each chain


def test_with_lock_wait_0_the_second_run_is_refused_at_once_in_one_line(cloud: Cloud):
    cloud.seed_project()
    cloud.gcp.latency.update({"cluster": 8.0})
    first = subprocess.Popen([str(INVOKE), "network", "cluster"], env=cloud.env(), cwd=ROOT,
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while f'"pid": {first.pid}' not in (LOCK.read_text() if LOCK.exists() else ""):
            assert first.poll() is None and time.monotonic() < deadline, first.stdout.read() if first.stdout else ""
            time.sleep(0.1)
        second = cloud.invoke("network", "cluster", INVOKE_PLAYBOOK_LOCK_WAIT="0")
    finally:
        out, _ = first.communicate(timeout=600)
    assert first.returncode == 0, out
    assert second.rc == 75, second
    [line] = second.out.strip().splitlines()
    assert re.fullmatch(rf"error: one changing run at a time on environment {STANDARD}: pid {first.pid} \(\S+@\S+, "
                        r"`invoke network cluster`, since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \w+, \d+s ago\) holds "
                        rf"\.state/{STANDARD}/lock; run again when it ends \(playbook\.lock_wait is 0: not waited "
                        r"for\)", line), line


def test_a_create_answered_already_exists_by_another_machines_run_looks_again(cloud: Cloud):
    """Another machine's run (no lock of ours sees it) makes the first VPC
    and the cluster between this run's look and its create: the VPC is ok,
    made meanwhile; the cluster, still being created, is waited for, then
    ok; the run converges."""
    cloud.seed_project()
    cloud.gcp.latency["cluster"] = 3.0

    def other_vpc(req) -> None:
        with cloud.gcp.lock:
            cloud.gcp.add_network(NET1)

    def other_cluster(req) -> None:
        with cloud.gcp.lock:
            c = cloud.seed_cluster()
            cloud.gcp._later({"status": "DONE"}, "cluster", c)   # PROVISIONING for 3 s

    cloud.gcp.server.meanwhile("POST", r"/global/networks$", other_vpc)
    cloud.gcp.server.meanwhile("POST", r"/locations/us-east5-b/clusters$", other_cluster)
    run = ok_run(cloud.invoke("network", "cluster"))
    assert (f"ok: [network : VPC {NET1}] made meanwhile by another run: network {NET1} exists (mtu 8896, custom "
            "subnets)") in run.out, run.out
    assert f"The resource 'projects/fake-tpu-project/global/networks/{NET1}' already exists: looking again" in run.out
    assert f"Already exists: projects/fake-tpu-project/locations/us-east5-b/clusters/{CLUSTER}." in run.out
    assert re.search(rf"ok: \[cluster : GKE cluster {CLUSTER}\] made meanwhile by another run: cluster {CLUSTER} is "
                     r"RUNNING", run.out), run.out
    assert (recap(run, "network")["failed"], recap(run, "cluster")["failed"]) == (0, 0)
    assert len(run.calls("POST", r"/global/networks$")) == 2 and len(run.calls("POST", r"/clusters$")) == 1
