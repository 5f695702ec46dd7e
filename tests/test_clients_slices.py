"""A chain that checks capacity first, another operation of the cluster waited
out, min_slices; Autopilot; `status` and why a worker is stuck.

Through `invoke` against the loopback fakes (tests/fakes/); which commands
run as their real processes and which are answered in-process, as for a
user, and where both ways are compared: tests/clients.py.
"""
from __future__ import annotations

import json
import re

import pytest

from tests.clients import (
    AUTOPILOT,
    BUCKET,
    CLUSTER,
    NET1,
    PROJECT,
    ROOT,
    Cloud,
    failed_run,
    ok_run,
    recap,
)
from tests.fakes import gcp as G

pytestmark = pytest.mark.clients



# -- 6c. a chain, another operation of the cluster, min_slices ----------------------------
def test_a_chain_that_will_make_node_pools_checks_capacity_before_its_first_change(cloud: Cloud):
    """`invoke network cluster nodepools` with 16 chips of quota for 32:
    the capacity checks run first, in the chain's first task; nothing is made."""
    cloud.gcp.set_quota("TPUS-PER-TPU-FAMILY-per-project-region", [({"region": "us-east5", "tpu_family": "CT6E"}, 16),
                                                                  ({}, 16)])
    run = failed_run(cloud.invoke("network", "cluster", "nodepools"))
    assert run.changes == [], run.changes
    refusal = ("the capacity options cannot make every slice: on-demand 1 (quota TPUS-PER-TPU-FAMILY (CT6E) in "
               "us-east5 permits 16 chips); missing 1 of 2 slices (16 chips, 16 per slice): request quota (IAM & Admin "
               "> Quotas), add an option to capacity: (spot, reservation, flex-start), or set slices: lower")
    assert f"failed: [capacity : plan for 2 slice(s)]\n  {refusal}\n" in run.out, run.out
    assert "PLAY [network" in run.out and "PLAY [cluster" not in run.out        # the chain stops there
    assert re.search(r"network : VPC maxtext-multislice-net-1 +not run", run.out), run.out
    assert recap(run, "network")["failed"] == 1


BUSY = {  # GKE's three forms of "another operation runs on the cluster"
    "incompatible": "Cluster is running incompatible operation operation-1700000000000-4a5b6c7d.",
    "currently": "Operation operation-1700000000000-4a5b6c7d is currently upgrading cluster maxtext-multislice. "
                 "Please wait and try again once it is done.",
    "repaired": "Cluster is currently being created, deleted, updated or repaired and cannot be updated.",
}


def test_node_pool_creates_wait_out_another_operation_of_the_cluster(cloud: Cloud):
    cloud.seed_to_cluster()
    cloud.gcp.server.fail("POST", r"/nodePools$", 400, G.gerror(400, BUSY["repaired"], "FAILED_PRECONDITION"), times=2)
    run = ok_run(cloud.invoke("nodepools"))
    posts = run.calls("POST", r"/nodePools$")
    assert sorted(r.status for r in posts) == [200, 200, 400, 400], [(r.status, r.body) for r in posts]
    assert sorted(r.body["nodePool"]["name"] for r in posts if r.status == 200) == ["v6e-16-0", "v6e-16-1"]
    waits = re.findall(r"^  retry  attempt \d+ until 1800s failed \(.*cannot be updated\.; a fresh look shows "
                       r"nothing changed\); again in [\d.]+s$", run.out, re.M)
    assert len(waits) == 2, run.out
    assert recap(run, "nodepools")["changed"] == 2


def test_teardown_waits_out_another_operation_of_the_cluster(cloud: Cloud):
    cloud.seed_full()
    cloud.get_credentials()
    cloud.gcp.server.fail("DELETE", rf"/clusters/{CLUSTER}$", 400,
                          G.gerror(400, BUSY["incompatible"], "FAILED_PRECONDITION"), times=1)
    run = ok_run(cloud.invoke("teardown", "--yes"))
    assert [r.status for r in run.calls("DELETE", rf"/clusters/{CLUSTER}$")] == [400, 200]
    assert re.search(r"^  retry  attempt 1 until 1800s failed \(.*running incompatible operation.*; a fresh look "
                     r"shows nothing changed\); again in", run.out, re.M), run.out
    assert not cloud.gcp.st.clusters


def test_a_flex_start_pool_that_stays_empty_leaves_one_slice_ready_and_names_the_other(cloud: Cloud):
    """min_slices: 1 and a flex-start pool that finds no capacity: `up` ends
    with one whole slice, the other named as waiting (here, in the recap,
    in `status`); a second `up` changes nothing; a job that is not elastic
    is refused, saying --elastic would start; the slice comes when the
    pool's nodes do."""
    cloud.change_inventory(capacity="flex-start", capacity_wait=600, min_slices=1)
    cloud.gcp.flex_start_empty.add("v6e-16-1")
    cloud.seed_to_cluster()
    run = ok_run(cloud.invoke("up"))
    waiting = "waiting: slice 1 (0 of 4 TPU workers ready: Pending: 0/"
    assert f"RayCluster maxtext-tpu-cluster: 1 of 2 slices ready (min_slices 1); {waiting}" in run.out, run.out
    assert re.search(r"^  raycluster : TPU slices of maxtext-tpu-cluster +ok +[\d.]+s\n +" + re.escape(waiting), run.out,
                     re.M), run.out
    assert "1 head + 4 of 8 TPU workers alive; 1 of 2 slices ready (min_slices 1); waiting: slice 1 (no host in Ray " \
           "yet)" in run.out
    assert recap(run, "up")["failed"] == 0

    status = ok_run(cloud.invoke("status"))
    assert re.search(r"status : RayCluster workers +as asked +1 of 2 slices ready \(min_slices 1\); " + re.escape(waiting)
                     + r".*; why: no node with free TPU chips", status.out), status.out
    assert re.search(r"status : TPU nodes ready +as asked +flex-start, nodes come as workers ask: v6e-16-1 \(flex-start\) "
                     r"0 of 4 nodes ready", status.out), status.out

    assert ok_run(cloud.invoke("up")).changes == []
    refused = failed_run(cloud.invoke("train", "--skip-preflight"))
    assert ("1 of 2 slices ready; waiting: slice 1 (no host in Ray yet): a job that is not elastic needs every slice; "
            "`invoke train --elastic` would start on the 1 ready and grow when the rest arrive") in refused.out
    assert not refused.calls("POST", r"/api/jobs")

    cloud.kube.set_pool_nodes("v6e-16-1", 4)                    # GKE found the chips: the pending workers run
    status = ok_run(cloud.invoke("status"))
    assert re.search(r"status : RayCluster workers +as asked +head and 8 TPU workers ready", status.out), status.out


# -- 9. Autopilot -------------------------------------------------------------------
def test_autopilot_cluster_is_regional_with_the_ray_operator_and_has_no_node_pools(cloud: Cloud):
    cloud.seed_project()
    run = ok_run(cloud.invoke("cluster", "nodepools", env_name=AUTOPILOT))
    [create] = run.calls("POST", rf"/container/v1/projects/{PROJECT}/locations/us-east5/clusters$")
    c = create.body["cluster"]
    assert c["name"] == "maxtext-autopilot" and c["autopilot"] == {"enabled": True}
    assert c["addonsConfig"]["rayOperatorConfig"] == {"enabled": True}
    assert c["initialClusterVersion"] == "1.35.2-gke.1842000"
    assert run.calls("POST", r"/nodePools$") == []
    assert recap(run, "nodepools")["skipped"] == 1
    kubeconfig = json.loads(cloud.client("kubectl", "config", "view", "--output=json").stdout)
    assert f"gke_{PROJECT}_us-east5_maxtext-autopilot" in [x["name"] for x in kubeconfig["contexts"]]


def test_autopilot_up_admits_the_workers_through_its_compute_class_and_makes_no_vpc(cloud: Cloud):
    """The tutorial's manifest would be refused by Autopilot (a privileged
    worker); ours has none, selects a ComputeClass with DRA networking that
    is applied first, and `up` makes no VPC. A second `up` changes nothing."""
    first = ok_run(cloud.invoke("up", env_name=AUTOPILOT))
    assert not first.calls("POST", r"/global/networks$") and not first.calls("POST", r"/subnetworks$")
    assert not [r for r in first.requests if "/compute/v1/" in r.path and r.method != "GET"]
    assert "skipped: [network : DCN networks] Autopilot: GKE makes and manages" in first.out
    [cc] = [r for r in first.kube if r.method == "POST" and r.path.endswith("/computeclasses")]
    [rc] = [r for r in first.kube if r.method == "POST" and r.path.endswith("/rayclusters")]
    assert cc.at < rc.at                                       # the ComputeClass before the RayCluster
    body = cloud.kube.body(rc)
    worker = body["spec"]["workerGroupSpecs"][0]["template"]["spec"]
    assert worker["containers"][0]["securityContext"] == {"capabilities": {"add": ["SYS_PTRACE"]}}
    assert worker["nodeSelector"]["cloud.google.com/compute-class"] == "maxtext-tpu-dranet"
    assert cloud.kube.get("computeclasses", "maxtext-tpu-dranet")["spec"]["nodePoolConfig"] == {
        "dra": {"networking": {"enabled": True}}}
    assert len(cloud.kube.worker_pods("maxtext")) == 8          # admitted: every worker runs
    assert "ok: [raycluster : Autopilot's rules] the rendered manifests keep Autopilot's rules" in first.out
    second = ok_run(cloud.invoke("up", env_name=AUTOPILOT))
    assert second.changes == [], second.changes
    assert recap(second, "up")["changed"] == 0

    # The tutorial's own worker (privileged) on the same Autopilot cluster:
    # refused; so is one adding a capability off Warden's list (ours adds
    # SYS_PTRACE, on it, and was admitted above).
    refused = {"tutorial-as-written": ('{"privileged": true}', "[denied by autogke-disallow-privilege]",
                                       "container ray-worker is privileged; not allowed in Autopilot"),
               "net-admin": ('{"capabilities": {"add": ["SYS_PTRACE", "NET_ADMIN"]}}',
                             "[denied by autogke-default-linux-capabilities]",
                             "linux capability 'NET_ADMIN' on container 'ray-worker' not allowed")}
    for name, (context, rule, why) in refused.items():
        event = _workers_refused(cloud, name, context)
        assert event and rule in event and why in event, (name, event)


def _workers_refused(cloud: Cloud, name: str, security_context: str) -> str | None:
    """Our RayCluster, named NAME, with this worker security context,
    applied with kubectl on the Autopilot cluster: Warden's refusal of its
    workers, as the event says it (None: they run)."""
    from playbooks.cloud import manifests
    from playbooks.config import tutorial
    from playbooks.core.render import render
    e = cloud.envdata(AUTOPILOT)
    values = dict(manifests.raycluster_values(e), WORKER_SECURITY_CONTEXT=security_context)
    text = render((ROOT / tutorial.RAYCLUSTER_MANIFEST).read_text(), values).replace(
        "name: maxtext-tpu-cluster", f"name: {name}")
    path = cloud.base / f"{name}-rc.yaml"
    path.write_text(text)
    ctx = f"--context=gke_{PROJECT}_us-east5_maxtext-autopilot"
    r = cloud.client("kubectl", "apply", "-f", str(path), ctx, env_name=AUTOPILOT)
    assert r.returncode == 0, r.stderr
    if cloud.kube.list("pods", "maxtext", f"ray.io/cluster={name},ray.io/node-type=worker"):
        return None
    [event, *_] = [ev["message"] for ev in cloud.kube.list("events", "maxtext") if ev["involvedObject"]["name"] == name]
    return event


def test_autopilot_teardown_neither_deletes_nor_expects_vpcs(cloud: Cloud):
    cloud.seed_full(AUTOPILOT)
    cloud.get_credentials(AUTOPILOT)
    run = ok_run(cloud.invoke("teardown", "--yes", env_name=AUTOPILOT))
    assert not [r for r in run.requests if "/compute/v1/" in r.path]
    assert [r.path.rsplit("/", 1)[-1] for r in run.requests if r.method == "DELETE" and "/clusters/" in r.path] == [
        "maxtext-autopilot"]
    assert "subnet" not in run.out.lower().split("play recap")[-1]


# -- 10. what is there, and why it is stuck --------------------------------------------
CAUSES = {
    "no-tpu": ({"scheduled": "0/5 nodes are available: 5 Insufficient google.com/tpu."},
               "no node with free TPU chips: the scheduler says '0/5 nodes are available: 5 Insufficient google.com/tpu.'"),
    "selector": ({"scheduled": "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."},
                 "no node matches the workers' node selector or compute class"),
    "claim": ({"scheduled": "0/4 nodes are available: 4 cannot allocate all claims."},
              "the DRANET NIC claim is not allocated"),
    "image": ({"waiting": ("ImagePullBackOff", 'Back-off pulling image "rayproject/ray:9.9.9-py312-tpu"')},
              "cannot pull image rayproject/ray: ImagePullBackOff: Back-off pulling image"),
    "crash": ({"phase": "Running", "waiting": ("CrashLoopBackOff", "back-off 5m0s restarting failed container"),
                   "restarts": 7, "log": "starting ray\nImportError: libtpu.so: cannot open shared object file\n"},
              "container ray-worker keeps crashing (7 restarts); its last lines: starting ray | ImportError: libtpu.so"),
    "mount": ({"events": (("FailedMount", 'MountVolume.SetUp failed for volume "gcs-fuse-csi-ephemeral" : rpc error: '
                                           'code = PermissionDenied desc = failed to get GCS bucket: googleapi: Error '
                                           '403: Caller does not have storage.objects.list access'),)},
              f"the GCS FUSE mount of gs://{BUCKET} is refused: the workload-identity binding of default/maxtext-ksa "
              f"(`invoke storage`)"),
}


@pytest.mark.parametrize("cause", list(CAUSES))
def test_each_cause_of_a_stuck_worker_is_said_in_one_line_by_the_kubernetes_client(cloud: Cloud, cause: str,
                                                                                 monkeypatch):
    """The real `kubernetes` client (its exec plugin: gke-gcloud-auth-plugin)
    against the fake API server: pods, their states and events."""
    from playbooks.cloud import kube_objects, slices
    cloud.seed_full()
    cloud.get_credentials()
    kwargs, words = CAUSES[cause]
    pods = cloud.kube.worker_pods("default")[:2]
    for p in pods:
        cloud.kube.break_pod("default", p, **kwargs)
    for k, v in cloud.env().items():
        monkeypatch.setenv(k, v)
    from playbooks.access import connectors
    monkeypatch.setattr(connectors, "_local", None)  # this machine's connector, with the fakes' environment
    e = cloud.envdata()
    # A slice is whole when every worker of its replica is ready: the broken
    # pods' replicas are not.
    broken = {slices.replica(cloud.kube.get("pods", p, "default")) for p in pods}
    s = slices.from_pods(e, cloud.kube.list("pods", "default"))
    assert s.head is True and set(s.whole) == {"slice 0", "slice 1"} - broken, s
    assert [name for name, _ in s.waiting] == sorted(broken), s
    found = kube_objects.causes(e)
    assert len(found) == 1, found               # one line per cause, not one per pod
    assert words in found[0] and f"(2 pods: {pods[0]}, {pods[1]})" in found[0], found


def test_status_names_a_pending_workers_cause_and_its_json_parses(cloud: Cloud):
    cloud.seed_full()
    cloud.get_credentials()
    ok = ok_run(cloud.invoke("status"))
    assert "diagnosis: everything is as the inventory asks" in ok.out, ok.out
    assert ok.changes == []
    [pod] = cloud.kube.worker_pods("default")[:1]
    cloud.kube.break_pod("default", pod, scheduled="0/5 nodes are available: 5 Insufficient google.com/tpu.")
    run = failed_run(cloud.invoke("status"))
    assert run.changes == []
    [line] = [ln for ln in run.out.splitlines() if ln.startswith("diagnosis: ")]
    # One worker down: its slice is not whole (every slice is asked for).
    assert re.match(r"diagnosis: status : RayCluster workers: 1 of 2 slices ready; waiting: slice [01] \(3 of 4 TPU "
                    r"workers ready: Pending: 0/5 nodes are available: 5 Insufficient google\.com/tpu\.\); why: no node "
                    r"with free TPU chips: the scheduler says '0/5 nodes are available: 5 Insufficient "
                    r"google\.com/tpu\.'", line), line
    assert re.search(r"status : jobs +as asked +0 job\(s\): none", run.out), run.out
    out = cloud.invoke("status", "--json").out      # (its one-line verdict is on stderr, merged here)
    doc = json.loads(out[out.index("{\n"):out.rindex("\n}") + 2])
    assert doc["as_asked"] is False and "Insufficient google.com/tpu" in doc["diagnosis"]
    assert {i["what"] for i in doc["items"]} >= {"cluster : GKE cluster maxtext-multislice", "status : TPU nodes ready",
                                                  "status : RayCluster workers", "status : jobs"}


def test_a_long_create_gives_a_sign_of_life_also_while_other_steps_run(cloud: Cloud):
    cloud.gcp.latency["network"] = 5.0
    run = ok_run(cloud.invoke("network", INVOKE_PLAYBOOK_HEARTBEAT="2"))
    beats = [ln for ln in run.out.splitlines() if "still running" in ln]
    assert beats, run.out
    # Both VPCs are made at once, so each step's lines come whole at its end;
    # its heartbeat comes at once, named by its step.
    assert re.search(rf"^  \[network : VPC {NET1}\] \d+s: `gcloud compute networks create \.\.\.` still running; "
                     rf"network {NET1}: present \(mtu 8896", "\n".join(beats), re.M), beats
    first = next(ln for ln in beats if NET1 in ln)
    assert run.out.index(first) < run.out.index(f"TASK [network : VPC {NET1}] *")
    assert run.out.splitlines()[1].startswith("logs: .state/"), run.out[:300]   # where the logs go, at the start
