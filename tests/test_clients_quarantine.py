"""A slice set aside on GKE and given back: `invoke hosts.quarantine` cordons
and taints its nodes and moves its worker pods off (KubeRay's new pods do
not land there), the optional pool replaced whole; a second run changes
nothing; check mode changes nothing; `invoke hosts.release` undoes it; a
watch sets aside again a slice whose record is no longer in force (its pool
made again, or given back where that record never heard of it). The
rights the watch will do it with from the Ray head (stall_watch: cluster):
applied by `invoke raycluster` before the RayCluster, unchanged by a second
run, deleted by `invoke teardown`, shown by the dry run.

Through `invoke` against the loopback fakes (tests/fakes/; what every such
test shares: tests/clients.py). The quarantine's and the release's kubectl
reads and writes (get, cordon, uncordon, taint, pod delete) are answered
in-process by the `kubernetes` client, which the run's log says of each, as
for a user; in each test's `[processes]` run (marker both_ways) each is the
real kubectl process. gcloud's changes, kubectl's apply and delete of the
watch's rights and get-credentials are real processes either way."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

from playbooks.cloud import manifests
from playbooks.core.facts import ABSENT
from playbooks.plays.quarantine import TAINT_KEY
from tests.clients import ROOT, Cloud, failed_run, logged, ok_run, recap

pytestmark = [pytest.mark.clients, pytest.mark.both_ways]

POOL = "v6e-16-0"


def pool_nodes(cloud: Cloud, pool: str = POOL) -> dict[str, dict]:
    return {n["metadata"]["name"]: n.get("spec") or {} for n in cloud.kube.list("nodes")
            if n["metadata"]["labels"].get("cloud.google.com/gke-nodepool") == pool}


def on_nodes(cloud: Cloud, nodes) -> list[str]:
    return sorted(p["metadata"]["name"] for p in cloud.kube.list("pods", "default", "ray.io/node-type=worker")
                  if (p.get("spec") or {}).get("nodeName") in set(nodes))


def tainted(spec: dict) -> bool:
    return any(t.get("key") == TAINT_KEY and t.get("effect") == "NoSchedule" for t in spec.get("taints") or [])


def record(cloud: Cloud) -> dict:
    path = ROOT / ".state" / cloud.envdata().name / "quarantine.json"
    return json.loads(path.read_text())["hosts"] if path.exists() else {}


# A followed job's watch sets a host aside (stall_action: restart), as
# runs/follow.py does: which hosts it holds before and after, then the steps.
WATCH = """
import os, sys
from invoke import Config
from playbooks.cli import task_steps
from playbooks.cli.session import open_session
c = Config(overrides={"playbook": {"inventory": os.environ["INVOKE_PLAYBOOK_INVENTORY"],
                                   "env": os.environ["INVOKE_PLAYBOOK_ENV"]}})
s = open_session(c, "train")
q = task_steps.follow_quarantine(s.env, True)
print("held before:", sorted(q.held()))
s.run("train", q.steps(sys.argv[1], sys.argv[2], "stall_action: restart"), parallel=False)
print("held after:", sorted(q.held()))
"""


def watch_sets_aside(cloud: Cloud, host: str, why: str) -> str:
    p = subprocess.run([sys.executable, "-c", WATCH, host, why], env=cloud.env(), cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    return p.stdout


def up(cloud: Cloud) -> dict[str, dict]:
    cloud.seed_full()
    cloud.get_credentials()
    nodes = pool_nodes(cloud)
    assert len(nodes) == 4 and len(on_nodes(cloud, nodes)) == 4    # a v6e-16 slice: 4 hosts, a worker on each
    return nodes


def test_quarantine_cordons_taints_moves_the_pods_then_a_second_run_changes_nothing(cloud: Cloud):
    nodes = up(cloud)
    before = on_nodes(cloud, nodes)
    since = time.time()
    run = ok_run(cloud.invoke("hosts.quarantine", POOL, "--why=chips failed the matmul check"))
    said_by(cloud, run, since)
    for name, spec in pool_nodes(cloud).items():
        assert spec.get("unschedulable") is True, (name, spec)
        assert tainted(spec), (name, spec)
    deleted = sorted(r.path.rsplit("/", 1)[-1] for r in run.kube if r.method == "DELETE")
    assert deleted == before
    # KubeRay's stand-in made them again: none on the quarantined nodes, and
    # with every other node taken, they wait (as on GKE, until a slice comes).
    assert on_nodes(cloud, nodes) == []
    pending = [p for p in cloud.kube.list("pods", "default", "ray.io/node-type=worker")
               if p["status"]["phase"] == "Pending"]
    assert len(pending) == 4 and "untolerated taints" in json.dumps(pending[0]["status"])
    # The other slice's nodes are untouched.
    assert not any(s.get("unschedulable") or s.get("taints") for s in pool_nodes(cloud, "v6e-16-1").values())
    rec = record(cloud)[POOL]
    assert (rec["slice"], sorted(rec["nodes"]), rec["why"]) == (POOL, sorted(nodes), "chips failed the matmul check")
    assert rec["by"] == "invoke hosts.quarantine"
    assert recap(run, "quarantine")["failed"] == 0

    again = ok_run(cloud.invoke("hosts.quarantine", POOL, "--why=again"))
    assert again.changes == [], again.changes
    assert record(cloud)[POOL]["why"] == "chips failed the matmul check"       # the first reason stays

    listed = ok_run(cloud.invoke("hosts"))
    assert re.search(rf"^{POOL}: slice {POOL}, since \S+ \S+, by invoke hosts.quarantine: chips failed the matmul "
                     rf"check\n  source: this checkout's record and node taint/cordon on the cluster$", listed.out,
                     re.M), listed.out
    assert len(re.findall(r"^  node \S+: cordoned, tainted$", listed.out, re.M)) == 4, listed.out
    assert listed.changes == []


WRITES = ("$ kubectl cordon ", "$ kubectl taint nodes ", "$ kubectl delete pod ")
IN_PROCESS = "answered in-process by the kubernetes client: no kubectl process ran"


def said_by(cloud: Cloud, run, since: float) -> None:
    """What made the quarantine's twelve writes (four nodes cordoned and
    tainted, four pods deleted), as the run's log says it: the `kubernetes`
    client in-process, no kubectl started for them; with --processes-only,
    twelve kubectl processes."""
    writes = [t for t in logged(cloud, "quarantine", since) if t.startswith(WRITES)]
    assert len(writes) == 12, writes
    started = [p for p in run.started("kubectl") if p.startswith(tuple(w[2:] for w in WRITES))]
    if cloud.processes_only:
        assert len(started) == 12 and not any(IN_PROCESS in t for t in writes), (started, writes)
    else:
        assert started == [] and all(IN_PROCESS in t.splitlines()[1] for t in writes), (started, writes)


def test_check_mode_changes_nothing_and_says_what_it_would_do(cloud: Cloud):
    nodes = up(cloud)
    run = ok_run(cloud.invoke("hosts.quarantine", POOL, "--why=x", INVOKE_PLAYBOOK_MODE="check"))
    assert run.changes == []
    assert record(cloud) == {}
    assert not any(s.get("unschedulable") or s.get("taints") for s in pool_nodes(cloud).values())
    assert len(on_nodes(cloud, nodes)) == 4
    assert "would record v6e-16-0 as quarantined: x" in run.out


def test_release_uncordons_untaints_and_forgets_but_leaves_a_node_someone_else_cordoned(cloud: Cloud):
    nodes = up(cloud)
    ok_run(cloud.invoke("hosts.quarantine", POOL, "--why=hung in a collective"))
    other = sorted(pool_nodes(cloud, "v6e-16-1"))[0]
    p = cloud.client("kubectl", "cordon", other)                  # a person's, not ours
    assert p.returncode == 0, p.stderr
    # A run whose watch set the slice aside: the release goes into its timeline (cost's end of quarantined).
    timeline = ROOT / ".state" / cloud.envdata().name / "training" / "r-released" / "events.jsonl"
    timeline.parent.mkdir(parents=True, exist_ok=True)
    timeline.write_text(json.dumps({"t": 1.0, "kind": "quarantined", "step": 5, "source": "train", "host": POOL,
                                    "slice": POOL, "why": "hung", "by": "stall_action: restart"}) + "\n")
    try:
        run = ok_run(cloud.invoke("hosts.release", POOL))
        for name, spec in pool_nodes(cloud).items():
            assert not spec.get("unschedulable") and not tainted(spec), (name, spec)
        assert pool_nodes(cloud, "v6e-16-1")[other].get("unschedulable") is True
        assert record(cloud) == {}
        assert recap(run, "release")["changed"] == 3       # uncordon, untaint, forget (and the event)
        released = [json.loads(line) for line in timeline.read_text().splitlines()][1:]
        assert [(e["kind"], e["host"], e["slice"], e["by"]) for e in released] == [
            ("released", POOL, POOL, "hosts.release")], released
        again = ok_run(cloud.invoke("hosts.release", POOL))
        assert again.changes == []
        assert len(timeline.read_text().splitlines()) == 2
        assert sorted(nodes) == sorted(pool_nodes(cloud))
    finally:
        timeline.unlink(missing_ok=True)
        timeline.parent.rmdir()


def test_a_pool_replaced_whole_when_the_inventory_says_so_and_its_new_nodes_set_aside_when_they_fail(cloud: Cloud):
    cloud.change_inventory(quarantine_replace_pool=True)
    nodes = up(cloud)
    run = ok_run(cloud.invoke("hosts.quarantine", POOL, "--why=vfio busy"))
    assert [r.path.rsplit("/", 1)[-1] for r in run.gcp if r.method == "DELETE"] == [POOL]
    assert [r.body["nodePool"]["name"] for r in run.gcp if r.method == "POST" and r.path.endswith("/nodePools")] \
        == [POOL]
    new = pool_nodes(cloud)
    assert len(new) == 4 and not set(new) & set(nodes)             # new nodes, not set aside
    assert not any(s.get("unschedulable") or s.get("taints") for s in new.values())
    assert len(on_nodes(cloud, new)) == 4                            # the workers came back onto them
    again = ok_run(cloud.invoke("hosts.quarantine", POOL, "--why=vfio busy"))
    assert again.changes == [], again.changes
    assert "no quarantined node of v6e-16-0 is left in its pool: nothing to replace" in again.out


    # The new slice fails again: the watch, which holds no host of the record
    # whose nodes are all gone, sets aside the new nodes (the record written anew).
    out = watch_sets_aside(cloud, POOL, "hung in a collective")
    assert "held before: []" in out and f"held after: ['{POOL}']" in out, out[-3000:]
    assert all(s.get("unschedulable") is True and tainted(s) for s in pool_nodes(cloud).values())
    rec = record(cloud)[POOL]
    assert (sorted(rec["nodes"]), rec["why"], rec["by"]) == (sorted(new), "hung in a collective",
                                                              "stall_action: restart"), rec


def test_a_record_given_back_where_it_never_heard_of_it_is_written_anew_by_the_watch(cloud: Cloud):
    """A watch in a head pod keeps its own record, which no release from
    this machine reaches: there the slice is given back (untainted), then
    fails again. The watch sets it aside again with this failure's reason;
    a person's second quarantine keeps the record as it is."""
    nodes = up(cloud)
    ok_run(cloud.invoke("hosts.quarantine", POOL, "--why=vfio busy"))
    first = record(cloud)[POOL]
    for n in nodes:                                               # the release, from another machine
        for argv in (("uncordon", n), ("taint", "nodes", n, f"{TAINT_KEY}-")):
            p = cloud.client("kubectl", *argv)
            assert p.returncode == 0, p.stderr
    out = watch_sets_aside(cloud, POOL, "hung in a collective")
    assert "held before: []" in out and f"held after: ['{POOL}']" in out, out[-3000:]
    assert "recorded v6e-16-0 anew: hung in a collective" in out, out[-3000:]
    assert all(s.get("unschedulable") is True and tainted(s) for s in pool_nodes(cloud).values())
    rec = record(cloud)[POOL]
    assert (sorted(rec["nodes"]), rec["why"], rec["by"]) == (sorted(nodes), "hung in a collective",
                                                              "stall_action: restart"), rec
    assert rec["since"] > first["since"]
    again = ok_run(cloud.invoke("hosts.quarantine", POOL, "--why=again"))
    assert again.changes == [] and record(cloud)[POOL] == rec


# -- `invoke hosts`: the nodes are the truth, the record this checkout's ---------------------------
def elsewhere(cloud: Cloud, pool: str) -> list[str]:
    """A quarantine made from another machine (a teammate's, the head pod's
    watch): the pool's nodes cordoned and tainted with kubectl, in no record here."""
    nodes = sorted(pool_nodes(cloud, pool))
    for n in nodes:
        for argv in (("cordon", n), ("taint", "nodes", n, f"{TAINT_KEY}=true:NoSchedule")):
            p = cloud.client("kubectl", *argv)
            assert p.returncode == 0, p.stderr
    return nodes


def test_hosts_reads_the_nodes_a_quarantine_made_elsewhere_is_listed_with_where_it_is_known_from(cloud: Cloud):
    """A slice set aside by a teammate (or the watch in the head pod) is in
    no record of this checkout: `invoke hosts` reads the nodes and lists it,
    said as known from the cluster; a node only cordoned is listed, not
    counted as set aside; the JSON says the same."""
    up(cloud)
    theirs = elsewhere(cloud, POOL)
    cordoned = sorted(pool_nodes(cloud, "v6e-16-1"))[:1]                # a person's cordon (or GKE's upgrade)
    assert cloud.client("kubectl", "cordon", *cordoned).returncode == 0
    assert record(cloud) == {}
    listed = ok_run(cloud.invoke("hosts"))
    assert "no host is quarantined" not in listed.out.splitlines()[0], listed.out
    assert re.search(rf"^{POOL}: set aside on the cluster, in no record of this checkout: by a teammate, another "
                     rf"machine or the watch in the head pod .*\n  source: node taint/cordon on the cluster$",
                     listed.out, re.M), listed.out
    assert sorted(re.findall(r"^  node (\S+): cordoned, tainted$", listed.out, re.M)) == theirs, listed.out
    assert re.search(r"^v6e-16-1: cordoned, without the quarantine taint: not set aside", listed.out, re.M)
    assert re.findall(r"^  node (\S+): cordoned, NOT tainted$", listed.out, re.M) == cordoned, listed.out
    assert listed.changes == []
    rows = {r["host"]: r for r in json.loads(ok_run(cloud.invoke("hosts", "--json")).out)}
    assert (rows[POOL]["source"], rows[POOL]["held"], rows[POOL]["why"]) == (
        ["node taint/cordon on the cluster"], True, None), rows
    assert sorted(rows[POOL]["nodes"]) == theirs
    assert (rows["v6e-16-1"]["held"], list(rows["v6e-16-1"]["nodes"])) == (False, cordoned), rows


def test_a_record_here_whose_nodes_were_given_back_elsewhere_is_said_as_such(cloud: Cloud):
    nodes = up(cloud)
    ok_run(cloud.invoke("hosts.quarantine", POOL, "--why=vfio busy"))
    for n in nodes:                                               # the release, from another machine
        for argv in (("uncordon", n), ("taint", "nodes", n, f"{TAINT_KEY}-")):
            assert cloud.client("kubectl", *argv).returncode == 0
    listed = ok_run(cloud.invoke("hosts"))
    assert re.search(rf"^{POOL}: slice {POOL}, since \S+ \S+, by invoke hosts.quarantine: vfio busy\n  source: this "
                     rf"checkout's record only: no node of it carries the taint now: given back from elsewhere .*; "
                     rf"not set aside: `invoke hosts.release {POOL}` clears this record$", listed.out, re.M), listed.out
    assert len(re.findall(r"^  node \S+: NOT cordoned, NOT tainted$", listed.out, re.M)) == 4, listed.out
    [row] = json.loads(ok_run(cloud.invoke("hosts", "--json")).out)
    assert (row["source"], row["held"]) == (["this checkout's record"], False), row


def test_hosts_that_cannot_read_the_nodes_says_could_not_look_never_none(cloud: Cloud):
    up(cloud)
    cloud.kube.server.fail("GET", r"^/api/v1/nodes$", 403, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                                     "message": 'nodes is forbidden: User "x" cannot list resource '
                                                                '"nodes"', "reason": "Forbidden", "code": 403},
                    times=20)
    try:
        run = failed_run(cloud.invoke("hosts"))
    finally:
        cloud.kube.server.clear_faults()
    assert "no host is quarantined" not in run.out, run.out
    assert "could not look" in run.out and "forbidden" in run.out.lower(), run.out
    assert [r.path for r in run.kube if r.path == "/api/v1/nodes"], run


def test_with_nothing_set_aside_hosts_says_where_it_looked(cloud: Cloud):
    up(cloud)
    listed = ok_run(cloud.invoke("hosts"))
    assert listed.out.strip() == ("no host is quarantined: no node cordoned or tainted on the cluster, none in this "
                                  "checkout's record"), listed.out
    assert [r.path for r in listed.kube if r.path == "/api/v1/nodes"], listed


def test_a_bad_host_name_is_one_line_naming_the_known_hosts(cloud: Cloud):
    run = failed_run(cloud.invoke("hosts.quarantine", "v6e-16-7", "--why=x"))
    assert run.out.strip() == ("error: host 'v6e-16-7': not a TPU slice's node pool of "
                               f"{cloud.envdata().name} (its hosts: v6e-16-0, v6e-16-1)"), run.out
    assert run.requests == []


# -- the watch's rights on the Ray head (manifests/ray-watch-rbac.yaml) ---------------------------
RBAC = "/apis/rbac.authorization.k8s.io/v1"
RBAC_PATHS = [f"{RBAC}/clusterroles/maxtext-watch-default", f"{RBAC}/clusterrolebindings/maxtext-watch-default",
              f"{RBAC}/namespaces/default/roles/maxtext-watch-default",
              f"{RBAC}/namespaces/default/rolebindings/maxtext-watch-default",
              "/api/v1/namespaces/default/serviceaccounts/maxtext-watch-default"]   # the head's own account
PLURALS = {"ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings", "Role": "roles",
           "RoleBinding": "rolebindings", "ServiceAccount": "serviceaccounts"}


@pytest.fixture
def watched(cloud: Cloud):
    """The Standard environment with stall_watch: cluster."""
    cloud.change_inventory(stall_watch="cluster")
    yield cloud


def test_the_watchs_rights_applied_before_the_raycluster_unchanged_again_deleted_by_teardown(watched: Cloud,
                                                                                             monkeypatch):
    cloud = watched
    cloud.seed_full()
    cloud.get_credentials()
    e = cloud.envdata()
    rendered = {d["kind"]: d for d in manifests.watch_rbac_docs(e)}
    assert _kubectl_and_the_client_read_them_alike(cloud, e, monkeypatch) is ABSENT

    dry = ok_run(cloud.invoke("--dry", "raycluster"))
    assert dry.requests == [], dry
    assert f"  apply  {manifests.watch_rbac_apply(e).line()}\n" in dry.out, dry.out

    run = ok_run(cloud.invoke("raycluster"))
    assert sorted(r.path for r in run.kube if r.method == "POST") == sorted(p.rsplit("/", 1)[0] for p in RBAC_PATHS)
    ours = RBAC_PATHS + [p.rsplit("/", 1)[0] for p in RBAC_PATHS]
    assert [r for r in run.changes if r.path not in ours] == []     # the RayCluster was there already
    for kind, doc in rendered.items():
        have = cloud.kube.get(PLURALS[kind], doc["metadata"]["name"], doc["metadata"].get("namespace", ""))
        assert have is not None, kind
        assert {f: have.get(f) for f in manifests.RBAC_FIELDS if f in doc} == \
            {f: doc[f] for f in manifests.RBAC_FIELDS if f in doc}, kind
    assert recap(run, "raycluster")["changed"] == 1
    assert "changed: [raycluster : RBAC of the watch maxtext-watch-default] applied (ServiceAccount, ClusterRole, " \
           "ClusterRoleBinding, Role, RoleBinding maxtext-watch-default, for service account " \
           "default/maxtext-watch-default)" in run.out, run.out

    again = ok_run(cloud.invoke("raycluster"))
    assert again.changes == [], again.changes
    assert "ok: [raycluster : RBAC of the watch maxtext-watch-default] ServiceAccount, ClusterRole, Role and their " \
           "bindings maxtext-watch-default are the ones rendered" in again.out, again.out
    got = _kubectl_and_the_client_read_them_alike(cloud, e, monkeypatch)
    assert list(got) == ["ClusterRoleBinding", "ClusterRole", "RoleBinding", "Role", "ServiceAccount"]
    # A binding's role never changes (the API server refuses it; so does the fake).
    p = cloud.client("kubectl", "patch", "rolebinding", "maxtext-watch-default", "--namespace", "default",
                     "--type=merge", "-p", '{"roleRef": {"name": "other"}}')
    assert p.returncode == 1 and "cannot change roleRef" in p.stderr, p.stderr

    down = ok_run(cloud.invoke("teardown", "--yes"))
    deleted = [r for r in down.kube if r.method == "DELETE" and r.path in RBAC_PATHS]
    assert sorted(r.path for r in deleted) == sorted(RBAC_PATHS)
    cluster_delete = next(r for r in down.gcp if r.method == "DELETE" and "/clusters/" in r.path)
    assert max(r.at for r in deleted) < cluster_delete.at


def _kubectl_and_the_client_read_them_alike(cloud: Cloud, e, monkeypatch):
    """The step's probe through kubectl and through the local connector's
    shortcut (the kubernetes client): the same objects, as the play parses them."""
    from playbooks.access.kube_api import KubectlShortcut
    from playbooks.core.facts import Completed
    fact, env = manifests.watch_rbac_fact(e), cloud.env()
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    cli, fast = cloud.client(*fact.command.argv), KubectlShortcut().run(list(fact.command.argv), env, 30)
    assert fast is not None and (fast.rc, cli.returncode) == (0, 0), (cli.stderr, fast and fast.stderr)
    got = fact.parse(Completed("", 0, fast.stdout, ""))
    assert got == fact.parse(Completed("", 0, cli.stdout, ""))
    return got
