"""Hosts set aside without Ray or a cloud: the record (a file that is not
one is "could not look", never "none"), the twin's host held out of `up`
and its slices said at once, the steps' order, the taint no pod of ours
tolerates. The GKE quarantine against the fakes (its kubectl answered by the
`kubernetes` client, and by the real kubectl in each test's `[processes]` run):
test_clients_quarantine.py."""
from __future__ import annotations

import json

import pytest

from playbooks.access import connectors
from playbooks.cli import task_steps
from playbooks.cloud import manifests
from playbooks.config import paths
from playbooks.core.errors import ProbeFailed
from playbooks.core.facts import ABSENT
from playbooks.core.fixtures import Answers
from playbooks.core.runner import Mode
from playbooks.plays import local_cluster, quarantine
from playbooks.runs import events as E
from playbooks.runs import quarantine_record as R
from playbooks.runs import timeline
from tests.conftest import env, run_with_facts

RECORD = "cat .state/local/quarantine.json"
NODES = ("curl -fsS 'http://127.0.0.2:8265/api/v0/nodes?limit=10000&detail=true'  # what `ray list nodes "
         "--address http://127.0.0.2:8265` reads")
HELD = {"tpu-group-1-0": R.entry("tpu-group-1", "chips failed the matmul check", "invoke hosts.quarantine",
                                 since=1764860000.0)}


def test_the_record_is_written_read_and_cleared(here):
    local = env("local")
    assert R.read(local) == {}                                  # no file: nothing set aside
    R.add(local, "tpu-group-1-0", HELD["tpu-group-1-0"]).fn()
    R.add(local, "tpu-group-0-0", R.entry("tpu-group-0", "hung", "stall restart")).fn()
    assert sorted(R.read(local)) == ["tpu-group-0-0", "tpu-group-1-0"]
    assert R.line("tpu-group-1-0", R.read(local)["tpu-group-1-0"]) == (
        "tpu-group-1-0: slice tpu-group-1, since 2025-12-04 14:53:20Z, by invoke hosts.quarantine: chips failed the "
        "matmul check")
    R.remove(local, "tpu-group-0-0").fn()
    assert list(R.read(local)) == ["tpu-group-1-0"]
    assert (here / ".state" / "local" / "quarantine.json").exists()


def test_what_a_watch_counts_as_set_aside_is_the_records_and_on_gke_only_while_a_node_keeps_the_taint(
        here, monkeypatch):
    """A watch in a GKE head pod keeps its own record, which no release from
    this machine reaches: there a host counts as set aside while a node of
    its record still carries the taint (a release untaints them first)."""
    local, dev = env("local"), env("dev")
    R.add(local, "tpu-group-1-0", HELD["tpu-group-1-0"]).fn()
    assert quarantine.held_now(local) == {"tpu-group-1-0"}
    for pool, nodes in (("v6e-16-0", ["n-a", "n-b"]), ("v6e-16-1", ["n-c"]), ("v6e-16-2", [])):
        R.add(dev, pool, R.entry(pool, "hung", "stall_action: restart", nodes)).fn()
    taints = {"n-a": [], "n-b": [{"key": quarantine.TAINT_KEY, "value": "true", "effect": "NoSchedule"}],
              "n-c": [], "n-new": []}   # n-c released (untainted); v6e-16-2 recorded no node: kept
    asked = []

    def nodes(env, *args, timeout=60):
        asked.append(args)
        pool = args[-1].split("=", 1)[1]
        mine = {"v6e-16-0": ["n-a", "n-b"], "v6e-16-1": ["n-c", "n-new"], "v6e-16-2": []}[pool]
        return {"items": [{"metadata": {"name": n}, "spec": {"taints": taints[n]}} for n in mine]}
    monkeypatch.setattr(quarantine.kube_objects, "kubectl_json", nodes)
    assert quarantine.held_now(dev) == {"v6e-16-0", "v6e-16-2"}
    assert asked[0] == ("nodes", "-l", "cloud.google.com/gke-nodepool=v6e-16-0")
    taints["n-b"] = []                                            # released from this machine: untainted
    assert quarantine.held_now(dev) == {"v6e-16-2"}

    def refused(env, *args, timeout=60):
        raise ProbeFailed("kubectl", "kubectl get nodes", 1, "", "Forbidden", why="could not look: Forbidden")
    monkeypatch.setattr(quarantine.kube_objects, "kubectl_json", refused)
    with pytest.raises(ProbeFailed):                              # could not look: never "none set aside"
        quarantine.held_now(dev)


@pytest.mark.parametrize("text,words", [("{not json", "is not JSON"), ('{"hosts": [1]}', "is not a record of hosts"),
                                        ('{"hosts": {"a": 1}}', "is not a record of hosts")])
def test_a_record_that_is_not_one_is_could_not_look_never_none(here, text, words):
    local = env("local")
    (here / ".state" / "local").mkdir(parents=True)
    (here / ".state" / "local" / "quarantine.json").write_text(text)
    with pytest.raises(ProbeFailed) as e:
        R.read(local)
    assert words in e.value.why and e.value.why.startswith("could not look")


def _up_facts(held: dict) -> dict:
    return {"kill -0 $(cat .state/local/nodes/head.pid)": True,
            "curl -fsS http://127.0.0.2:8265/api/version": {"ray_version": "2.60.0"},
            "kill -0 $(cat .state/local/nodes/tpu-group-0-0.pid)": True,
            "kill -0 $(cat .state/local/nodes/tpu-group-1-0.pid)": False,
            NODES: ABSENT, RECORD: held,
            "kill -0 $(cat .state/local/nodes/tpu-*.pid) && curl -fsS http://127.0.0.2:8265/api/v0/nodes  # every TPU "
            "host ALIVE": {"tpu-group-0-0": {"process": True, "joined": True},
                           "tpu-group-1-0": {"process": False, "joined": False, "exited": "not started (no pid file)"}}}


def test_up_does_not_start_a_quarantined_host_and_says_at_once_why_its_slice_is_missing():
    local = env("local")
    steps = local_cluster.steps(local)
    recap, _out = run_with_facts(steps, {**_up_facts(HELD), NODES: [{"state": "ALIVE", "is_head_node": True}]},
                                mode=Mode.CHECK, keep_going=True)
    by = {r.title: r for r in recap.results}
    host = by["twin : TPU host tpu-group-1-0"]
    assert host.outcome == "skipped", host
    assert "quarantined" in host.reason and "`invoke hosts.release tpu-group-1-0`" in host.reason
    slices = by["twin : TPU slices"]
    assert slices.outcome == "failed" and "TPU host tpu-group-1-0 is quarantined" in slices.reason, slices.reason


def test_without_a_record_up_would_start_the_host():
    """The same state, nothing set aside: the host step would start it (the check above can fail)."""
    local = env("local")
    recap, _ = run_with_facts(local_cluster.steps(local), {**_up_facts({}), NODES: [{"state": "ALIVE",
                                                                                     "is_head_node": True}]},
                              mode=Mode.CHECK, keep_going=True)
    host = next(r for r in recap.results if r.title == "twin : TPU host tpu-group-1-0")
    assert host.outcome == "changed" and "start TPU host tpu-group-1-0" in host.reason


def test_a_slice_that_min_slices_can_do_without_is_not_a_failure():
    """min_slices 1 of 2: the other slice is enough; the quarantined one is waited for, not failed."""
    local = env("local", min_slices=1)
    recap, _ = run_with_facts(local_cluster.steps(local), {**_up_facts(HELD), NODES: [{"state": "ALIVE",
                                                                                       "is_head_node": True}]},
                              mode=Mode.CHECK, keep_going=True)
    slices = next(r for r in recap.results if r.title == "twin : TPU slices")
    assert slices.outcome != "failed", slices


def test_quarantine_on_the_twin_records_then_stops_the_host_and_a_second_run_changes_nothing():
    local = env("local")
    pid = "kill -0 $(cat .state/local/nodes/tpu-group-1-0.pid)"
    steps = task_steps.quarantine_steps(local, "tpu-group-1-0", "chips failed", "a test")
    assert [s.id for s in steps] == ["quarantine:record", "quarantine:stop-tpu-group-1-0"]
    recap, out = run_with_facts(steps, {RECORD: Answers({}, HELD), pid: Answers(True, False)})
    assert [r.outcome for r in recap.results] == ["changed", "changed"]
    text = "\n".join(out)
    assert "apply  # record tpu-group-1-0 as quarantined in .state/local/quarantine.json: chips failed" in text
    assert "apply  kill -TERM $(cat .state/local/nodes/tpu-group-1-0.pid)" in text
    again, _ = run_with_facts(task_steps.quarantine_steps(local, "tpu-group-1-0", "other", "a test"),
                              {RECORD: HELD, pid: False})
    assert [r.outcome for r in again.results] == ["ok", "ok"]


def test_release_on_the_twin_forgets_first_then_starts_the_host_as_up_does():
    local = env("local")
    steps = task_steps.release_steps(local, "tpu-group-1-0")
    assert [s.id for s in steps] == ["release:record", "twin:head", "twin:tpu-group-1-0"]
    assert all("release:record" in s.after for s in steps[1:])


def test_host_names_and_their_problem_name_the_known_hosts():
    assert task_steps.host_names(env("local")) == ["tpu-group-0-0", "tpu-group-1-0"]
    assert task_steps.host_names(env("dev")) == ["v6e-16-0", "v6e-16-1"]
    assert task_steps.host_problem(env("dev"), "v6e-16-1") is None
    assert task_steps.host_problem(env("dev"), "tpu-group-0-0") == (
        "host 'tpu-group-0-0': not a TPU slice's node pool of dev (its hosts: v6e-16-0, v6e-16-1)")


def test_the_replace_pool_steps_come_only_when_the_inventory_asks():
    plain = [s.id for s in task_steps.quarantine_steps(env("dev"), "v6e-16-0", "x", "t")]
    assert plain == ["kube:credentials", "quarantine:record", "quarantine:cordon", "quarantine:taint",
                     "quarantine:pods"]
    replaced = task_steps.quarantine_steps(env("dev", quarantine_replace_pool=True), "v6e-16-0", "x", "t")
    assert [s.id for s in replaced][-2:] == ["quarantine:replace", "nodepools:v6e-16-0"]
    assert "quarantine:replace" in replaced[-1].after


def _tolerates(tol: dict, key: str) -> bool:
    """Whether a toleration lets a pod onto a node with ``key``'s NoSchedule taint."""
    if tol.get("effect") not in (None, "", "NoSchedule"):
        return False
    if tol.get("operator") == "Exists":
        return tol.get("key") in (None, "", key)
    return tol.get("key") == key


@pytest.mark.parametrize("name", ["dev", "dev-autopilot"])
def test_no_pod_of_ours_tolerates_the_quarantine_taint(name):
    docs = manifests.raycluster_docs(env(name))
    templates = []
    for d in docs:
        spec = d.get("spec") or {}
        templates.append((spec.get("headGroupSpec") or {}).get("template"))
        templates += [g.get("template") for g in spec.get("workerGroupSpecs") or []]
    specs = [(t or {}).get("spec") or {} for t in templates if t]
    assert specs, docs
    tolerations = [tol for s in specs for tol in s.get("tolerations") or []]
    assert not any(_tolerates(t, quarantine.TAINT_KEY) for t in tolerations), tolerations
    # The check itself sees a toleration that would let them in.
    assert _tolerates({"operator": "Exists"}, quarantine.TAINT_KEY)
    assert _tolerates({"key": quarantine.TAINT_KEY, "operator": "Equal", "value": "true"}, quarantine.TAINT_KEY)


def test_the_twin_quarantine_really_stops_the_host_holds_it_out_and_release_forgets_it(here, monkeypatch):
    """Apply mode with this machine's connector (rooted in a temporary
    folder): a stand-in process carrying a host's pid-file marker is the
    host's node; no Ray. Quarantined: recorded, the process stopped; a second
    run changes nothing; `up`'s host step (check mode) would not start it."""
    import subprocess
    import sys

    from playbooks.core.play import Playbook
    from playbooks.core.recap import Reporter
    from playbooks.core.runner import Runner
    from playbooks.twin.nodes import Host, pidfile

    local = env("local")
    node = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "ray start --address"])
    try:
        pidfile(local, "tpu-group-1-0").write(node.pid)
        lines: list[str] = []

        def run(steps, mode=Mode.APPLY):
            book = Playbook(Runner(mode, connectors.this_machine()), Reporter(lines.append), workers=1)
            return book.run("t", steps)

        first = run(task_steps.quarantine_steps(local, "tpu-group-1-0", "chips failed", "a test"))
        assert [r.outcome for r in first.results] == ["changed", "changed"], "\n".join(lines)
        assert node.wait(timeout=30) is not None                        # the node's process is gone
        assert R.read(local)["tpu-group-1-0"]["why"] == "chips failed"
        again = run(task_steps.quarantine_steps(local, "tpu-group-1-0", "other words", "a test"))
        assert [r.outcome for r in again.results] == ["ok", "ok"]
        assert R.read(local)["tpu-group-1-0"]["why"] == "chips failed"
        held = run([local_cluster.host_step(local, Host("tpu-group-1-0", 1, 0))], mode=Mode.CHECK)
        assert held.results[0].outcome == "skipped" and "quarantined" in held.results[0].reason
        timelines = runs_that_set_it_aside(here, monkeypatch)
        gone = run([quarantine.forget_step(local, "tpu-group-1-0")])
        assert gone.results[0].outcome == "changed" and R.read(local) == {}
        released_where_it_was_set_aside(timelines)
    finally:
        node.kill()
        node.wait()


def runs_that_set_it_aside(here, monkeypatch) -> dict[str, list[dict]]:
    """Four runs' timelines (the project's folder made the temporary one):
    one has tpu-group-1-0 set aside; one set it aside, then its next job
    was priced (its ledger starts afresh); one set it aside, then its job
    ended (nothing is billed between jobs); one set aside another host."""
    monkeypatch.setattr(paths, "ROOT", here)
    def q(t, host):
        return {"t": t, "kind": E.QUARANTINED, "step": 5, "source": "train", "host": host,
                "slice": host.rsplit("-", 1)[0], "why": "hang", "by": "stall_action: restart"}
    runs = {"held": [q(10.0, "tpu-group-1-0")],
            "priced-since": [q(10.0, "tpu-group-1-0"), {"t": 20.0, "kind": E.PRICED, "step": None, "source": "train"}],
            "job-ended": [q(10.0, "tpu-group-1-0"), {"t": 20.0, "kind": E.JOB_END, "step": None, "source": "train"}],
            "other-host": [q(10.0, "tpu-group-0-0")]}
    for run, evs in runs.items():
        f = here / ".state" / "local" / "training" / run / "events.jsonl"
        f.parent.mkdir(parents=True)
        f.write_text("".join(json.dumps(e) + "\n" for e in evs))
    return runs


def released_where_it_was_set_aside(runs: dict[str, list[dict]]) -> None:
    local = env("local")
    for run, before in runs.items():
        now = timeline.read(local, run)
        if run == "held":
            assert now[:-1] == before
            assert {k: now[-1][k] for k in ("kind", "source", "host", "slice", "by")} == {
                "kind": E.RELEASED, "source": "hosts", "host": "tpu-group-1-0", "slice": "tpu-group-1",
                "by": "hosts.release"}
            assert timeline.set_aside(now, "tpu-group-1-0") is None
        else:
            assert now == before, run


def test_a_release_in_a_dry_run_says_the_event_and_writes_nothing(here, monkeypatch):
    local = env("local")
    runs = runs_that_set_it_aside(here, monkeypatch)
    _, out = run_with_facts([quarantine.forget_step(local, "tpu-group-1-0")], {RECORD: HELD},
                                mode=Mode.DRY)
    assert "# released: an event in the timeline of each run that has tpu-group-1-0 set aside" in out.text()
    assert all(timeline.read(local, run) == evs for run, evs in runs.items())


def _node(name: str, pool: str, cordoned: bool, tainted: bool) -> dict:
    taints = [{"key": quarantine.TAINT_KEY, "value": "true", "effect": "NoSchedule"}] if tainted else []
    return {"kind": "Node", "metadata": {"name": name, "labels": {"cloud.google.com/gke-nodepool": pool}},
            "spec": {"unschedulable": cordoned, "taints": taints}}


def test_statuss_row_on_gke_counts_a_slice_tainted_elsewhere_and_not_a_node_only_cordoned(here):
    """`invoke status`'s row reads the nodes (the same read as its other
    rows): a slice whose nodes carry the taint is held out though no record
    here names it; a node only cordoned is said, not counted; a record whose
    nodes are untainted is said as no longer in force."""
    dev = env("dev")
    nodes, record = quarantine.cluster_nodes_fact(dev).key, R.fact(dev).key
    listed = [_node("n-a", "v6e-16-0", True, True), _node("n-b", "v6e-16-1", True, False),
              _node("n-c", "v6e-16-2", False, False)]
    recap, _ = run_with_facts([quarantine.list_step(dev, "status", held_fails=True)],
                              {record: {}, nodes: {"kind": "List", "items": listed}})
    [r] = recap.results
    assert r.outcome == "failed" and r.reason.startswith("1 quarantined: v6e-16-0; not set aside, but said: "
                                                         "v6e-16-1 (`invoke hosts`"), r.reason
    given_back = {"v6e-16-2": R.entry("v6e-16-2", "hung", "stall_action: restart", ["n-c"])}
    recap, out = run_with_facts([quarantine.list_step(dev, "status", held_fails=True)],
                                {record: given_back, nodes: {"kind": "List", "items": listed[1:]}})
    [r] = recap.results
    assert (r.outcome, r.reason) == ("ok", "no host is quarantined; not set aside, but said: v6e-16-1, v6e-16-2")
    assert "  source: this checkout's record only: no node of it carries the taint now" in "\n".join(out), out
