"""Stopping the bill keeps what the user made (issue 64, item 1), through
`invoke` against the loopback fakes with the real gcloud, gsutil and
kubectl (tests/clients.py): `teardown` keeps the bucket and every
checkpoint unless `--delete-bucket` names it, and says what it kept and
what bills it; `stop-tpus` deletes the TPU node pools (Standard) or the
RayCluster (Autopilot) and nothing else, a second run changes nothing,
`invoke status` says the TPUs are off and what still bills, and `invoke up`
makes them again."""
from __future__ import annotations

import pytest

from tests.clients import AUTOPILOT, BUCKET, CLUSTER, Cloud, bodies, failed_run, ok_run, recap

pytestmark = pytest.mark.clients

GIB5 = 5 * 1024 ** 3


def _deletes(run) -> list[str]:
    return [r.path for r in run.requests if r.method == "DELETE"]


def test_teardown_keeps_the_bucket_and_every_checkpoint_unless_asked_by_name(cloud: Cloud):
    cloud.seed_full()
    cloud.get_credentials()
    cloud.gcp.add_object(BUCKET, "rayjob-elastic-8b/checkpoints/20/state", size=GIB5)
    objects = set(cloud.gcp.st.objects[BUCKET])
    run = ok_run(cloud.invoke("teardown", "--yes"))
    assert not [p for p in _deletes(run) if "/storage/v1/" in p], _deletes(run)
    assert not run.started("gsutil") and not [p for p in run.started("gcloud") if " rm " in p]
    assert set(cloud.gcp.st.objects[BUCKET]) == objects and BUCKET in cloud.gcp.st.buckets
    assert not cloud.gcp.st.clusters  # the rest of the teardown is done
    # One line: what it kept, its size (the real `gcloud storage du`), what bills it, how to delete it.
    assert f"gcloud storage du --summarize gs://{BUCKET}" in run.started("gcloud"), run.started("gcloud")
    line = next(ln for ln in run.out.splitlines() if ln.startswith(f"ok: [teardown : bucket gs://{BUCKET}]"))
    assert line.endswith(f"kept bucket gs://{BUCKET} (US-EAST5, STANDARD): 5.00 GiB; Cloud Storage bills it per "
                         "GiB-month at its class's price in its location (not read here: "
                         "https://cloud.google.com/storage/pricing); `invoke teardown --delete-bucket` deletes it"), line

    again = ok_run(cloud.invoke("teardown", "--yes"))
    assert again.changes == [] and "kept bucket" in again.out

    # What still bills after it: the bucket it kept (there is no cluster).
    status = failed_run(cloud.invoke("status"))
    assert f"  TPUs: off (no cluster {CLUSTER}: nothing of it is billed)" in status.out, status.out
    assert f"  still billed: bucket gs://{BUCKET} (US-EAST5, STANDARD): 5.00 GiB;" in status.out, status.out

    gone = ok_run(cloud.invoke("teardown", "--yes", "--delete-bucket"))
    assert BUCKET not in cloud.gcp.st.buckets
    assert f"/storage/v1/b/{BUCKET}" in _deletes(gone)


def _default_pool_nodes(cloud: Cloud) -> None:
    """The default pool's 3 nodes, as GKE registers them (the fake makes
    nodes for the TPU pools only)."""
    for i in range(3):
        cloud.kube.create("nodes", {"metadata": {"name": f"gke-{CLUSTER}-default-pool-{i}",
                                                 "labels": {"cloud.google.com/gke-nodepool": "default-pool"}},
                                    "spec": {}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}})


def _tpu_pools(cloud: Cloud) -> dict[str, dict]:
    [c] = cloud.gcp.st.clusters.values()
    return {p["name"]: p for p in c["nodePools"] if p["name"] != "default-pool"}


def test_stop_tpus_deletes_only_the_tpu_node_pools_and_up_makes_them_again(cloud: Cloud):
    cloud.change_inventory(prices={"default-pool": 0.76})
    cloud.seed_full()
    cloud.get_credentials()
    _default_pool_nodes(cloud)
    before = {n: (p["config"]["machineType"], p["placementPolicy"]["tpuTopology"], p["initialNodeCount"],
                  p["config"]["labels"]) for n, p in _tpu_pools(cloud).items()}
    objects = set(cloud.gcp.st.objects[BUCKET])
    run = ok_run(cloud.invoke("stop-tpus"))
    assert sorted(p.rsplit("/", 1)[-1] for p in _deletes(run)) == ["v6e-16-0", "v6e-16-1"], _deletes(run)
    assert all("/nodePools/" in p for p in _deletes(run))
    assert [r.path for r in run.changes if r.method != "DELETE"] == []
    assert recap(run, "stop-tpus")["changed"] == 2
    assert "changed: [stop-tpus : TPU node pool v6e-16-0] deleted (on-demand): `invoke up` makes it again" in run.out
    # Kept: the cluster and its CPU pool, the bucket and its checkpoints, the RayCluster.
    [c] = cloud.gcp.st.clusters.values()
    assert [p["name"] for p in c["nodePools"]] == ["default-pool"]
    assert set(cloud.gcp.st.objects[BUCKET]) == objects
    assert [rc["metadata"]["name"] for rc in cloud.kube.list("rayclusters")] == ["maxtext-tpu-cluster"]

    again = ok_run(cloud.invoke("stop-tpus"))
    assert again.changes == [] and recap(again, "stop-tpus")["changed"] == 0
    assert "node pool v6e-16-1 is not there: none of its TPUs bills" in again.out

    status = failed_run(cloud.invoke("status"))   # not as the inventory asks: its TPU pools are missing
    assert "  TPUs: off (no TPU node pool): `invoke up` makes them again" in status.out, status.out
    billed = next(ln for ln in status.out.splitlines() if ln.startswith("  still billed: "))
    assert billed.startswith("  still billed: default-pool (3 nodes x n1-standard-16, $2.28/h); cluster fee (cluster "
                             "maxtext-multislice, $0.10/h); "), billed
    assert f"bucket gs://{BUCKET} (US-EAST5, STANDARD): " in billed, billed

    up = ok_run(cloud.invoke("up"))
    made = {p["nodePool"]["name"]: p["nodePool"] for p in bodies(up, "POST", r"/nodePools$")}
    assert {n: (p["config"]["machineType"], p["placementPolicy"]["tpuTopology"], p["initialNodeCount"],
                p["config"]["labels"]) for n, p in made.items()} == before
    assert sorted(r.path.rsplit("/", 1)[-1] for r in up.changes) == ["nodePools", "nodePools"], \
        [(r.method, r.path) for r in up.changes]
    on = cloud.invoke("status")
    assert "  TPUs: on (v6e-16-0 4 nodes, v6e-16-1 4 nodes): `invoke stop-tpus` stops their bill" in on.out, on.out


def test_stop_tpus_on_autopilot_deletes_the_raycluster_and_up_applies_it_again(cloud: Cloud):
    cloud.seed_full(AUTOPILOT)
    cloud.get_credentials(AUTOPILOT)
    run = ok_run(cloud.invoke("stop-tpus", env_name=AUTOPILOT))
    assert [p.rsplit("/", 2)[-2:] for p in _deletes(run)] == [["rayclusters", "maxtext-tpu-cluster"]], _deletes(run)
    assert cloud.gcp.st.clusters and cloud.gcp.st.buckets
    assert cloud.kube.list("rayclusters") == []
    again = ok_run(cloud.invoke("stop-tpus", env_name=AUTOPILOT))
    assert again.changes == [] and "RayCluster maxtext-tpu-cluster is not there" in again.out

    up = ok_run(cloud.invoke("up", env_name=AUTOPILOT))
    assert [rc["metadata"]["name"] for rc in cloud.kube.list("rayclusters")] == ["maxtext-tpu-cluster"], up.out
