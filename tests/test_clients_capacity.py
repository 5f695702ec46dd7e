"""Capacity: the options and their read-only preflight, shortages, an ordered
capacity list with a plan per slice and the next option after a stockout.

Through `invoke` against the loopback fakes (tests/fakes/); which commands
run as their real processes and which are answered in-process, as for a
user, and where both ways are compared: tests/clients.py.
"""
from __future__ import annotations

import re

import pytest

from tests.clients import (
    CLUSTER,
    PROJECT,
    Cloud,
    affinity_values,
    bodies,
    failed_run,
    ok_run,
    recap,
    recap_lines,
)
from tests.fakes import gcp as G

pytestmark = pytest.mark.clients



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
    if case == "enough-shared":      # what comes before the pools is made elsewhere: here, only the pools
        cloud.seed_to_cluster()
    run = cloud.invoke("nodepools" if case == "enough-shared" else "up")
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
        cloud.seed_to_cluster()
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
    cloud.seed_to_cluster()
    cloud.seed_pools()
    pool = cloud.gcp.st.clusters[("us-east5-b", CLUSTER)]["nodePools"][1]
    pool["config"]["spot"] = True
    run = failed_run(cloud.invoke("nodepools"))
    assert "drift: node pool v6e-16-0: capacity is spot, want on-demand" in run.out
    assert run.changes == []


def test_a_quota_error_of_the_create_is_classified(cloud: Cloud):
    cloud.seed_to_cluster()
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
    cloud.seed_to_cluster()               # the networks and the cluster are not what this is about
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
    cloud.seed_to_cluster()
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
    cloud.seed_to_cluster()
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


# -- another TPU generation: v5p (playbooks/config/tpu.py) -----------------------------------
def test_a_v5p_environment_checks_its_own_quota_and_makes_its_own_pools(cloud: Cloud):
    """The machine type decides the generation: capacity reads v5p's quota
    and machine type, the pools are v5p-16-<i> of 2x2x4 with no DCN networks
    (no DRANET on v5p), and GKE labels their nodes tpu-v5p-slice; a second run
    changes nothing; a v5p quota short of the slices stops it, named."""
    cloud.change_inventory(machine_type="ct5p-hightpu-4t", topology="2x2x4")
    run = ok_run(cloud.invoke("capacity"))
    assert "zone us-east5-b offers ct5p-hightpu-4t" in run.out
    assert "quota TPUS-PER-TPU-FAMILY (CT5P) in us-east5 permits 64 chips; this inventory needs 32" in run.out
    assert "v5p-16-0: on-demand" in run.out and "CT6E" not in run.out
    v6e_only = [({"region": "us-east5", "tpu_family": "CT6E"}, 64), ({}, 0)]
    cloud.gcp.set_quota("TPUS-PER-TPU-FAMILY-per-project-region", v6e_only)
    run = failed_run(cloud.invoke("capacity"))
    assert "on-demand 0 (quota TPUS-PER-TPU-FAMILY (CT5P) in us-east5 permits 0 chips); missing 2 of 2" in run.out
    cloud.gcp.set_quota("TPUS-PER-TPU-FAMILY-per-project-region", [({"region": "us-east5", "tpu_family": "CT5P"},
                                                                  64), *v6e_only])
    cloud.seed_to_cluster()
    run = ok_run(cloud.invoke("nodepools"))
    made = [p["nodePool"] for p in bodies(run, "POST", r"/nodePools$")]
    assert sorted(p["name"] for p in made) == ["v5p-16-0", "v5p-16-1"]  # made at once
    for p in made:
        assert (p["config"]["machineType"], p["placementPolicy"]["tpuTopology"], p["initialNodeCount"]) == \
            ("ct5p-hightpu-4t", "2x2x4", 4)
        assert not (p.get("networkConfig") or {}).get("additionalNodeNetworkConfigs")
        assert p["config"]["labels"] == {"tpu-playbooks/capacity": "on-demand"}
    nodes = [n for n in cloud.kube.list("nodes") if n["metadata"]["labels"].get("cloud.google.com/gke-nodepool",
                                                                                 "").startswith("v5p-16-")]
    assert len(nodes) == 8
    assert {n["metadata"]["labels"]["cloud.google.com/gke-tpu-accelerator"] for n in nodes} == {"tpu-v5p-slice"}
    assert ok_run(cloud.invoke("nodepools")).changes == []
