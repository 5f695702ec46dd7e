"""Stopping the bill keeps what the user made (issue 64, item 1), step by
step from declared facts (nothing starts): `teardown` keeps the bucket
unless `--delete-bucket` names it, and says in one line what it kept and
what bills it; `stop-tpus` deletes only the TPU node pools (GKE Standard),
the RayCluster (Autopilot) or the simulated TPU hosts (the twin), each
step idempotent; what still bills, said from what exists. Against the
fakes with the real clients: tests/test_clients_bill_stop.py; on the twin,
up and train from the checkpoint after it: tests/test_bill_stop_e2e.py."""
from __future__ import annotations

import pytest

from playbooks.cli import session, task_steps
from playbooks.cloud import still_billed
from playbooks.cloud.env_cost import EnvCost, Part
from playbooks.cloud.gke import bucket_fact, clusters_fact
from playbooks.core.errors import ProbeFailed
from playbooks.core.facts import ABSENT, Completed
from playbooks.core.fixtures import Answers
from playbooks.core.play import Playbook
from playbooks.core.recap import Reporter
from playbooks.core.runner import Mode, Runner
from playbooks.plays import stop_tpus, teardown
from playbooks.twin.nodes import HEAD
from tests.conftest import INVOKE, ROOT, env, run_with_facts

DEV = env("dev")
BUCKET = "gs://my-tpu-project-maxtext-ckpt"
GIB5 = 5 * 1024 ** 3


def applied(lines):
    return [ln.split("apply  ", 1)[1] for ln in lines if ln.startswith("  apply")]


def dry_commands(steps) -> list[str]:
    """Every command line a dry run of ``steps`` shows (probes, changes, verifies)."""
    runner = Runner(Mode.DRY)
    Playbook(runner, Reporter(lambda line: None)).run("test", steps)
    return [c.line() for c in runner.recorded]


def _bucket_facts(present: bool = True) -> dict:
    described = {"name": "my-tpu-project-maxtext-ckpt", "location": "US-EAST5", "storageClass": "STANDARD"}
    gone = Completed("", 1, "", f"ERROR: (gcloud.storage.buckets.describe) {BUCKET} not found: 404.")
    return {bucket_fact(DEV).key: described if present else gone,
            still_billed.bytes_fact(DEV).key: f"{GIB5}   {BUCKET}\n" if present else gone}


# -- teardown keeps the bucket ---------------------------------------------------------
def test_teardown_keeps_the_bucket_and_says_what_it_holds_and_what_bills_it():
    [step] = [s for s in teardown.steps(DEV) if s.id == "teardown:bucket"]
    recap, out = run_with_facts([step], _bucket_facts())
    assert recap.counters() == "ok=1 changed=0 failed=0 skipped=0", out.text()
    assert applied(out) == []
    assert (f"ok: [teardown : bucket {BUCKET}] kept bucket {BUCKET} (US-EAST5, STANDARD): 5.00 GiB; Cloud Storage "
            f"bills it per GiB-month at its class's price in its location (not read here: "
            f"https://cloud.google.com/storage/pricing); `invoke teardown --delete-bucket` deletes it") in out, out.text()
    # No delete of the bucket or an object anywhere in a teardown without the flag (its dry run's every
    # command), and its prompt says the bucket is kept.
    assert not [c for c in dry_commands(teardown.steps(DEV)) if " rm " in c], dry_commands(teardown.steps(DEV))
    assert f"gsutil rm -r {BUCKET}" in dry_commands(teardown.steps(DEV, delete_bucket=True))
    assert f"(bucket {BUCKET} and its checkpoints kept)" in teardown.summary(DEV)
    assert "everything in it" not in teardown.summary(DEV)
    # Gone: said, nothing else.
    recap, out = run_with_facts([step], _bucket_facts(present=False))
    assert recap.counters() == "ok=1 changed=0 failed=0 skipped=0" and f"bucket {BUCKET} is not there" in out.text()


def test_teardown_deletes_the_bucket_only_when_named():
    steps = teardown.steps(DEV, delete_bucket=True)
    [step] = [s for s in steps if s.id == "teardown:bucket"]
    recap, out = run_with_facts([step], {bucket_fact(DEV).key: Answers({"name": "x"}, Completed(
        "", 1, "", f"ERROR: (gcloud.storage.buckets.describe) {BUCKET} not found: 404."))})
    assert applied(out) == [f"gsutil rm -r {BUCKET}"], out.text()
    assert recap.counters() == "ok=0 changed=1 failed=0 skipped=0"
    assert f"bucket {BUCKET} and everything in it (every run's checkpoints)" in teardown.summary(DEV, True)


def test_a_size_that_cannot_be_read_is_said_and_the_bucket_still_kept():
    [step] = [s for s in teardown.steps(DEV) if s.id == "teardown:bucket"]
    facts = _bucket_facts()
    facts[still_billed.bytes_fact(DEV).key] = Completed("", 1, "", "ERROR: (gcloud.storage.du) HTTPError 403: denied")
    recap, out = run_with_facts([step], facts)
    assert recap.counters() == "ok=1 changed=0 failed=0 skipped=0", out.text()
    assert "its size could not be read: could not look (exit code 1)" in out.text()
    assert applied(out) == []


def test_the_bucket_bytes_read_proves_absence_only_by_a_404():
    parse = still_billed.bytes_fact(DEV).parse
    assert parse(Completed("", 0, f"1234   {BUCKET}\n", "")) == 1234
    assert parse(Completed("", 1, "", f"ERROR: (gcloud.storage.du) {BUCKET} not found: 404.")) is ABSENT
    for bad in (Completed("", 1, "", "ERROR: (gcloud.storage.du) HTTPError 403: denied"),
                Completed("", 0, "nothing like a size\n", "")):
        with pytest.raises(ProbeFailed):
            parse(bad)
    assert still_billed.size(GIB5) == "5.00 GiB" and still_billed.size(12) == "12 bytes"


def test_teardown_delete_bucket_on_the_twin_is_refused_in_one_line(tmp_path):
    import subprocess
    r = subprocess.run([INVOKE, "--dry", "teardown", "--delete-bucket", "--env", "local"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert r.returncode == 2, r.stdout + r.stderr
    [line] = (r.stdout + r.stderr).strip().splitlines()
    assert line.startswith("error: teardown --delete-bucket: environment 'local' is local: it has no bucket"), line


# -- stop-tpus -----------------------------------------------------------------------------
def _pool(name, status="RUNNING"):
    return {"name": name, "status": status, "initialNodeCount": 4,
            "config": {"machineType": "ct6e-standard-4t", "labels": {"tpu-playbooks/capacity": "on-demand"}},
            "placementPolicy": {"tpuTopology": "4x4"}}


def _cluster(*pools):
    default = {"name": "default-pool", "initialNodeCount": 3, "config": {"machineType": "n1-standard-16"}}
    return [{"name": "maxtext-multislice", "status": "RUNNING", "location": "us-east5-b",
             "nodePools": [default, *pools]}]


DELETES = [f"gcloud container node-pools delete v6e-16-{i} --location=us-east5-b --cluster=maxtext-multislice "
           f"--project=my-tpu-project --quiet" for i in (0, 1)]


def test_stop_tpus_deletes_only_the_tpu_node_pools_and_a_second_run_changes_nothing():
    steps = task_steps.stop_tpus_steps(DEV)
    key = clusters_fact(DEV).key
    # Each delete's verify looks again: one pool gone, then both.
    recap, out = run_with_facts(steps, {key: Answers(_cluster(_pool("v6e-16-0"), _pool("v6e-16-1")),
                                                     _cluster(_pool("v6e-16-1")), _cluster())})
    assert sorted(applied(out)) == DELETES, out.text()
    assert recap.counters() == "ok=1 changed=2 failed=0 skipped=0", out.text()
    assert "[stop-tpus : TPU node pool v6e-16-1] would delete node pool v6e-16-1 (on-demand)" in out.text()
    kept = [ln for ln in out if ln.startswith("ok: [stop-tpus : kept]")]
    assert kept and "bucket gs://my-tpu-project-maxtext-ckpt (every run's checkpoints)" in kept[0], out.text()
    # The second run: the pools are gone; nothing is sent.
    recap, out = run_with_facts(task_steps.stop_tpus_steps(DEV), {key: _cluster()})
    assert applied(out) == [] and recap.counters() == "ok=3 changed=0 failed=0 skipped=0", out.text()
    assert "node pool v6e-16-0 is not there: none of its TPUs bills" in out.text()
    # No cluster: nothing of it bills, nothing to do.
    recap, out = run_with_facts(task_steps.stop_tpus_steps(DEV), {key: []})
    assert applied(out) == [] and "no cluster maxtext-multislice" in out.text()


def test_stop_tpus_waits_out_a_pool_already_being_deleted():
    key = clusters_fact(DEV).key
    steps = task_steps.stop_tpus_steps(DEV)[:1]
    recap, out = run_with_facts(steps, {key: Answers(_cluster(_pool("v6e-16-0", "STOPPING")), _cluster())})
    assert applied(out) == [] and "note   node pool v6e-16-0 is already being deleted" in out.text(), out.text()
    assert recap.counters() == "ok=1 changed=0 failed=0 skipped=0", out.text()
    assert "node pool v6e-16-0 is not there: none of its TPUs bills" in out.text()


def test_stop_tpus_on_autopilot_deletes_the_raycluster_and_on_the_twin_stops_only_the_hosts():
    auto = task_steps.stop_tpus_steps(env("dev-autopilot"))
    assert [s.id for s in auto] == ["kube:credentials", "stop-tpus:raycluster", "stop-tpus:kept"]
    local = env("local")
    ids = [s.id for s in task_steps.stop_tpus_steps(local)]
    assert ids == ["stop-tpus:stop-tpu-group-1-0", "stop-tpus:stop-tpu-group-0-0", "stop-tpus:kept"]
    assert f"stop-tpus:stop-{HEAD}" not in ids


def test_stop_tpus_takes_the_environments_lock_and_says_why_it_is_named_so():
    assert "stop-tpus" in session.CHANGING
    assert "not `pause`" in (stop_tpus.__doc__ or "")
    assert "kubernetes-engine/docs/concepts/tpus" in (stop_tpus.__doc__ or "")  # why delete, not resize to 0


# -- what still bills --------------------------------------------------------------------
def _cost(*tpu_nodes: int) -> EnvCost:
    parts = [Part("default-pool", "3 nodes x n1-standard-16", 0.76, 3, "$0.76/node-hour (inventory prices:)"),
             *[Part(f"v6e-16-{i}", f"{n} nodes x 4 chips (ct6e-standard-4t), on-demand", 10.8, n, "x")
               for i, n in enumerate(tpu_nodes)],
             Part("cluster fee", "cluster maxtext-multislice", None, 1, "no price (...)")]
    return EnvCost(parts, 0.0, 3600.0)


def test_what_still_bills_when_the_tpus_are_off_and_when_they_are_on():
    bucket = still_billed.bucket_line(DEV, {"location": "US-EAST5", "storageClass": "STANDARD"}, GIB5)
    off = still_billed.bills(_cluster()[0], _cost(), bucket)
    lines = still_billed.lines(off)
    assert off.off and lines[0].startswith("TPUs: off (no TPU node pool): `invoke up` makes them again"), lines
    assert lines[1] == (f"still billed: default-pool (3 nodes x n1-standard-16, $2.28/h); cluster fee (cluster "
                        f"maxtext-multislice, no price); {bucket}")
    on = still_billed.bills(_cluster(_pool("v6e-16-0"), _pool("v6e-16-1"))[0], _cost(4, 4), bucket)
    assert not on.off and on.doc()["tpus"] == "on" and on.doc()["tpu_nodes"] == {"v6e-16-0": 4, "v6e-16-1": 4}
    assert still_billed.lines(on)[0].startswith("TPUs: on (v6e-16-0 4 nodes, v6e-16-1 4 nodes): `invoke stop-tpus`")
    # No cluster (after a teardown): the bucket it kept is what still bills.
    gone = still_billed.bills(ABSENT, EnvCost(absent="no cluster maxtext-multislice: nothing of it is billed"), bucket)
    assert still_billed.lines(gone)[1] == f"still billed: {bucket}"
