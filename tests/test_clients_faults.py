"""Faults: denied probes, transient errors and texts no rule knows (as each
client prints them), doctor, a node pool left in ERROR.

Through `invoke` against the loopback fakes (tests/fakes/); which commands
run as their real processes and which are answered in-process, as for a
user, and where both ways are compared: tests/clients.py.
"""
from __future__ import annotations

import re

import pytest

from tests.clients import (
    BUCKET,
    CLUSTER,
    NET1,
    NET2,
    PROJECT,
    Cloud,
    Run,
    failed_run,
    ok_run,
    recap,
)
from tests.fakes import gcp as G
from tests.fakes.cloud import SERVICE_ACCOUNT

pytestmark = pytest.mark.clients



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
                  "message": 'serviceaccounts is forbidden: User "tester@example.com" cannot list '
                             'resource "serviceaccounts" in API group "" in the namespace "default"'}
        # The service account is one of the objects read by one list of each kind (gke.objects_command).
        cloud.kube.server.fail("GET", r"/namespaces/default/serviceaccounts$", 403, denied, times=99)
        run = failed_run(cloud.invoke("storage"))
        message, create = 'serviceaccounts is forbidden', r"/serviceaccounts$"
    assert "could not look" in run.out and message in run.out, run.out
    assert run.calls("POST", create) == [], "a denied probe was read as absent"
    assert run.changes == [], run.changes
    # Nothing denied is read as absent. The cluster of a case that seeds only the project is absent, truly:
    # `kube:credentials` compares the context with the cluster (its `clusters list`) and says so.
    absent = [ln for ln in run.out.splitlines() if "=> absent" in ln]
    assert not [ln for ln in absent if "clusters list" not in ln or case != "storage-401"], absent


# -- 5. transient errors --------------------------------------------------------------
# The connector reads these lists in-process first (playbooks/access/gcp_api.py);
# a read that fails leaves the command line to its gcloud process for the
# rest of the run: one request more, once, before gcloud's own attempts.
IN_PROCESS = 1


def test_transient_errors_are_retried_with_backoff_then_succeed(cloud: Cloud):
    cloud.seed_networks()
    cloud.gcp.server.fail("GET", r"/global/networks$", 503, G.unavailable(), times=IN_PROCESS + 2)
    cloud.gcp.server.fail("GET", r"/regions/us-east5/subnetworks$", 429, G.rate_limited(), times=IN_PROCESS + 1)
    run = ok_run(cloud.invoke("network"))
    retries = [line for line in run.out.splitlines() if line.strip().startswith("retry")]
    assert len(retries) == 3, run.out
    assert "attempt 1 of 5 failed (ERROR: (gcloud.compute.networks.list)" in retries[0]
    assert "again in 1.0s" in retries[0] and "attempt 2 of 5" in retries[1] and "again in 2.0s" in retries[1]
    assert "(gcloud.compute.networks.subnets.list)" in retries[2] and "again in 1.0s" in retries[2]
    assert len(run.calls("GET", r"/global/networks$")) == IN_PROCESS + 3
    r = recap(run, "network")
    assert (r["ok"], r["changed"], r["failed"]) == (4, 0, 0)


def test_transient_errors_that_do_not_pass_stop_after_the_bounded_retries(cloud: Cloud):
    cloud.gcp.server.fail("GET", r"/global/networks$", 503, G.unavailable(), times=99)
    run = failed_run(cloud.invoke("network"))
    assert len([ln for ln in run.out.splitlines() if ln.strip().startswith("retry")]) == 4
    assert len(run.calls("GET", r"/global/networks$")) == IN_PROCESS + 5    # RetryPolicy.attempts
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
    cloud.seed_to_cluster()
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
    first = 1 + IN_PROCESS  # the in-process read first (the bucket's too: its describe asks --raw)
    cloud.gcp.server.fail(method, path, code, unseen(code), times=first)
    run = ok_run(cloud.invoke(task))
    assert len(retries(run)) == 1 and "attempt 1 of 5 failed" in retries(run)[0], run.out
    assert "something nobody wrote a rule for" in retries(run)[0]
    assert "could not look" not in run.out, run.out
    statuses = [r.status for r in run.calls(method, path)]
    assert statuses[:first] == [code] * first and statuses[first] != code, statuses


# -- 5c. doctor, against the fakes ------------------------------------------------------
def test_doctor_checks_credentials_project_and_context(cloud: Cloud):
    run = ok_run(cloud.invoke("doctor"))
    assert f"gcloud account {SERVICE_ACCOUNT}" in run.out      # the fakes' signed-in service account
    cloud.use_access_token_file()
    run = ok_run(cloud.invoke("doctor"))
    assert "gcloud authenticates with the access token in" in run.out
    assert f"project {PROJECT} is readable with these credentials" in run.out
    assert "does not exist yet: no context to check" in run.out
    cloud.seed_project()
    cloud.seed_cluster()
    # Two problems at once: no context for the cluster, and the project denied.
    cloud.gcp.server.fail("GET", r"/crm/v1/projects/", 403, G.forbidden("resourcemanager.projects.get",
                                                                       f"projects/{PROJECT}"), times=99)
    run = failed_run(cloud.invoke("doctor"))
    assert f"but the kubeconfig has no context gke_{PROJECT}_us-east5-b_{CLUSTER}" in run.out
    assert "resourcemanager.projects.get" in run.out
    assert recap(run, "doctor")["failed"] == 2        # each listed, and every other check ran
    cloud.gcp.server.clear_faults()
    cloud.get_credentials()
    run = ok_run(cloud.invoke("doctor"))
    assert f"context gke_{PROJECT}_us-east5-b_{CLUSTER} reaches Kubernetes" in run.out


# -- 6. a node pool left in ERROR (GCE_STOCKOUT) ----------------------------------------
def test_stockout_is_reported_and_the_broken_pool_is_replaced_on_rerun(cloud: Cloud):
    cloud.seed_to_cluster()
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
    cloud.seed_to_cluster()
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
