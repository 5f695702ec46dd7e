"""Notices on GKE against the loopback fakes (issue 37):
chaos.preempt-worker deletes a worker pod with the grace asked (its preStop
hook, in the RayCluster the fake holds, gives the notice); chaos.maintenance
labels the pod's slice's nodes as GKE labels a scheduled host maintenance,
which `invoke status` then says and the watch's look reads
(plays/slice_notice.py ``coming``); hosts.maintenance starts a slice's
maintenance with GKE's perform-maintenance label, once (a second run changes
nothing), and in check mode says so and changes nothing.

The pod delete, the labels and the reads of the nodes are kubectl command
lines the `kubernetes` client answers in-process (the run's log says so of
each), as for a user; in each test's `[processes]` run (marker both_ways)
each is the real kubectl process (tests/clients.py). The maintenance exclusion's
renewal is the real gcloud's update."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from playbooks.config import host_notice
from tests.clients import Cloud, failed_run, logged, ok_run, recap
from tests.conftest import ROOT

pytestmark = [pytest.mark.clients, pytest.mark.both_ways]

SCHEDULED = "cloud.google.com/scheduled-maintenance-time"
PERFORM = "cloud.google.com/perform-maintenance"


@pytest.fixture
def up(cloud: Cloud) -> Cloud:
    cloud.seed_full()
    cloud.get_credentials()
    return cloud


def pool_of(cloud: Cloud, pod: str) -> str:
    p = next(p for p in cloud.kube.list("pods", "default") if p["metadata"]["name"] == pod)
    node = next(n for n in cloud.kube.list("nodes") if n["metadata"]["name"] == p["spec"]["nodeName"])
    return node["metadata"]["labels"]["cloud.google.com/gke-nodepool"]


def labels(cloud: Cloud, pool: str) -> list[dict]:
    return [n["metadata"]["labels"] for n in cloud.kube.list("nodes")
            if n["metadata"]["labels"].get("cloud.google.com/gke-nodepool") == pool]


def test_the_raycluster_workers_carry_the_prestop_hook_that_gives_the_notice(up: Cloud):
    [rc] = up.kube.list("rayclusters", "default")
    [group] = rc["spec"]["workerGroupSpecs"]
    [container] = group["template"]["spec"]["containers"]
    assert container["lifecycle"] == host_notice.prestop_hook()


def test_preempt_deletes_one_worker_pod_with_the_grace_asked(up: Cloud):
    run = ok_run(up.invoke("chaos.preempt-worker", "--grace=15"))
    [deleted] = [r for r in run.requests if r.method == "DELETE"]
    assert deleted.path.startswith("/api/v1/namespaces/default/pods/")
    assert deleted.query.get("gracePeriodSeconds") == "15" or (deleted.body or {}).get("gracePeriodSeconds") == 15, \
        (deleted.query, deleted.body)
    assert recap(run, "chaos")["changed"] == 1  # the delete (the credentials are there)
    bad = failed_run(up.invoke("chaos.preempt-worker", "--grace=0"))
    assert bad.out.strip().splitlines()[-1] == "error: --grace 0: must be a whole number of seconds from 1 to 3600"


def test_a_maintenance_scheduled_by_chaos_is_read_by_status_and_the_watch_then_started_once(up: Cloud):
    pod = sorted(up.kube.worker_pods("default"))[-1]
    pool = pool_of(up, pod)
    before = int(time.time())
    ok_run(up.invoke("chaos.maintenance", "--in=3600", f"--target={pod}"))
    at = {int(lb[SCHEDULED]) for lb in labels(up, pool)}
    assert len(at) == 1 and before + 3600 <= at.pop() <= int(time.time()) + 3600
    other = [lb for p in ("v6e-16-0", "v6e-16-1") if p != pool for lb in labels(up, p)]
    assert other and not any(SCHEDULED in lb for lb in other)
    # The watch's look at what is coming (plays/slice_notice.py): its kubectl reads, in a process of its own.
    look = subprocess.run([sys.executable, "-c", (
        "import json; from playbooks.plays import slice_notice; from playbooks.config.schema import load_inventory; "
        "import os; e = load_inventory(os.environ['INVOKE_PLAYBOOK_INVENTORY']).env(os.environ['INVOKE_PLAYBOOK_ENV']); "
        "print(json.dumps(slice_notice.coming(e)))")], env=up.env(), cwd=ROOT, capture_output=True, text=True,
        timeout=120)
    assert look.returncode == 0, look.stderr[-2000:]
    coming = json.loads(look.stdout.strip().splitlines()[-1])
    assert list(coming) == [pool] and coming[pool][1].startswith("host maintenance at "), coming
    status = ok_run(up.invoke("status")).out
    assert (f"{pool}: maintenance " in status and "in 59 min" in status) or "in 1 h" in status, status[-3000:]
    # Its start: in check mode nothing changes; then the label, once.
    checked = ok_run(up.invoke("hosts.maintenance", pool, INVOKE_PLAYBOOK_MODE="check"))
    assert not any(PERFORM in lb for lb in labels(up, pool)) and checked.changes == []
    since = time.time()
    first = ok_run(up.invoke("hosts.maintenance", pool))
    assert all(lb.get(PERFORM) == "true" for lb in labels(up, pool))
    [label] = [t for t in logged(up, "maintenance", since) if t.startswith("$ kubectl label nodes ")]
    said = "answered in-process by the kubernetes client: no kubectl process ran"
    ran = [p for p in first.started("kubectl") if p.startswith("kubectl label nodes ")]
    assert (len(ran), said in label.splitlines()[1]) == ((1, False) if up.processes_only else (0, True)), label
    assert len([r for r in first.requests if r.method == "PATCH"]) == len(labels(up, pool))
    again = ok_run(up.invoke("hosts.maintenance", pool))
    assert [r for r in again.requests if r.method == "PATCH"] == []
    assert recap(again, "maintenance")["changed"] == 0


RENEW = """
import os, sys
from invoke import Config
from playbooks.cli import task_steps
from playbooks.cli.session import open_session
c = Config(overrides={"playbook": {"inventory": os.environ["INVOKE_PLAYBOOK_INVENTORY"],
                                   "env": os.environ["INVOKE_PLAYBOOK_ENV"]}})
s = open_session(c, "train")
q = task_steps.follow_quarantine(s.env, True)
r = s.run("train", q.renew(sys.argv[1]), parallel=False)
"""


def test_the_follows_watch_renews_the_maintenance_hold_that_ends_within_a_day(up: Cloud):
    """The watch's renewal (follow.Watch.renew_hold runs these steps every
    6 hours), through the engine (the real gcloud's update; its read of the
    cluster answered in-process unless --processes-only): an exclusion of the
    run ending within a day is removed and added for 7 more days; one in
    force is left; none (released) stays none."""
    from tests.fakes import gcp as G
    hold = "playbooks-train-rayjob-elastic-8b"

    def renew() -> str:
        p = subprocess.run([sys.executable, "-c", RENEW, "rayjob-elastic-8b"], env=up.env(), cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
        return p.stdout

    def exclusions() -> dict:
        c = up.gcp.st.clusters[("us-east5-b", "maxtext-multislice")]
        return ((c.get("maintenancePolicy") or {}).get("window") or {}).get("maintenanceExclusions") or {}

    assert "nothing to renew" in renew() and hold not in exclusions()
    up.gcp.add_exclusion("us-east5-b", "maxtext-multislice", hold, days=0.5)
    out = renew()
    assert f"renewed maintenance exclusion {hold}" in out, out[-2000:]
    end = G._rfc3339(exclusions()[hold]["endTime"])
    assert end is not None and (end - G._rfc3339(exclusions()[hold]["startTime"])).total_seconds() > 6.9 * 86400
    assert "holds" in renew()
