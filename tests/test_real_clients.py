"""The playbooks driven through the REAL gcloud, gsutil, kubectl (with
gke-gcloud-auth-plugin) and ray CLIs, against loopback fakes of GCP, the GKE
cluster's Kubernetes API and the Ray dashboard (tests/fakes/).

Each test runs ``invoke`` as a user would (a subprocess, a temp inventory,
apply mode) and asserts on what the fakes received. "Changing requests" are
POST/PUT/PATCH/DELETE, minus the RPCs that are POSTs by protocol but change
nothing (getIamPolicy, compute operations/wait, the OAuth token endpoint).

The dashboard play is included in `invoke up`: the fake dashboard answers on
the inventory's dashboard_port (as the port-forward would), so the play
finds it and `ray list nodes` reads the fake cluster's Ray pods from it.
"""
from __future__ import annotations

import json
import re

import pytest

from tests.fakes import gcp as G
from tests.fakes.cloud import AUTOPILOT, PROJECT, PROJECT_NUMBER, ROOT, TOKEN, USER, Cloud, Run, cloud, cloud_session

pytestmark = pytest.mark.clients

__all__ = ["cloud", "cloud_session"]  # fixtures, used by name

# The controller-host tests share these fakes' environment and .state/ folder:
# collected here, they run in this file's worker (tests/controller_cases.py).
from tests.controller_cases import (  # noqa: E402,F401
    controller,
    test_an_unreachable_controller_is_one_line_and_unreachable_in_the_recap,
    test_dns_control_plane_asks_for_the_dns_endpoint,
    test_doctor_through_the_controller_checks_the_controllers_tools,
    test_internal_control_plane_without_a_controller_is_refused_in_one_line,
    test_project_files_reach_a_controller_without_sftp_through_cat,
    test_the_dry_run_through_a_controller_is_the_local_one_naming_the_controller,
    test_up_through_the_controller_converges_and_a_second_run_sends_no_change,
)

NET1, NET2 = "maxtext-multislice-net-1", "maxtext-multislice-net-2"
CLUSTER = "maxtext-multislice"
BUCKET = f"{PROJECT}-ckpt"
ZONE_PATH = f"/container/v1/projects/{PROJECT}/locations/us-east5-b"
WORKLOAD_PRINCIPAL = (f"principal://iam.googleapis.com/projects/{PROJECT_NUMBER}/locations/global/"
                      f"workloadIdentityPools/{PROJECT}.svc.id.goog/subject/ns/default/sa/maxtext-ksa")


def bodies(run: Run, method: str, pattern: str) -> list[dict]:
    return [r.body for r in run.calls(method, pattern)]


def recap(run: Run, play: str) -> dict:
    found = [r for r in run.recaps() if r["play"] == play]
    assert found, f"no recap for {play}\n{run}"
    return found[-1]


def affinity_values(pod_spec: dict) -> list[str]:
    """The capacity options the TPU workers' node affinity admits (our label)."""
    [term] = pod_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    [expr] = term["matchExpressions"]
    assert (expr["key"], expr["operator"]) == ("tpu-playbooks/capacity", "In")
    return expr["values"]


def recap_lines(run: Run, play: str) -> str:
    """The recap block of a play (its step lines and their notes)."""
    return run.out.split(f"PLAY RECAP [{play} ", 1)[1].split("\n\n", 1)[0]


def ok_run(run: Run) -> Run:
    assert run.rc == 0, str(run)
    return run


def failed_run(run: Run) -> Run:
    assert run.rc != 0, str(run)
    return run


# -- 1. up from empty, then up again -------------------------------------------------
def test_up_from_empty_creates_the_tutorial_then_second_run_changes_nothing(cloud: Cloud):
    first = ok_run(cloud.invoke("up"))
    r = recap(first, "up")
    assert (r["changed"], r["failed"]) == (15, 0), first.out

    # §1 the APIs and the user's three roles
    assert bodies(first, "POST", r"/services:batchEnable$") == [
        {"serviceIds": ["container.googleapis.com", "cloudbuild.googleapis.com"]}]
    policy = cloud.gcp.st.iam
    for role in ("roles/container.admin", "roles/iam.serviceAccountAdmin", "roles/cloudbuild.builds.editor"):
        assert any(b["role"] == role and f"user:{USER}" in b["members"] for b in policy["bindings"]), role
    assert len(first.calls("POST", r":setIamPolicy$")) == 3

    # §2 two custom-mode VPCs with MTU 8896, one subnet each with its range
    nets = bodies(first, "POST", r"/global/networks$")
    assert sorted((n["name"], n["mtu"], n["autoCreateSubnetworks"]) for n in nets) == [
        (NET1, 8896, False), (NET2, 8896, False)]
    subs = {s["name"]: s for s in bodies(first, "POST", r"/regions/us-east5/subnetworks$")}
    assert subs["tpu-subnet-1"]["ipCidrRange"] == "10.50.0.0/16"
    assert subs["tpu-subnet-1"]["network"].endswith(f"/global/networks/{NET1}")
    assert subs["tpu-subnet-2"]["ipCidrRange"] == "10.60.0.0/16"
    assert subs["tpu-subnet-2"]["network"].endswith(f"/global/networks/{NET2}")

    # §3 the Standard cluster, zonal, with the tutorial's flags
    [create] = first.calls("POST", ZONE_PATH + "/clusters$")
    c = create.body["cluster"]
    assert c["name"] == CLUSTER and c["initialClusterVersion"] == "1.35.2-gke.1842000"
    assert c["addonsConfig"]["rayOperatorConfig"] == {"enabled": True}
    assert c["addonsConfig"]["gcsFuseCsiDriverConfig"] == {"enabled": True}
    assert c["networkConfig"]["datapathProvider"] == "ADVANCED_DATAPATH"        # --enable-dataplane-v2
    assert c["workloadIdentityConfig"] == {"workloadPool": f"{PROJECT}.svc.id.goog"}
    assert c["nodePools"][0]["config"]["machineType"] == "n1-standard-16"
    assert "autopilot" not in c

    # ... whose endpoint and CA the real get-credentials wrote, with the auth plugin
    kubeconfig = json.loads(cloud.client("kubectl", "config", "view", "--raw", "--output=json").stdout)
    ctx = f"gke_{PROJECT}_us-east5-b_{CLUSTER}"
    [kc] = [x["cluster"] for x in kubeconfig["clusters"] if x["name"] == ctx]
    assert kc["server"] == cloud.kube.url and kc.get("certificate-authority-data")
    [user] = [u["user"] for u in kubeconfig["users"] if u["name"] == ctx]
    assert user["exec"]["command"] == "gke-gcloud-auth-plugin"
    assert first.kube and all(r.headers.get("authorization") == f"Bearer {TOKEN}" for r in first.kube)

    # §4 two TPU v6e node pools, one 4x4 slice of 4 hosts each, on both DCN networks, DRANET label
    pools = {p["nodePool"]["name"]: p["nodePool"] for p in bodies(first, "POST", r"/nodePools$")}
    assert sorted(pools) == ["v6e-16-0", "v6e-16-1"]
    for p in pools.values():
        assert p["config"]["machineType"] == "ct6e-standard-4t"
        assert p["placementPolicy"]["tpuTopology"] == "4x4"
        assert p["initialNodeCount"] == 4
        assert p["config"]["labels"] == {"cloud.google.com/gke-networking-dra-driver": "true",
                                         "tpu-playbooks/capacity": "on-demand"}
        assert p["config"]["gvnic"] == {"enabled": True}
        assert p["config"]["advancedMachineFeatures"]["threadsPerCore"] == "1"
        assert p["config"]["oauthScopes"] == ["https://www.googleapis.com/auth/cloud-platform"]
        nets = [(n["network"].rsplit("/", 1)[-1], n["subnetwork"].rsplit("/", 1)[-1])
                for n in p["networkConfig"]["additionalNodeNetworkConfigs"]]
        assert nets == [(NET1, "tpu-subnet-1"), (NET2, "tpu-subnet-2")]

    # §5 the bucket (gsutil mb), the KSA, the workload-identity binding
    [mb] = first.calls("POST", r"^/storage/v1/b$")
    assert mb.query["project"] == PROJECT
    assert (mb.body["name"], mb.body["location"].lower(), mb.body["storageClass"].upper()) == (
        BUCKET, "us-east5", "STANDARD")
    assert first.calls("POST", r"^/oauth2/token$"), "gsutil authenticated through the fake token endpoint"
    bucket_policy = cloud.gcp.st.bucket_iam[BUCKET]
    assert {"role": "roles/storage.objectUser", "members": [WORKLOAD_PRINCIPAL]} in bucket_policy["bindings"]
    assert [cloud.kube.body(r)["metadata"]["name"] for r in first.calls("POST", r"/default/serviceaccounts$")] == [
        "maxtext-ksa"]

    # §7 the DRANET claim template and the RayCluster, applied; it became ready
    [claim] = bodies(first, "POST", r"/resourceclaimtemplates$")
    req = claim["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert (claim["metadata"]["name"], req["deviceClassName"], req["count"]) == ("two-netdev", "netdev.google.com", 2)
    [rc] = bodies(first, "POST", r"/rayclusters$")
    [group] = rc["spec"]["workerGroupSpecs"]
    assert (rc["metadata"]["name"], group["replicas"], group["numOfHosts"]) == ("maxtext-tpu-cluster", 2, 4)
    assert group["template"]["spec"]["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == "4x4"
    assert "1 head + 8 TPU workers alive" in first.out

    # Second run: every step ok, nothing sent that could change anything.
    second = ok_run(cloud.invoke("up"))
    r2 = recap(second, "up")
    assert (r2["ok"], r2["changed"], r2["failed"], r2["skipped"]) == (23, 0, 0, 0), second.out
    assert second.changes == [], second.changes


# -- 2. a run that fails halfway, then a re-run ------------------------------------
def test_failed_create_halfway_then_rerun_converges_without_duplicates(cloud: Cloud):
    cloud.seed_project()
    cloud.seed_networks()
    quota = G.gerror(403, "Insufficient regional quota to satisfy request: resource \"TPUS_V6E_PER_PROJECT\": "
                          "request requires '16.0' and is short '16.0'.", "PERMISSION_DENIED", "quotaExceeded")
    cloud.gcp.server.fail("POST", r"/nodePools$", 403, quota, skip=1)   # the second pool's create

    first = failed_run(cloud.invoke("cluster", "nodepools"))
    assert "Insufficient regional quota" in first.out
    assert recap(first, "cluster")["changed"] == 1
    np = recap(first, "nodepools")
    assert (np["changed"], np["failed"]) == (1, 1)
    assert [r.status for r in first.calls("POST", r"/nodePools$")] == [200, 403]
    # The pools are created at once: which one's POST came second is a race.
    refused = [r.body["nodePool"]["name"] for r in first.calls("POST", r"/nodePools$") if r.status == 403]

    second = ok_run(cloud.invoke("cluster", "nodepools"))
    c = recap(second, "cluster")
    assert (c["ok"], c["changed"], c["failed"]) == (2, 0, 0)
    np2 = recap(second, "nodepools")
    assert (np2["ok"], np2["changed"], np2["failed"]) == (5, 1, 0)     # the 3 capacity checks, the plan, the other pool
    assert [r.body["nodePool"]["name"] for r in second.calls("POST", r"/nodePools$")] == refused
    assert [r.path for r in second.changes] == [ZONE_PATH + f"/clusters/{CLUSTER}/nodePools"]

    both = first.requests + second.requests
    assert not [r for r in both if r.status == 409], "no create of something that exists"
    created = [r.body.get("cluster", r.body.get("nodePool", {})).get("name")
               for r in both if r.method == "POST" and r.status == 200 and G.changes(r)]
    assert sorted(created) == [CLUSTER, "v6e-16-0", "v6e-16-1"]
    st = cloud.gcp.st
    assert len(st.clusters) == 1
    pools = st.clusters[("us-east5-b", CLUSTER)]["nodePools"]
    assert sorted(p["name"] for p in pools) == ["default-pool", "v6e-16-0", "v6e-16-1"]
    assert all(p["status"] == "RUNNING" for p in pools)


def test_check_mode_from_empty_changes_nothing_and_says_what_it_cannot_check_yet(cloud: Cloud):
    run = ok_run(cloud.invoke("up", INVOKE_PLAYBOOK_MODE="check"))
    assert run.changes == []                      # not one mutating request
    r = recap(run, "up")
    assert r["failed"] == 0 and r["changed"] >= 8, run.out
    assert re.search(r"network : subnet tpu-subnet-1 +changed", run.out)   # its probe can answer
    assert "would change: created" in run.out
    # What needs the cluster cannot look before it exists: skipped, with why.
    assert re.search(r"raycluster : RayCluster \S+ +skipped .*cannot be checked before .*cluster : GKE cluster "
                     r"maxtext-multislice change \(check mode changes nothing\)", run.out), run.out
    assert re.search(r"nodepools : TPU node pool v6e-16-0 +skipped", run.out)
    assert cloud.gcp.st.networks == {}


def test_check_mode_chaos_before_credentials_is_skipped_not_failed(cloud: Cloud):
    cloud.seed_full()          # a cluster with its RayCluster, but no kubeconfig context here yet
    run = ok_run(cloud.invoke("chaos.delete-worker", INVOKE_PLAYBOOK_MODE="check"))
    assert run.changes == []
    assert re.search(r"chaos : delete one Ray TPU worker pod +skipped .*cannot be checked before chaos : kubectl "
                     r"credentials changes", run.out), run.out


# -- 3. drift: the resource exists with another shape -------------------------------
def test_network_with_another_mtu_is_drift(cloud: Cloud):
    cloud.seed_networks(mtu=1460)
    run = failed_run(cloud.invoke("network"))
    assert f"drift: network {NET1}: mtu is 1460, want 8896" in run.out
    # Both VPCs are probed at once (they are independent): both drifts are
    # reported; the subnets, which depend on them, are not run.
    assert recap(run, "network")["failed"] == 2
    assert re.search(r"network : subnet tpu-subnet-1 +not run", run.out)
    assert run.changes == []
    assert cloud.gcp.st.networks[NET1]["mtu"] == 1460     # never overwritten


def test_node_pool_with_another_topology_is_drift(cloud: Cloud):
    cloud.seed_project()
    cloud.seed_networks()
    cloud.seed_cluster()
    cloud.seed_pools(topology="2x2")
    run = failed_run(cloud.invoke("nodepools"))
    assert "drift: node pool v6e-16-0: TPU topology is 2x2, want 4x4" in run.out
    assert run.changes == []


# -- 4. 401/403 on a probe (and a list that says it is incomplete) -----------------
@pytest.mark.parametrize("case", ["compute-403", "subnets-403", "storage-401", "kube-403", "clusters-missing-zone"])
def test_denied_probe_stops_the_run_and_is_never_read_as_absent(cloud: Cloud, case: str):
    cloud.seed_project()
    if case == "compute-403":
        denied = G.forbidden("compute.networks.list", f"projects/{PROJECT}")
        cloud.gcp.server.fail("GET", r"/global/networks$", 403, denied, times=99)
        run = failed_run(cloud.invoke("network"))
        message, create = "Required 'compute.networks.list' permission", r"/global/networks$"
    elif case == "subnets-403":
        # gcloud's regional list exits 0 on this unless told not to (gke.STRICT_COMPUTE_LISTS)
        cloud.gcp.add_network(NET1)
        cloud.gcp.add_network(NET2)
        denied = G.forbidden("compute.subnetworks.list", f"projects/{PROJECT}")
        cloud.gcp.server.fail("GET", r"/subnetworks$", 403, denied, times=99)
        run = failed_run(cloud.invoke("network"))
        message, create = "Required 'compute.subnetworks.list' permission", r"/subnetworks$"
    elif case == "storage-401":
        cloud.gcp.server.fail("GET", rf"^/storage/v1/b/{BUCKET}$", 401, G.unauthenticated(), times=99)
        run = failed_run(cloud.invoke("storage"))
        message, create = "UNAUTHENTICATED: Request had invalid authentication credentials", r"^/storage/v1/b$"
    elif case == "clusters-missing-zone":
        # Not a 403: GKE answers 200 but says a zone did not respond; gcloud
        # warns and exits 0 with a list that may lack the cluster.
        cloud.gcp.server.fail("GET", r"/locations/-/clusters$", 200, {"clusters": [], "missingZones": ["us-east5-b"]},
                              times=99)
        run = failed_run(cloud.invoke("cluster"))
        message, create = "The following zones did not respond: us-east5-b", r"/clusters$"
    else:
        cloud.seed_networks()
        cloud.seed_cluster()
        cloud.seed_bucket()
        denied = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403,
                  "message": 'serviceaccounts "maxtext-ksa" is forbidden: User "tester@example.com" cannot get '
                             'resource "serviceaccounts" in API group "" in the namespace "default"'}
        cloud.kube.server.fail("GET", r"/serviceaccounts/maxtext-ksa$", 403, denied, times=99)
        run = failed_run(cloud.invoke("storage"))
        message, create = 'serviceaccounts "maxtext-ksa" is forbidden', r"/serviceaccounts$"
    assert "could not look" in run.out and message in run.out, run.out
    assert run.calls("POST", create) == [], "a denied probe was read as absent"
    assert run.changes == [], run.changes
    assert "=> absent" not in run.out


# -- 5. transient errors --------------------------------------------------------------
def test_transient_errors_are_retried_with_backoff_then_succeed(cloud: Cloud):
    cloud.seed_networks()
    cloud.gcp.server.fail("GET", r"/global/networks$", 503, G.unavailable(), times=2)
    cloud.gcp.server.fail("GET", r"/regions/us-east5/subnetworks$", 429, G.rate_limited(), times=1)
    run = ok_run(cloud.invoke("network"))
    retries = [line for line in run.out.splitlines() if line.strip().startswith("retry")]
    assert len(retries) == 3, run.out
    assert "attempt 1 of 5 failed (ERROR: (gcloud.compute.networks.list)" in retries[0]
    assert "again in 1.0s" in retries[0] and "attempt 2 of 5" in retries[1] and "again in 2.0s" in retries[1]
    assert "(gcloud.compute.networks.subnets.list)" in retries[2] and "again in 1.0s" in retries[2]
    assert len(run.calls("GET", r"/global/networks$")) == 3
    r = recap(run, "network")
    assert (r["ok"], r["changed"], r["failed"]) == (4, 0, 0)


def test_transient_errors_that_do_not_pass_stop_after_the_bounded_retries(cloud: Cloud):
    cloud.gcp.server.fail("GET", r"/global/networks$", 503, G.unavailable(), times=99)
    run = failed_run(cloud.invoke("network"))
    assert len([ln for ln in run.out.splitlines() if ln.strip().startswith("retry")]) == 4
    assert len(run.calls("GET", r"/global/networks$")) == 5                 # RetryPolicy.attempts
    assert "could not look" in run.out
    assert run.calls("POST", r"/global/networks$") == []


# -- 5b. faults with texts the code has never seen, as each client prints them -------
def unseen(code: int) -> dict:
    """An error body whose message no rule of the code knows: only the status
    (as the client prints it, or does not) can tell what it is."""
    import secrets
    return G.gerror(code, f"zq-{secrets.token_hex(4)} something nobody wrote a rule for",
                    {429: "RESOURCE_EXHAUSTED", 503: "UNAVAILABLE", 403: "PERMISSION_DENIED",
                     400: "INVALID_ARGUMENT"}[code], "somethingNew")


def retries(run: Run) -> list[str]:
    return [line.strip() for line in run.out.splitlines() if line.strip().startswith("retry")]


def test_compute_create_answered_503_twice_is_tried_again_after_a_fresh_look(cloud: Cloud):
    # gcloud compute prints only the server's message: its debug log has the status.
    cloud.gcp.server.fail("POST", r"/global/networks$", 503, unseen(503), times=2)
    run = ok_run(cloud.invoke("network"))
    assert sorted(cloud.gcp.st.networks) == [NET1, NET2]
    posts = run.calls("POST", r"/global/networks$")
    assert [r.status for r in posts].count(503) == 2 and len(posts) == 4, [r.status for r in posts]
    assert len([r for r in retries(run) if "a fresh look shows nothing changed" in r]) == 2, run.out
    assert "something nobody wrote a rule for" in run.out
    assert recap(run, "network")["changed"] == 4


def test_a_create_whose_answer_was_lost_is_not_made_twice(cloud: Cloud):
    # The network is created, but the answer is a 503: the fresh look finds it.
    cloud.gcp.server.fail("POST", r"/global/networks$", 503, unseen(503), times=1, after=True)
    run = ok_run(cloud.invoke("network"))
    assert len(run.calls("POST", r"/global/networks$")) == 2       # one per network, none again
    assert any("but a fresh look shows the change was made" in r for r in retries(run)), run.out
    assert not [r for r in run.requests if r.status == 409]
    assert recap(run, "network")["changed"] == 4


def test_a_403_or_400_with_an_unseen_text_is_never_retried(cloud: Cloud):
    cloud.gcp.server.fail("POST", r"/global/networks$", 403, unseen(403), times=99)
    run = failed_run(cloud.invoke("network"))
    assert len(run.calls("POST", r"/global/networks$")) == 2        # each network tried once
    assert retries(run) == [], run.out
    assert "something nobody wrote a rule for" in run.out
    cloud.reset()
    cloud.seed_project()
    cloud.seed_networks()
    cloud.seed_cluster()
    cloud.gcp.server.fail("POST", r"/nodePools$", 400, unseen(400), times=99)
    run = failed_run(cloud.invoke("nodepools"))
    assert len(run.calls("POST", r"/nodePools$")) == 2 and retries(run) == [], run.out


@pytest.mark.parametrize("case", ["storage-429", "container-503", "compute-429"])
def test_a_probe_answered_429_or_503_with_an_unseen_text_is_retried(cloud: Cloud, case: str):
    # (gcloud's apitools commands, `services` and `projects`, retry 5xx
    # themselves first: tests/test_transient.py reads their output.)
    cloud.seed_project()
    task, method, path, code = {
        "storage-429": ("storage", "GET", rf"^/storage/v1/b/{BUCKET}$", 429),     # gcloud storage: RESOURCE_EXHAUSTED
        "container-503": ("cluster", "GET", r"/clusters$", 503),                  # gcloud container: code=503
        "compute-429": ("network", "GET", r"/global/networks$", 429),             # gcloud compute: only its debug log
    }[case]
    if task == "storage":
        cloud.seed_cluster()
        cloud.get_credentials()
    cloud.gcp.server.fail(method, path, code, unseen(code), times=1)
    run = ok_run(cloud.invoke(task))
    assert len(retries(run)) == 1 and "attempt 1 of 5 failed" in retries(run)[0], run.out
    assert "something nobody wrote a rule for" in retries(run)[0]
    assert "could not look" not in run.out, run.out
    statuses = [r.status for r in run.calls(method, path)]
    assert statuses[0] == code and statuses[1] != code, statuses


# -- 5c. doctor, against the fakes ------------------------------------------------------
def test_doctor_checks_credentials_project_and_context(cloud: Cloud):
    run = ok_run(cloud.invoke("doctor"))
    assert "gcloud authenticates with the access token in" in run.out
    assert f"project {PROJECT} is readable with these credentials" in run.out
    assert "does not exist yet: no context to check" in run.out
    cloud.seed_project()
    cloud.seed_cluster()
    run = failed_run(cloud.invoke("doctor"))
    assert f"but the kubeconfig has no context gke_{PROJECT}_us-east5-b_{CLUSTER}" in run.out
    assert recap(run, "doctor")["failed"] == 1        # and every other check ran
    cloud.get_credentials()
    run = ok_run(cloud.invoke("doctor"))
    assert f"context gke_{PROJECT}_us-east5-b_{CLUSTER} reaches Kubernetes" in run.out
    cloud.gcp.server.fail("GET", r"/crm/v1/projects/", 403, G.forbidden("resourcemanager.projects.get",
                                                                       f"projects/{PROJECT}"), times=99)
    run = failed_run(cloud.invoke("doctor"))
    assert "resourcemanager.projects.get" in run.out


# -- 6. a node pool left in ERROR (GCE_STOCKOUT) ----------------------------------------
def test_stockout_is_reported_and_the_broken_pool_is_replaced_on_rerun(cloud: Cloud):
    cloud.seed_project()
    cloud.seed_networks()
    cloud.seed_cluster()
    cloud.gcp.stockouts.append(G.Stockout("v6e-16-0", op_fails=True))
    first = failed_run(cloud.invoke("nodepools"))
    assert "GCE_STOCKOUT" in first.out and "does not have enough resources" in first.out
    # One line: the class, GKE's message, what to do.
    assert re.search(r"no TPU capacity: GCE_STOCKOUT: Instance .* does not have enough resources .*Options: re-run "
                     r"\(`invoke nodepools`\) to replace the broken pool; or set zone: to one of us-east5-a, "
                     r"us-east5-c \(they offer ct6e-standard-4t\); or another capacity option: \(spot, reservation, "
                     r"flex-start\)", first.out), first.out
    pools = {p["name"]: p for p in cloud.gcp.st.clusters[("us-east5-b", CLUSTER)]["nodePools"]}
    # The two slices are created at once: the other one is there.
    assert (pools["v6e-16-0"]["status"], pools["v6e-16-1"]["status"]) == ("ERROR", "RUNNING")
    np = recap(first, "nodepools")
    assert (np["changed"], np["failed"]) == (1, 1)

    # The re-run replaces the broken pool (delete, then create), never counts it done.
    second = ok_run(cloud.invoke("nodepools"))
    assert "replaced a broken pool (was ERROR: GCE_STOCKOUT" in second.out
    assert [r.path.rsplit("/", 1)[-1] for r in second.calls("DELETE", r"/nodePools/")] == ["v6e-16-0"]
    assert [r.body["nodePool"]["name"] for r in second.calls("POST", r"/nodePools$")] == ["v6e-16-0"]
    assert second.calls("DELETE", r"/nodePools/v6e-16-0$")[0].at < second.calls("POST", r"/nodePools$")[0].at
    np = recap(second, "nodepools")
    assert (np["ok"], np["changed"], np["failed"]) == (5, 1, 0)     # the 3 capacity checks, the plan, the other pool
    pools = cloud.gcp.st.clusters[("us-east5-b", CLUSTER)]["nodePools"]
    assert sorted((p["name"], p["status"]) for p in pools) == [
        ("default-pool", "RUNNING"), ("v6e-16-0", "RUNNING"), ("v6e-16-1", "RUNNING")]


def test_pool_that_breaks_after_its_create_is_caught_by_the_verify(cloud: Cloud):
    cloud.seed_project()
    cloud.seed_networks()
    cloud.seed_cluster()
    cloud.gcp.stockouts.append(G.Stockout("v6e-16-1", op_fails=False))
    first = failed_run(cloud.invoke("nodepools"))
    assert "node pool v6e-16-1 is ERROR: GCE_STOCKOUT" in first.out and "to replace the broken pool" in first.out
    assert "no TPU capacity: GCE_STOCKOUT" in first.out
    np = recap(first, "nodepools")
    assert (np["changed"], np["failed"]) == (1, 1)
    second = ok_run(cloud.invoke("nodepools"))
    assert [r.path.rsplit("/", 1)[-1] for r in second.calls("DELETE", r"/nodePools/")] == ["v6e-16-1"]
    np = recap(second, "nodepools")
    assert (np["ok"], np["changed"], np["failed"]) == (5, 1, 0)     # the 3 capacity checks, the plan, the other pool


# -- 6b. capacity: options, the read-only preflight, shortages ---------------------------
def test_a_quota_shortage_stops_up_before_any_mutating_request(cloud: Cloud):
    cloud.gcp.set_quota("TPUS-PER-TPU-FAMILY-per-project-region", [({"region": "us-east5", "tpu_family": "CT6E"}, 0),
                                                                  ({}, 0)])
    run = failed_run(cloud.invoke("up"))
    assert run.changes == [], run.changes
    assert ("the capacity options cannot make every slice: on-demand 0 (quota TPUS-PER-TPU-FAMILY (CT6E) in us-east5 "
            "permits 0 chips); missing 2 of 2 slices (32 chips, 16 per slice): request quota (IAM & Admin > Quotas), "
            "add an option to capacity: (spot, reservation, flex-start), or set slices: lower") in run.out
    assert re.search(r"prereqs : APIs .* +not run", run.out)
    assert recap(run, "up")["failed"] == 1


def test_quota_permits_is_said_and_a_check_that_cannot_look_does_not_stop(cloud: Cloud):
    run = ok_run(cloud.invoke("capacity"))
    assert "quota TPUS-PER-TPU-FAMILY (CT6E) in us-east5 permits 64 chips; this inventory needs 32" in run.out
    assert "zone us-east5-b offers ct6e-standard-4t" in run.out
    assert "GKE 1.35.2-gke.1842000 is offered in us-east5-b" in run.out
    cloud.gcp.server.fail("GET", r"/quotaInfos/", 403, G.gerror(403, "Cloud Quotas API has not been used in project "
                                                              "123456789012 before or it is disabled.",
                                                              "PERMISSION_DENIED", "accessNotConfigured"), times=99)
    run = ok_run(cloud.invoke("capacity"))
    assert re.search(r"capacity : TPU quota for 32 chips +skipped .*not checked: quota TPUS-PER-TPU-FAMILY \(CT6E\) "
                     r"in us-east5: could not look .*Cloud Quotas API has not been used", run.out), run.out
    # The plan: its option possible, never proven; the run goes on.
    assert re.search(r"capacity : plan for 2 slice\(s\) +skipped .*not checked: 2 slice\(s\): 2 on-demand: 2 slice\(s\) on "
                     r"an option whose check could not look", run.out), run.out
    assert "v6e-16-0: on-demand (not checked: quota TPUS-PER-TPU-FAMILY (CT6E) in us-east5: could not look" in run.out


def test_a_zone_without_the_machine_type_is_refused_with_the_zones_that_have_it(cloud: Cloud):
    cloud.gcp.st.machine_types["us-east5-b"] = ["n1-standard-16"]
    run = failed_run(cloud.invoke("nodepools"))
    assert ("zone us-east5-b does not offer ct6e-standard-4t; the zones of us-east5 that do: us-east5-a, us-east5-c "
            "(set zone:)") in run.out
    assert run.changes == []


def test_a_version_not_offered_is_refused(cloud: Cloud):
    cloud.change_inventory(cluster_version="1.35.9-gke.9")
    run = failed_run(cloud.invoke("capacity"))
    assert "GKE 1.35.9-gke.9 is not offered in us-east5-b (offered: 1.35.2-gke.1842000, 1.34.1-gke.1829001): set "\
           "cluster_version:" in run.out


@pytest.mark.parametrize("case", ["missing", "not-ready", "too-few", "other-machine", "enough-shared"])
def test_a_reservation_is_checked_before_anything_is_made(cloud: Cloud, case: str):
    name = "projects/owner-proj/reservations/tpu-res" if case == "enough-shared" else "tpu-res"
    cloud.change_inventory(capacity="reservation", reservation=name)
    owner = "owner-proj" if case == "enough-shared" else ""
    if case != "missing":
        cloud.gcp.add_reservation("us-east5-b", "tpu-res", count=8, in_use=3 if case == "too-few" else 0,
                                  status="CREATING" if case == "not-ready" else "READY",
                                  machine_type="ct5lp-hightpu-4t" if case == "other-machine" else "ct6e-standard-4t",
                                  project=owner)
    run = cloud.invoke("up")
    want = {
        "missing": f"no reservation tpu-res in zone us-east5-b of project {PROJECT}",
        "not-ready": "reservation tpu-res is CREATING, not READY",
        "too-few": "reservation tpu-res 1 (5 of 8 hosts free); missing 1 of 2 slices (16 chips, 16 per slice)",
        "other-machine": "reservation tpu-res holds ct5lp-hightpu-4t machines, this inventory needs ct6e-standard-4t",
        "enough-shared": "reservation tpu-res is READY with 8 free ct6e-standard-4t hosts (count 8, in use 0): 2 whole "
                         "slice(s) of 4 hosts",
    }[case]
    assert want in run.out, run.out
    if case != "enough-shared":
        assert run.rc != 0 and run.changes == [], run.changes
        return
    assert run.rc == 0, run.out
    assert "a pool consuming a reservation needs no TPU quota" in run.out
    for p in bodies(run, "POST", r"/nodePools$"):
        aff = p["nodePool"]["config"]["reservationAffinity"]
        assert aff == {"consumeReservationType": "SPECIFIC_RESERVATION", "key": "compute.googleapis.com/reservation-name",
                       "values": [name]}, aff


def test_spot_and_flex_start_pools_are_made_with_their_flags_and_the_workers_select_them(cloud: Cloud):
    # The pools and the RayCluster on a seeded cluster (what capacity
    # changes); `up` from empty is covered once, on-demand, above.
    def seeded(**capacity):
        cloud.reset()
        cloud.change_inventory(**capacity)
        cloud.seed_project()
        cloud.seed_networks()
        cloud.seed_cluster()
        cloud.get_credentials()

    seeded(capacity="spot")
    run = ok_run(cloud.invoke("capacity", "nodepools", "raycluster"))
    assert "quota PREEMPTIBLE-TPU-V6E in us-east5 permits 64 chips" in run.out
    assert all(p["nodePool"]["config"]["spot"] is True for p in bodies(run, "POST", r"/nodePools$"))
    assert all(p["nodePool"]["config"]["labels"]["tpu-playbooks/capacity"] == "spot"
               for p in bodies(run, "POST", r"/nodePools$"))
    [rc] = bodies(run, "POST", r"/rayclusters$")
    spec = rc["spec"]["workerGroupSpecs"][0]["template"]["spec"]
    assert spec["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == "4x4"
    assert affinity_values(spec) == ["spot"]
    assert ok_run(cloud.invoke("nodepools", "raycluster")).changes == []

    seeded(capacity="flex-start", capacity_wait=600)
    run = ok_run(cloud.invoke("nodepools", "raycluster"))
    for p in bodies(run, "POST", r"/nodePools$"):
        np = p["nodePool"]
        assert np["config"]["flexStart"] is True and np["initialNodeCount"] == 0
        assert np["autoscaling"] == {"enabled": True, "minNodeCount": 0, "maxNodeCount": 4, "locationPolicy": "ANY"}
        assert np["management"]["autoRepair"] is False
        assert np["config"]["reservationAffinity"] == {"consumeReservationType": "NO_RESERVATION"}
    [rc] = bodies(run, "POST", r"/rayclusters$")
    assert affinity_values(rc["spec"]["workerGroupSpecs"][0]["template"]["spec"]) == ["flex-start"]
    assert ok_run(cloud.invoke("nodepools", "raycluster")).changes == []
    # Not elastic on preemptible capacity: said once, before the job.
    train = cloud.invoke("--dry", "train", "--skip-preflight")
    assert "capacity: flex-start: a preemption ends this job" in train.out and "--elastic" in train.out


def test_a_spot_pool_where_on_demand_is_asked_is_drift(cloud: Cloud):
    cloud.seed_project()
    cloud.seed_networks()
    cloud.seed_cluster()
    cloud.seed_pools()
    pool = cloud.gcp.st.clusters[("us-east5-b", CLUSTER)]["nodePools"][1]
    pool["config"]["spot"] = True
    run = failed_run(cloud.invoke("nodepools"))
    assert "drift: node pool v6e-16-0: capacity is spot, want on-demand" in run.out
    assert run.changes == []


def test_a_quota_error_of_the_create_is_classified(cloud: Cloud):
    cloud.seed_project()
    cloud.seed_networks()
    cloud.seed_cluster()
    cloud.gcp.stockouts.append(G.Stockout("v6e-16-0", op_fails=True, code="GCE_QUOTA_EXCEEDED",
                                          message="Instance 'gke-{pool}' creation failed: Quota 'TPUS_PER_TPU_FAMILY' "
                                                  "exceeded. Limit: 16.0 in region us-east5."))
    run = failed_run(cloud.invoke("nodepools"))
    assert re.search(r"not enough quota: GCE_QUOTA_EXCEEDED: .*Quota 'TPUS_PER_TPU_FAMILY' exceeded.*Options: re-run "
                     r".*; or request the quota", run.out), run.out


# -- 6c. an ordered capacity list: a plan per slice, the next option after a stockout ---------
def test_a_capacity_list_makes_each_slice_from_the_best_option_with_room_and_a_second_up_changes_nothing(
        cloud: Cloud):
    """[reservation, spot]: a reservation with the hosts of one slice, Spot
    quota for the other. One pool of each, the plan said before any create
    and in the recap; the workers admit both; a second `up` sends no change;
    `status` shows each slice's capacity, read back from GKE."""
    cloud.change_inventory(capacity=["reservation", "spot"], reservation="zeta-resv")
    cloud.gcp.add_reservation("us-east5-b", "zeta-resv", count=4)
    cloud.gcp.set_quota("PREEMPTIBLE-TPU-V6E-per-project-region", [({"region": "us-east5"}, 16), ({}, 0)])
    first = ok_run(cloud.invoke("up"))
    plan = ["v6e-16-0: reservation zeta-resv (4 of 4 hosts free)",
            "v6e-16-1: spot (quota PREEMPTIBLE-TPU-V6E in us-east5 permits 16 chips)"]
    for line in plan:
        assert f"  note   {line}" in first.out and f"      {line}" in recap_lines(first, "up"), first.out
    assert first.out.index(plan[1]) < first.out.index("gcloud container node-pools create")   # before any create
    pools = {p["nodePool"]["name"]: p["nodePool"] for p in bodies(first, "POST", r"/nodePools$")}
    assert sorted(pools) == ["v6e-16-0", "v6e-16-1"]                    # one create each: no failure, no retry
    assert pools["v6e-16-0"]["config"]["reservationAffinity"] == {
        "consumeReservationType": "SPECIFIC_RESERVATION", "key": "compute.googleapis.com/reservation-name",
        "values": ["zeta-resv"]}
    assert pools["v6e-16-0"]["config"].get("spot") is None
    assert pools["v6e-16-1"]["config"]["spot"] is True and "reservationAffinity" not in pools["v6e-16-1"]["config"]
    assert {n: p["config"]["labels"]["tpu-playbooks/capacity"] for n, p in pools.items()} == {
        "v6e-16-0": "reservation", "v6e-16-1": "spot"}
    assert cloud.gcp.st.reservations[(PROJECT, "us-east5-b", "zeta-resv")]["specificReservation"]["inUseCount"] == "4"
    [rc] = bodies(first, "POST", r"/rayclusters$")
    [group] = rc["spec"]["workerGroupSpecs"]                            # one group, both capacities
    assert affinity_values(group["template"]["spec"]) == ["reservation", "spot"]

    second = ok_run(cloud.invoke("up"))
    assert second.changes == [], second.changes
    assert recap(second, "up")["changed"] == 0
    assert "v6e-16-0: reservation zeta-resv (its pool, RUNNING)" in second.out
    assert "node pool v6e-16-1 is RUNNING (4x4, spot)" in second.out

    status = ok_run(cloud.invoke("status"))
    assert "every pool has its 4 nodes ready: v6e-16-0 reservation zeta-resv 4/4, v6e-16-1 spot 4/4" in status.out


@pytest.mark.parametrize("op_fails", [True, False], ids=["the-create-fails", "the-pool-breaks-after"])
def test_a_spot_stockout_on_one_slice_makes_that_slice_on_demand(cloud: Cloud, op_fails: bool):
    cloud.seed_project()
    cloud.seed_networks()
    cloud.seed_cluster()
    cloud.change_inventory(capacity=["spot", "on-demand"])
    cloud.gcp.stockouts.append(G.Stockout("v6e-16-1", op_fails=op_fails, capacity="spot"))
    run = ok_run(cloud.invoke("nodepools"))
    creates = [(p["nodePool"]["name"], "spot" if p["nodePool"]["config"].get("spot") else "on-demand")
               for p in bodies(run, "POST", r"/nodePools$")]
    assert sorted(creates) == [("v6e-16-0", "spot"), ("v6e-16-1", "on-demand"), ("v6e-16-1", "spot")]
    assert creates.index(("v6e-16-1", "spot")) < creates.index(("v6e-16-1", "on-demand"))
    # The broken Spot pool is deleted before the on-demand one is made.
    [delete] = run.calls("DELETE", r"/nodePools/")
    assert delete.path.endswith("/v6e-16-1")
    [od] = [r for r in run.calls("POST", r"/nodePools$") if not r.body["nodePool"]["config"].get("spot")]
    assert delete.at < od.at
    pools = {p["name"]: p for p in cloud.gcp.st.clusters[("us-east5-b", CLUSTER)]["nodePools"]}
    assert (pools["v6e-16-0"]["status"], pools["v6e-16-1"]["status"]) == ("RUNNING", "RUNNING")
    assert pools["v6e-16-1"]["config"]["labels"]["tpu-playbooks/capacity"] == "on-demand"
    # Each attempt logged and named in the recap.
    note = "spot: no TPU capacity: GCE_STOCKOUT: Instance 'gke-v6e-16-1-xxxx' creation failed"
    assert f"  note   {note}" in run.out and f"      {note}" in recap_lines(run, "nodepools"), run.out
    assert "; next: on-demand" in recap_lines(run, "nodepools")
    assert re.search(r"changed: \[nodepools : TPU node pool v6e-16-1\] created \(4x4, 4 nodes, on-demand\), in place "
                     r"of spot \(no TPU capacity\)", run.out), run.out
    # A pool of any option of the list is as asked: a second run sends nothing.
    again = ok_run(cloud.invoke("nodepools"))
    assert again.changes == [] and "node pool v6e-16-1 is RUNNING (4x4, on-demand)" in again.out


def test_a_create_refused_for_another_reason_never_moves_to_another_option(cloud: Cloud):
    cloud.seed_project()
    cloud.seed_networks()
    cloud.seed_cluster()
    cloud.change_inventory(capacity=["spot", "on-demand"])
    cloud.gcp.server.fail("POST", r"/nodePools$", 403, G.forbidden("container.nodePools.create", CLUSTER))
    run = failed_run(cloud.invoke("nodepools"))
    posts = run.calls("POST", r"/nodePools$")
    assert sorted(r.status for r in posts) == [200, 403]                # one create each, no other option tried
    assert all(r.body["nodePool"]["config"]["spot"] is True for r in posts)
    assert run.calls("DELETE", r"/nodePools/") == []
    assert "container.nodePools.create" in run.out and "next: on-demand" not in run.out


def test_quota_for_no_option_is_refused_before_any_create_with_each_options_numbers(cloud: Cloud):
    cloud.change_inventory(capacity=["spot", "on-demand"])
    cloud.gcp.set_quota("PREEMPTIBLE-TPU-V6E-per-project-region", [({"region": "us-east5"}, 8), ({}, 0)])
    cloud.gcp.set_quota("TPUS-PER-TPU-FAMILY-per-project-region", [({"region": "us-east5", "tpu_family": "CT6E"}, 0),
                                                                  ({}, 0)])
    run = failed_run(cloud.invoke("up"))
    assert run.changes == [], run.changes
    assert ("the capacity options cannot make every slice: spot 0 (quota PREEMPTIBLE-TPU-V6E in us-east5 permits 8 "
            "chips); on-demand 0 (quota TPUS-PER-TPU-FAMILY (CT6E) in us-east5 permits 0 chips); missing 2 of 2 slices "
            "(32 chips, 16 per slice)") in run.out, run.out
    assert re.search(r"prereqs : APIs .* +not run", run.out)


# -- 6c. a chain, another operation of the cluster, min_slices ----------------------------
def test_a_chain_that_will_make_node_pools_checks_capacity_before_its_first_change(cloud: Cloud):
    """`invoke network cluster nodepools` with 16 chips of quota for 32:
    the capacity checks run first, in the chain's first task; nothing is made."""
    cloud.gcp.set_quota("TPUS-PER-TPU-FAMILY-per-project-region", [({"region": "us-east5", "tpu_family": "CT6E"}, 16),
                                                                  ({}, 16)])
    run = failed_run(cloud.invoke("network", "cluster", "nodepools"))
    assert run.changes == [], run.changes
    refusal = ("quota TPUS-PER-TPU-FAMILY (CT6E) in us-east5 is 16 chips, this inventory needs 32 (2 slices x 16 "
               "chips): request it, or use capacity: spot or reservation")
    assert f"failed: [capacity : TPU quota for 32 chips]\n  {refusal}\n" in run.out, run.out
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
    cloud.seed_project()
    cloud.seed_networks()
    cloud.seed_cluster()
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
    cloud.seed_project()
    cloud.seed_networks()
    cloud.seed_cluster()
    run = ok_run(cloud.invoke("up"))
    waiting = "waiting: slice 1 (0 of 4 TPU workers ready: Pending: 0/"
    assert f"RayCluster maxtext-tpu-cluster: 1 of 2 slices ready (min_slices 1); {waiting}" in run.out, run.out
    assert re.search(r"^  raycluster : TPU slices of maxtext-tpu-cluster +ok +[\d.]+s  " + re.escape(waiting), run.out,
                     re.M), run.out
    assert "1 head + 4 of 8 TPU workers alive; 1 of 2 slices ready (min_slices 1); waiting: slice 1 (no host in Ray " \
           "yet)" in run.out
    assert recap(run, "up")["failed"] == 0

    status = ok_run(cloud.invoke("status"))
    assert re.search(r"status : RayCluster workers +as asked +1 of 2 slices ready \(min_slices 1\); " + re.escape(waiting)
                     + r".*; why: no node with free TPU chips", status.out), status.out
    assert re.search(r"status : TPU nodes ready +as asked +flex-start: v6e-16-1 0 of 4 nodes ready", status.out)

    assert ok_run(cloud.invoke("up")).changes == []
    refused = failed_run(cloud.invoke("train", "--skip-preflight"))
    assert ("1 of 2 slices ready; waiting: slice 1 (no host in Ray yet): a job that is not elastic needs every slice; "
            "`invoke train --elastic` would start on the 1 ready and grow when the rest arrive") in refused.out
    assert not refused.calls("POST", r"/api/jobs")

    cloud.kube.set_pool_nodes("v6e-16-1", 4)                    # GKE found the chips: the pending workers run
    status = ok_run(cloud.invoke("status"))
    assert re.search(r"status : RayCluster workers +as asked +head and 8 TPU workers ready", status.out), status.out


# -- 7. teardown ----------------------------------------------------------------------
def test_teardown_deletes_everything_networks_last_and_a_second_run_deletes_nothing(cloud: Cloud):
    cloud.seed_full()
    cloud.get_credentials()
    run = ok_run(cloud.invoke("teardown", "--yes"))
    deletes = [(r.path.split("/")[-2], r.path.rsplit("/", 1)[-1]) for r in run.requests if r.method == "DELETE"]
    order = {d: i for i, d in enumerate(deletes)}
    # Dependency order (independent branches run at once): the RayCluster
    # before its cluster; the bucket's objects before the bucket; the subnets
    # after the cluster; the networks last, after their subnets.
    assert sorted(deletes) == sorted([
        ("rayclusters", "maxtext-tpu-cluster"), ("clusters", CLUSTER), ("o", "notes.txt"),
        ("o", "rayjob-elastic-8b%2Fcheckpoints%2F10%2Fmeta"), ("o", "rayjob-elastic-8b%2Fcheckpoints%2F10%2Fstate"),
        ("b", BUCKET), ("subnetworks", "tpu-subnet-1"), ("subnetworks", "tpu-subnet-2"),
        ("networks", NET1), ("networks", NET2)]), deletes
    assert order[("rayclusters", "maxtext-tpu-cluster")] < order[("clusters", CLUSTER)]
    assert max(order[d] for d in deletes if d[0] == "o") < order[("b", BUCKET)]
    assert order[("clusters", CLUSTER)] < min(order[("subnetworks", "tpu-subnet-1")],
                                              order[("subnetworks", "tpu-subnet-2")])
    assert deletes[-2:] in ([("networks", NET1), ("networks", NET2)], [("networks", NET2), ("networks", NET1)])
    assert order[("subnetworks", "tpu-subnet-1")] < order[("networks", NET1)]
    assert order[("subnetworks", "tpu-subnet-2")] < order[("networks", NET2)]
    assert all(r.status in (200, 204) for r in run.requests if r.method == "DELETE")
    st = cloud.gcp.st
    assert not (st.networks or st.subnets or st.clusters or st.buckets)
    r = recap(run, "teardown")
    assert (r["changed"], r["failed"]) == (7, 0)

    again = ok_run(cloud.invoke("teardown", "--yes"))
    assert [r for r in again.requests if r.method == "DELETE"] == []
    assert again.changes == []
    r = recap(again, "teardown")
    assert (r["ok"], r["changed"], r["failed"]) == (9, 0, 0)      # the maintenance step among them


# -- 8. chaos ------------------------------------------------------------------------
def test_chaos_deletes_exactly_one_worker_pod_found_by_label(cloud: Cloud):
    cloud.seed_full()
    cloud.get_credentials()
    workers = set(cloud.kube.worker_pods("default"))
    heads = [p["metadata"]["name"] for p in cloud.kube.list("pods", "default", "ray.io/node-type=head")]
    assert len(workers) == 8 and len(heads) == 1
    run = ok_run(cloud.invoke("chaos.delete-worker"))
    [listed] = run.calls("GET", r"/namespaces/default/pods$")
    assert listed.query["labelSelector"] == "ray.io/node-type=worker"
    [deleted] = [r for r in run.requests if r.method == "DELETE"]
    name = deleted.path.rsplit("/", 1)[-1]
    assert deleted.path == f"/api/v1/namespaces/default/pods/{name}" and name in workers
    assert run.changes == [deleted]
    assert recap(run, "chaos")["changed"] == 1
    assert name not in cloud.kube.worker_pods("default")       # KubeRay's stand-in replaced it
    assert len(cloud.kube.worker_pods("default")) == 8


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
    assert worker["containers"][0]["securityContext"] == {}
    assert worker["nodeSelector"]["cloud.google.com/compute-class"] == "maxtext-tpu-dranet"
    assert cloud.kube.get("computeclasses", "maxtext-tpu-dranet")["spec"]["nodePoolConfig"] == {
        "dra": {"networking": {"enabled": True}}}
    assert len(cloud.kube.worker_pods("maxtext")) == 8          # admitted: every worker runs
    assert "ok: [raycluster : Autopilot's rules] the rendered manifests keep Autopilot's rules" in first.out
    second = ok_run(cloud.invoke("up", env_name=AUTOPILOT))
    assert second.changes == [], second.changes
    assert recap(second, "up")["changed"] == 0

    # The tutorial's own worker (privileged) on the same Autopilot cluster: refused.
    from playbooks import manifests, tutorial
    from playbooks.core.render import render
    e = cloud.envdata(AUTOPILOT)
    values = dict(manifests.raycluster_values(e), WORKER_SECURITY_CONTEXT='{"privileged": true}')
    text = render((ROOT / tutorial.RAYCLUSTER_MANIFEST).read_text(), values).replace(
        "name: maxtext-tpu-cluster", "name: tutorial-as-written")
    path = cloud.base / "tutorial-rc.yaml"
    path.write_text(text)
    ctx = f"--context=gke_{PROJECT}_us-east5_maxtext-autopilot"
    r = cloud.client("kubectl", "apply", "-f", str(path), ctx, env_name=AUTOPILOT)
    assert r.returncode == 0, r.stderr
    assert cloud.kube.list("pods", "maxtext", "ray.io/cluster=tutorial-as-written,ray.io/node-type=worker") == []
    events = [ev["message"] for ev in cloud.kube.list("events", "maxtext")
              if ev["involvedObject"]["name"] == "tutorial-as-written"]
    assert events and "[denied by autogke-disallow-privilege]" in events[0] and\
        "container ray-worker is privileged; not allowed in Autopilot" in events[0]


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
    from playbooks import k8s, slices
    cloud.seed_full()
    cloud.get_credentials()
    kwargs, words = CAUSES[cause]
    pods = cloud.kube.worker_pods("default")[:2]
    for p in pods:
        cloud.kube.break_pod("default", p, **kwargs)
    for k, v in cloud.env().items():
        monkeypatch.setenv(k, v)
    from playbooks import hosts
    monkeypatch.setattr(hosts, "_local", None)  # this machine's connector, with the fakes' environment
    e = cloud.envdata()
    # A slice is whole when every worker of its replica is ready: the broken
    # pods' replicas are not.
    broken = {slices.replica(cloud.kube.get("pods", p, "default")) for p in pods}
    s = slices.from_pods(e, cloud.kube.list("pods", "default"))
    assert s.head is True and set(s.whole) == {"slice 0", "slice 1"} - broken, s
    assert [name for name, _ in s.waiting] == sorted(broken), s
    found = k8s.causes(e)
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


# -- 11. checkpoints Orbax finalized, and GKE maintenance held off during a run --------
CKPT = "rayjob-multi-slice/checkpoints"
SET_POLICY = rf"/clusters/{CLUSTER}:setMaintenancePolicy$"
HOLD = "playbooks-train-rayjob-multi-slice"


def exclusions(cloud: Cloud) -> dict:
    c = cloud.gcp.st.clusters[("us-east5-b", CLUSTER)]
    return ((c.get("maintenancePolicy") or {}).get("window") or {}).get("maintenanceExclusions") or {}


def seed_checkpoints(cloud: Cloud) -> None:
    """Steps 10 and 20 finalized (Orbax's commit_success.txt); 30 as a
    preempted save left it, without its marker."""
    for o in ("10/commit_success.txt", "10/model_params/d/0", "20/_CHECKPOINT_METADATA", "20/commit_success.txt",
              "20/model_params/d/0", "30/_CHECKPOINT_METADATA", "30/model_params/d/0"):
        cloud.gcp.add_object(BUCKET, f"{CKPT}/{o}")


def test_a_stale_checkpoint_in_the_bucket_is_named_and_never_counted(cloud: Cloud):
    cloud.seed_full()
    cloud.get_credentials()
    seed_checkpoints(cloud)
    # The workers writing gs:// themselves: Orbax's commit-file rule skips 30 too.
    run = ok_run(cloud.invoke("train", "--skip-preflight", "--set", f"base_output_directory=gs://{BUCKET}/",
                              INVOKE_PLAYBOOK_MODE="check"))
    assert (f"probe  gcloud storage ls 'gs://{BUCKET}/{CKPT}/*'  => checkpoint steps [10, 20]; not finalized, "
            f"ignored: 30") in run.out, run.out
    assert ("ok: [train : checkpoints of rayjob-multi-slice] run rayjob-multi-slice resumes from checkpoint step 20; "
            "ignored, not finalized: 30: no commit_success.txt: Orbax did not finalize it") in run.out
    assert run.changes == []
    # Through the GCS FUSE mount (the tutorial's /data/), Orbax on the
    # workers would take 30/ as final: refused before any job, with the command.
    run = failed_run(cloud.invoke("train", "--skip-preflight", INVOKE_PLAYBOOK_MODE="check"))
    assert (f"MaxText would restore from it. Remove it (`gcloud storage rm --recursive gs://{BUCKET}/{CKPT}/30/`) to "
            f"resume from 20, or start over with --fresh") in run.out, run.out
    assert re.search(r"train : job rayjob-multi-slice \(llama3-8b\) +not run", run.out)
    # `invoke status` counts the run's checkpoints the same way.
    cloud.dashboard.jobs = [{"submission_id": "rayjob-multi-slice-1", "status": "SUCCEEDED", "start_time": 1,
                             "entrypoint": f"python maxtext_multi_slice_trainer.py base.yml base_output_directory="
                                           f"gs://{BUCKET}/ run_name=rayjob-multi-slice"}]
    out = cloud.invoke("status").out
    assert "rayjob-multi-slice-1  SUCCEEDED" in out and ", checkpoint 20 (not finalized, ignored: 30)" in out, out


def test_train_holds_maintenance_off_and_releases_it_when_the_job_ends(cloud: Cloud):
    """The exclusion is added before the job is submitted, and removed when
    the job ends (here: a submit the fake dashboard refuses, so no job
    runs); a second train, the exclusion in force, adds none."""
    cloud.seed_full()
    cloud.get_credentials()
    first = failed_run(cloud.invoke("train", "--skip-preflight"))
    policy = first.calls("POST", SET_POLICY)
    assert len(policy) == 2, first.out
    added = policy[0].body["maintenancePolicy"]["window"]["maintenanceExclusions"][HOLD]
    assert added["maintenanceExclusionOptions"] == {"scope": "NO_MINOR_OR_NODE_UPGRADES"}
    start, end = (G._rfc3339(added[k]) for k in ("startTime", "endTime"))
    assert start and end and abs((end - start).total_seconds() - 7 * 86400) < 60
    assert HOLD not in policy[1].body["maintenancePolicy"]["window"]["maintenanceExclusions"]
    held = first.out.index("changed: [train : hold off GKE maintenance] added maintenance exclusion " + HOLD)
    submitted = first.out.index("apply  ray job submit")
    released = first.out.index(f"maintenance exclusion {HOLD} removed: GKE may upgrade the nodes again")
    assert held < submitted < released, first.out
    assert "`ray job submit` failed" in first.out
    assert exclusions(cloud) == {}

    # The exclusion in force already (another train of the run follows its job):
    # the hold step sends nothing; the job's end removes it.
    cloud.gcp.add_exclusion("us-east5-b", CLUSTER, HOLD, days=6)
    cloud.gcp.add_exclusion("us-east5-b", CLUSTER, "holidays", days=3, scope="NO_UPGRADES")
    second = failed_run(cloud.invoke("train", "--skip-preflight"))
    assert re.search(rf"ok: \[train : hold off GKE maintenance\] maintenance exclusion {HOLD} "
                     r"\(no_minor_or_node_upgrades\) until \S+ \S+ UTC holds off node and minor upgrades", second.out)
    [removed] = second.calls("POST", SET_POLICY)
    assert list(removed.body["maintenancePolicy"]["window"]["maintenanceExclusions"]) == ["holidays"]
    assert list(exclusions(cloud)) == ["holidays"]             # a user's exclusion is left alone

    # One that ends within a day is renewed (removed, added) before the job.
    cloud.gcp.add_exclusion("us-east5-b", CLUSTER, HOLD, days=6.5, started_days_ago=6)
    third = failed_run(cloud.invoke("train", "--skip-preflight"))
    assert f"renewed maintenance exclusion {HOLD} (it ends at" in third.out
    assert len(third.calls("POST", SET_POLICY)) == 3              # remove, add, and the job's end


def test_status_shows_an_exclusion_in_force_and_teardown_removes_ours_only(cloud: Cloud):
    cloud.seed_full()
    cloud.get_credentials()
    cloud.gcp.add_exclusion("us-east5-b", CLUSTER, HOLD, days=7)
    cloud.gcp.add_exclusion("us-east5-b", CLUSTER, "playbooks-train-rayjob-elastic-8b", days=2, started_days_ago=3)
    out = cloud.invoke("status").out
    assert re.search(rf"status : maintenance exclusions +as asked +in force: {HOLD} \(no_minor_or_node_upgrades\) "
                     r"until \S+ \S+ UTC$", out, re.M), out
    run = ok_run(cloud.invoke("teardown", "--yes"))
    assert len(run.calls("POST", SET_POLICY)) == 2, run.out      # one update per exclusion
    deleted = run.calls("DELETE", rf"/clusters/{CLUSTER}$")[0]
    assert all(r.at < deleted.at for r in run.calls("POST", SET_POLICY))
    assert "changed: [teardown : maintenance exclusions of our runs] removed playbooks-train-rayjob-elastic-8b, " \
           f"{HOLD}" in run.out


# -- 12. the client libraries as speed-ups: the same answers as the CLIs -----------------
def test_the_kubernetes_client_answers_kubectl_as_kubectl_does(cloud: Cloud, monkeypatch):
    """Every kubectl read of the plays, once through the real kubectl and
    once through the local connector's shortcut (the `kubernetes` client):
    the same JSON (as the plays parse it), the same errors, the same exit.
    (The client runs GKE's auth plugin with this process's environment, as
    `invoke` does: the fakes' client environment is set here.)"""
    import json as _json

    from playbooks import gke, k8s
    from playbooks.kube_client import KubectlShortcut
    cloud.seed_full()
    cloud.get_credentials()
    e = cloud.envdata()
    pod = cloud.kube.worker_pods("default")[0]
    cloud.kube.break_pod("default", pod, phase="Running", waiting=("CrashLoopBackOff", "back-off"), restarts=2,
                         log="one\ntwo\nthree\nfour\n")
    reads = [
        gke.kube_get(e, "raycluster", "maxtext-tpu-cluster", "default").command.argv,       # three refs, one List
        gke.kube_get(e, "namespace", "default").command.argv,                               # one named object
        gke.kube_get(e, "computeclass", "absent-class").command.argv,                       # none: empty output
        gke.kube(e, "get", "pods", "--namespace", "default", "-l", "ray.io/node-type=worker", "--output=json").argv,
        gke.kube(e, "get", "nodes", "-l", "cloud.google.com/gke-nodepool", "--output=json").argv,
        gke.kube(e, "get", "events", "--namespace", "default", "--output=json").argv,
        gke.kube(e, "get", "raycluster/nope", "--namespace", "default", "--output=json").argv,  # NotFound, exit 1
        gke.kube(e, "logs", pod, "--namespace", "default", "--tail=3").argv,
    ]
    shortcut, env = KubectlShortcut(), cloud.env()
    for k, v in env.items():
        monkeypatch.setenv(k, v)

    def shape(text: str):
        if not text.strip():
            return None
        doc = _json.loads(text) if text.lstrip().startswith("{") else text
        if isinstance(doc, dict) and "items" in doc:
            return ("List", sorted((i.get("kind"), (i.get("metadata") or {}).get("name")) for i in doc["items"]))
        if isinstance(doc, dict):
            return (doc.get("kind"), (doc.get("metadata") or {}).get("name"), doc.get("spec"), doc.get("status"))
        return doc

    for argv in reads:
        cli = cloud.client(*argv)
        fast = shortcut.run(list(argv), env, 30)
        assert fast is not None, f"the shortcut does not answer {argv}"
        assert (fast.rc, shape(fast.stdout)) == (cli.returncode, shape(cli.stdout)), (argv, cli.stderr, fast.stderr)
        if cli.returncode:
            assert fast.stderr.split(":")[0] == cli.stderr.split(":")[0], (fast.stderr, cli.stderr)
    # What the plays read through it parses to the same values.
    parse = gke.raycluster_fact(e).parse
    from playbooks.core.facts import Completed
    argv = reads[0]
    cli, fast = cloud.client(*argv), shortcut.run(list(argv), env, 30)
    assert parse(Completed("", 0, fast.stdout, "")) == parse(Completed("", 0, cli.stdout, ""))
    assert k8s.ready(e, parse(Completed("", 0, fast.stdout, ""))) == "head ready, 7 of 8 TPU workers ready"
    # A command it does not know runs as a process.
    assert shortcut.run(["kubectl", "get", "pods", "--watch"], env, 30) is None
    assert shortcut.run(["kubectl", "apply", "-f", "-"], env, 30) is None
