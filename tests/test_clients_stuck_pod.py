"""No pod delete hangs a run (issue 63): a pod whose node's kubelet is dead
stays Terminating (the fake keeps it, as the API server does, until a
delete with grace period 0: ``FakeKube.stop_kubelet``). A quarantine of its
slice, as `invoke hosts.quarantine` and as the watch run it, and
chaos.delete-worker / chaos.preempt-worker of that pod end within the bound
(``stuck_pod_after``): the pod force-deleted (``stuck_pod: force``) or left
Terminating (``leave``), with one line saying why; never a wait without end.

Through the kubernetes client's answer (the default) and through the real
kubectl (``TPU_PLAYBOOKS_PROCESSES_ONLY=1``), against the loopback fakes
(tests/clients.py). Each run has a deadline: a run that would wait for
ever fails the test at it instead."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.clients import ROOT, Cloud, ok_run, recap
from tests.test_clients_quarantine import POOL, WATCH, on_nodes, pool_nodes, up

pytestmark = [pytest.mark.clients, pytest.mark.both_ways]

AFTER = 3           # stuck_pod_after in these tests
DEADLINE = 150      # seconds a whole run may take here: far past the bound, far short of "never"
KUBECTL = {"TPU_PLAYBOOKS_PROCESSES_ONLY": "1"}


def dead_node(cloud: Cloud, choice: str) -> tuple[str, str]:
    """The slice up, the inventory's stuck_pod and a short bound, one node
    of the slice with its kubelet dead: (that node, its worker pod)."""
    cloud.change_inventory(stuck_pod=choice, stuck_pod_after=AFTER)
    nodes = up(cloud)
    node = sorted(nodes)[1]
    [pod] = on_nodes(cloud, [node])
    cloud.kube.stop_kubelet(node)
    return node, pod


def deletes(run, pod: str) -> list[object]:
    """The grace period of each DELETE of ``pod`` (None: the pod's own)."""
    return [(r.body or {}).get("gracePeriodSeconds", r.query.get("gracePeriodSeconds"))
            for r in run.kube if r.method == "DELETE" and r.path.endswith(f"/pods/{pod}")]


def line(node: str, pod: str, choice: str) -> str:
    done = "force-deleted" if choice == "force" else "left"
    return (f"pod {pod} still Terminating after {AFTER}s: its node {node} is NotReady (Kubelet stopped posting node "
            f"status.); {done} (stuck_pod: {choice})")


@pytest.mark.parametrize(("choice", "via"), [("force", {}), ("leave", KUBECTL)], ids=["force-client", "leave-kubectl"])
def test_a_quarantine_whose_pod_stays_terminating_ends_within_the_bound(cloud: Cloud, choice, via):
    node, pod = dead_node(cloud, choice)
    run = ok_run(cloud.invoke("hosts.quarantine", POOL, "--why=a dead kubelet", timeout=DEADLINE, **via))
    assert line(node, pod, choice) in run.out, run.out
    r = recap(run, "quarantine")
    assert r["failed"] == 0 and r["changed"] == 4, r            # record, cordon, taint, the pods
    if choice == "force":
        assert deletes(run, pod) == [None, 0]                    # the bounded delete, then grace 0
        assert cloud.kube.get("pods", pod, "default") is None
    else:
        assert deletes(run, pod) == [None]
        assert cloud.kube.get("pods", pod, "default")["metadata"]["deletionTimestamp"]
        again = ok_run(cloud.invoke("hosts.quarantine", POOL, "--why=again", timeout=DEADLINE, **via))
        assert again.changes == [], again.changes                # left: not deleted again
        assert f"({pod} Terminating, left: stuck_pod: leave)" in again.out, again.out
    if via:                                                      # the real kubectl ran the deletes, bounded
        ran = [p for p in run.started("kubectl") if " delete pod " in p]
        assert ran and all(f"--timeout={AFTER}s" in p for p in ran), ran
    # The other pods of the slice went as usual; every node is set aside.
    assert on_nodes(cloud, pool_nodes(cloud)) == ([] if choice == "force" else [pod])
    assert all(s.get("unschedulable") for s in pool_nodes(cloud).values())


def test_the_watchs_quarantine_of_a_slice_with_a_dead_kubelet_ends(cloud: Cloud):
    """The watch (stall_action: restart) sets the slice aside as
    runs/follow.py does, in one process: it ends, and the host is held."""
    node, pod = dead_node(cloud, "force")
    p = subprocess.run([sys.executable, "-c", WATCH, POOL, "hung in a collective"], env=cloud.env(), cwd=ROOT,
                       capture_output=True, text=True, timeout=DEADLINE)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    assert f"held after: ['{POOL}']" in p.stdout and line(node, pod, "force") in p.stdout, p.stdout[-3000:]
    assert cloud.kube.get("pods", pod, "default") is None


@pytest.mark.parametrize(("task", "choice", "via"), [
    (("chaos.delete-worker",), "force", KUBECTL),
    (("chaos.delete-worker",), "leave", {}),
    (("chaos.preempt-worker", "--grace=2"), "force", {}),
], ids=["delete-force-kubectl", "delete-leave-client", "preempt-force-client"])
def test_a_chaos_delete_of_a_pod_that_stays_terminating_ends_within_the_bound(cloud: Cloud, task, choice, via):
    node, pod = dead_node(cloud, choice)
    run = ok_run(cloud.invoke(*task, f"--target={pod}", timeout=DEADLINE, **via))
    assert line(node, pod, choice) in run.out, run.out
    assert recap(run, "chaos")["changed"] == 1 and recap(run, "chaos")["failed"] == 0
    grace = 2 if task[0] == "chaos.preempt-worker" else None
    assert deletes(run, pod) == ([grace, 0] if choice == "force" else [grace])
    assert (cloud.kube.get("pods", pod, "default") is None) == (choice == "force")
    assert re.search(rf"pod {pod}\b", run.out)
