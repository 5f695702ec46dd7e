"""A Spot preemption's notice lengthened (issue 64, item 3), through `invoke`
against the loopback fakes with the real gcloud and kubectl
(tests/clients.py): the Spot pools get the node system configuration this
machine's gcloud can send (gcloud 555.0.0 or later; an older one makes the
pool without it and says so), the TPU workers' grace matches the notice, and
a second run changes nothing."""
from __future__ import annotations

import json
import subprocess

import pytest

from playbooks.config import spot_grace
from tests.clients import CLUSTER, Cloud, bodies, ok_run

pytestmark = pytest.mark.clients


def gcloud_version() -> str:
    out = subprocess.run(["gcloud", "version", "--format=json"], capture_output=True, text=True, timeout=120)
    return json.loads(out.stdout)["Google Cloud SDK"]


def test_spot_pools_get_the_longer_notice_this_gcloud_can_send_and_the_workers_grace_matches(cloud: Cloud):
    cloud.change_inventory(capacity="spot")
    cloud.seed_to_cluster()
    cloud.get_credentials()
    run = ok_run(cloud.invoke("nodepools", "raycluster"))
    posts = [p["nodePool"]["config"] for p in bodies(run, "POST", r"/nodePools$")]
    assert len(posts) == 2 and all(c["spot"] is True for c in posts)
    version = gcloud_version()
    if spot_grace.gcloud_blocker(version) is None:
        assert all(c["kubeletConfig"] == spot_grace.KUBELET_CONFIG for c in posts), posts
    else:  # this machine's gcloud (528.0.0 when written) refuses the keys: made without, said so
        assert all("kubeletConfig" not in c for c in posts), posts
        assert f"made without its node system configuration: gcloud {version} does not send" in run.out
    [rc] = bodies(run, "POST", r"/rayclusters$")
    spec = rc["spec"]["workerGroupSpecs"][0]["template"]["spec"]
    assert spec["terminationGracePeriodSeconds"] == 105
    assert "'--deadline-remaining-seconds=105'" in spec["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][2]
    assert ok_run(cloud.invoke("nodepools", "raycluster")).changes == []
    # The pools as GKE keeps them after a create that sent it: as asked, nothing said of it.
    for np in cloud.gcp.st.clusters[("us-east5-b", CLUSTER)]["nodePools"]:
        if (np.get("config") or {}).get("spot"):
            np["config"]["kubeletConfig"] = dict(spot_grace.KUBELET_CONFIG)
    again = ok_run(cloud.invoke("nodepools"))
    assert again.changes == [] and "node system configuration" not in again.out
    assert "node pool v6e-16-0 is RUNNING (4x4, spot)" in again.out


def _spot_pools(cloud: Cloud, kubelet: dict | None) -> None:
    """The fake cluster's TPU pools made Spot, with ``kubelet`` as their
    kubeletConfig (None: made without it, as gcloud 528 makes them)."""
    for np in cloud.gcp.st.clusters[("us-east5-b", CLUSTER)]["nodePools"]:
        if np["name"].startswith("v6e-"):
            np.setdefault("config", {})["spot"] = True
            np["config"].pop("kubeletConfig", None)
            if kubelet is not None:
                np["config"]["kubeletConfig"] = dict(kubelet)


def _grace_deleted(run) -> int:
    [deleted] = [r for r in run.requests if r.method == "DELETE"]
    return int(deleted.query.get("gracePeriodSeconds") or (deleted.body or {}).get("gracePeriodSeconds"))


def test_the_rehearsals_default_notice_is_what_the_spot_pools_as_made_give_never_the_plans(cloud: Cloud):
    """chaos.preempt-worker without --grace reads the Spot pools: made without
    the kubeletConfig (a gcloud older than 555.0.0: every gcloud 528 here), a
    preemption gives the job's pods GKE's 15 s, so the rehearsal gives 15 s
    and says why, not the 105 s the plan would have given them."""
    cloud.change_inventory(capacity="spot")
    cloud.seed_full()
    cloud.get_credentials()
    _spot_pools(cloud, None)
    run = ok_run(cloud.invoke("chaos.preempt-worker", "--restore-after=0"))
    assert _grace_deleted(run) == spot_grace.DEFAULT_PODS_S, run.out
    assert "was made without the lengthened graceful termination" in run.out, run.out
    assert f"the notice is {spot_grace.DEFAULT_PODS_S} s, not the {spot_grace.PODS_S} s planned" in run.out
    _spot_pools(cloud, spot_grace.KUBELET_CONFIG)
    run = ok_run(cloud.invoke("chaos.preempt-worker", "--restore-after=0"))
    assert _grace_deleted(run) == spot_grace.PODS_S, run.out
    assert "not the" not in run.out


def test_capacity_says_the_notice_this_gcloud_can_give_the_spot_pools(cloud: Cloud):
    """`invoke capacity` on Spot, run by the real gcloud: where it is older
    than 555.0.0 (528.0.0 when written) it cannot send the pools'
    kubeletConfig, so the notice said is GKE's 15 s, with why, never the
    105 s the plan would give; a gcloud that sends it gets the 105 s."""
    cloud.change_inventory(capacity="spot")
    cloud.seed_to_cluster()
    run = ok_run(cloud.invoke("capacity"))
    [notice] = [ln for ln in run.out.splitlines() if "capacity : notice before a slice goes]" in ln and "ok:" in ln]
    version = gcloud_version()
    if spot_grace.gcloud_blocker(version) is None:
        assert f"the first {spot_grace.PODS_S} s to the job's pods" in notice, notice
    else:
        assert f"not lengthened: gcloud {version} does not send" in notice, notice
        assert f"end within its {spot_grace.DEFAULT_PODS_S} s" in notice, notice
        assert f"{spot_grace.PODS_S} s" not in notice, notice
