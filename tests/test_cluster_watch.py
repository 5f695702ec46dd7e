"""The watch in the cluster (stall_watch: cluster): its Ray job's command
(each word arriving as it was through Ray's shell), its id never taken
for a run's job, and the follow beside it a viewer that acts on nothing,
writes nothing and shows what the watch recorded."""
from __future__ import annotations

import json
import os
import shlex

import pytest

from playbooks.access.ray_api import ours
from playbooks.runs import cluster_watch, restart, timeline
from tests.test_goodput import T0, WatchedEnv, ev, start, steps
from tests.test_restart import TWIN, FakeQuarantine, StepsContext


class Env(WatchedEnv):
    stall_watch = "cluster"


def test_the_watch_job_arrives_word_for_word_through_rays_shell(monkeypatch):
    from playbooks.config import paths
    odd = "/tmp/a project's folder $(x)"
    monkeypatch.setattr(paths, "ROOT", type(paths.ROOT)(odd))
    monkeypatch.setenv("INVOKE_PLAYBOOK_INVENTORY", "/tmp/inv 'x'.yaml")
    c = cluster_watch.submit_command(Env(30, "restart"), "http://127.0.0.1:8265", "run", "run-3", elastic=True)
    argv = list(c.argv)
    assert f"--submission-id=run-3{cluster_watch.SUFFIX}" in argv and "--no-wait" in argv
    entry = argv[argv.index("--") + 1:]
    assert entry[:3] == ["env", "-C", odd]
    assert entry[-5:] == ["watch", "--env=e", "--run=run", "--job=run-3", "--elastic"]
    # Ray 2.60 joins the entrypoint with shlex.join and the head runs it through a shell.
    assert shlex.split(shlex.join(entry)) == entry
    env_vars = json.loads(argv[argv.index("--runtime-env-json") + 1])["env_vars"]
    assert env_vars["INVOKE_PLAYBOOK_INVENTORY"] == "/tmp/inv 'x'.yaml"
    monkeypatch.delenv("INVOKE_PLAYBOOK_INVENTORY")
    c = cluster_watch.submit_command(Env(30, "restart"), "http://x", "run", "run-3", elastic=False)
    assert "--elastic" not in c.argv and "INVOKE_PLAYBOOK_INVENTORY" not in " ".join(c.argv)


def test_the_watch_is_never_a_runs_job_and_is_found_only_while_it_runs():
    listed = [{"submission_id": "run-1", "status": "RUNNING", "start_time": 1},
              {"submission_id": "run-1-watch", "status": "RUNNING", "start_time": 2}]
    assert [j["submission_id"] for j in ours("run", listed)] == ["run-1"]
    assert [j["submission_id"] for j in ours(None, listed)] == ["run-1"]
    assert cluster_watch.watching(listed, "run-1") == listed[1]
    assert cluster_watch.watching([dict(listed[1], status="SUCCEEDED")], "run-1") is None
    assert cluster_watch.watching(None, "run-1") is None


def viewer(tmp_path, monkeypatch, fake: FakeQuarantine):
    from playbooks.config import paths
    from playbooks.runs import follow
    monkeypatch.setattr(paths, "here", lambda rel: tmp_path / rel)
    ctx, env = StepsContext(True), Env(30, "restart")
    f = follow.Follower(ctx, env, "run", "run-1", quarantine=restart.Quarantine(True, TWIN, fake), viewer=True)
    for e in start() + steps(1, 5, 27):
        f.line(f"(RayTrainWorker pid=1) trainer event: {json.dumps(e)}")
    now = [T0 + 31 + 60]  # a stall long since
    return ctx, env, f, follow.Watch(f, "http://127.0.0.1:8265", None, 1.0, clock=lambda: now[0])


def test_the_viewer_acts_on_nothing_writes_nothing_and_shows_what_the_watch_recorded(tmp_path, monkeypatch):
    fake = FakeQuarantine()
    ctx, env, f, w = viewer(tmp_path, monkeypatch, fake)
    w.tick()
    # The stall is the watch's to act on: nothing set aside, stopped, said or written here.
    assert fake.calls == [] and ctx.ran == [] and not f.stopped
    assert not [s for s in ctx.said if s.startswith("stalled")]
    assert timeline.read(env, "run") == []
    # What the watch in the cluster wrote, shown as it said it.
    timeline.append(env, "run", [
        ev(40, "stall_started", source="watch", job="run-1", line="stalled: no step since 12:00 (30 s; last step 5)",
           cause="chaos (tpu-group-1-0): SIGSTOP"),
        ev(41, "hang_diagnosed", source="watch", job="run-1", line="hang: host tpu-group-1-0 missing",
           culprits=["tpu-group-1-0"], evidence="hangs/x"),
        ev(42, "quarantined", source="watch", job="run-1", host="tpu-group-1-0", by="stall_action: restart",
           why="hang: host tpu-group-1-0 missing"),
        ev(43, "stall_ended", 9, source="watch", job="run-1", by="step", seconds=31.0),
        ev(44, "quarantined", source="watch", job="run-2", host="tpu-group-0-0", by="health gate", why="x"),
        ev(45, "stopped", source="train", job="run-1", by="someone else"),
    ])
    w.tick()
    assert "stalled: no step since 12:00 (30 s; last step 5)" in ctx.said
    assert "  why: chaos (tpu-group-1-0): SIGSTOP" in ctx.said
    assert "  hang: host tpu-group-1-0 missing (evidence: hangs/x)" in ctx.said
    assert ("watch in the cluster: host tpu-group-1-0 quarantined by stall_action: restart: hang: host "
            "tpu-group-1-0 missing") in ctx.said
    assert "stall ended: step 9 after 31 s without a step" in ctx.said
    # Another job's, or another source's, are not this watch's.
    assert f.quarantined == ["tpu-group-1-0"] and not f.stopped
    assert not [s for s in ctx.said if "tpu-group-0-0" in s or "someone else" in s]
    # Still nothing written by the viewer: the file holds the watch's six lines only.
    assert len(timeline.read(env, "run")) == 6


def test_a_stop_by_the_watch_is_the_viewers_outcome_too(tmp_path, monkeypatch):
    ctx, env, f, w = viewer(tmp_path, monkeypatch, FakeQuarantine())
    timeline.append(env, "run", [ev(40, "stopped", source="watch", job="run-1", by="stall_action: stop")])
    w.tick()
    assert f.stopped and "watch in the cluster: job run-1 stopped by stall_action: stop" in ctx.said


def test_a_failed_gate_is_the_failed_jobs_one_line_naming_the_host():
    gate = {"kind": "health_gate", "t": 1.0, "unhealthy": [
        {"slice": "tpu-group-0", "host": 0, "hostname": "m", "failed": ["devices"]}]}
    line = restart.gate_refusal([gate], simulated=True, elastic=False)
    assert line is not None and "\n" not in line
    assert "the health gate failed on host tpu-group-0-0 (devices)" in line
    assert "a job that is not elastic cannot go on" in line and "`invoke hosts.quarantine tpu-group-0-0`" in line
    assert "not elastic" not in (restart.gate_refusal([gate], simulated=True, elastic=True) or "")
    assert restart.gate_refusal([dict(gate, unhealthy=[])], simulated=True, elastic=False) is None
    assert restart.gate_refusal([], simulated=False, elastic=False) is None


def test_a_failed_health_gate_wakes_the_watch_at_once_not_at_its_next_beat(tmp_path, monkeypatch):
    import threading

    from playbooks.config import paths
    from playbooks.runs import follow
    monkeypatch.setattr(paths, "here", lambda rel: tmp_path / rel)
    ctx, env = StepsContext(True), Env(30, "restart")
    f = follow.Follower(ctx, env, "run", "run-1", quarantine=restart.Quarantine(True, TWIN, FakeQuarantine()))
    ticked = threading.Event()
    w = follow.Watch(f, "http://127.0.0.1:8265", None, 600.0)  # a beat every 10 minutes
    monkeypatch.setattr(w, "tick", ticked.set)
    with w:
        gate = ev(5, "health_gate", job="run-1", source="trainer", unhealthy=[{"slice": "tpu-group-1", "host": 0}])
        healthy = dict(gate, t=gate["t"] - 1, unhealthy=[])
        f.line(f"(RayTrainWorker pid=1) trainer event: {json.dumps(healthy)}")
        assert not ticked.wait(1.0)  # a gate that passed wakes nothing
        f.line(f"(RayTrainWorker pid=1) trainer event: {json.dumps(gate)}")
        assert ticked.wait(5.0)


def checked(t: float, slice_: str, rank: int, devices_ok: bool) -> dict:
    """A host's own health_checked event: its devices, and a collective that
    failed (the hosts' device counts differ: the all-gather cannot reshape)."""
    return ev(t, "health_checked", job="run-1", source="trainer", rank=rank, hostname="vm", slice=slice_, host="0",
              ok=False, checks={"devices": {"ok": devices_ok, "detail": f"devices {4 if devices_ok else 3} of 4"},
                                "collective": {"ok": False, "detail": "ValueError: cannot reshape array"}})


def test_a_host_that_names_itself_sick_is_set_aside_when_the_verdicts_could_not_be_gathered(tmp_path, monkeypatch):
    """The soak of 2026-12-04: a sick host (3 devices of 4) in a group with
    a whole one; the all-gather of the verdicts failed, rank 0 (whole)
    named nobody; only the sick host's own event names it."""
    from playbooks.config import paths
    from playbooks.runs import follow
    monkeypatch.setattr(paths, "here", lambda rel: tmp_path / rel)
    fake = FakeQuarantine()
    ctx, env = StepsContext(True), Env(30, "restart")
    f = follow.Follower(ctx, env, "run", "run-1", quarantine=restart.Quarantine(True, TWIN, fake))
    w = follow.Watch(f, "http://127.0.0.1:8265", None, 1.0)
    gate = ev(5.1, "health_gate", job="run-1", source="trainer", ok=False, unhealthy=[])
    for e in (checked(5, "tpu-group-0", 0, True), checked(5.2, "tpu-group-1", 1, False), gate):
        f.line(f"(RayTrainWorker pid=1) trainer event: {json.dumps(e)}")
    assert f.wake.is_set()
    w.gate()
    assert [c[0] for c in fake.calls] == ["tpu-group-1-0"] and fake.calls[0][2] == restart.BY_GATE
    assert "devices: devices 3 of 4" in fake.calls[0][1]
    # The next group's gate names it again (a gate before the set aside took hold): not set aside twice.
    again = ev(9, "health_gate", job="run-1", source="trainer", ok=False,
               unhealthy=[{"slice": "tpu-group-1", "host": "0", "rank": 1, "failed": ["devices"]}])
    f.line(f"(RayTrainWorker pid=1) trainer event: {json.dumps(again)}")
    w.gate()
    assert len(fake.calls) == 1
    assert [e["host"] for e in timeline.read(env, "run") if e["kind"] == "quarantined"] == ["tpu-group-1-0"]


def test_only_a_hosts_own_failed_check_names_it_never_a_failed_collective_alone():
    assert restart.failed_hosts(checked(1, "tpu-group-0", 0, True)) == []
    [sick] = restart.failed_hosts(checked(1, "tpu-group-1", 1, False))
    assert (sick["slice"], sick["rank"], sick["failed"]) == ("tpu-group-1", 1, ["devices: devices 3 of 4"])
    assert restart.failed_hosts({"kind": "health_gate", "unhealthy": [sick, "x"]}) == [sick]
    assert restart.failed_hosts({"kind": "step"}) == [] and restart.failed_hosts(None) == []
    line = restart.gate_refusal([checked(1, "tpu-group-0", 0, True), checked(1, "tpu-group-1", 1, False)],
                                simulated=True, elastic=False)
    assert line is not None and "host tpu-group-1-0 (devices: devices 3 of 4)" in line and "tpu-group-0-0" not in line


def test_a_sick_host_named_only_in_the_failed_jobs_message_is_the_one_line_too():
    """The soak of 2026-12-04: the sick rank 0 ended before its own events
    reached the driver's log; Ray's final message keeps its HostUnhealthy."""
    message = ("Job entrypoint command failed with exit code 1, last available logs (truncated to 20,000 chars):\n"
               "  raise HostUnhealthy(message(sick, coll))\n"
               "health_check.HostUnhealthy: health check failed, the worker group stops before MaxText: vm (slice "
               "tpu-group-0, worker 0, rank 0): devices: devices 3 of 4 (cpu) | the hosts' verdicts could not be "
               "gathered: ValueError: cannot reshape\n"
               "health_check.HostUnhealthy: health check failed, the worker group stops before MaxText: vm (slice "
               "tpu-group-1, worker 0, rank 1): \n")
    healthy = checked(1, "tpu-group-1", 1, True)
    line = restart.gate_refusal([healthy], simulated=True, elastic=False, message=message)
    assert line is not None and line.startswith("the health gate failed on host tpu-group-0-0 (devices: devices 3 of 4 "
                                                "(cpu)); a job that is not elastic")
    assert "tpu-group-1-0" not in line
    assert restart.gate_refusal([healthy], simulated=True, elastic=False, message="exit code 1: OOM") is None
    # On GKE a host is its pod's hostname.
    gke = message.replace("vm (slice tpu-group-0", "ray-worker-abc (slice v6e-16-0")
    assert "host ray-worker-abc (devices" in (restart.gate_refusal([], simulated=False, elastic=False, message=gke)
                                             or "")


# -- on GKE: the watch in the head pod -------------------------------------------------
class GkeEnv(Env):
    name, kind = "g", "gke"
    from playbooks.config.choices import PLATFORMS
    platform = PLATFORMS["gke"]


def test_on_gke_the_watch_ships_the_project_its_packages_at_the_locks_pins_and_says_it_is_in_the_head(monkeypatch):
    from playbooks.access.kube_api import IN_CLUSTER_ENV
    from playbooks.config import paths
    from playbooks.config.versions import pinned
    monkeypatch.setenv("INVOKE_PLAYBOOK_INVENTORY", str(paths.ROOT / "inv dir" / "my 'inv'.yaml"))
    argv = list(cluster_watch.submit_command(GkeEnv(30, "restart"), "http://localhost:8265", "run", "run-3",
                                             elastic=True).argv)
    assert argv[argv.index("--working-dir") + 1] == "."
    entry = argv[argv.index("--") + 1:]
    assert entry == ["python", "-m", "invoke", "watch", "--env=g", "--run=run", "--job=run-3", "--elastic"]
    assert shlex.split(shlex.join(entry)) == entry
    renv = json.loads(argv[argv.index("--runtime-env-json") + 1])
    assert renv["pip"]["packages"] == [f"invoke=={pinned('invoke')}", f"PyYAML=={pinned('PyYAML')}",
                                       f"kubernetes=={pinned('kubernetes')}"]
    assert all(pinned(p) for p in cluster_watch.PACKAGES)
    assert {".git", "tests", "docs", "bench"} <= set(renv["excludes"])
    ev_ = renv["env_vars"]
    assert ev_[IN_CLUSTER_ENV] == "1" and ev_[cluster_watch.DASHBOARD_ENV] == "http://127.0.0.1:8265"
    # The inventory as a path inside the folder shipped (the head's cwd).
    assert ev_["INVOKE_PLAYBOOK_INVENTORY"] == "inv dir/my 'inv'.yaml"
    monkeypatch.delenv("INVOKE_PLAYBOOK_INVENTORY")
    argv = cluster_watch.submit_command(GkeEnv(30, "restart"), "http://x", "run", "run-3", elastic=False).argv
    assert "INVOKE_PLAYBOOK_INVENTORY" not in " ".join(argv) and "--elastic" not in argv


def test_on_gke_an_inventory_outside_the_project_is_refused_in_one_line(monkeypatch, tmp_path):
    import pytest

    from playbooks.core.errors import InputError
    monkeypatch.setenv("INVOKE_PLAYBOOK_INVENTORY", str(tmp_path / "inv.yaml"))
    with pytest.raises(InputError) as e:
        cluster_watch.submit_command(GkeEnv(30, "restart"), "http://x", "run", "run-3", elastic=False)
    said = str(e.value)
    assert "\n" not in said and str(tmp_path / "inv.yaml") in said and "stall_watch: follow" in said
    # The twin's watch runs on this machine: any inventory path goes as it is.
    argv = cluster_watch.submit_command(Env(30, "restart"), "http://x", "run", "run-3", elastic=False).argv
    assert str(tmp_path / "inv.yaml") in " ".join(argv)


def quarantined_event(t: float = T0 + 50) -> dict:
    return ev(t - T0, "quarantined", source="watch", job="run-1", host="v6e-16-1", slice="v6e-16-1",
              why="failed its health checks: devices", by="health gate", nodes=["n-1-0", "n-1-1"])


@pytest.mark.usefixtures("here")  # the record of hosts set aside: the test's own
def test_the_head_writes_each_event_into_its_log_and_this_machine_takes_each_back_once(tmp_path, monkeypatch,
                                                                                       capsys):
    from playbooks.access.kube_api import IN_CLUSTER_ENV
    from playbooks.config import paths
    from playbooks.runs import quarantine_record as R
    from playbooks.runs import watch_records
    env = GkeEnv(30, "restart")
    head, here = tmp_path / "head", tmp_path / "here"
    monkeypatch.setattr(paths, "here", lambda rel: head / rel)
    monkeypatch.setenv(IN_CLUSTER_ENV, "1")
    written = [ev(1, "step", 1, job="run-1", source="trainer"), quarantined_event()]
    timeline.append(env, "run", written)
    log = "some line of the watch's own\n" + capsys.readouterr().out + "\x1b[0m(noise) not an event\n"
    assert len(timeline.read(env, "run")) == 2  # the head's own copy too
    monkeypatch.delenv(IN_CLUSTER_ENV)
    monkeypatch.setattr(paths, "here", lambda rel: here / rel)
    assert watch_records.import_text(env, log, ("run",)) == 2
    assert capsys.readouterr().out == ""  # this machine does not write them into any log
    assert timeline.read(env, "run") == written
    rec = R.read(env)["v6e-16-1"]
    assert rec["nodes"] == ["n-1-0", "n-1-1"] and rec["since"] == written[1]["t"] and "health gate" in rec["by"]
    # Read again: nothing comes in twice; a host released here is not set aside again by the same log.
    R.write(env, {})
    assert watch_records.import_text(env, log, ("run",)) == 0
    assert timeline.read(env, "run") == written and R.read(env) == {}
    # Another run's events are not this run's.
    assert watch_records.import_text(env, log, ("other",)) == 0


@pytest.mark.usefixtures("here")
def test_a_record_here_older_than_the_watchs_quarantine_is_replaced_a_newer_one_kept(tmp_path, monkeypatch):
    """The watch sets aside only a host it does not hold (a record here of
    it may be older: its pool made again since, new nodes)."""
    from playbooks.config import paths
    from playbooks.runs import quarantine_record as R
    from playbooks.runs import watch_records
    from playbooks.runs.timeline import MARK
    env = GkeEnv(30, "restart")
    monkeypatch.setattr(paths, "here", lambda rel: tmp_path / rel)
    e = quarantined_event()
    line = MARK + json.dumps({"run": "run", "event": e})
    older = R.entry("v6e-16-1", "vfio busy", "invoke hosts.quarantine", ["n-old-0"], since=e["t"] - 600)
    R.write(env, {"v6e-16-1": older})
    assert watch_records.import_text(env, line) == 1
    rec = R.read(env)["v6e-16-1"]
    assert (rec["nodes"], rec["why"], rec["since"]) == (["n-1-0", "n-1-1"], e["why"], e["t"])
    newer = dict(older, since=e["t"] + 1)
    R.write(env, {"v6e-16-1": newer})
    assert watch_records.import_text(env, MARK + json.dumps({"run": "run-b", "event": e})) == 1
    assert R.read(env) == {"v6e-16-1": newer}


def test_a_line_that_is_not_a_well_formed_event_of_a_valid_run_is_skipped(tmp_path, monkeypatch):
    from playbooks.config import paths
    from playbooks.runs import watch_records
    from playbooks.runs.timeline import MARK
    env = GkeEnv(30, "restart")
    monkeypatch.setattr(paths, "here", lambda rel: tmp_path / rel)
    bad = [MARK + "{not json", MARK + json.dumps({"run": "../../etc", "event": ev(1, "step", 1)}),
           MARK + json.dumps({"run": "run", "event": {"kind": "step"}}),  # no time
           MARK + json.dumps({"run": "run", "event": "x"}), MARK + json.dumps(["run"]),
           MARK + json.dumps({"run": "run", "event": dict(ev(1, "step", 1), t="soon")})]
    assert watch_records.import_text(env, "\n".join(bad)) == 0
    assert not (tmp_path / paths.training(env.name)).exists()
    good = MARK + json.dumps({"run": "run", "event": ev(1, "step", 1, job="run-1")})
    assert watch_records.import_text(env, "(prefix) " + good) == 1


class Looks:
    """A step context whose looks at the watch's job answer in turn."""

    def __init__(self, *answers):
        self.answers, self.looked, self.slept = list(answers), [], 0.0

    def look(self, fact, fresh=False):
        self.looked.append(fact.display)
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]

    def sleep(self, s):
        self.slept += s


def starting(env, *answers):
    from types import SimpleNamespace

    from playbooks.plays import train
    run = SimpleNamespace(job=SimpleNamespace(address="http://localhost:8265", env=env), via=None)
    ctx = Looks(*answers)
    return train.JobRun.watch_started(run, ctx, "run-3"), ctx


def test_the_job_is_submitted_only_once_its_watch_runs_and_never_after_a_watch_that_failed():
    got, ctx = starting(GkeEnv(30, "restart"), {"status": "PENDING"}, {"status": "PENDING"}, {"status": "RUNNING"})
    assert got is None and len(ctx.looked) == 3 and ctx.looked[0].endswith("/api/jobs/run-3-watch")
    failed = {"status": "FAILED", "message": "Failed to set up runtime environment.\npip install invoke==2.2.1: "
                                             "Could not find a version that satisfies the requirement"}
    got, _ = starting(GkeEnv(30, "restart"), {"status": "PENDING"}, failed)
    assert got is not None and got.outcome == "failed" and "\n" not in got.reason
    assert got.reason.startswith("the watch of job run-3 (run-3-watch) is FAILED before its job was submitted: "
                                 "Failed to set up runtime environment. pip install invoke==2.2.1")
    assert "no job was submitted" in got.reason and "must reach it" in got.reason and "stall_watch: follow" in got.reason
    got, ctx = starting(Env(30, "restart"), None)  # never listed: bounded
    assert got is not None and f"not RUNNING within {cluster_watch.START_WITHIN:.0f} s (it is not listed)" in got.reason
    assert ctx.slept >= cluster_watch.START_WITHIN and "PyPI" not in got.reason


def test_on_gke_the_watch_keeps_its_records_in_the_runs_bucket_where_a_restarted_head_finds_them(tmp_path):
    """The watch in a head pod is told to keep its state in the bucket as
    the head mounts it (the tutorial's gcsfuse volume), not in the
    working_dir Ray unpacks for each upload: a process started in another
    working_dir (a restarted head, a new upload of the code) with the same
    state folder reads the record of hosts set aside and the run's
    timeline that the first wrote."""
    import subprocess
    import sys

    from playbooks.cloud import manifests
    from playbooks.config import paths
    from tests.conftest import env as inventory_env

    renv = json.loads(cluster_watch.runtime_env(GkeEnv(30, "restart"), {}))
    assert renv["env_vars"][paths.STATE_ENV] == cluster_watch.HEAD_STATE
    assert cluster_watch.HEAD_STATE.startswith(cluster_watch.BUCKET_MOUNT + "/")
    for name in ("dev", "dev-autopilot"):
        e = inventory_env(name)
        head = manifests.head_pod_spec(next(d for d in manifests.raycluster_docs(e) if d["kind"] == "RayCluster"))
        mounts = {m["name"]: m["mountPath"] for m in head["containers"][0].get("volumeMounts") or []}
        bucket = [v["name"] for v in head.get("volumes") or []
                  if (v.get("csi") or {}).get("volumeAttributes", {}).get("bucketName") == e.gs_bucket]
        assert bucket and mounts[bucket[0]] == cluster_watch.BUCKET_MOUNT, (name, mounts)
    bucket_state = tmp_path / "bucket" / ".tpu-playbooks"
    write = ("from playbooks.runs import quarantine_record as R, timeline\n"
             "class E: name = 'g'\n"
             "R.write(E, {'v6e-16-1': R.entry('v6e-16-1', 'hang', 'the watch', ['n-1'], since=5.0)})\n"
             "timeline.append(E, 'run', [{'t': 1.0, 'kind': 'quarantined', 'host': 'v6e-16-1'}])\n")
    read = ("from playbooks.runs import quarantine_record as R, timeline\n"
            "class E: name = 'g'\n"
            "print(sorted(R.read(E)), [e['kind'] for e in timeline.read(E, 'run')])\n")
    env = {**os.environ, paths.STATE_ENV: str(bucket_state), "PYTHONPATH": str(paths.ROOT)}
    for code, cwd in ((write, tmp_path / "working_dir_1"), (read, tmp_path / "working_dir_2")):
        cwd.mkdir()
        p = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == "['v6e-16-1'] ['quarantined']", p.stdout
    assert (bucket_state / "g" / "quarantine.json").is_file()
