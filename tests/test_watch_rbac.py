"""The rights of the watch in the cluster on GKE (manifests/ray-watch-rbac.yaml):
the head's own service account, and the rendered ClusterRole, Role and
bindings that grant it exactly what the watch does and nothing more, valid
for Kubernetes 1.35; the `raycluster` step that applies them (only with
stall_watch: cluster, before the RayCluster; absent -> apply, as rendered ->
ok, other rules -> drift, one missing -> apply), the head on that account
(a head on another is drift), its bucket binding (`storage`) and the
`teardown` step that deletes them; all in the dry run with their commands.
Who may do what, subject by subject: tests/test_rbac_subjects.py."""
import copy
import shutil
import subprocess

import pytest
import yaml

from playbooks.cloud import manifests
from playbooks.cloud.gke import raycluster_fact
from playbooks.cloud.kube_context import kubeconfig_fact
from playbooks.core.errors import InputError
from playbooks.core.fixtures import Answers
from playbooks.core.render import check_values, envsubst, render, variables
from playbooks.core.runner import Mode
from playbooks.plays import raycluster, storage, teardown
from tests.conftest import ROOT, env, run_with_facts
from tests.goldens import dry_run

DEV_FOLLOW = env("dev")
MANIFEST = (ROOT / manifests.WATCH_RBAC_MANIFEST).read_text()
CONTEXT = "--context=gke_my-tpu-project_us-east5-b_maxtext-multislice"
REFS = ("clusterrolebinding/maxtext-watch-default clusterrole/maxtext-watch-default "
        "rolebinding/maxtext-watch-default role/maxtext-watch-default serviceaccount/maxtext-watch-default "
        "--namespace default")
PROBE = f"kubectl get {REFS} --ignore-not-found --output=json {CONTEXT}"
APPLY = (f"WATCH_KSA_NAME=maxtext-watch-default NAMESPACE=default envsubst '${{WATCH_KSA_NAME}} ${{NAMESPACE}}' < "
         f"manifests/ray-watch-rbac.yaml | kubectl apply -f - {CONTEXT}")
DELETE = f"kubectl delete {REFS} --ignore-not-found {CONTEXT}"
CLUSTERS = "gcloud container clusters list --format=json --project=my-tpu-project"
KUBECONFIG = kubeconfig_fact(DEV_FOLLOW).key


def watched(name: str = "dev", **changes):
    """An environment of the shipped inventory with stall_watch: cluster."""
    return env(name, stall_watch="cluster", **changes)


DEV = watched()


def docs(e=DEV) -> dict[str, dict]:
    return {d["kind"]: d for d in manifests.watch_rbac_docs(e)}


def listed(*objects) -> dict:
    """What `kubectl get a/x b/y -o json` prints for the objects found."""
    return {"apiVersion": "v1", "kind": "List", "items": list(objects), "metadata": {"resourceVersion": ""}}


def applied(lines):
    return [ln.split("apply  ", 1)[1] for ln in lines if ln.startswith("  apply")]


# -- the manifest ---------------------------------------------------------------------------
def test_the_rules_are_exactly_what_the_watch_does_and_no_wildcard():
    d = docs()
    assert d["ClusterRole"]["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]}]
    assert d["Role"]["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "delete"]},
        {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "list"]},
        {"apiGroups": ["ray.io"], "resources": ["rayclusters"], "verbs": ["get", "list"]}]
    for kind in ("ClusterRole", "Role"):
        for rule in d[kind]["rules"]:
            assert set(rule) == {"apiGroups", "resources", "verbs"}, rule      # no resourceNames, no URLs
            assert not any("*" in w for f in rule.values() for w in f), rule
    assert "aggregationRule" not in d["ClusterRole"]


def test_the_node_rights_are_cluster_wide_the_rest_in_the_namespace_for_the_heads_account():
    e = watched(namespace="team-a", ksa_name="ray-workers")
    d = docs(e)
    subject = [{"kind": "ServiceAccount", "name": "maxtext-watch-team-a", "namespace": "team-a"}]
    assert manifests.head_ksa_name(e) == "maxtext-watch-team-a"
    assert {k: v["metadata"] for k, v in d.items()} == {
        "ServiceAccount": {"name": "maxtext-watch-team-a", "namespace": "team-a"},
        "ClusterRole": {"name": "maxtext-watch-team-a"},
        "ClusterRoleBinding": {"name": "maxtext-watch-team-a"},
        "Role": {"name": "maxtext-watch-team-a", "namespace": "team-a"},
        "RoleBinding": {"name": "maxtext-watch-team-a", "namespace": "team-a"}}
    assert d["ClusterRoleBinding"]["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                                  "name": "maxtext-watch-team-a"}
    assert d["RoleBinding"]["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                           "name": "maxtext-watch-team-a"}
    assert d["ClusterRoleBinding"]["subjects"] == d["RoleBinding"]["subjects"] == subject
    # Two environments of one cluster (two namespaces) never share a name.
    assert manifests.watch_rbac_name(e) != manifests.watch_rbac_name(DEV) == "maxtext-watch-default"


def test_each_object_validates_against_kubernetes_1_35():
    import kubernetes_validate

    for doc in docs().values():
        kubernetes_validate.validate(doc, "1.35.0", strict=True)
    bad = yaml.safe_load(yaml.safe_dump(docs()["ClusterRoleBinding"]))
    del bad["roleRef"]["kind"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, "1.35.0", strict=True)


def test_variables_are_exactly_the_ones_given_and_none_may_be_empty():
    values = manifests.watch_rbac_values(DEV)
    assert variables(MANIFEST) == ["WATCH_KSA_NAME", "NAMESPACE"] and set(values) == {"NAMESPACE", "WATCH_KSA_NAME"}
    with pytest.raises(InputError, match=r"variable \$\{WATCH_KSA_NAME\} is empty"):
        check_values("m.yaml", MANIFEST, {**values, "WATCH_KSA_NAME": ""})
    with pytest.raises(InputError, match=r"variable \$\{NAMESPACE\} has no value"):
        check_values("m.yaml", MANIFEST, {"WATCH_KSA_NAME": "k"})


@pytest.mark.skipif(not shutil.which("envsubst"), reason="envsubst not installed")
def test_real_envsubst_renders_what_python_renders():
    values = manifests.watch_rbac_values(DEV)
    cmd = envsubst(manifests.WATCH_RBAC_MANIFEST, values, root=ROOT)
    r = subprocess.run(list(cmd.argv), input=MANIFEST, capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", **dict(cmd.env)})
    assert r.returncode == 0 and r.stdout == render(MANIFEST, values)
    assert manifests.watch_rbac_apply(DEV).line() == APPLY


# -- when ----------------------------------------------------------------------------------
def test_wanted_only_on_gke_with_the_watch_in_the_cluster():
    assert manifests.watch_rbac_wanted(DEV) and manifests.watch_rbac_wanted(watched("dev-autopilot"))
    assert not manifests.watch_rbac_wanted(env("dev"))                    # follow: GKE's default
    assert not manifests.watch_rbac_wanted(env("local"))                  # the twin's watch runs as this user
    assert env("local").stall_watch == "cluster"


def test_the_step_is_in_the_play_before_the_raycluster_only_when_wanted():
    ids = [s.id for s in raycluster.steps(DEV)]
    assert ids == ["raycluster:skew", "raycluster:watch-rbac", "raycluster:apply", "raycluster:slices"]
    apply = next(s for s in raycluster.steps(DEV) if s.id == "raycluster:apply")
    assert "raycluster:watch-rbac" in apply.after
    for follow in (env("dev"), env("dev-autopilot")):
        steps = raycluster.steps(follow)
        assert "raycluster:watch-rbac" not in [s.id for s in steps]
        assert all("raycluster:watch-rbac" not in s.after for s in steps)
        assert "teardown:watch-rbac" not in [s.id for s in teardown.steps(follow)]
    assert [s.id for s in raycluster.steps(watched("dev-autopilot"))][:4] == [
        "raycluster:autopilot-rules", "raycluster:compute-class", "raycluster:skew", "raycluster:watch-rbac"]


# -- the head on its own account ------------------------------------------------------------
def pod_accounts(e) -> tuple[str, str]:
    """(the head's, the TPU workers') serviceAccountName in the rendered RayCluster."""
    rc = next(d for d in manifests.raycluster_docs(e) if d["kind"] == "RayCluster")
    return (manifests.head_pod_spec(rc)["serviceAccountName"],
            manifests.group_pod_spec(manifests.worker_group(rc))["serviceAccountName"])


@pytest.mark.parametrize("name", ["dev", "dev-autopilot"])
def test_the_head_runs_as_the_watchs_account_only_with_the_watch_the_workers_as_ksa_name(name):
    e = watched(name)
    assert pod_accounts(e) == (f"maxtext-watch-{e.namespace}", "maxtext-ksa")
    assert pod_accounts(env(name)) == ("maxtext-ksa", "maxtext-ksa")        # follow: the tutorial's one account


@pytest.mark.parametrize("e", [DEV, env("dev")], ids=["cluster", "follow"])
def test_a_head_on_another_account_is_drift_naming_the_delete_and_raycluster(e):
    docs_ = {d["kind"]: d for d in manifests.raycluster_docs(e)}
    key = raycluster_fact(e).key

    def decided(rc):
        return run_with_facts([raycluster.apply_step(e)], {key: {"items": [docs_["ResourceClaimTemplate"], rc]}},
                              mode=Mode.CHECK)

    recap, out = decided(docs_["RayCluster"])
    assert recap.counters() == "ok=1 changed=0 failed=0 skipped=0", out.text()
    old = copy.deepcopy(docs_["RayCluster"])
    other = "maxtext-ksa" if manifests.watch_rbac_wanted(e) else "maxtext-watch-default"
    old["spec"]["headGroupSpec"]["template"]["spec"]["serviceAccountName"] = other
    recap, out = decided(old)
    text = out.text().replace("\n", " ")
    assert recap.failed and applied(out) == [], text
    assert (f"drift: RayCluster maxtext-tpu-cluster: head serviceAccountName {other!r}, want "
            f"{manifests.head_ksa_name(e)!r}") in text, text
    assert ("to make it as rendered (a running job ends): kubectl delete raycluster maxtext-tpu-cluster --namespace "
            "default") in text and "then `invoke raycluster`" in text, text


NUMBER = "gcloud projects describe my-tpu-project '--format=value(projectNumber)'"
POLICY = "gcloud storage buckets get-iam-policy gs://my-tpu-project-maxtext-ckpt --format=json"
POOL = "principal://iam.googleapis.com/projects/123456789/locations/global/workloadIdentityPools/my-tpu-project" \
       ".svc.id.goog/subject/ns/default/sa/"
# The enabled services name the project by its number: the binding's check reads it there.
SERVICES = {"gcloud services list --enabled --format=json --project=my-tpu-project":
            [{"name": "projects/123456789/services/storage.googleapis.com", "parent": "projects/123456789"}]}


def test_the_heads_account_gets_the_bucket_binding_too_after_the_ksas():
    """The head mounts the bucket (its Ray Train driver writes the run's
    storage there): the tutorial's binding again for its own account."""
    assert [s.id for s in storage.steps(env("dev"))] == ["storage:bucket", "storage:ksa", "storage:binding"]
    assert [s.id for s in storage.steps(DEV)] == ["storage:bucket", "storage:ksa", "storage:binding",
                                                  "storage:head-binding"]
    step = [s for s in storage.steps(DEV) if s.id == "storage:head-binding"]
    assert "storage:binding" in step[0].after
    assert {"storage:head-binding", "raycluster:watch-rbac"} <= set(
        next(s for s in raycluster.steps(DEV) if s.id == "raycluster:apply").after)
    ksa = {"role": "roles/storage.objectUser", "members": [POOL + "maxtext-ksa"]}
    head = {"role": "roles/storage.objectUser", "members": [POOL + "maxtext-watch-default"]}
    recap, out = run_with_facts(step, {**SERVICES, NUMBER: "123456789\n", POLICY: Answers({"bindings": [ksa]},
                                                                             {"bindings": [ksa, head]})})
    assert applied(out) == ["gcloud storage buckets add-iam-policy-binding gs://my-tpu-project-maxtext-ckpt "
                            f"--member {POOL}maxtext-watch-default --role roles/storage.objectUser"], out.text()
    assert "granted roles/storage.objectUser to default/maxtext-watch-default" in out.text()
    recap, out = run_with_facts(step, {**SERVICES, POLICY: {"bindings": [ksa, head]}})
    assert applied(out) == [] and recap.counters() == "ok=1 changed=0 failed=0 skipped=0"
    # The KSA's binding alone does not verify the head's.
    recap, out = run_with_facts(step, {**SERVICES, NUMBER: "123456789\n", POLICY: {"bindings": [ksa]}})
    assert recap.failed and "roles/storage.objectUser not granted yet" in out.text(), out.text()


# -- the raycluster step -------------------------------------------------------------------
def rbac_step(e=DEV):
    return [s for s in raycluster.steps(e) if s.id == "raycluster:watch-rbac"]


def test_absent_is_applied_then_verified_then_a_second_run_changes_nothing():
    present = listed(*docs().values())
    recap, out = run_with_facts(rbac_step(), {PROBE: Answers("", present)})
    assert recap.counters() == "ok=0 changed=1 failed=0 skipped=0", out.text()
    assert applied(out) == [APPLY]
    assert "applied (ServiceAccount, ClusterRole, ClusterRoleBinding, Role, RoleBinding maxtext-watch-default, " \
           "for service account default/maxtext-watch-default)" in out.text()
    recap, out = run_with_facts(rbac_step(), {PROBE: present})
    assert recap.counters() == "ok=1 changed=0 failed=0 skipped=0" and applied(out) == []


def test_one_missing_is_applied_and_other_rules_are_drift_never_overwritten():
    d = docs()
    recap, out = run_with_facts(rbac_step(), {PROBE: Answers(listed(d["ClusterRole"], d["Role"]),
                                                             listed(*d.values()))})
    assert applied(out) == [APPLY] and recap.counters() == "ok=0 changed=1 failed=0 skipped=0"
    wider = dict(d["Role"], rules=[{"apiGroups": [""], "resources": ["pods"], "verbs": ["*"]}])
    recap, out = run_with_facts(rbac_step(), {PROBE: listed(d["ClusterRole"], wider)})
    assert applied(out) == [] and recap.counters() == "ok=0 changed=0 failed=1 skipped=0"
    assert 'drift: Role maxtext-watch-default rules: [{"apiGroups": [""], "resources": ["pods"], "verbs": ["*"]}], ' \
           'want [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "delete"]}' in out.text()
    other = dict(d["ClusterRoleBinding"], subjects=[{"kind": "ServiceAccount", "name": "x", "namespace": "default"}])
    _recap, out = run_with_facts(rbac_step(), {PROBE: listed(*{**d, "ClusterRoleBinding": other}.values())})
    assert "drift: ClusterRoleBinding maxtext-watch-default subjects:" in out.text() and applied(out) == []


def test_an_apply_that_leaves_one_out_fails_its_verify():
    d = docs()
    recap, out = run_with_facts(rbac_step(), {PROBE: Answers("", listed(d["ClusterRole"], d["Role"]))})
    assert recap.counters() == "ok=0 changed=0 failed=1 skipped=0"
    assert "ServiceAccount maxtext-watch-default not found; ClusterRoleBinding maxtext-watch-default not found; " \
           "RoleBinding maxtext-watch-default not found" in out.text()


# -- teardown ------------------------------------------------------------------------------
def test_teardown_deletes_them_when_present_and_not_when_gone_or_with_the_cluster():
    step = [s for s in teardown.steps(DEV) if s.id == "teardown:watch-rbac"]
    cluster = [{"name": "maxtext-multislice", "status": "RUNNING", "location": "us-east5-b"}]
    kubeconfig = {"contexts": [{"name": CONTEXT.split("=", 1)[1]}]}
    d = docs()
    facts = {CLUSTERS: cluster, KUBECONFIG: kubeconfig, PROBE: Answers(listed(d["Role"], d["ClusterRole"]), "")}
    recap, out = run_with_facts(step, facts)
    assert applied(out) == [DELETE] and recap.counters() == "ok=0 changed=1 failed=0 skipped=0"
    recap, out = run_with_facts(step, {**facts, PROBE: ""})
    assert applied(out) == [] and "no ServiceAccount, ClusterRole, Role or binding maxtext-watch-default" in out.text()
    recap, out = run_with_facts(step, {**facts, CLUSTERS: []})
    assert applied(out) == [] and "the watch's RBAC maxtext-watch-default with it" in out.text()
    cluster_step = next(s for s in teardown.steps(DEV) if s.id == "teardown:cluster")
    assert "teardown:watch-rbac" in cluster_step.after
    assert "the watch's service account, ClusterRole, Role and bindings maxtext-watch-default" in teardown.summary(DEV)
    assert "maxtext-watch" not in teardown.summary(env("dev"))


# -- the dry run ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def inventory(tmp_path_factory):
    """The shipped dev environment with stall_watch: cluster, in a file of its own."""
    shipped = yaml.safe_load((ROOT / "inventory.yaml").read_text())["environments"]
    path = tmp_path_factory.mktemp("inventory") / "inventory.yaml"
    path.write_text(yaml.safe_dump({"default": "dev", "environments": {
        "dev": dict(shipped["dev"], stall_watch="cluster")}}))
    return path


def test_the_dry_run_shows_the_apply_before_the_raycluster_and_teardowns_delete(inventory):
    rc, out, err = dry_run("dev", ["raycluster"], inventory)
    assert rc == 0 and "PROCESSES STARTED" not in err, err
    task = out.split("TASK [raycluster : RBAC of the watch maxtext-watch-default]", 1)[1]
    assert out.index("RBAC of the watch") < out.index("TASK [raycluster : RayCluster maxtext-tpu-cluster]")
    assert f"  probe  {PROBE}  => absent (assumed)" in task
    assert f"  apply  {APPLY}\n" in task
    rc, out, err = dry_run("dev", ["teardown"], inventory)
    assert rc == 0 and "PROCESSES STARTED" not in err, err
    assert f"  apply  {DELETE}\n" in out
    assert out.index("TASK [teardown : RBAC of the watch") < out.index("TASK [teardown : GKE cluster")
