"""A stalled job's evidence, gathered against the loopback fake Ray
dashboard (tests/fakes/ray_dashboard.py: the State API's actors and
/worker/traceback as Ray 2.60 answers them), through this machine's
connector: the workers listed, each stack read within its timeout (one that
does not answer is evidence), kept under the run's folder, and the follow's
watch naming the hang once per stall."""
import json
from pathlib import Path

import pytest

from playbooks.access import connectors, worker_stacks
from playbooks.access.worker_stacks import WorkerProc, actors_url, list_workers, read_stack, said
from playbooks.config import paths
from playbooks.runs import events as E
from playbooks.runs import hang_diagnosis as H
from playbooks.runs import hang_evidence, timeline
from tests.fakes.ray_dashboard import FakeDashboard
from tests.test_goodput import T0, FakeContext, WatchedEnv, start, steps
from tests.test_hang_diagnosis import stack

NODES = [f"{i:056x}" for i in range(1, 5)]


@pytest.fixture
def dash():
    d = FakeDashboard(lambda: []).start()
    yield d
    d.stop()


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "here", lambda rel: tmp_path / rel)
    return tmp_path


def address(d: FakeDashboard) -> str:
    return f"http://127.0.0.1:{d.port}"


def beat(rank: int, t: float, step: int = 5) -> dict:
    return {"t": t, "kind": E.HEARTBEAT, "step": step, "rank": rank, "every": 2.0, "slice": f"tpu-group-{rank // 2}",
            "host": str(rank % 2), "hostname": "box", "pid": 4000 + rank, "node_id": NODES[rank]}


def four_workers(d: FakeDashboard, frozen: float | str = 3.0) -> None:
    """Ranks 0, 1, 3 wait in a collective; rank 2's dump does not return
    within the timeout (``frozen`` seconds), or answers ``frozen``."""
    for r in range(4):
        d.add_worker(NODES[r], 4000 + r, frozen if r == 2 else stack("blocked"))
    d.add_worker(NODES[0], 3999, stack("blocked"), class_name="TrainController")  # not a training worker
    d.add_worker(NODES[2], 3998, stack("blocked"), state="DEAD")                  # a worker of a group gone


def test_the_workers_are_the_alive_training_workers_filtered_by_ray(dash):
    four_workers(dash)
    via = connectors.this_machine()
    ws = list_workers(address(dash), via)
    assert [(w.node_id, w.pid) for w in ws] == [(NODES[r], 4000 + r) for r in range(4)]
    [req] = [r for r in dash.server.since() if r.path == "/api/v0/actors"]
    assert req.query_all["filter_keys"] == ["class_name", "state"]
    assert req.query_all["filter_values"] == ["RayTrainWorker", "ALIVE"]
    assert actors_url("http://h:1").startswith("http://h:1/api/v0/actors?filter_keys=class_name&filter_predicates=%3D")


def test_a_stack_read_is_its_text_no_answer_or_why_not(dash, monkeypatch):
    four_workers(dash)
    via, a = connectors.this_machine(), address(dash)
    assert read_stack(a, via, WorkerProc(NODES[0], 4000)).text == stack("blocked")
    monkeypatch.setattr(worker_stacks, "STACK_TIMEOUT", 0.5)
    r = read_stack(a, via, WorkerProc(NODES[2], 4002))
    assert (r.text, r.no_answer, r.unread) == (None, True, None)
    # py-spy's own failure: its stderr's first line, not Ray's "Failed to execute" wrapper.
    r = read_stack(a, via, WorkerProc(NODES[1], 9999))
    assert r.unread == "HTTP 500: Error: Failed to find python version from target process"
    dash.profiling = False
    r = read_stack(a, via, WorkerProc(NODES[0], 4000))
    assert not r.no_answer and r.unread is not None and "RAY_DASHBOARD_ENABLE_PROFILING=1" in r.unread
    assert said("boom\nmore") == "boom"


def test_the_evidence_is_kept_under_the_runs_folder_and_names_the_frozen_host(dash, here, monkeypatch):
    monkeypatch.setattr(worker_stacks, "STACK_TIMEOUT", 0.5)
    four_workers(dash)
    now = T0 + 100
    beats = [beat(0, now - 1, 6), beat(1, now - 1, 6), beat(2, now - 40, 5), beat(3, now - 1, 6)]
    found = hang_evidence.collect(WatchedEnv(5, "report"), "run", address(dash), connectors.this_machine(), beats,
                                  now)
    d = found.diagnosis
    assert (d.cause, d.culprits) == (H.MISSING, ("tpu-group-1-0",))
    assert d.line.startswith("hang: host tpu-group-1-0 (slice tpu-group-1) missing from the collective the other 3 "
                             "wait in (its heartbeat stopped ")
    folder = here / paths.hang_dir("e", "run", found.folder.rpartition("/")[2])
    assert sorted(p.name for p in folder.iterdir()) == ["evidence.json", "tpu-group-0-0.txt", "tpu-group-0-1.txt",
                                                        "tpu-group-1-1.txt"]
    assert (folder / "tpu-group-0-0.txt").read_text() == stack("blocked")
    record = json.loads((folder / "evidence.json").read_text())
    assert record["culprits"] == ["tpu-group-1-0"] and record["cause"] == H.MISSING
    [w2] = [w for w in record["workers"] if w["rank"] == 2]
    assert (w2["no_answer"], w2["stack_read"], w2["step"]) == (True, False, 5)


def test_a_dashboard_that_cannot_list_the_workers_leaves_the_heartbeats_to_decide(dash, here):
    dash.server.fail("GET", r"^/api/v0/actors$", 500, {"result": False, "msg": "GCS unavailable"})
    now = T0 + 100
    beats = [beat(0, now - 1, 6), beat(1, now - 40, 5)]
    found = hang_evidence.collect(WatchedEnv(5, "report"), "run", address(dash), connectors.this_machine(), beats,
                                  now)
    assert (found.diagnosis.cause, found.diagnosis.culprits) == (H.MISSING, ("tpu-group-0-1",))
    record = json.loads((Path(found.folder) / "evidence.json").read_text())  # under tmp_path: shown absolute
    assert all(w["unread"].startswith("workers not listed: ") for w in record["workers"])


def test_the_watch_names_the_hang_once_per_stall_before_it_stops_the_job(dash, here, monkeypatch):
    """A stall seen by the follow's watch: the heartbeats of the followed
    log (kept out of the timeline) and the stacks, one line said, one
    ``hang_diagnosed`` event, before `ray job stop`."""
    from playbooks.runs import follow
    monkeypatch.setattr(worker_stacks, "STACK_TIMEOUT", 0.5)
    four_workers(dash)
    ctx, env = FakeContext(), WatchedEnv(30, "stop")
    f = follow.Follower(ctx, env, "run", "run-1")
    group = [dict(e, workers=4) if e["kind"] == "workers_started" else e for e in start()]
    for e in group + steps(1, 5, 27) + [dict(beat(r, T0 + 28 + (r != 2) * 30), job="run-1") for r in range(4)]:
        f.line(f"(RayTrainWorker pid=1) trainer event: {json.dumps(e)}")
    assert not [e for e in timeline.read(env, "run") if e["kind"] == E.HEARTBEAT]
    now = [T0 + 31 + 30]
    w = follow.Watch(f, address(dash), connectors.this_machine(), 1.0, clock=lambda: now[0])
    w.tick()
    w.tick()
    [line] = [s for s in ctx.said if s.startswith("  hang: ")]
    assert line.startswith("  hang: host tpu-group-1-0 (slice tpu-group-1) missing from the collective the other 3 "
                           "wait in"), ctx.said
    assert ctx.said.index(line) < len(ctx.said) - 1 and ctx.ran == ["ray job stop --address "
                                                                       f"{address(dash)} run-1"]
    [d] = [e for e in timeline.read(env, "run") if e["kind"] == E.HANG_DIAGNOSED]
    assert (d["cause"], d["culprits"], d["job"]) == (H.MISSING, ["tpu-group-1-0"], "run-1")
    kinds = [e["kind"] for e in timeline.read(env, "run")]
    assert kinds.index(E.HANG_DIAGNOSED) < kinds.index(E.STOPPED)
    # Once per stall: more looks while it lasts read no stack again.
    reads = len([r for r in dash.server.since() if r.path == "/worker/traceback"])
    w.tick()
    assert len([r for r in dash.server.since() if r.path == "/worker/traceback"]) == reads == 4


# -- where the diagnosis is shown ------------------------------------------------------------
HANG = "hang: host tpu-group-1-0 (slice tpu-group-1) missing from the collective the other 3 wait in"


def test_goodput_shows_the_stalls_hang_under_its_incident():
    from playbooks.runs import goodput
    from tests.test_goodput import ev
    events = start() + steps(1, 5, 27) + [
        ev(43.0, "stall_started", 5, since=T0 + 31.0), ev(44.0, E.HANG_DIAGNOSED, 5, cause=H.MISSING, line=HANG),
        ev(71.0, "step", 6, seconds=40.0), ev(71.0, "stall_ended", 6, since=T0 + 31.0, seconds=40.0),
        ev(75, "job_end")]
    r = goodput.account(events, "run")
    [i] = r["incidents"]
    assert i["hang"] == HANG
    text = goodput.lines(r)
    assert text[text.index(next(t for t in text if " stall (" in t)) + 1] == f"      {HANG}"
    # A diagnosis outside any stall is no stall's.
    late = [e for e in events if e["kind"] != E.HANG_DIAGNOSED] + [ev(74.0, E.HANG_DIAGNOSED, 9, line=HANG)]
    assert "hang" not in goodput.account(late, "run")["incidents"][0]


def test_status_says_the_stalls_hang_the_follower_named(here):
    import time

    from playbooks.cli import status
    from playbooks.core.facts import Completed
    now = time.time()
    env = WatchedEnv(30, "report")
    shifted = [dict(e, t=now - 100 + e["t"] - T0) for e in start() + steps(1, 5, 27)]
    log = Completed("ray job logs ...", 0, "\n".join(f"(RayTrainWorker pid=1) trainer event: {json.dumps(e)}"
                                                     for e in shifted), "")
    fact = status.stall_fact(env, "run-1")
    assert "hang:" not in fact.parse(log)
    timeline.append(env, "run", [timeline.event(E.HANG_DIAGNOSED, "train", 5, t=now - 200, job="run-1",
                                                line="hang: an older stall's")])
    assert "hang:" not in fact.parse(log)  # before this stall began: another stall's
    timeline.append(env, "run", [timeline.event(E.HANG_DIAGNOSED, "train", 5, t=now - 20, job="run-1", line=HANG)])
    line = fact.parse(log)
    assert line.startswith("stalled: no step since ") and line.endswith(f"; {HANG}")
