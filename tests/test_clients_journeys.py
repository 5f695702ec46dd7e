"""Whole journeys: `up` from empty then again (nothing sent), a run that fails
halfway and its re-run, check mode, drift, teardown, chaos, the checkpoints
Orbax finalized and the maintenance hold of a run, the kubernetes client
answering as kubectl does.

Through `invoke` against the loopback fakes (tests/fakes/); which commands
run as their real processes and which are answered in-process, as for a
user, and where both ways are compared: tests/clients.py.
"""
from __future__ import annotations

import json
import re
import shutil

import pytest
import yaml

from tests.clients import (
    BUCKET,
    CLUSTER,
    NET1,
    NET2,
    PROJECT,
    TOKEN,
    USER,
    WORKLOAD_PRINCIPAL,
    ZONE_PATH,
    Cloud,
    bodies,
    failed_run,
    ok_run,
    recap,
)
from tests.fakes import gcp as G

pytestmark = pytest.mark.clients



# -- 1. up from empty, then up again -------------------------------------------------
def test_up_from_empty_creates_the_tutorial_then_second_run_changes_nothing(cloud: Cloud):
    first = ok_run(cloud.invoke("up"))
    r = recap(first, "up")
    assert (r["changed"], r["failed"]) == (15, 0), first.out

    _apis_and_roles(cloud, first)
    _networks(cloud, first)
    _cluster(cloud, first)
    _nodepools(cloud, first)
    _storage(cloud, first)
    _raycluster(cloud, first)

    # Second run: every step ok, nothing sent that could change anything.
    second = ok_run(cloud.invoke("up"))
    r2 = recap(second, "up")
    assert (r2["ok"], r2["changed"], r2["failed"], r2["skipped"]) == (24, 0, 0, 0), second.out
    assert second.changes == [], second.changes


def _apis_and_roles(cloud: Cloud, first) -> None:
    """the APIs and the user's three roles."""
    # §1 the APIs and the user's three roles
    assert bodies(first, "POST", r"/services:batchEnable$") == [
        {"serviceIds": ["container.googleapis.com", "cloudbuild.googleapis.com", "cloudbilling.googleapis.com"]}]
    policy = cloud.gcp.st.iam
    for role in ("roles/container.admin", "roles/iam.serviceAccountAdmin", "roles/cloudbuild.builds.editor"):
        assert any(b["role"] == role and f"user:{USER}" in b["members"] for b in policy["bindings"]), role
    assert len(first.calls("POST", r":setIamPolicy$")) == 3


def _networks(cloud: Cloud, first) -> None:
    """two custom-mode VPCs with MTU 8896, one subnet each with its range."""
    # §2 two custom-mode VPCs with MTU 8896, one subnet each with its range
    nets = bodies(first, "POST", r"/global/networks$")
    assert sorted((n["name"], n["mtu"], n["autoCreateSubnetworks"]) for n in nets) == [
        (NET1, 8896, False), (NET2, 8896, False)]
    subs = {s["name"]: s for s in bodies(first, "POST", r"/regions/us-east5/subnetworks$")}
    assert subs["tpu-subnet-1"]["ipCidrRange"] == "10.50.0.0/16"
    assert subs["tpu-subnet-1"]["network"].endswith(f"/global/networks/{NET1}")
    assert subs["tpu-subnet-2"]["ipCidrRange"] == "10.60.0.0/16"
    assert subs["tpu-subnet-2"]["network"].endswith(f"/global/networks/{NET2}")


def _cluster(cloud: Cloud, first) -> None:
    """the Standard cluster, zonal, with the tutorial's flags."""
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


def _nodepools(cloud: Cloud, first) -> None:
    """two TPU v6e node pools, one 4x4 slice of 4 hosts each, on both DCN networks, DRANET label."""
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


def _storage(cloud: Cloud, first) -> None:
    """the bucket (gsutil mb), the KSA, the workload-identity binding."""
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


def _raycluster(cloud: Cloud, first) -> None:
    """the DRANET claim template and the RayCluster, applied; it became ready."""
    # §7 the DRANET claim template and the RayCluster, applied; it became ready
    [claim] = bodies(first, "POST", r"/resourceclaimtemplates$")
    req = claim["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert (claim["metadata"]["name"], req["deviceClassName"], req["count"]) == ("two-netdev", "netdev.google.com", 2)
    [rc] = bodies(first, "POST", r"/rayclusters$")
    [group] = rc["spec"]["workerGroupSpecs"]
    assert (rc["metadata"]["name"], group["replicas"], group["numOfHosts"]) == ("maxtext-tpu-cluster", 2, 4)
    assert group["template"]["spec"]["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == "4x4"
    assert "1 head + 8 TPU workers alive" in first.out


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
    c = recap(second, "cluster")      # a chain that makes node pools checks capacity in its first task:
    assert (c["ok"], c["changed"], c["failed"]) == (6, 0, 0)           # the 3 checks, the plan, cluster, credentials
    np2 = recap(second, "nodepools")
    assert (np2["ok"], np2["changed"], np2["failed"]) == (5, 1, 0)     # its own checks again, fresh; the other pool
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
    # The node pools are read with the clusters: no cluster is proof of no pool, so the step can say it.
    assert re.search(r"nodepools : TPU node pool v6e-16-0 +changed", run.out), run.out
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
    cloud.seed_to_cluster()
    cloud.seed_pools(topology="2x2")
    run = failed_run(cloud.invoke("nodepools"))
    assert "drift: node pool v6e-16-0: TPU topology is 2x2, want 4x4" in run.out
    assert run.changes == []


def test_a_cluster_made_again_elsewhere_gets_its_context_written_again(cloud: Cloud):
    """The context get-credentials wrote for a cluster since deleted and made
    again under the same name (the Console, another machine's teardown and
    up) points at the old endpoint and CA: the credentials step compares it
    with the cluster GKE shows, runs the real get-credentials again, and
    kubectl reaches the new cluster; a second run changes nothing."""
    cloud.seed_full()
    made = cloud.gcp.st.clusters[("us-east5-b", CLUSTER)]
    new = {"endpoint": made["endpoint"], "masterAuth": made["masterAuth"]}
    old_ca = G._b64(cloud.gcp.server.pki.ca_pem)        # another CA than the fake API server's
    made.update(endpoint="127.0.0.1:9", masterAuth={"clusterCaCertificate": old_ca})
    cloud.get_credentials()                             # the old cluster's context, as an earlier up left it
    made.update(new)                                    # the cluster made again: a new endpoint and CA
    context = f"gke_{PROJECT}_us-east5-b_{CLUSTER}"

    run = ok_run(cloud.invoke("cluster", "raycluster"))
    assert (recap(run, "cluster")["changed"], recap(run, "raycluster")["failed"]) == (1, 0), run.out
    assert (f"context {context} points at https://127.0.0.1:9, the cluster is at https://{new['endpoint']}"
            in run.out), run.out
    assert [p for p in run.started("gcloud") if "get-credentials" in p]
    config = yaml.safe_load((cloud.kube_dir / "config").read_text())
    [entry] = [c["cluster"] for c in config["clusters"] if c["name"] == context]
    assert entry == {"server": f"https://{new['endpoint']}",
                     "certificate-authority-data": new["masterAuth"]["clusterCaCertificate"]}
    kubectl = cloud.client("kubectl", "get", "namespace", "default", "--output=json", f"--context={context}")
    assert kubectl.returncode == 0, kubectl.stderr

    again = ok_run(cloud.invoke("cluster"))
    assert recap(again, "cluster")["changed"] == 0, again.out
    assert f"context {context} exists and points at the cluster" in again.out
    assert not [p for p in again.started("gcloud") if "get-credentials" in p]


# -- 7. teardown ----------------------------------------------------------------------
def test_teardown_deletes_everything_networks_last_and_a_second_run_deletes_nothing(cloud: Cloud):
    """With --delete-bucket (without it the bucket is kept: test_clients_bill_stop.py)."""
    cloud.seed_full()
    cloud.get_credentials()
    run = ok_run(cloud.invoke("teardown", "--yes", "--delete-bucket"))
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

    again = ok_run(cloud.invoke("teardown", "--yes", "--delete-bucket"))
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


def test_chaos_target_rank0_and_peer_delete_the_pods_the_running_jobs_timeline_names(cloud: Cloud):
    """--target=rank0 / peer: the pod of the running job's rank 0, or of
    another rank, from its worker_started events (a worker's hostname is its
    pod's name); with no job running it refuses, deleting nothing."""
    from tests.fakes.cloud import ROOT, STANDARD
    cloud.seed_full()
    cloud.get_credentials()
    pods = sorted(cloud.kube.worker_pods("default"))
    run_dir = ROOT / ".state" / STANDARD / "training" / "rayjob-multi-slice"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    try:
        none = failed_run(cloud.invoke("chaos.delete-worker", "--target=rank0"))
        assert "--target=rank0: no job is running" in none.out, none.out
        assert [r for r in none.requests if r.method == "DELETE"] == []
        cloud.dashboard.jobs = [{"submission_id": "rayjob-multi-slice-1", "status": "RUNNING", "start_time": 1,
                                 "entrypoint": f"python maxtext_multi_slice_trainer.py base.yml "
                                               f"base_output_directory=gs://{BUCKET}/ run_name=rayjob-multi-slice"}]
        events = [{"t": 100.0 + i, "kind": "worker_started", "step": None, "source": "trainer",
                   "job": "rayjob-multi-slice-1", "rank": rank, "workers": 2, "slice": f"slice-{rank}", "host": "0",
                   "hostname": pod} for i, (rank, pod) in enumerate(((1, pods[5]), (0, pods[3])))]
        (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
        for target, pod in (("rank0", pods[3]), ("peer", pods[5])):
            run = ok_run(cloud.invoke("chaos.delete-worker", f"--target={target}"))
            [deleted] = [r for r in run.requests if r.method == "DELETE"]
            assert deleted.path == f"/api/v1/namespaces/default/pods/{pod}", (target, deleted.path)
            assert run.calls("GET", r"/namespaces/default/pods$") == []  # not the tutorial's first-pod lookup
        lost = [e for e in map(json.loads, (run_dir / "events.jsonl").read_text().splitlines())
                if e["kind"] == "worker_lost"]
        assert [(e["pod"], e["target"]) for e in lost] == [(pods[3], "rank0"), (pods[5], "peer")]
        bad = cloud.invoke("chaos.delete-worker", "--target=Not_A_Pod")
        assert bad.rc == 2 and "--target 'Not_A_Pod': not first, rank0, peer nor a pod's name" in bad.out, bad.out
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


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
    """Some kubectl reads of the plays (every form the goldens hold:
    tests/test_in_process.py), once through the real kubectl and once
    through the local connector's shortcut (the `kubernetes` client):
    the same JSON (as the plays parse it), the same errors, the same exit.
    (The client runs GKE's auth plugin with this process's environment, as
    `invoke` does: the fakes' client environment is set here.)"""
    from playbooks.access.kube_api import KubectlShortcut
    from playbooks.cloud import gke
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

    for argv in reads:
        cli = cloud.client(*argv)
        fast = shortcut.run(list(argv), env, 30)
        assert fast is not None, f"the shortcut does not answer {argv}"
        assert (fast.rc, shape(fast.stdout)) == (cli.returncode, shape(cli.stdout)), (argv, cli.stderr, fast.stderr)
        if cli.returncode:
            assert fast.stderr.split(":")[0] == cli.stderr.split(":")[0], (fast.stderr, cli.stderr)
    _the_plays_read_the_same_through_it(cloud, shortcut, env, e, reads[0])


def shape(text: str):
    """What of kubectl's output the comparison looks at."""
    if not text.strip():
        return None
    doc = json.loads(text) if text.lstrip().startswith("{") else text
    if isinstance(doc, dict) and "items" in doc:
        return ("List", sorted((i.get("kind"), (i.get("metadata") or {}).get("name")) for i in doc["items"]))
    if isinstance(doc, dict):
        return (doc.get("kind"), (doc.get("metadata") or {}).get("name"), doc.get("spec"), doc.get("status"))
    return doc


def _the_plays_read_the_same_through_it(cloud: Cloud, shortcut, env: dict, e, argv) -> None:
    from playbooks.cloud import gke, slices
    from playbooks.core.facts import Completed
    # What the plays read through it parses to the same values.
    parse = gke.raycluster_fact(e).parse
    cli, fast = cloud.client(*argv), shortcut.run(list(argv), env, 30)
    assert parse(Completed("", 0, fast.stdout, "")) == parse(Completed("", 0, cli.stdout, ""))
    # The slices the plays count from the RayCluster's pods: the same either way.
    pods = slices.pods_fact(e)
    cli, fast = cloud.client(*pods.command.argv), shortcut.run(list(pods.command.argv), env, 30)
    assert fast is not None
    whole = pods.parse(Completed("", 0, fast.stdout, ""))
    assert whole == pods.parse(Completed("", 0, cli.stdout, ""))
    assert whole.text().startswith("1 of 2 slices ready; waiting: slice "), whole.text()
    # A command it does not know runs as a process.
    assert shortcut.run(["kubectl", "get", "pods", "--watch"], env, 30) is None
    assert shortcut.run(["kubectl", "apply", "-f", "-"], env, 30) is None
