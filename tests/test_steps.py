"""Step outcomes from declared facts (pyinfra-style): each probe's answer is
declared by its command line; an undeclared probe is an error, never a
default. Nothing starts: these run the real plays with a fixture runner."""

import pytest

from playbooks.config import spot_grace
from playbooks.core.facts import Completed
from playbooks.core.fixtures import Answers
from playbooks.core.runner import Mode
from playbooks.plays import cluster, network, nodepools, storage, teardown
from tests.conftest import env, run_with_facts

DEV = env("dev")
NETS = "CLOUDSDK_CORE_VERBOSITY=debug gcloud compute networks list --format=json --project=my-tpu-project"
CLUSTERS = "gcloud container clusters list --format=json --project=my-tpu-project"


def with_pools(*pools):
    """`clusters list` holding the cluster with these node pools: the node
    pools are read from it (GKE's Cluster carries its ``nodePools``)."""
    return [{"name": "maxtext-multislice", "status": "RUNNING", "location": "us-east5-b", "nodePools": list(pools)}]


def net(name, mtu=8896, auto=False):
    return {"name": name, "mtu": mtu, "autoCreateSubnetworks": auto}


def applied(lines):
    return [ln.split("apply  ", 1)[1] for ln in lines if ln.startswith("  apply")]


def test_absent_network_is_created_then_verified():
    steps = network.steps(DEV)[:1]
    after = [net("maxtext-multislice-net-1")]
    recap, out = run_with_facts(steps, {NETS: Answers([], after)})
    assert recap.counters() == "ok=0 changed=1 failed=0 skipped=0"
    assert applied(out) == ["CLOUDSDK_CORE_VERBOSITY=debug gcloud compute networks create maxtext-multislice-net-1 --subnet-mode=custom "
                            "--mtu=8896 --project=my-tpu-project"]
    assert any(ln.startswith("  verify") and ln.endswith("=> ok") for ln in out)


def test_present_network_is_ok_with_no_command():
    recap, out = run_with_facts(network.steps(DEV)[:2], {NETS: [net("maxtext-multislice-net-1"),
                                                               net("maxtext-multislice-net-2")]})
    assert recap.counters() == "ok=2 changed=0 failed=0 skipped=0"
    assert applied(out) == []


def test_network_with_another_mtu_is_drift_with_both_values():
    recap, out = run_with_facts(network.steps(DEV)[:1], {NETS: [net("maxtext-multislice-net-1", mtu=1460)]})
    assert recap.counters() == "ok=0 changed=0 failed=1 skipped=0"
    assert "drift: network maxtext-multislice-net-1: mtu is 1460, want 8896" in out.text()
    assert applied(out) == []


def test_probe_error_stops_the_run_and_is_not_absent():
    denied = Completed(NETS, 1, "", "ERROR: (gcloud.compute.networks.list) Some requests did not succeed:\n"
                                    " - Required 'compute.networks.list' permission for 'projects/my-tpu-project'")
    recap, out = run_with_facts(network.steps(DEV), {NETS: denied})
    assert recap.counters() == "ok=0 changed=0 failed=1 skipped=0"
    assert recap.not_run == ["network : VPC maxtext-multislice-net-2", "network : subnet tpu-subnet-1",
                             "network : subnet tpu-subnet-2"]
    assert "could not look (exit code 1)" in out.text() and "Required 'compute.networks.list'" in out.text()
    assert applied(out) == []


def test_undeclared_probe_is_an_error():
    recap, out = run_with_facts(network.steps(DEV)[2:3], {NETS: []})
    assert recap.failed
    assert ("probe not declared by the fixture: CLOUDSDK_COMPUTE_ALLOW_PARTIAL_ERROR=false "
            "CLOUDSDK_CORE_VERBOSITY=debug gcloud compute networks subnets list") in out.text()


def test_subnet_on_another_network_is_drift():
    subs = ("CLOUDSDK_COMPUTE_ALLOW_PARTIAL_ERROR=false CLOUDSDK_CORE_VERBOSITY=debug "
            "gcloud compute networks subnets list --regions=us-east5 --format=json --project=my-tpu-project")
    other = {"name": "tpu-subnet-1", "network": "https://x/projects/p/global/networks/other-net",
             "ipCidrRange": "10.51.0.0/16"}
    _recap, out = run_with_facts(network.steps(DEV)[2:3], {subs: [other]})
    assert "drift: subnet tpu-subnet-1: it is on network 'other-net', want 'maxtext-multislice-net-1'; "\
           "range is 10.51.0.0/16, want 10.50.0.0/16" in out.text()


def pool(name, status="RUNNING", topology="4x4", nodes=4, capacity="on-demand"):
    # A Spot pool as this project makes it: with its lengthened graceful termination (cloud/node_shutdown.py).
    extra = {"spot": True, "kubeletConfig": dict(spot_grace.KUBELET_CONFIG)} if capacity == "spot" else {}
    return {"name": name, "status": status, "initialNodeCount": nodes,
            "config": {"machineType": "ct6e-standard-4t", **extra,
                       "labels": {"cloud.google.com/gke-networking-dra-driver": "true",
                                  "tpu-playbooks/capacity": capacity}},
            "placementPolicy": {"tpuTopology": topology},
            "networkConfig": {"additionalNodeNetworkConfigs": [
                {"network": "maxtext-multislice-net-1", "subnetwork": "tpu-subnet-1"},
                {"network": "maxtext-multislice-net-2", "subnetwork": "tpu-subnet-2"}]}}


def test_node_pool_with_another_topology_is_drift():
    _recap, out = run_with_facts(nodepools.steps(DEV)[:1], {CLUSTERS: with_pools(pool("v6e-16-0", topology="2x4"))})
    assert "drift: node pool v6e-16-0: TPU topology is 2x4, want 4x4" in out.text()


def test_broken_node_pool_is_replaced_not_counted_done():
    broken = pool("v6e-16-0", status="ERROR")
    broken["statusMessage"] = "GCE_STOCKOUT: no ct6e-standard-4t capacity in us-east5-b"
    recap, out = run_with_facts(nodepools.steps(DEV)[:1], {CLUSTERS: Answers(with_pools(broken), with_pools(pool("v6e-16-0")))})
    cmds = applied(out)
    assert cmds[0].startswith("gcloud container node-pools delete v6e-16-0 --location=us-east5-b")
    assert cmds[1].startswith("gcloud container node-pools create v6e-16-0")
    assert "replaced a broken pool (was ERROR: GCE_STOCKOUT" in out.text()
    assert recap.counters() == "ok=0 changed=1 failed=0 skipped=0"


def test_pool_that_fails_while_waiting_stops_at_once():
    broken = pool("v6e-16-0", status="ERROR")
    broken["statusMessage"] = "GCE_STOCKOUT"
    recap, out = run_with_facts(nodepools.steps(DEV)[:1], {CLUSTERS: Answers(with_pools(), with_pools(broken))})
    assert recap.failed
    assert "not verified after the change: node pool v6e-16-0 is ERROR: GCE_STOCKOUT" in out.text()


def test_autopilot_skips_node_pools_with_its_reason():
    recap, out = run_with_facts(nodepools.steps(env("dev-autopilot")), {})
    assert recap.counters() == "ok=0 changed=0 failed=0 skipped=1"
    assert "Autopilot has no node pools to create" in out.text()


def test_cluster_being_created_elsewhere_is_waited_for_not_created_again():
    c = {"name": "maxtext-multislice", "status": "PROVISIONING", "location": "us-east5-b",
         "addonsConfig": {"rayOperatorConfig": {"enabled": True}},
         "workloadIdentityConfig": {"workloadPool": "my-tpu-project.svc.id.goog"}}
    recap, out = run_with_facts(cluster.steps(DEV)[:1], {CLUSTERS: Answers([c], [{**c, "status": "RUNNING"}])})
    assert applied(out) == []
    assert recap.counters() == "ok=1 changed=0 failed=0 skipped=0"


def test_autopilot_cluster_found_where_standard_is_asked_is_drift():
    c = {"name": "maxtext-multislice", "status": "RUNNING", "location": "us-east5", "autopilot": {"enabled": True},
         "addonsConfig": {"rayOperatorConfig": {"enabled": True}}}
    _recap, out = run_with_facts(cluster.steps(DEV)[:1], {CLUSTERS: [c]})
    assert "it is in us-east5, want us-east5-b; it is Autopilot, want Standard" in out.text()


SERVICES = "gcloud services list --enabled --format=json --project=my-tpu-project"


def enabled(number="123456789"):
    """The enabled services as Service Usage lists them: each names the
    project by its number (``parent``)."""
    return [{"name": f"projects/{number}/services/{s}", "parent": f"projects/{number}", "state": "ENABLED",
             "config": {"name": s}} for s in ("container.googleapis.com", "storage.googleapis.com")]


def test_binding_uses_the_looked_up_project_number():
    number = "gcloud projects describe my-tpu-project '--format=value(projectNumber)'"
    policy = "gcloud storage buckets get-iam-policy gs://my-tpu-project-maxtext-ckpt --format=json"
    member = ("principal://iam.googleapis.com/projects/123456789/locations/global/workloadIdentityPools/"
              "my-tpu-project.svc.id.goog/subject/ns/default/sa/maxtext-ksa")
    granted = {"bindings": [{"role": "roles/storage.objectUser", "members": [member]}]}
    step = [s for s in storage.steps(DEV) if s.id == "storage:binding"]
    recap, out = run_with_facts(step, {SERVICES: enabled(), number: "123456789\n",
                                       policy: Answers({"bindings": []}, granted)})
    assert applied(out) == ["gcloud storage buckets add-iam-policy-binding gs://my-tpu-project-maxtext-ckpt "
                            f"--member {member} --role roles/storage.objectUser"]
    # Granted: the number is the one the enabled services name; no `gcloud projects describe` (undeclared here).
    recap, out = run_with_facts(step, {SERVICES: enabled(), policy: granted})
    assert applied(out) == [] and recap.counters() == "ok=1 changed=0 failed=0 skipped=0", out.text()
    # A binding of another project's number is not this one's.
    recap, out = run_with_facts(step, {SERVICES: enabled("987654321"), number: "987654321\n",
                                       policy: Answers(granted, granted)}, mode=Mode.CHECK)
    assert recap.counters() == "ok=0 changed=1 failed=0 skipped=0", out.text()
    # Services that cannot be listed, or name no one number: the tutorial's `gcloud projects describe` says it.
    denied = Completed(SERVICES, 1, "", "ERROR: (gcloud.services.list) PERMISSION_DENIED: denied")
    for services in (denied, []):
        recap, out = run_with_facts(step, {SERVICES: services, number: "123456789\n", policy: granted})
        assert recap.counters() == "ok=1 changed=0 failed=0 skipped=0", out.text()


def test_teardown_leaves_a_subnet_of_another_network_alone():
    subs = ("CLOUDSDK_COMPUTE_ALLOW_PARTIAL_ERROR=false CLOUDSDK_CORE_VERBOSITY=debug "
            "gcloud compute networks subnets list --regions=us-east5 --format=json --project=my-tpu-project")
    other = {"name": "tpu-subnet-1", "network": "projects/p/global/networks/someone-else"}
    step = [s for s in teardown.steps(DEV) if s.id == "teardown:subnet-1"]
    _recap, out = run_with_facts(step, {subs: [other]})
    assert applied(out) == []
    assert "belongs to network someone-else, not maxtext-multislice-net-1: left alone" in out.text()


def test_check_mode_prints_but_does_not_verify():
    from playbooks.core.runner import Mode
    recap, out = run_with_facts(network.steps(DEV)[:1], {NETS: []}, mode=Mode.CHECK)
    assert recap.counters() == "ok=0 changed=1 failed=0 skipped=0"
    assert "would change: created" in out.text()
    assert not any(ln.startswith("  verify") for ln in out)


def test_check_mode_skips_what_needs_a_change_it_does_not_make_and_fails_the_rest():
    """A step that needs one which would change cannot look at what it
    needs: its failure becomes a skip with the reason (transitively). A
    failure that needs no pending change stays a failure."""
    from playbooks.core.command import Command
    from playbooks.core.runner import Mode
    from playbooks.core.step import Step, change, fail
    a = Step("t", "a", lambda look: change(Command(("true",)), reason="made"), id="a")
    b = Step("t", "b", lambda look: fail("a is not there"), id="b", after=("a",))
    c = Step("t", "c", lambda look: fail("c's own problem"), id="c", after=("b",))
    recap, out = run_with_facts([a, b, c], {}, mode=Mode.CHECK)
    assert recap.counters() == "ok=0 changed=1 failed=0 skipped=2"
    assert "skipped: [t : b] cannot be checked before t : a changes (check mode changes nothing): a is not there"\
        in out.text()
    assert "skipped: [t : c] cannot be checked before t : a changes" in out.text()  # the change it waits on
    d = Step("t", "d", lambda look: fail("denied"), id="d")
    recap, out = run_with_facts([a, d], {}, mode=Mode.CHECK)
    assert recap.counters() == "ok=0 changed=1 failed=1 skipped=0"
    recap, out = run_with_facts([a, b], {}, mode=Mode.APPLY)  # apply mode: no such leniency
    assert "failed=1" in recap.counters()


def test_check_mode_says_a_step_that_would_wait_is_not_ready_never_as_asked():
    """Check mode waits for nothing: a wait is what is (not ready), counted
    as changed (not converged); status shows it "not ready" with why. What
    is there can be looked at: a failure that needs it stays a failure, and
    is the diagnosis (it may say why: a worker's Kubernetes cause)."""
    from playbooks.cli import status
    from playbooks.core.runner import Mode
    from playbooks.core.step import Step, fail, ok, wait
    a = Step("t", "slices", lambda look: wait("1 of 2 slices ready"), id="a")
    b = Step("t", "workers", lambda look: fail("a worker Pending: no node with free TPU chips"), id="b",
             after=("a",))
    c = Step("t", "jobs", lambda look: ok("none"), id="c", after=("a",))
    recap, out = run_with_facts([a, b, c], {}, mode=Mode.CHECK, keep_going=True)
    assert recap.counters() == "ok=1 changed=1 failed=1 skipped=0"
    assert "changed: [t : slices] would wait: 1 of 2 slices ready" in out.text()
    doc = status.report(env("local"), recap)
    assert [(i["verdict"], i["reason"]) for i in doc["items"]] == [
        ("not ready", "1 of 2 slices ready"), ("not as asked", "a worker Pending: no node with free TPU chips"),
        ("as asked", "none")]
    assert not doc["as_asked"] and doc["diagnosis"] == "t : workers: a worker Pending: no node with free TPU chips"
    recap, _ = run_with_facts([a, c], {}, mode=Mode.CHECK)
    assert status.report(env("local"), recap)["diagnosis"] == "t : slices: not ready"


def test_more_than_64_chips_are_said_before_any_pool_is_made():
    big = env("dev", slices=4, topology="8x8")
    _recap, out = run_with_facts(nodepools.steps(big)[:1], {})
    assert "this environment asks for 256 TPU v6e chips: 4 slices of 8x8 (64 chips, 16 ct6e-standard-4t hosts "\
           "each), more than 64" in out.text()
    assert [s.name for s in nodepools.steps(DEV)] == ["TPU node pool v6e-16-0", "TPU node pool v6e-16-1"]


def test_check_mode_says_the_port_forward_would_start_not_that_it_started():
    from playbooks.core.facts import ABSENT
    from playbooks.core.runner import Mode
    from playbooks.plays import dashboard
    recap, out = run_with_facts([dashboard.forward_step(DEV)], {"curl -fsS http://localhost:8265/api/version": ABSENT},
                                mode=Mode.CHECK)
    assert "would start the port-forward to http://localhost:8265" in out.text()
    assert "port-forward started" not in out.text()
    assert recap.results[0].found == "no port-forward"  # what is, for a report


def test_a_step_has_one_body_decide_or_run():
    from playbooks.core.step import Step, ok
    Step("p", "decides", lambda look: ok())
    Step("p", "runs", run=lambda ctx: None)
    for kwargs in ({}, {"decide": lambda look: ok(), "run": lambda ctx: None}):
        with pytest.raises(TypeError, match="either decide or run"):
            Step("p", "s", **kwargs)


# -- the engine's decisions, waits and words ---------------------------------------------------
def _fact(name, value=None):
    from playbooks.core.facts import Fact
    return Fact(name=name, python=lambda: value, display=f"look {name}")


def test_skip_and_unchecked_are_decisions_with_their_words():
    from playbooks.core.step import Step, skip, unchecked
    probe = _fact("quota")
    steps = [Step("p", "does not apply", lambda look: skip("not on Autopilot")),
             Step("p", "cannot look", lambda look: (look(probe), unchecked("403 from the quotas API"))[1])]
    recap, out = run_with_facts(steps, {"look quota": None})
    assert recap.counters() == "ok=0 changed=0 failed=0 skipped=2"
    assert "skipped: [p : does not apply] not on Autopilot" in out.text()
    assert "skipped: [p : cannot look] not checked: 403 from the quotas API" in out.text()
    assert [r.found for r in recap.results] == ["", "unknown"]


def test_a_dry_run_says_what_it_would_check_and_do_never_that_it_did():
    from playbooks.core.facts import Action, Fact
    from playbooks.core.play import Playbook
    from playbooks.core.recap import Reporter
    from playbooks.core.runner import Mode, Runner
    from playbooks.core.step import Step, change, ok
    probe = Fact(name="zones", python=lambda: ["z"], display="list zones", assumed=["z"])
    steps = [Step("p", "offered", lambda look: ok(f"zone {look(probe)[0]} offers it")),
             Step("p", "no look", lambda look: ok("nothing looked at")),
             Step("p", "made", lambda look: change(Action("make it", lambda: None), reason="made it",
                                                   would="make it", found="missing")),
             Step("p", "made, no would", lambda look: change(Action("x", lambda: None), reason="created"))]
    out: list[str] = []
    recap = Playbook(Runner(Mode.DRY), Reporter(out.append)).run("t", steps)
    text = "\n".join(out)
    assert recap.counters() == "ok=2 changed=2 failed=0 skipped=0"
    assert "ok: [p : offered] would check: zone z offers it" in text
    assert "ok: [p : no look] nothing looked at" in text
    assert "changed: [p : made] would make it" in text
    assert "changed: [p : made, no would] would change: created" in text
    assert "made it" not in text.replace("would make it", "")


def test_an_await_is_polled_by_the_engine_between_two_commands():
    from playbooks.core.facts import Action
    from playbooks.core.step import Await, Step, change
    seen: list[str] = []
    gone = _fact("ghost")
    steps = [Step("p", "restart", lambda look: change(Action("stop", lambda: seen.append("stop")),
                                                      Await(gone, lambda v: None if v == "gone" else "still listed",
                                                            "the ghost gone", timeout=10, interval=1),
                                                      Action("start", lambda: seen.append("start")),
                                                      reason="restarted"))]
    recap, out = run_with_facts(steps, {"look ghost": Answers("listed", "listed", "gone")})
    assert recap.counters() == "ok=0 changed=1 failed=0 skipped=0", out.text()
    waits = [ln for ln in out if ln.startswith("  wait")]
    assert waits == ["  wait   look ghost  (until the ghost gone)  => still listed",
                     "  wait   look ghost  (until the ghost gone)  => ok"], out.text()
    timed_out, out = run_with_facts(steps, {"look ghost": "listed"})
    assert timed_out.counters() == "ok=0 changed=0 failed=1 skipped=0"
    assert "waited 10s for the ghost gone: still listed" in out.text()


def test_a_verify_that_meets_a_final_state_stops_at_once():
    from playbooks.core.facts import Action
    from playbooks.core.step import Broken, Step, Verify, change
    state = _fact("node")

    def check(v):
        if v == "exited":
            raise Broken("the node exited: OSError: no room")
        return None if v == "up" else "not up yet"
    steps = [Step("p", "start", lambda look: change(Action("start", lambda: None), reason="started"),
                  verify=Verify(state, check, timeout=3600, interval=1))]
    recap, out = run_with_facts(steps, {"look node": Answers("starting", "exited")})
    assert recap.counters() == "ok=0 changed=0 failed=1 skipped=0"
    assert "not verified after the change: the node exited: OSError: no room" in out.text()


def test_a_step_hands_data_on_through_the_recap():
    from playbooks.core.step import Step, ok
    recap, _ = run_with_facts([Step("p", "rows", lambda look: ok("2 rows", data=[1, 2]), id="p:rows")], {})
    assert recap.data("p:rows") == [1, 2] and recap.data("p:none") is None


def test_status_of_a_stopped_local_cluster_says_what_is():
    """Not running, and unknown because of it: never what a change would do."""
    from playbooks.cli import status
    from playbooks.core.facts import ABSENT
    from playbooks.core.runner import Mode
    local = env("local")
    facts = {"kill -0 $(cat .state/local/nodes/head.pid)": False,
             "kill -0 $(cat .state/local/nodes/tpu-group-0-0.pid)": False,
             "kill -0 $(cat .state/local/nodes/tpu-group-1-0.pid)": False,
             "curl -fsS http://127.0.0.2:8265/api/version": ABSENT,
             "ss -ltn 'sport >= :6390 and sport <= :6412'  # a port of the local nodes already taken": [],
             "curl -fsS 'http://127.0.0.2:8265/api/v0/nodes?limit=10000&detail=true'  # what `ray list nodes "
             "--address http://127.0.0.2:8265` reads": ABSENT,
             "curl -fsS http://127.0.0.2:8265/api/jobs/": ABSENT,
             "cat .state/local/quarantine.json": {}}
    recap, _out = run_with_facts(status.steps(local), facts, mode=Mode.CHECK)
    doc = status.report(local, recap)
    rows = {i["what"]: (i["verdict"], i["reason"]) for i in doc["items"]}
    assert rows["twin : Ray head http://127.0.0.2:8265"] == ("not running", "not running")
    assert rows["twin : TPU host tpu-group-0-0"] == ("not running", "not running")
    assert rows["dashboard : Ray nodes"][0] == "unknown"
    assert rows["twin : TPU slices"][0] == "unknown"
    assert rows["dashboard : Ray nodes"][1].startswith("unknown because twin : Ray head http://127.0.0.2:8265 is "
                                                       "not running")
    assert rows["status : jobs"] == ("unknown", "unknown because no Ray dashboard answers at http://127.0.0.2:8265")
    assert doc["diagnosis"] == "twin : Ray head http://127.0.0.2:8265: not running: run `invoke up`"
    assert not doc["as_asked"]
    assert "would" not in "\n".join(status.table(doc))


# -- checkpoints: only what Orbax finalized counts -------------------------------------
def _real(steps):
    """Run steps with real probes (in-process facts on this machine)."""
    from playbooks.core.play import Playbook
    from playbooks.core.recap import Reporter
    from playbooks.core.runner import Mode, Runner
    from tests.conftest import Transcript
    out = Transcript()
    recap = Playbook(Runner(Mode.APPLY), Reporter(out.append), workers=1).run("test", steps)
    return recap, out


@pytest.mark.parametrize("steps,want", [(31, "run rayjob-multi-slice resumes from checkpoint step 20"),
                                        (21, "run rayjob-multi-slice already trained to step 20 of 21")])
def test_a_half_written_local_checkpoint_is_named_and_never_counted(tmp_path, steps, want):
    """What a preempted save leaves locally (Orbax writes <step>.orbax-
    checkpoint-tmp-<ts>/ and renames it on commit): step 30 is not there
    for train, though its folder is the newest."""
    from pathlib import Path

    from playbooks.job.spec import build_job, checkpoints_place
    from playbooks.plays import train
    job = build_job(env("local"), "llama3-8b", steps=steps, sets=[f"base_output_directory={tmp_path}/"])
    where = Path(checkpoints_place(job)[1])
    for d in ("10/model_params", "20/model_params", "30.orbax-checkpoint-tmp-1733000000/model_params"):
        (where / d).mkdir(parents=True)
    (where / "30.orbax-checkpoint-tmp-1733000000" / "_CHECKPOINT_METADATA").write_text("{}")
    (where / "40").write_text("a file named like a step is no step")
    recap, out = _real([train.checkpoint_step(job)])
    assert recap.counters() == "ok=1 changed=0 failed=0 skipped=0", out.text()
    assert want in out.text(), out.text()
    assert ("ignored, not finalized: 30.orbax-checkpoint-tmp-1733000000: a save that did not finish (Orbax renames "
            "<step>.orbax-checkpoint-tmp-* to <step> when it commits)") in out.text()
    assert f"ls {where}  => checkpoint steps [10, 20]; not finalized, ignored: 30.orbax-checkpoint-tmp-1733000000" \
        in out.text()


def test_fresh_deletes_a_folder_that_holds_only_a_half_written_step(tmp_path):
    from pathlib import Path

    from playbooks.job.spec import build_job, checkpoints_place
    from playbooks.plays import train
    # A dashboard port nothing answers on: no job of the run is running.
    job = build_job(env("local", dashboard_port=8399), "llama3-8b", fresh=True,
                    sets=[f"base_output_directory={tmp_path}/"])
    where = Path(checkpoints_place(job)[1])
    (where / "10.orbax-checkpoint-tmp-1").mkdir(parents=True)
    recap, out = _real([train.checkpoint_step(job)])
    assert recap.counters() == "ok=0 changed=1 failed=0 skipped=0", out.text()
    assert not where.exists()


def test_fresh_never_deletes_the_checkpoints_a_running_job_of_the_run_writes(tmp_path):
    """A job of the run RUNNING (a follow that was interrupted, another
    terminal): --fresh is refused before anything is deleted."""
    from pathlib import Path

    from playbooks.job.spec import build_job, checkpoints_place
    from playbooks.plays import train
    job = build_job(env("local"), "llama3-8b", elastic=True, fresh=True, sets=[f"base_output_directory={tmp_path}/"])
    where = Path(checkpoints_place(job)[1])
    jobs = "curl -fsS http://127.0.0.2:8265/api/jobs/"
    running = [{"submission_id": "rayjob-elastic-8b-2", "status": "RUNNING"},
               {"submission_id": "other-run-1", "status": "RUNNING"},
               {"submission_id": "rayjob-elastic-8b-1", "status": "SUCCEEDED"}]
    from playbooks.job.spec import Checkpoints
    kept = "ls .state/local/training/rayjob-elastic-8b/events.jsonl"
    recap, out = run_with_facts([train.checkpoint_step(job)], {jobs: running, f"ls {where}": Checkpoints((10,)),
                                                               kept: True})
    assert recap.counters() == "ok=0 changed=0 failed=1 skipped=0", out.text()
    assert ("job rayjob-elastic-8b-2 of run rayjob-elastic-8b is RUNNING: --fresh would delete the checkpoints it "
            "writes; stop it first (`ray job stop --address http://127.0.0.2:8265 rayjob-elastic-8b-2`), or follow "
            "it (`invoke logs --run rayjob-elastic-8b --follow`)") in out.text()
    assert "rm -r" not in out.text()
    done = [{"submission_id": "rayjob-elastic-8b-2", "status": "STOPPED"}, running[1]]
    recap, out = run_with_facts([train.checkpoint_step(job)], {jobs: done, kept: True,
                                                               f"ls {where}": Answers(Checkpoints((10,)), Checkpoints())})
    assert recap.counters() == "ok=0 changed=1 failed=0 skipped=0", out.text()


CKPT = "gs://my-tpu-project-maxtext-ckpt/rayjob-multi-slice/checkpoints/"
LS = f"gcloud storage ls '{CKPT}*'"


def _listing(*dirs):
    """`gcloud storage ls <checkpoints>/*` as gcloud prints it: each step
    directory, then its entries."""
    return "\n".join(f"{CKPT}{d}/:\n" + "".join(f"{CKPT}{d}/{k}\n" for k in kids) for d, kids in dirs)


def test_gcs_counts_a_step_only_with_orbax_commit_marker():
    from playbooks.job.spec import gcs_checkpoints
    have = gcs_checkpoints(CKPT, _listing(
        ("10", ["_CHECKPOINT_METADATA", "commit_success.txt", "model_params/"]),
        ("20", ["_CHECKPOINT_METADATA", "model_params/"]),                  # preempted before its marker
        ("30", ["commit_success.txt", "model_params/"]),                    # FUSE rename still copying
        ("30.orbax-checkpoint-tmp-1733", ["optimizer_state/"]),
        ("notes", ["x"])))
    assert have.steps == (10,)
    assert have.partial == (("20", "no commit_success.txt: Orbax did not finalize it"),
                            ("30", "its 30.orbax-checkpoint-tmp-* is still there: a rename through GCS FUSE that "
                                   "did not finish"),
                            ("30.orbax-checkpoint-tmp-1733", "a save that did not finish (Orbax renames "
                                                             "<step>.orbax-checkpoint-tmp-* to <step> when it "
                                                             "commits)"))


@pytest.mark.parametrize("base", ["/data/", "gs://my-tpu-project-maxtext-ckpt/"])
def test_a_stale_gcs_step_is_ignored_and_a_restore_from_it_refused(base):
    """The workers write gs:// (Orbax's commit-file rule: it skips step 20
    too) or through GCS FUSE at /data/ (a folder to Orbax: it would take 20/
    as final and restore from it, so train refuses, with the command)."""
    from playbooks.job.spec import build_job
    from playbooks.plays import train
    job = build_job(DEV, "llama3-8b", sets=[f"base_output_directory={base}"])
    listing = _listing(("10", ["commit_success.txt", "model_params/"]), ("20", ["model_params/"]))
    recap, out = run_with_facts([train.checkpoint_step(job)], {LS: listing})
    if base.startswith("gs://"):
        assert recap.counters() == "ok=1 changed=0 failed=0 skipped=0", out.text()
        assert ("run rayjob-multi-slice resumes from checkpoint step 10; ignored, not finalized: 20: no "
                "commit_success.txt: Orbax did not finalize it") in out.text()
    else:
        assert recap.counters() == "ok=0 changed=0 failed=1 skipped=0", out.text()
        assert ("checkpoint step 20 of run rayjob-multi-slice is not whole (no commit_success.txt: Orbax did not "
                "finalize it), but the workers read /data/ as a folder, where Orbax takes any <step>/ as final: "
                f"MaxText would restore from it. Remove it (`gcloud storage rm --recursive {CKPT}20/`) to resume "
                "from 10, or start over with --fresh") in out.text()
    assert applied(out) == []


# -- GKE maintenance held off during a run ------------------------------------------------
HOLD = "playbooks-train-rayjob-multi-slice"
UPDATE = "gcloud container clusters update maxtext-multislice --location=us-east5-b "
ADD = (UPDATE + f"--add-maintenance-exclusion-name={HOLD} --add-maintenance-exclusion-start=P0D "
       "--add-maintenance-exclusion-end=P7D --add-maintenance-exclusion-scope=no_minor_or_node_upgrades "
       "--project=my-tpu-project --quiet")
REMOVE = UPDATE + f"--remove-maintenance-exclusion={HOLD} --project=my-tpu-project --quiet"


def _cluster(**exclusions):
    """`clusters list` of one cluster with these exclusions: name -> (days
    from now it started, days from now it ends, scope)."""
    import datetime as dt
    now = dt.datetime.now(dt.UTC)
    windows = {n.replace("_", "-"): {"startTime": (now + dt.timedelta(days=a)).strftime("%Y-%m-%dT%H:%M:%SZ"),
                                     "endTime": (now + dt.timedelta(days=b)).strftime("%Y-%m-%dT%H:%M:%S.123456789Z"),
                                     "maintenanceExclusionOptions": {"scope": scope}}
               for n, (a, b, scope) in exclusions.items()}
    return [{"name": "maxtext-multislice", "status": "RUNNING", "location": "us-east5-b",
             "maintenancePolicy": {"resourceVersion": "abc", "window": {"maintenanceExclusions": windows}}}]


NODES = "NO_MINOR_OR_NODE_UPGRADES"
ours_ = HOLD.replace("-", "_")


@pytest.mark.parametrize("before,after,trained_to,want,commands", [
    ({}, {ours_: (0, 7, NODES)}, None, "add maintenance exclusion " + HOLD + " (no node or minor upgrades for 7 days", [ADD]),
    ({ours_: (-1, 6, NODES)}, None, None, f"maintenance exclusion {HOLD} (no_minor_or_node_upgrades) until", []),
    ({ours_: (-6, 0.5, NODES)}, {ours_: (0, 7, NODES)}, None, f"renewed maintenance exclusion {HOLD} (it ends at",
     [REMOVE, ADD]),
    ({ours_: (-1, 6, "NO_UPGRADES")}, {ours_: (0, 7, NODES)}, None, "its scope is NO_UPGRADES", [REMOVE, ADD]),
    ({ours_: (-9, -2, NODES)}, {ours_: (0, 7, NODES)}, None, "not in force", [REMOVE, ADD]),
    ({ours_: (-1, 6, NODES)}, {}, 99, "removed maintenance exclusion " + HOLD + ": run rayjob-multi-slice is "
     "already trained", [REMOVE]),
    ({"holidays": (0, 3, "NO_UPGRADES")}, None, 99, "run rayjob-multi-slice is already trained: nothing to hold", []),
])
def test_the_hold_is_added_once_renewed_when_short_and_gone_for_a_trained_run(before, after, trained_to, want,
                                                                              commands):
    from playbooks.job.spec import build_job
    from playbooks.plays import train
    job = build_job(DEV, "llama3-8b")
    listing = _listing((str(trained_to), ["commit_success.txt"])) if trained_to else ""
    facts = {CLUSTERS: Answers(_cluster(**before), *([_cluster(**after)] if after is not None else [])),
             LS: Completed(LS, 0, listing, "") if listing else Completed(LS, 1, "", "ERROR: (gcloud.storage.ls) One or "
                                                                                  "more URLs matched no objects.")}
    recap, out = run_with_facts([train.hold_step(job)], facts)
    assert not recap.failed, out.text()
    assert want in out.text(), out.text()
    assert applied(out) == commands


def test_no_hold_when_the_inventory_says_so():
    from playbooks.job.spec import build_job
    from playbooks.plays import train
    recap, out = run_with_facts([train.hold_step(build_job(env("dev", hold_maintenance=False), "llama3-8b"))], {})
    assert recap.counters() == "ok=0 changed=0 failed=0 skipped=1"
    assert "hold_maintenance: false: GKE may upgrade the TPU nodes during the run" in out.text()


# -- capacity: a plan per slice, a change that moves on, a derived fact ------------------------------
LISTED = env("dev", capacity=["reservation", "spot"], reservation="zeta-resv")
QUOTA = "gcloud beta quotas info describe {} --service=compute.googleapis.com --project=my-tpu-project --format=json"
SPOT_QUOTA = QUOTA.format("PREEMPTIBLE-TPU-V6E-per-project-region")
ON_DEMAND_QUOTA = QUOTA.format("TPUS-PER-TPU-FAMILY-per-project-region")
RESERVATION = ("CLOUDSDK_CORE_VERBOSITY=debug gcloud compute reservations describe zeta-resv --zone=us-east5-b "
               "--format=json --project=my-tpu-project")
CLUSTER = {"name": "maxtext-multislice", "status": "RUNNING", "location": "us-east5-b"}
GCLOUD = "gcloud version --format=json"  # asked where a Spot pool gets its node system configuration


def quota(value, **dims):
    return {"dimensionsInfos": [{"dimensions": {"region": "us-east5", **dims}, "details": {"value": str(value)}}]}


def reservation(count, in_use=0):
    return {"name": "zeta-resv", "status": "READY", "specificReservation": {
        "count": str(count), "inUseCount": str(in_use), "instanceProperties": {"machineType": "ct6e-standard-4t"}}}


def notes(out):
    return [ln.split("note   ", 1)[1] for ln in out if ln.startswith("  note")]


def plan_step(e):
    from playbooks.plays import capacity
    [step] = [s for s in capacity.steps(e) if s.id == "capacity:plan"]
    return step


def test_the_plan_gives_a_reservation_its_whole_slices_then_the_next_option_its_quota():
    recap, out = run_with_facts([plan_step(LISTED)], {CLUSTERS: [], SPOT_QUOTA: quota(64),
                                                      RESERVATION: reservation(6)})
    assert recap.counters() == "ok=1 changed=0 failed=0 skipped=0", out.text()
    want = ["v6e-16-0: reservation zeta-resv (6 of 6 hosts free)",
            "v6e-16-1: spot (quota PREEMPTIBLE-TPU-V6E in us-east5 permits 64 chips)"]
    assert notes(out) == want
    assert recap.results[0].notes == want                   # kept under the step's line in the recap
    assert "\n      v6e-16-1: spot (quota" in "\n".join(recap.render())
    assert recap.data("capacity:plan").option(1) == "spot"


def test_a_shortfall_is_one_line_with_what_each_option_can_take_before_any_create():
    e = env("dev", capacity=["spot", "on-demand"])
    recap, out = run_with_facts([plan_step(e)] + nodepools.steps(e),
                                {CLUSTERS: [], SPOT_QUOTA: quota(16), ON_DEMAND_QUOTA: quota(0, tpu_family="CT6E")})
    assert recap.failed and recap.not_run == ["nodepools : TPU node pool v6e-16-0", "nodepools : TPU node pool v6e-16-1"]
    assert ("the capacity options cannot make every slice: spot 1 (quota PREEMPTIBLE-TPU-V6E in us-east5 permits 16 "
            "chips); on-demand 0 (quota TPUS-PER-TPU-FAMILY (CT6E) in us-east5 permits 0 chips); missing 1 of 2 slices "
            "(16 chips, 16 per slice): request quota (IAM & Admin > Quotas), add an option to capacity: (reservation, "
            "flex-start), or set slices: lower") in out.text()
    assert notes(out) == ["v6e-16-0: spot (quota PREEMPTIBLE-TPU-V6E in us-east5 permits 16 chips)",
                          "v6e-16-1: none (no option of capacity [spot, on-demand] can take it)"]
    assert applied(out) == []


def test_a_check_that_cannot_look_leaves_its_option_possible_never_proven():
    e = env("dev", capacity=["spot", "on-demand"])
    denied = Completed(SPOT_QUOTA, 1, "", "ERROR: (gcloud.beta.quotas.info.describe) PERMISSION_DENIED: Cloud Quotas "
                                          "API has not been used in project 123 before or it is disabled.")
    recap, out = run_with_facts([plan_step(e)], {CLUSTERS: [], SPOT_QUOTA: denied,
                                                 ON_DEMAND_QUOTA: quota(0, tpu_family="CT6E")})
    assert recap.counters() == "ok=0 changed=0 failed=0 skipped=1", out.text()
    assert "not checked: 2 slice(s): 2 spot: 2 slice(s) on an option whose check could not look" in out.text()
    assert notes(out)[0].startswith("v6e-16-0: spot (not checked: quota PREEMPTIBLE-TPU-V6E in us-east5: could not "
                                    "look (exit code 1)")


def test_a_slice_whose_pool_exists_keeps_it_and_its_quota_is_not_counted_twice():
    """A second run: the reservation's hosts are in use by our own pool and
    the Spot quota by the other: each slice keeps its pool, nothing is short."""
    res = dict(pool("v6e-16-0", capacity="reservation"))
    res["config"] = dict(res["config"], reservationAffinity={"consumeReservationType": "SPECIFIC_RESERVATION",
                                                             "values": ["zeta-resv"]})
    facts = {CLUSTERS: [dict(CLUSTER, nodePools=[res, pool("v6e-16-1", capacity="spot")])], SPOT_QUOTA: quota(16),
             RESERVATION: reservation(4, in_use=4), GCLOUD: {"Google Cloud SDK": "555.0.0"}}
    recap, out = run_with_facts([plan_step(LISTED)] + nodepools.steps(LISTED), facts)
    assert recap.counters() == "ok=3 changed=0 failed=0 skipped=0", out.text()
    assert notes(out) == ["v6e-16-0: reservation zeta-resv (its pool, RUNNING)", "v6e-16-1: spot (its pool, RUNNING)"]
    assert "node pool v6e-16-1 is RUNNING (4x4, spot)" in out.text()
    # One more slice: the Spot quota is all held by v6e-16-1, the reservation's hosts by v6e-16-0.
    three = env("dev", capacity=["reservation", "spot"], reservation="zeta-resv", slices=3)
    recap, out = run_with_facts([plan_step(three)], facts)
    assert recap.failed and "spot 0 (quota PREEMPTIBLE-TPU-V6E in us-east5 permits 16 chips, 16 of them held by this "\
                            "cluster's pools)" in out.text()


def test_the_pools_follow_the_plan_made_once_and_a_pool_of_another_option_of_the_list_is_as_asked():
    from playbooks.core.runner import Mode
    facts = {CLUSTERS: [], SPOT_QUOTA: quota(64), RESERVATION: reservation(4), GCLOUD: {"Google Cloud SDK": "555.0.0"}}
    recap, out = run_with_facts([plan_step(LISTED)] + nodepools.steps(LISTED), facts, mode=Mode.CHECK)
    assert recap.counters() == "ok=1 changed=2 failed=0 skipped=0", out.text()
    creates = applied(out)
    assert "--reservation-affinity=specific --reservation=zeta-resv" in creates[0] and "--spot" not in creates[0]
    assert creates[1].endswith("--spot --project=my-tpu-project --system-config-from-file=-")
    assert "--node-labels=cloud.google.com/gke-networking-dra-driver=true,tpu-playbooks/capacity=reservation" \
        in creates[0]
    derived = [ln for ln in out if ln.startswith("  probe  capacity plan")]
    assert len(derived) == 3 and sum("(cached)" not in ln for ln in derived) == 1   # made once, then held
    # Drift: a pool of an option outside the list, or without our label.
    recap, out = run_with_facts(nodepools.steps(env("dev"))[:1], {CLUSTERS: with_pools(pool("v6e-16-0", capacity="spot"))})
    assert "drift: node pool v6e-16-0: capacity is spot, want on-demand" in out.text()
    unlabelled = pool("v6e-16-0")
    del unlabelled["config"]["labels"]["tpu-playbooks/capacity"]
    recap, out = run_with_facts(nodepools.steps(env("dev"))[:1], {CLUSTERS: with_pools(unlabelled)})
    assert "drift: node pool v6e-16-0: node label tpu-playbooks/capacity is missing" in out.text()


def _pool_try(made, what, fails):
    from playbooks.core.errors import CommandFailed
    from playbooks.core.facts import Action

    def fn():
        if fails:
            raise CommandFailed("p : pool", f"make {what}", 1, stderr=f"ERROR: {fails}")
        made.append(what)
    return Action(f"make {what}", fn)


def test_a_change_that_fails_moves_to_what_the_step_offers_instead_each_attempt_named():
    from playbooks.core.play import Playbook
    from playbooks.core.recap import Reporter
    from playbooks.core.runner import Mode, Runner
    from playbooks.core.step import Step, change
    made: list[str] = []
    order = ["reservation", "spot", "on-demand"]
    failing = {"reservation": "no capacity in your reservation", "spot": "GCE_STOCKOUT"}

    def attempt(what, notes=()):
        def instead(look, why):
            if "capacity" not in why and "STOCKOUT" not in why:
                return None        # a failure of another kind stands
            nxt = order[order.index(what) + 1]
            return attempt(nxt, (f"{what}: {why.splitlines()[-1].strip()}; next: {nxt}",))
        return change(_pool_try(made, what, failing.get(what)), reason=f"made on {what}", notes=notes,
                      instead=instead)

    out: list[str] = []
    recap = Playbook(Runner(Mode.APPLY), Reporter(out.append)).run("t", [Step("p", "pool", lambda look: attempt(
        "reservation"))])
    assert made == ["on-demand"] and recap.counters() == "ok=0 changed=1 failed=0 skipped=0", "\n".join(out)
    assert recap.results[0].notes == ["reservation: ERROR: no capacity in your reservation; next: spot",
                                      "spot: ERROR: GCE_STOCKOUT; next: on-demand"]
    assert "changed: [p : pool] made on on-demand" in out
    assert "      spot: ERROR: GCE_STOCKOUT; next: on-demand" in out       # the recap names each attempt
    # A failure of another kind (a flag refused, a 403) never moves on.
    made.clear()
    failing["reservation"] = "(gcloud) PERMISSION_DENIED: 403"
    out.clear()
    recap = Playbook(Runner(Mode.APPLY), Reporter(out.append)).run("t", [Step("p", "pool", lambda look: attempt(
        "reservation"))])
    assert made == [] and recap.failed and recap.results[0].notes == []
    assert "PERMISSION_DENIED: 403" in "\n".join(out)


def test_a_derived_fact_is_made_once_and_held_across_a_change():
    from playbooks.core.facts import Action, Fact
    from playbooks.core.play import Playbook
    from playbooks.core.recap import Reporter
    from playbooks.core.runner import Mode, Runner
    from playbooks.core.step import Step, change
    looks: list[int] = []
    source = Fact(name="free", python=lambda: (looks.append(1), 4 - len(looks))[1], display="look free")
    plan = Fact(name="plan", display="the plan", derive=lambda look: f"{look(source)} free when planned")
    seen: list[str] = []

    def decide(look):
        seen.append(look(plan))
        return change(Action("take one", lambda: None), reason="took one")
    out: list[str] = []
    recap = Playbook(Runner(Mode.APPLY), Reporter(out.append)).run("t", [Step("p", "a", decide, id="a"),
                                                                         Step("p", "b", decide, id="b")])
    assert recap.counters() == "ok=0 changed=2 failed=0 skipped=0"
    assert seen == ["3 free when planned", "3 free when planned"] and len(looks) == 1
    assert "  probe  the plan  => 3 free when planned (cached)" in out


# -- min_slices: done when that many slices are whole; the rest named as waiting ----------
# The one read of the namespace's objects (gke.objects_command): the RayCluster's pods among them.
PODS = ("kubectl get serviceaccounts,resourceclaimtemplates,rayclusters,pods,nodes --namespace default --output=json "
        "--context=gke_my-tpu-project_us-east5-b_maxtext-multislice")
UNSCHEDULABLE = "0/9 nodes are available: 5 Insufficient google.com/tpu."


def tpu_pod(replica, host, ready=True, label="replicaIndex"):
    """A TPU worker pod of replica ``replica``, labelled as GKE's TPU webhook
    (replicaIndex: tpu-group-N) or KubeRay >= 1.5 (its replica index) does."""
    value = f"tpu-group-{replica}" if label == "replicaIndex" else str(replica)
    status = ({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]} if ready else
              {"phase": "Pending", "conditions": [{"type": "Ready", "status": "False"},
                                                  {"type": "PodScheduled", "status": "False",
                                                   "message": UNSCHEDULABLE}]})
    return {"kind": "Pod", "metadata": {"name": f"w-{replica}-{host}", "labels": {
        "ray.io/cluster": "maxtext-tpu-cluster", "ray.io/node-type": "worker", "ray.io/group": "tpu-group",
        label: value}}, "status": status}


HEAD_POD = {"kind": "Pod", "metadata": {"name": "h", "labels": {"ray.io/cluster": "maxtext-tpu-cluster",
                                                                 "ray.io/node-type": "head"}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


def pods(ready_replicas, label="replicaIndex"):
    return {"items": [HEAD_POD] + [tpu_pod(r, h, r in ready_replicas, label) for r in (0, 1) for h in range(4)]}


@pytest.mark.parametrize("label", ["replicaIndex", "ray.io/worker-group-replica-index"])
def test_raycluster_is_done_with_min_slices_whole_and_names_the_slice_still_waiting(label):
    from playbooks.plays import raycluster
    one = env("dev", min_slices=1)
    recap, out = run_with_facts([raycluster.slices_step(one)], {PODS: pods({0}, label)})
    assert recap.counters() == "ok=1 changed=0 failed=0 skipped=0", out.text()
    waiting = f"waiting: slice 1 (0 of 4 TPU workers ready: Pending: {UNSCHEDULABLE})"
    assert f"RayCluster maxtext-tpu-cluster: 1 of 2 slices ready (min_slices 1); {waiting}" in out.text()
    # ... and the recap names it, under the step's line
    [at] = [i for i, ln in enumerate(out) if ln.startswith("  raycluster : TPU slices of maxtext-tpu-cluster  ok")]
    assert out[at + 1] == f"      {waiting}", out.text()
    # Every slice asked for (the default): one slice whole is not done.
    recap, out = run_with_facts([raycluster.slices_step(DEV)], {PODS: pods({0}, label)})
    assert recap.failed and "1 of 2 slices ready; waiting: slice 1" in out.text()


def test_a_slice_with_one_worker_missing_is_not_whole():
    from playbooks.cloud.slices import from_pods
    half = pods({0})
    half["items"][5]["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}  # 1-0
    s = from_pods(DEV, half["items"])
    assert (s.whole, [w for w, _ in s.waiting]) == (("slice 0",), ["slice 1"])
    assert "1 of 4 TPU workers ready" in s.waiting_text()


def test_a_wait_that_passes_says_what_is_after_it_not_what_it_waited_for():
    from playbooks.plays import raycluster
    one = env("dev", min_slices=1)
    recap, out = run_with_facts([raycluster.slices_step(one)], {PODS: Answers(pods(set()), pods(set()), pods({1}))})
    assert recap.counters() == "ok=1 changed=0 failed=0 skipped=0", out.text()
    assert "note   RayCluster maxtext-tpu-cluster: 0 of 2 slices ready (min_slices 1)" in out.text()
    [last] = [ln for ln in out if ln.startswith("ok: ")]
    assert last.startswith("ok: [raycluster : TPU slices of maxtext-tpu-cluster] RayCluster maxtext-tpu-cluster: 1 of "
                           "2 slices ready (min_slices 1); waiting: slice 0"), last


NODES = ("curl -fsS 'http://localhost:8265/api/v0/nodes?limit=10000&detail=true'  # what `ray list nodes "
         "--address http://localhost:8265` reads")


def ray_nodes(slices_up):
    return [{"state": "ALIVE", "is_head_node": True, "resources_total": {}}] + [
        {"state": "ALIVE", "is_head_node": False, "resources_total": {"TPU": 4},
         "labels": {"ray.io/tpu-slice-name": f"tpu-group-{s}", "ray.io/tpu-worker-id": str(w)}}
        for s in slices_up for w in range(4)]


def test_a_job_that_is_not_elastic_refuses_to_start_on_fewer_than_every_slice():
    from playbooks.job.spec import build_job
    from playbooks.plays import train
    recap, out = run_with_facts([train.slices_step(DEV, build_job(DEV, "llama3-8b"))], {NODES: ray_nodes([0])})
    assert recap.failed
    assert ("1 of 2 slices ready; waiting: slice 1 (no host in Ray yet): a job that is not elastic needs every "
            "slice; `invoke train --elastic` would start on the 1 ready and grow when the rest arrive") in out.text()
    recap, out = run_with_facts([train.slices_step(DEV, build_job(DEV, "llama3-8b", elastic=True))],
                                {NODES: ray_nodes([0])})
    assert recap.counters() == "ok=1 changed=0 failed=0 skipped=0"
    assert "the elastic job starts on 1 and grows when the rest arrive" in out.text()
    # A slice with a host missing is not one to start on.
    partial = ray_nodes([0, 1])[:-1]
    recap, out = run_with_facts([train.slices_step(DEV, build_job(DEV, "llama3-8b"))], {NODES: partial})
    assert recap.failed and "waiting: slice 1 (3 of 4 hosts in Ray)" in out.text()
    recap, _ = run_with_facts([train.slices_step(DEV, build_job(DEV, "llama3-8b"))], {NODES: ray_nodes([0, 1])})
    assert recap.counters() == "ok=1 changed=0 failed=0 skipped=0"


def test_the_late_slice_of_the_rehearsal_is_named_with_when_it_joins():
    import time

    from playbooks.twin.nodes import slices_of
    late = env("local-late-slice")
    state = {"tpu-group-0-0": {"process": True, "joined": True},
             "tpu-group-1-0": {"process": True, "joined": False, "started": time.time() - 10}}
    s = slices_of(late, state)
    assert s.whole == ("slice 0",) and s.enough(late.min_slices) and not s.complete
    assert s.waiting_text().startswith("waiting: slice 1 (0 of 1 hosts joined; tpu-group-1-0 joins 40s after its "
                                       "start (rehearse_late_slice): in about 3")
    gone = dict(state, **{"tpu-group-0-0": {"process": False, "joined": False, "exited": "ValueError: x"}})
    assert slices_of(late, gone).text() == ("0 of 2 slices ready; waiting: slice 0 (0 of 1 hosts joined; "
                                            "tpu-group-0-0 not running: ValueError: x); slice 1 (0 of 1 hosts joined; "
                                            "tpu-group-1-0 joins 40s after its start (rehearse_late_slice): in about "
                                            "30s)")


def test_a_chain_that_will_make_node_pools_checks_capacity_in_its_first_task():
    from playbooks.cli import task_steps
    first = task_steps.chained(DEV, "network", task_steps.play_steps(DEV, "network"), ("network", "cluster", "nodepools"))
    ids = [s.id for s in first]
    assert ids[:3] == ["capacity:machine-type", "capacity:version", "capacity:quota"], ids
    assert all(set(s.after) >= set(ids[:3]) for s in first[3:])  # nothing of the network before them
    for task, chain in (("network", ("network", "cluster")),                      # no node pools: as it is
                        ("cluster", ("network", "cluster", "nodepools")),         # not the first task
                        ("network", ("teardown", "network", "nodepools")),
                        ("teardown", ("teardown", "up"))):                        # a teardown first: as it is
        steps = task_steps.play_steps(DEV, task) if task != "teardown" else task_steps.teardown_steps(DEV)
        assert [s.id for s in task_steps.chained(DEV, task, list(steps), chain)] == [s.id for s in steps], (task, chain)
    auto = env("dev-autopilot")
    same = task_steps.play_steps(auto, "cluster")
    assert task_steps.chained(auto, "cluster", list(same), ("cluster", "nodepools")) == same   # Autopilot: no pools
    first_up = task_steps.chained(auto, "cluster", task_steps.play_steps(auto, "cluster"), ("cluster", "up"))
    assert first_up[0].id == "capacity:machine-type"                                   # `up` checks capacity


class _Stream:
    def __init__(self, tty):
        self.tty = tty

    def isatty(self):
        return self.tty


@pytest.mark.parametrize("environ, tty, plain", [
    ({"NO_COLOR": "1"}, True, True),      # no-color.org: any value, even on a terminal
    ({"NO_COLOR": ""}, True, False),      # set but empty: not asked
    ({}, True, False),                    # a terminal: as the tool printed it
    ({}, False, True),                    # a pipe, a file, CI
])
def test_colours_go_only_to_a_terminal_and_never_with_no_color(environ, tty, plain):
    from playbooks.core.recap import Reporter, plain_output
    assert plain_output(_Stream(tty), environ) is plain
    out: list[str] = []
    Reporter(out.append, plain=plain).line("\x1b[36m(RayTrainWorker pid=1)\x1b[0m completed step: 3")
    assert (out == ["(RayTrainWorker pid=1) completed step: 3"]) is plain
    assert ("\x1b[36m" in out[0]) is not plain


@pytest.mark.parametrize("plain", [True, False])
def test_a_followed_tools_coloured_lines_reach_the_console_as_the_reporter_decides(plain):
    """A real process prints Ray's colours; the step echoes each line as it
    came; the reporter drops the codes off a terminal or with NO_COLOR."""
    import sys

    from playbooks.access import connectors
    from playbooks.core.command import Command
    from playbooks.core.play import Outcome, Playbook
    from playbooks.core.recap import OK, Reporter
    from playbooks.core.runner import Mode, Runner
    from playbooks.core.step import Step
    code = "print('\\x1b[32mJob \\'x-1\\' succeeded\\x1b[39m'); print('\\x1b[1m\\x1b[36m(pid=7)\\x1b[0m hello')"

    def body(ctx):
        done = ctx.stream(Command((sys.executable, "-c", code)), ctx.echo)
        return Outcome(OK, f"exited {done.rc}")

    out: list[str] = []
    here = connectors.this_machine()
    recap = Playbook(Runner(Mode.APPLY, here, here=here), Reporter(out.append, plain=plain), workers=1).run(
        "t", [Step("logs", "log", run=body)])
    assert recap.counters() == "ok=1 changed=0 failed=0 skipped=0", out
    text = "\n".join(out)
    assert ("Job 'x-1' succeeded" in text and "(pid=7) hello" in text) is plain, text
    assert ("\x1b[" in text) is not plain, text


def test_a_status_looks_on_after_a_look_that_failed_and_what_needs_it_is_unknown_never_wrong():
    """keep_going, steps at once: every step runs whatever failed before it;
    a probe that could not look makes its step "unknown" (not a finding),
    and a step that needs it is unknown too, saying which; the diagnosis is
    the first thing read that is not as asked, else the first unknown."""
    from playbooks.cli import status
    from playbooks.core.errors import ProbeFailed
    from playbooks.core.facts import Fact
    from playbooks.core.play import Playbook
    from playbooks.core.recap import Reporter
    from playbooks.core.runner import Mode, Runner
    from playbooks.core.step import Step, fail, ok
    look503 = Fact(name="cluster", python=lambda: None, display="gcloud container clusters list --format=json")
    declared = {look503.key: ProbeFailed("cluster", look503.line(), 1, "", "ERROR: (gcloud.container.clusters.list) "
                                         "ResponseError: code=503, message=unavailable",
                                         why="could not look (exit code 1): ERROR: code=503")}
    a = Step("t", "cluster", lambda look: ok(str(look(look503))), id="a", probes=(look503,))
    b = Step("t", "pools", lambda look: fail("no pool v6e-16-0"), id="b", after=("a",))
    c = Step("t", "bucket", lambda look: ok("present"), id="c")
    d = Step("t", "ksa", lambda look: fail("missing"), id="d")
    out: list[str] = []
    recap = Playbook(Runner(Mode.CHECK, facts=declared), Reporter(out.append), workers=4).run(
        "status", [a, b, c], keep_going=True)
    assert [r.title for r in recap.results] == ["t : cluster", "t : pools", "t : bucket"] and not recap.not_run
    doc = status.report(env("local"), recap)
    assert [(i["verdict"], i["reason"]) for i in doc["items"]] == [
        ("unknown", "unknown because could not look (exit code 1): ERROR: code=503"),
        ("unknown", "unknown because it needs t : cluster, which could not be read (no pool v6e-16-0)"),
        ("as asked", "present")]
    assert doc["diagnosis"] == "t : cluster: unknown because could not look (exit code 1): ERROR: code=503"
    assert not doc["as_asked"]
    # Something read that is not as asked is the diagnosis before an unknown.
    recap = Playbook(Runner(Mode.CHECK, facts=declared), Reporter(out.append), workers=4).run(
        "status", [a, b, c, d], keep_going=True)
    assert status.report(env("local"), recap)["diagnosis"] == "t : ksa: missing"
    # Without keep_going, the first failure still stops the rest (the plays that change things).
    recap = Playbook(Runner(Mode.CHECK, facts=declared), Reporter(out.append), workers=4).run("up", [a, b, c])
    assert "t : pools" in recap.not_run


def _kept_env(port: int):
    from playbooks.config.schema import load_inventory
    from playbooks.core.inventory import resolve
    inv = load_inventory()
    raw = {**inv.raw["local"], "ray_ip": "127.0.0.1", "dashboard_port": port, "gcs_port": 7740}
    return resolve(inv.path, "logs-kept-test", raw, inv.schema)


@pytest.fixture
def kept_env(tmp_path):
    import shutil
    import socket

    from playbooks.config.project import ROOT
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing answers on it once closed
    e = _kept_env(port)
    yield e
    shutil.rmtree(ROOT / ".state" / e.name, ignore_errors=True)


def _followed(e, run: str, sid: str, lines: list[str], status: str, log) -> None:
    """What `train` (or `logs --follow`) leaves of a job it followed to its
    end: the driver log's copy, named in the job's end in the timeline."""
    from playbooks.access import connectors
    from playbooks.core.play import Outcome, Playbook
    from playbooks.core.recap import OK, Reporter
    from playbooks.core.runner import Mode, Runner
    from playbooks.core.step import Step
    from playbooks.runs.follow import Follower

    def body(ctx):
        f = Follower(ctx, e, run, sid, log)
        f.started({"start_time": 1796301289323})
        for line in lines:
            f.line(line)
        f.close()
        f.ended({"status": status, "end_time": 1796301377594})
        return Outcome(OK, "followed")

    here = connectors.this_machine()
    Playbook(Runner(Mode.APPLY, here, here=here), Reporter(lambda line: None), workers=1).run(
        "t", [Step("train", "follow", run=body)])


def test_logs_shows_the_copy_a_follow_kept_when_no_dashboard_answers_or_ray_forgot_the_job(kept_env):
    """A finished run's driver log, with the Ray cluster down (locally: not
    started; on GKE: no port-forward) or up again without the job (a head
    pod made again, a cluster started afresh): the copy its follow kept,
    said to be it and from when; the newest job of any run by default."""
    from playbooks.config.project import ROOT
    from playbooks.plays import logs
    from playbooks.runs import timeline
    from playbooks.runs.events import when
    from tests.fakes.ray_dashboard import FakeDashboard
    folder = ROOT / ".state" / kept_env.name / "runs"
    _followed(kept_env, "older", "older-1", ["old line"], "FAILED", folder / "20261201-000000-train" / "job.log")
    _followed(kept_env, "r", "r-2", ["Job 'r-2' submitted successfully", "completed step: 59"], "SUCCEEDED",
              folder / "20261203-123448-train" / "job.log")
    [end] = [ev for ev in timeline.read(kept_env, "r") if ev["kind"] == "job_end"]
    assert end["log"] == f".state/{kept_env.name}/runs/20261203-123448-train/job.log"
    recap, out = _real([logs.logs_step(kept_env, None, follow=False)])
    assert recap.counters() == "ok=1 changed=0 failed=0 skipped=0", out.text()
    assert (f"  no Ray dashboard answers at http://127.0.0.1:{kept_env.dashboard_port}: the kept copy of job r-2's "
            f"driver log, as it was followed to the job's end (SUCCEEDED {when(end['t'])}): {end['log']}"
            in out), out.text()
    assert out.index("Job 'r-2' submitted successfully") + 1 == out.index("completed step: 59")
    # Ray up again without the job: the same copy; a run's own, with its outcome.
    dash = FakeDashboard(lambda: []).start()
    try:
        again = _kept_env(dash.port)
        recap, out = _real([logs.logs_step(again, "older", follow=False)])
    finally:
        dash.stop()
    assert recap.counters() == "ok=0 changed=0 failed=1 skipped=0", out.text()
    assert "no job of run older at http://127.0.0.1:" in out.text() and "old line" in out
    assert f"job older-1 FAILED {when(end['t'])} (the kept copy of its driver log: no job of run older" in out.text()
    # No copy kept: said, with what keeps one.
    recap, out = _real([logs.logs_step(kept_env, "never", follow=False)])
    assert recap.failed and "no copy of a driver log of run never was kept" in out.text(), out.text()


def test_a_status_without_a_gcloud_account_says_the_cause_once_with_its_fix():
    """No gcloud account: every gcloud look fails with the same words. The
    account's row is the diagnosis, with its fix (`gcloud auth login`, once
    in the whole table); the rows it left unknown say so briefly, without
    gcloud's message; a row unknown for another cause keeps its own."""
    from playbooks.cli import status
    from playbooks.core.errors import ProbeFailed
    from playbooks.core.facts import Fact
    from playbooks.core.play import Playbook
    from playbooks.core.recap import Reporter
    from playbooks.core.runner import Mode, Runner
    from playbooks.core.step import Step, ok
    words = "ERROR: (gcloud.container.clusters.list) You do not currently have an active account selected."
    clusters = Fact(name="cluster", python=lambda: None, display="gcloud container clusters list --format=json")
    pods = Fact(name="pods", python=lambda: None, display="kubectl get pods --output=json")
    pools = Fact(name="pools", python=lambda: None, display="gcloud container node-pools list --format=json")
    account = status.account_step()
    declared = {account.probes[0].key: {"core": {"disable_usage_reporting": "True"}},
                clusters.key: ProbeFailed("cluster", clusters.line(), 1, "", words, why=f"could not look: {words}"),
                pools.key: ProbeFailed("pools", pools.line(), 1, "", words.replace("clusters", "node-pools"),
                                       why=f"could not look: {words.replace('clusters', 'node-pools')}"),
                pods.key: ProbeFailed("pods", pods.line(), 1, "", "error: no context", why="no context")}
    a = Step("t", "cluster", lambda look: ok(str(look(clusters))), id="a", probes=(clusters,))
    b = Step("t", "pools", lambda look: ok(str(look(pools))), id="b", after=("a",), probes=(pools,))
    c = Step("t", "pods", lambda look: ok(str(look(pods))), id="c", probes=(pods,))

    def run(steps):
        recap = Playbook(Runner(Mode.CHECK, facts=declared), Reporter(lambda line: None), workers=4).run(
            "status", steps, keep_going=True)
        return status.report(env("dev"), recap)

    doc = run([account, a, b, c])
    rows = {i["what"]: (i["verdict"], i["reason"]) for i in doc["items"]}
    assert rows == {
        "status : gcloud account": ("not as asked", "no active account and no access token file: every gcloud "
                                                    "command fails"),
        "t : cluster": ("unknown", "unknown because gcloud has no account (the diagnosis)"),
        "t : pools": ("unknown", "unknown because gcloud has no account (the diagnosis)"),
        "t : pods": ("unknown", "unknown because no context")}
    assert doc["diagnosis"] == ("status : gcloud account: no active account and no access token file: every gcloud "
                                "command fails: run `gcloud auth login` (`invoke doctor` checks it)")
    assert "\n".join(status.table(doc)).count("gcloud auth login") == 1
    # With an account (or without its row) gcloud's own words stay: nothing is hidden.
    declared[account.probes[0].key] = {"core": {"account": "me@example.com"}}
    doc = run([account, a, b])
    assert doc["items"][0]["verdict"] == "as asked" and words.split(") ")[1] in doc["items"][1]["reason"]
    assert doc["diagnosis"].startswith("t : cluster: unknown because could not look: ERROR:")


def test_a_local_host_without_a_pid_file_is_not_started_not_its_old_logs_line():
    """After a teardown (or before any `up`) a host's log is an old run's:
    status names the host not started (its diagnosis: run `invoke up`),
    never a line of that log. A host whose process died (its pid file left)
    still says why, from its log."""
    import shutil

    from playbooks.config import paths
    from playbooks.config.schema import load_inventory
    from playbooks.core.inventory import resolve
    from playbooks.twin import nodes
    inv = load_inventory()
    local = resolve(inv.path, "t-stale-logs", {**inv.raw["local"], "gcs_port": 6990, "dashboard_port": 8299},
                    inv.schema)
    state = paths.here(f"{paths.STATE}/t-stale-logs")
    try:
        for name in ("tpu-group-0-0", "tpu-group-1-0"):
            log = paths.here(paths.node_log(local.name, name))
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text("INFO worker.py:1 -- Connecting to existing Ray cluster\nRuntimeError: an old run's end\n")
        nodes.pidfile(local, "tpu-group-1-0").write(2 ** 22 + 1)  # a pid no process has: it died
        s = nodes.slices_of(local, nodes.hosts_state(local))
        assert "tpu-group-0-0 not started" in s.text(), s.text()
        assert "tpu-group-1-0 not running: RuntimeError: an old run's end" in s.text(), s.text()
    finally:
        shutil.rmtree(state, ignore_errors=True)


# -- a create answered "already exists": another run made it meanwhile ---------------------
# What gcloud compute 528 prints (its debug log left out) when the network was
# made by another run between this step's look and its create.
NET_EXISTS = ("ERROR: (gcloud.compute.networks.create) Could not fetch resource:\n"
              " - The resource 'projects/my-tpu-project/global/networks/maxtext-multislice-net-1' already exists\n")


def scripted(tmp_path, lists, create):
    """A connector that answers a network step's commands from a script:
    each networks list in turn from ``lists``, the create with ``create``
    (exit code, stdout, stderr); what ran is kept in ``.ran``."""
    import json

    from playbooks.core.connector import LocalConnector, Ran

    class Scripted(LocalConnector):
        def __init__(self, root):
            super().__init__(root)
            self.ran: list[str] = []

        def run(self, argv, env=(), input=None, cwd=None, timeout=None):
            self.ran.append(" ".join(argv))
            if "create" in argv:
                return Ran(*create, 0.1)
            return Ran(0, json.dumps(lists.pop(0)), "", 0.1)

    return Scripted(str(tmp_path))


def _race(tmp_path, lists, create=(1, "", NET_EXISTS)):
    from playbooks.access.cli_clients import already_exists
    from playbooks.core.play import Playbook
    from playbooks.core.recap import Reporter
    from playbooks.core.runner import Mode, RetryPolicy, Runner

    conn = scripted(tmp_path, lists, create)
    out: list[str] = []
    runner = Runner(Mode.APPLY, conn, RetryPolicy(already_exists=already_exists))
    recap = Playbook(runner, Reporter(out.append)).run("t", network.steps(DEV)[:1])
    return recap, "\n".join(out), conn.ran


def test_a_create_answered_already_exists_looks_again_and_is_ok_when_made_as_asked(tmp_path):
    recap, out, ran = _race(tmp_path, [[], [net("maxtext-multislice-net-1")]])
    assert recap.counters() == "ok=1 changed=0 failed=0 skipped=0", out
    assert ("ok: [network : VPC maxtext-multislice-net-1] made meanwhile by another run: network "
            "maxtext-multislice-net-1 exists (mtu 8896, custom subnets)") in out
    assert ("note   ERROR: (gcloud.compute.networks.create) Could not fetch resource: - The resource "
            "'projects/my-tpu-project/global/networks/maxtext-multislice-net-1' already exists: looking again") in out
    assert [r.split()[2:4] for r in ran] == [["networks", "list"], ["networks", "create"], ["networks", "list"]]


def test_a_create_answered_already_exists_is_drift_when_made_with_another_shape(tmp_path):
    recap, out, _ = _race(tmp_path, [[], [net("maxtext-multislice-net-1", mtu=1460)]])
    assert recap.counters() == "ok=0 changed=0 failed=1 skipped=0", out
    assert ("drift: network maxtext-multislice-net-1: mtu is 1460, want 8896 (made meanwhile by another run)"
            in out), out


def test_a_create_answered_already_exists_that_a_fresh_look_still_misses_fails_once(tmp_path):
    recap, out, ran = _race(tmp_path, [[], []])
    assert recap.failed and "already exists" in out and "a fresh look still finds it to make" in out, out
    assert sum("create" in r for r in ran) == 1         # looked again once, never created again


def test_a_failure_of_another_kind_does_not_look_again(tmp_path):
    denied = (1, "", "ERROR: (gcloud.compute.networks.create) Could not fetch resource:\n - Required "
                     "'compute.networks.create' permission for 'projects/my-tpu-project'\n")
    recap, out, ran = _race(tmp_path, [[]], denied)
    assert recap.failed and "looking again" not in out and len(ran) == 2, out


@pytest.mark.parametrize("name", ["dev", "dev-autopilot"])
def test_a_raycluster_without_the_settings_our_manifests_add_is_drift_naming_each(name):
    """A RayCluster applied before the head's profiling setting (or the
    workers' security context, or their preStop hook) was added: drift, one
    entry per setting, with the command that makes it again; the rendered
    one is ok."""
    import copy

    from playbooks.cloud import manifests
    from playbooks.cloud.gke import raycluster_fact
    from playbooks.core.runner import Mode
    from playbooks.plays import raycluster
    e = env(name)
    docs = {d["kind"]: d for d in manifests.raycluster_docs(e)}
    key = raycluster_fact(e).key

    def decided(rc):
        items = [d for d in (docs.get("ResourceClaimTemplate"), rc) if d]
        return run_with_facts([raycluster.apply_step(e)], {key: {"items": items}}, mode=Mode.CHECK)

    recap, out = decided(docs["RayCluster"])
    assert recap.counters() == "ok=1 changed=0 failed=0 skipped=0", out.text()
    old = copy.deepcopy(docs["RayCluster"])
    head = old["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    head["env"] = [v for v in head["env"] if v["name"] != "RAY_DASHBOARD_ENABLE_PROFILING"]
    worker = old["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    del worker["lifecycle"]
    worker["securityContext"] = {"privileged": True} if name == "dev-autopilot" else {}
    recap, out = decided(old)
    assert recap.failed, out.text()
    text = out.text()
    assert "drift: RayCluster maxtext-tpu-cluster: head env RAY_DASHBOARD_ENABLE_PROFILING=None, want '1'" in text
    had, want = (('{"privileged": true}', '{"capabilities": {"add": ["SYS_PTRACE"]}}') if name == "dev-autopilot"
                 else ("{}", '{"privileged": true}'))
    assert f"worker securityContext {had}, want {want}" in text, text
    assert "worker lifecycle null, want {" in text
    assert ("to make it as rendered (a running job ends): kubectl delete raycluster maxtext-tpu-cluster --namespace "
            f"{e.namespace}") in text.replace("\n", " "), text
