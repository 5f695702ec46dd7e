"""A Spot preemption's notice as this project's pools give it (issue 64,
items 3 and 4): the Standard Spot pools made with the longer graceful
termination GKE allows (config/spot_grace.py, cloud/node_shutdown.py), the
worker pods' grace to match, what `capacity`, `preflight` and `train` say
of a save against it (where it cannot be had: Autopilot, an older
cluster), and chaos.preempt-worker's notice, by default what a preemption
gives the job's pods here, said against the save the preflight estimates."""
from __future__ import annotations

import json

from playbooks.cloud import manifests
from playbooks.config import spot_grace
from playbooks.config.choices import preemption_grace_s, worker_grace_s
from playbooks.core.facts import ABSENT
from playbooks.core.step import DRIFT, OK
from playbooks.job import save_period
from playbooks.job.save_period import Times
from tests.conftest import env

SPOT = env("dev", capacity="spot")
OLDER = env("dev", capacity="spot", cluster_version="1.34.1-gke.1829001")
AUTOPILOT = env("dev-autopilot", capacity="spot")
SAVE_24 = Times(24.0, 24.0, 2.5, "estimated", measured=False)  # the issue's ~24 s save
LOSS = "the steps since its last checkpoint"


def _config(command) -> dict | None:
    """The node system configuration a create gives gcloud on its stdin."""
    if "--system-config-from-file=-" not in command.argv:
        return None
    assert command.pipe_from is not None and command.pipe_from.argv[:2] == ("printf", "%s")
    return json.loads(command.pipe_from.argv[2])


def test_a_standard_spot_pool_is_made_with_the_longest_graceful_termination_gke_allows():
    from playbooks.plays.nodepools import create_command
    config = _config(create_command(SPOT, "v6e-16-0", "spot"))
    assert config == {"kubeletConfig": {"shutdownGracePeriodSeconds": 120, "shutdownGracePeriodCriticalPodsSeconds": 15}}
    k = config["kubeletConfig"]
    # GKE's limits: the total one of 0, 30, 120; the critical part 0 to the total.
    assert k["shutdownGracePeriodSeconds"] in spot_grace.ALLOWED_SHUTDOWN_S
    assert 0 <= k["shutdownGracePeriodCriticalPodsSeconds"] <= k["shutdownGracePeriodSeconds"]
    # Not on a pool that is not Spot (GKE: "only valid for Spot VMs"), nor where the cluster is older.
    assert _config(create_command(env("dev", capacity=["spot", "on-demand"]), "v6e-16-0", "on-demand")) is None
    assert _config(create_command(OLDER, "v6e-16-0", "spot")) is None


def test_the_worker_pods_grace_and_their_drain_deadline_match_what_the_spot_pools_give():
    def worker(e):
        rc = next(d for d in manifests.raycluster_docs(e) if d["kind"] == "RayCluster")
        return manifests.group_pod_spec(manifests.worker_group(rc))

    spec = worker(SPOT)
    assert spec["terminationGracePeriodSeconds"] == 105 == worker_grace_s(SPOT)
    hook = spec["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][2]
    assert "'--deadline-remaining-seconds=105'" in hook
    for e in (env("dev"), AUTOPILOT, OLDER):  # nothing lengthened: Kubernetes' default, as before
        assert worker(e)["terminationGracePeriodSeconds"] == 30
    # A RayCluster applied before the grace was set (none: 30 s) is drift where the pools give more.
    rc = next(d for d in manifests.raycluster_docs(SPOT) if d["kind"] == "RayCluster")
    manifests.group_pod_spec(manifests.worker_group(rc)).pop("terminationGracePeriodSeconds")
    assert "worker terminationGracePeriodSeconds 30, want 105" in manifests.added_settings_diffs(SPOT, rc)


def test_what_a_notice_gives_a_save_is_said_against_the_grace_the_environment_really_has():
    [spot] = SPOT.options
    said = save_period.notice_text(spot, SAVE_24, LOSS)
    assert spot.notice_s == 105 and "the first 105 s to the job's pods" in said
    assert "shutdownGracePeriodSeconds=120" in said and "does end within its 105 s: a preemption replays no step" in said
    # Where it cannot be had, the default 15 s, why, and what a preemption replays.
    for e, why in ((AUTOPILOT, "Autopilot: no node pool of ours"), (OLDER, "older than 1.35.0-gke.1171000")):
        [o] = e.options
        said = save_period.notice_text(o, SAVE_24, LOSS)
        assert o.notice_s == 15 and why in said
        assert f"does not end within its 15 s: a preemption replays {LOSS}" in said


def test_preflights_line_says_the_lengthened_notice():
    from playbooks.job import save_plan
    from playbooks.job.spec import build_job
    from playbooks.plays.preflight import save_step
    job = build_job(SPOT, "llama3-8b")
    save_plan.apply(SPOT, job, None)
    step = save_step(SPOT, job)

    def said(gcloud: str) -> str:
        return step.decide(lambda fact: gcloud if fact.name == "gcloud's version" else None).reason
    line = said(spot_grace.MIN_GCLOUD)
    assert "the first 105 s to the job's pods" in line and "does end within its 105 s" in line
    # A gcloud too old to send the pools' kubeletConfig: the pools it makes give GKE's 15 s, and the line says so.
    old = said("528.0.0")
    assert "not lengthened: gcloud 528.0.0 does not send" in old and "does not end within its 15 s" in old, old


class _Looks:
    """A look over the pool step's facts: the pool read back, gcloud's version."""

    def __init__(self, pool, gcloud: str):
        self.pool, self.gcloud = pool, gcloud

    def __call__(self, fact):
        if fact.name == "gcloud's version":
            return self.gcloud
        assert fact.name.startswith("node pool "), fact.name
        return self.pool


def _spot_pool(kubelet: dict | None) -> dict:
    from playbooks.cloud import capacity_options as cap
    cfg = {"machineType": SPOT.machine_type, "spot": True,
           "labels": {"cloud.google.com/gke-networking-dra-driver": "true", cap.LABEL: "spot"}}
    if kubelet is not None:
        cfg["kubeletConfig"] = kubelet
    nets = [{"network": f"maxtext-multislice-net-{i + 1}", "subnetwork": f"tpu-subnet-{i + 1}"} for i in (0, 1)]
    return {"name": "v6e-16-0", "status": "RUNNING", "config": cfg, "initialNodeCount": SPOT.hosts_per_slice,
            "placementPolicy": {"tpuTopology": SPOT.topology},
            "networkConfig": {"additionalNodeNetworkConfigs": nets}}


def test_a_spot_pool_made_without_it_is_drift_with_the_update_that_gives_it():
    from playbooks.plays.nodepools import Pool
    pool = Pool(SPOT, 0)
    d = pool.decide(_Looks(_spot_pool({"insecureKubeletReadonlyPortEnabled": False}), "578.0.0"))
    assert d.kind == DRIFT, d
    assert d.reason == ("node pool v6e-16-0: its Spot VMs do not give the job's pods 105 s of a preemption's notice (kubeletConfig: "
            "shutdownGracePeriodSeconds unset, want 120; shutdownGracePeriodCriticalPodsSeconds unset, want 15; "
            "unset: GKE's default, 15 s)")
    [note] = d.notes
    assert "GKE re-creates the pool's nodes" in note
    assert "| gcloud container node-pools update v6e-16-0 --location=us-east5-b --cluster=maxtext-multislice" in note
    assert note.endswith("--system-config-from-file=-")
    # As set: as asked. A gcloud too old to send it: the pool as it is, and why, said.
    assert pool.decide(_Looks(_spot_pool(dict(spot_grace.KUBELET_CONFIG)), "578.0.0")).kind == OK
    d = pool.decide(_Looks(_spot_pool(None), "528.0.0"))
    assert d.kind == OK and "gcloud 528.0.0 does not send kubeletConfig.shutdownGracePeriodSeconds" in d.notes[0]


def test_a_create_by_a_gcloud_too_old_to_send_it_goes_without_it_and_says_so():
    from playbooks.plays.nodepools import Pool
    pool = Pool(SPOT, 0)
    old = pool.decide(_Looks(ABSENT, "528.0.0"))
    [create] = old.commands
    assert _config(create) is None and "--spot" in create.argv
    assert "made without its node system configuration: gcloud 528.0.0" in old.notes[0]
    [create] = pool.decide(_Looks(ABSENT, "555.0.0")).commands
    assert _config(create) == {"kubeletConfig": dict(spot_grace.KUBELET_CONFIG)}


def test_the_rehearsal_defaults_to_what_a_preemption_gives_the_job_pods_here():
    from playbooks.cli.task_steps import preempt_steps
    assert (preemption_grace_s(SPOT), preemption_grace_s(AUTOPILOT), preemption_grace_s(OLDER)) == (105, 15, 15)
    assert preemption_grace_s(env("dev")) == 30  # on-demand: no preemption's notice; a pod's grace
    [kill] = [s for s in preempt_steps(AUTOPILOT, None, 0) if s.id == "chaos:preempt"]
    assert kill.title.endswith("delete one Ray TPU worker pod with a grace period of 15 s")


def test_the_rehearsal_says_its_notice_against_the_preflights_estimate_and_the_real_one():
    from playbooks.plays.chaos import grace_words, real_words, save_seconds
    t = save_seconds(AUTOPILOT).assumed  # a dry run's: the estimate for the default job, not "not known"
    assert isinstance(t, Times) and not t.measured
    assert grace_words(15, t).startswith(f"a notice of 15 s is shorter than a save ({t.whole_s:.3g} s to "
                                         f"finalized, estimate)")
    assert real_words(AUTOPILOT, 30) == ("a spot preemption here gives the job's pods 15 s: this notice is gentler "
                                         "than the real one (--grace=15 rehearses it)")
    assert real_words(SPOT, 105).endswith("as long as the real one")


def test_trains_preemption_line_reads_the_spot_pools_as_made_not_the_plan():
    """`train`'s preemption line on Spot: a save of 30 s ends within the 105 s
    the lengthened pools give, not within GKE's 15 s; the pools as the
    cluster shows them decide (one made by a gcloud older than 555.0.0 lacks
    the kubeletConfig), not the plan."""
    from playbooks.cloud.gke import nodepool_name
    from playbooks.job import save_plan
    from playbooks.job.save_period import Times
    from playbooks.job.spec import build_job
    from playbooks.plays import train
    e = env("dev", capacity="spot")
    job = build_job(e, "llama3-8b", sets=["checkpoint_period=100"])
    save_plan.apply(e, job, Times(30.0, 30.0, 2.0, "run r's", True))

    def said(kubelet):
        cfg = {"spot": True, **({"kubeletConfig": dict(kubelet)} if kubelet else {})}
        cluster = {"name": e.cluster_name, "nodePools": [{"name": nodepool_name(e, i), "config": dict(cfg)}
                                                         for i in range(e.slices)]}
        [step] = train.preemption_note(e, job)
        return step.decide(lambda fact: cluster if fact.name.startswith("cluster ") else None).reason

    lengthened = said(spot_grace.KUBELET_CONFIG)
    assert "resumes from that save" in lengthened and "not the" not in lengthened, lengthened
    default = said(None)
    assert "resumes from that save" not in default, default
    assert f"the notice is {spot_grace.DEFAULT_PODS_S} s, not the {spot_grace.PODS_S} s planned" in default, default
