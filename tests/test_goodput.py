"""A run's timeline and what it costs: the goodput accounting on synthetic
timelines (every second given to one cause; replayed steps; two incidents;
a stall), the stall rule and its line, and the events read from real Ray
Train and Ray log lines."""
from __future__ import annotations

import itertools
import json
import time

import pytest

from playbooks.config.choices import PLATFORMS
from playbooks.runs import goodput, stall, timeline

T0 = 1_800_000_000.0


def ev(t: float, kind: str, step: int | None = None, **fields) -> dict:
    return {"t": T0 + t, "kind": kind, "step": step, "source": "test", "job": "run-1", **fields}


def steps(first: int, last: int, t: float, every: float = 1.0, seconds: float | None = None) -> list[dict]:
    """Steps first..last, one every ``every`` seconds, the first at ``t``."""
    return [ev(t + i * every, "step", s, seconds=seconds or every) for i, s in enumerate(range(first, last + 1))]


def start(t_group: float = 10.0, first_step_at: float = 26.0) -> list[dict]:
    """Submitted at 0, a worker group at 10, a compile 15-25, step 0 at 26 (14 s with its compile)."""
    return [ev(0, "submitted"), ev(t_group, "workers_started", workers=2), ev(12, "jax_initialized"),
            ev(15, "compile_started"), ev(25, "compile_ended", seconds=10.0),
            ev(first_step_at, "step", 0, seconds=14.0), ev(first_step_at, "first_step", 0)]


def adds_up(r: dict) -> float:
    return r["productive_s"] + sum(r["badput_s"].values())


def test_a_clean_run_each_second_has_one_cause_and_they_add_up():
    events = start() + steps(1, 9, 27) + [ev(31.5, "checkpoint_saved", 5, seconds=0.4), ev(37, "job_end",
                                                                                          status="SUCCEEDED")]
    r = goodput.account(events, "run")
    assert r["wall_s"] == 37.0 and not r["running"]
    assert r["badput_s"]["scheduling"] == 10.0
    assert r["badput_s"]["startup"] == 2.0  # the group at 10 until step 0 began (26 - 14)
    assert r["badput_s"]["compile"] == 10.0
    assert r["badput_s"]["checkpoint"] == pytest.approx(0.4)
    assert r["badput_s"]["other"] == 2.0  # after the last step until the job's end
    assert r["productive_s"] == pytest.approx(4.0 + 9 - 0.4)
    assert adds_up(r) == pytest.approx(r["wall_s"], abs=1e-6)
    assert r["steps"] == {"counted": 10, "replayed": 0} and r["incidents"] == []
    assert r["goodput_pct"] == pytest.approx(100 * r["productive_s"] / 37, abs=0.01)


def test_a_worker_group_starts_at_the_trainers_time_not_when_rays_line_is_read():
    events = [ev(0, "submitted"), ev(9, "jax_initialized"), ev(10, "workers_started", workers=2),
              *steps(0, 3, 20), ev(24, "job_end")]
    r = goodput.account(events, "run")
    assert r["badput_s"]["scheduling"] == 9.0 and r["badput_s"]["startup"] == 10.0


def incident(t: float, lost_by: str = "chaos", restored: int = 10, first: int = 11, upto: int = 20) -> list[dict]:
    """A worker lost at t; Ray Train's failure at t+5; a new group at t+20;
    restore t+25..t+26; compile t+27..t+37; step ``first`` at t+38 (12 s),
    then one step a second up to ``upto``."""
    return [ev(t, "worker_lost", by=lost_by, host="tpu-group-0-0"),
            ev(t + 5, "failure", decision="RETRY", n=1),
            ev(t + 20, "workers_restarted", workers=1),
            ev(t + 25, "restore_started", restored), ev(t + 26, "restored", restored, seconds=1.0),
            ev(t + 37, "compile_ended", seconds=10.0),
            ev(t + 38, "step", first, seconds=12.0), ev(t + 38, "first_step_after_restore", first,
                                                          restored_from=restored),
            *steps(first + 1, upto, t + 39)]


def test_one_incident_lost_at_restored_from_replayed_and_time_to_recover():
    events = start() + steps(1, 15, 27) + incident(42.5) + [ev(100, "job_end", status="SUCCEEDED")]
    r = goodput.account(events, "run")
    [i] = r["incidents"]
    assert (i["kind"], i["lost_at_step"], i["restored_from_step"], i["replayed_steps"]) == ("worker_lost", 15, 10, 5)
    assert i["recover_s"] == 38.0 and i["detect_s"] == 5.0 and "chaos" in i["by"]
    # Steps 11..15 ran twice: the second time is badput.
    assert r["steps"] == {"counted": 21, "replayed": 5}
    b = r["badput_s"]
    assert b["detection"] == 5.0  # the loss until Ray Train's failure
    assert b["restore"] == 1.0 and b["compile"] == 20.0
    # Lost work: the step in progress at the loss (step 15 ended at 41);
    # then steps 11..15 again: step 11's 12 s less its 10 s compile, 4 x 1 s.
    assert b["replayed"] == pytest.approx(1.5 + 2.0 + 4.0)
    assert adds_up(r) == pytest.approx(r["wall_s"], abs=1e-6)


def test_a_step_the_old_group_finishes_after_the_loss_is_where_it_was_lost_not_its_recovery():
    """The survivor logs the step it was in when its peer was killed (MaxText
    logs a step once the next one is dispatched): step 16, a second after the
    loss, is the old group's last work; the incident ends at the new group's
    first step, and 11..16 are replayed."""
    events = (start() + steps(1, 15, 27) + [ev(42.5, "worker_lost", by="chaos", host="tpu-group-0-0"),
                                            ev(43.5, "step", 16, seconds=1.0)]
              + incident(42.5)[1:] + [ev(100, "job_end", status="SUCCEEDED")])
    r = goodput.account(events, "run")
    [i] = r["incidents"]
    assert (i["kind"], i["lost_at_step"], i["restored_from_step"], i["replayed_steps"]) == ("worker_lost", 16, 10, 6)
    assert i["recover_s"] == 38.0 and i["detect_s"] == 5.0 and i["first_step"] == 11
    assert r["steps"] == {"counted": 21, "replayed": 6}  # 0..16, then 17..20 after 11..16 again
    assert adds_up(r) == pytest.approx(r["wall_s"], abs=1e-6)
    # Without a new group's events, a step at or below N is still the recovery.
    bare = (start() + steps(1, 15, 27) + [ev(42.5, "worker_lost", by="chaos"), ev(60, "step", 11, seconds=1.0),
                                          ev(70, "job_end")])
    [j] = goodput.account(bare, "run")["incidents"]
    assert (j["lost_at_step"], j["first_step"], j["recover_s"]) == (15, 11, 17.5)


def peer(events: list[dict], rank: int = 1, lag: float = 0.1) -> list[dict]:
    """What the first host of another slice says of the same steps, a little later."""
    return [dict(e, kind="peer_step", rank=rank, t=e["t"] + lag) for e in events if e["kind"] == "step"]


def test_a_step_only_a_peer_said_before_rank_0s_host_was_lost_is_where_it_was_lost():
    """Rank 0's host is killed before it logs step 16; the other slice's first
    host logs it (peer_step): lost at 16, 11..16 replayed. A step said by two
    hosts counts once; the new group's steps, said by both again, are replays
    of the old group's and count once each too."""
    old = start() + steps(1, 15, 27)
    events = (old + peer(old) + [ev(42.3, "peer_step", 16, seconds=1.0, rank=1)]
              + incident(42.5) + peer(incident(42.5)) + [ev(100, "job_end", status="SUCCEEDED")])
    r = goodput.account(events, "run")
    [i] = r["incidents"]
    assert (i["lost_at_step"], i["restored_from_step"], i["replayed_steps"], i["first_step"]) == (16, 10, 6, 11)
    assert i["recover_s"] == 38.0
    assert r["steps"] == {"counted": 21, "replayed": 6}
    assert adds_up(r) == pytest.approx(r["wall_s"], abs=1e-6)
    # The peer's step 16 after the loss (the survivor's last step): the same.
    late = old + peer(old) + [ev(43.0, "peer_step", 16, seconds=1.0, rank=1)] + incident(42.5)
    [j] = goodput.account(late + [ev(100, "job_end")], "run")["incidents"]
    assert (j["lost_at_step"], j["replayed_steps"], j["first_step"]) == (16, 6, 11)
    # `invoke train`'s summary says the same step: "resize 2 -> 1 workers after step 16".
    from playbooks.runs.train_summary import Summary
    for run in (events, late):
        s = Summary()
        for e in sorted(run, key=lambda e: e["t"]):
            s.add(e)
        assert s.resize_steps == [16] and 16 in s.done_steps and s.last_step == 20

    # Rank 0 says step 15 after its peer did and after the loss (its host lost
    # next): still the old group's, not the recovery.
    both = start() + steps(1, 14, 27) + [ev(41.2, "peer_step", 15, seconds=1.0, rank=1), ev(42.5, "worker_lost"),
                                         ev(42.6, "step", 15, seconds=1.0)] + incident(42.5)[1:]
    k = goodput.account(both + [ev(100, "job_end")], "run")
    assert [(x["lost_at_step"], x["first_step"]) for x in k["incidents"]] == [(15, 11)]
    assert k["steps"] == {"counted": 21, "replayed": 5}


def test_two_incidents_are_two_and_a_second_loss_before_recovering_is_the_same_one():
    events = (start() + steps(1, 15, 27) + incident(42.5, upto=25)
              + [ev(110, "resize", workers_from=1, workers=2, n=1), ev(112, "workers_restarted", workers=2, n=2),
                 ev(113, "failure", decision="RETRY", n=2), ev(120, "workers_restarted", workers=2, n=3),
                 ev(121, "restore_started", 20), ev(122, "restored", 20, seconds=1.0),
                 *steps(21, 30, 130), ev(145, "job_end", status="SUCCEEDED")])
    r = goodput.account(events, "run")
    first, second = r["incidents"]
    assert (first["lost_at_step"], first["restored_from_step"], first["replayed_steps"]) == (15, 10, 5)
    assert second["kind"] == "resize" and second["failures"] == 1
    assert (second["lost_at_step"], second["restored_from_step"], second["replayed_steps"]) == (25, 20, 5)
    assert second["recover_s"] == 20.0
    assert r["steps"]["replayed"] == 10
    assert adds_up(r) == pytest.approx(r["wall_s"], abs=1e-6)


def test_a_stall_is_its_own_badput_and_incident():
    events = start() + steps(1, 5, 27) + [
        ev(29.0, "worker_hung", by="chaos", host="tpu-group-1-0", cause="SIGSTOP"),
        ev(43.0, "stall_started", 5, since=T0 + 31.0), ev(71.0, "step", 6, seconds=40.0),
        ev(71.0, "stall_ended", 6, since=T0 + 31.0, seconds=40.0), *steps(7, 9, 72), ev(75, "job_end")]
    r = goodput.account(events, "run")
    [i] = r["incidents"]
    assert i["kind"] == "stall" and i["lost_at_step"] == 5 and i["replayed_steps"] == 0
    assert i["recover_s"] == 40.0 and "chaos (tpu-group-1-0)" in i["by"]
    assert r["badput_s"]["stall"] == 40.0
    assert adds_up(r) == pytest.approx(r["wall_s"], abs=1e-6)


def test_a_running_job_is_accounted_until_now_and_segments_tile_the_wall_time():
    events = start() + steps(1, 5, 27)
    r = goodput.account(events, "run", now=T0 + 40)
    assert r["running"] and r["wall_s"] == 40.0
    segs = goodput.segments(events, now=T0 + 40)
    assert segs[0][0] == T0 and segs[-1][1] == T0 + 40
    assert all(a[1] == b[0] for a, b in itertools.pairwise(segs))
    assert [s[2] for s in segs[:3]] == ["scheduling", "startup", "productive"]
    assert goodput.account([], "run")["wall_s"] == 0.0


def test_the_report_as_lines_and_json():
    events = start() + steps(1, 15, 27) + incident(42.5) + [ev(100, "job_end", status="SUCCEEDED")]
    r = goodput.account(events, "run")
    text = "\n".join(goodput.lines(r))
    assert "goodput of run run (job run-1)" in text
    assert "lost at step 15, restored from step 10, 5 steps replayed, recovered in 38.0 s" in text
    doc = json.loads(json.dumps(r))
    for k in ("run", "wall_s", "productive_s", "goodput_pct", "badput_s", "incidents"):
        assert k in doc
    assert set(doc["badput_s"]) == set(goodput.CAUSES)
    assert set(doc["incidents"][0]) >= {"kind", "lost_at_step", "restored_from_step", "replayed_steps", "recover_s"}
    # A resize before any step: said so, not "lost at step None".
    early = [ev(0, "submitted"), ev(10, "workers_started", workers=1), ev(12, "resize", workers_from=1, workers=2, n=1),
             ev(14, "workers_restarted", workers=2, n=2), *steps(0, 3, 30), ev(35, "job_end")]
    assert "resize (Ray Train resized the worker group 1 -> 2): before any step, no restore, 0 steps replayed, " \
           "recovered in 18.0 s" in "\n".join(goodput.lines(goodput.account(early, "run")))


# -- stalls -----------------------------------------------------------------------------
def test_a_stall_is_no_step_for_stall_after_and_the_line_says_it():
    events = start() + steps(1, 40, 27, every=2.0)  # p90 of the warm steps: 2 s
    last = T0 + 27 + 39 * 2
    assert stall.check(events, last + 599) is None  # default: max(10 x 2 s, 10 min)
    s = stall.check(events, last + 600)
    assert s is not None and s.last_step == 40 and s.p90 == 2.0
    since = time.strftime("%H:%M", time.localtime(last))
    assert s.line() == f"stalled: no step since {since} (10 min; last step 40; p90 step 2.0 s)"
    assert stall.check(events, last + 14, stall_after=15) is None
    assert stall.check(events, last + 15, stall_after=15) is not None
    # A job of 41 steps whose last is done saves and ends: no step is due.
    told = events + [ev(11, "jax_initialized", steps=41)]
    assert stall.check(told, last + 3600, stall_after=15) is None
    assert stall.check(told[:-3] + told[-1:], last + 3600, stall_after=15) is not None


def test_before_a_groups_first_step_the_compile_is_allowed_for_and_a_loss_starts_it_again():
    events = start()[:3]  # submitted, the group, jax initialized at 12
    assert stall.check(events, T0 + 12 + 15 + 599, stall_after=15) is None  # 15 s + the compile allowance
    assert stall.check(events, T0 + 12 + 15 + 600, stall_after=15) is not None
    running = start() + steps(1, 5, 27)
    lost = running + [ev(40, "worker_lost", by="chaos")]
    assert stall.check(running, T0 + 60, stall_after=15) is not None
    assert stall.check(lost, T0 + 60, stall_after=15) is None  # recovering, not hung
    assert stall.compile_allowance([ev(1, "compile_ended", seconds=400.0)]) == 1200.0


# -- the events of real log lines ---------------------------------------------------------------
RAY_LINES = """\
\x1b[36m(TrainController pid=12637)\x1b[0m Started training worker group of size 2:
\x1b[36m(RayTrainWorker pid=12785)\x1b[0m trainer event: {"t": 1796165880.5, "kind": "worker_started", "step": null, "rank": 0, "workers": 2, "slice": "tpu-group-0", "host": "0"}
\x1b[36m(RayTrainWorker pid=12785)\x1b[0m trainer event: {"t": 1796165930.25, "kind": "step", "step": 15, "seconds": 1.18}
\x1b[36m(RayTrainWorker pid=12786)\x1b[0m jax.errors.JaxRuntimeError: UNKNOWN: Gloo all-reduce failed: Connection reset by peer
(TrainController pid=12637) [FailurePolicy] RETRY
(TrainController pid=12637)   Source: worker group
(TrainController pid=12637)   Error count: 1 (max allowed: 3)
(TrainController pid=12637) Error: Training failed due to worker errors:
(TrainController pid=12637) [Rank 0 Error Snippet]:
(raylet) The node with node id: 0547ab5ee06571eb03a6f22c63b2e1b382a5728dc349381c3d1c60ce and address: 127.0.0.13 and node name: 127.0.0.13 has been marked dead because the detector has missed too many heartbeats from it. This can happen when a 	(1) raylet crashes unexpectedly (OOM, etc.)
(TrainController pid=12637) Detected ready resources for 1 workers in the cluster. Deciding to start/restart training with this worker group size.
(TrainController pid=12637) Started training worker group of size 1:
(TrainController pid=12637) Detected changes in the cluster resources. Deciding to resize the worker group from 1 -> 2 workers.
(TrainController pid=12637) Started training worker group of size 2:
(RayTrainWorker pid=1) trainer event: {"t": "not a time", "kind": "step"}
(RayTrainWorker pid=1) trainer event: {not json
"""


def test_ray_train_and_ray_lines_become_events_a_group_at_its_trainers_start_the_rest_when_read_live():
    clock = iter(range(100, 200)).__next__
    r = timeline.Reader("run-1", clock=lambda: float(clock()))
    out = [e for line in RAY_LINES.splitlines() for e in r.feed(line)] + r.end()
    kinds = [e["kind"] for e in out]
    assert kinds == ["workers_started", "worker_started", "step", "failure", "worker_lost", "workers_restarted",
                     "resize", "workers_restarted"]
    by = {e["kind"]: e for e in out}
    assert by["worker_started"]["t"] == 1796165880.5 and by["worker_started"]["source"] == "trainer"
    assert by["failure"]["decision"] == "RETRY" and by["failure"]["origin"] == "worker group"
    assert by["failure"]["error"] == "Training failed due to worker errors:" and by["failure"]["count"] == 1
    assert by["failure"]["step"] == 15  # the last step the log had shown
    assert by["worker_lost"]["by"] == "node" and "missed too many heartbeats" in by["worker_lost"]["cause"]
    assert by["resize"]["workers_from"] == 1 and by["resize"]["workers"] == 2
    assert [e["workers"] for e in out if e["kind"].startswith("workers_")] == [2, 1, 2]
    assert all(e["job"] == "run-1" for e in out)
    # The first group's line at its rank 0's start; read live (the trainer's
    # events within LIVE_S of the clock), the rest when read.
    assert (out[0]["t"], out[0]["t_from"]) == (1796165880.5, "trainer")
    assert {e["t_from"] for e in out[3:]} == {"read"} and by["failure"]["t"] < by["worker_lost"]["t"]


def test_a_log_read_again_from_its_start_adds_nothing_twice(tmp_path, monkeypatch):
    from playbooks.config import paths
    monkeypatch.setattr(paths, "here", lambda rel: tmp_path / rel)

    class Env:
        name = "e"

    w = timeline.Writer(Env(), "run", "run-1")
    for n in range(2):
        r = timeline.Reader("run-1", clock=lambda n=n: 1000.0 + n)
        for line in RAY_LINES.splitlines():
            w.add(r.feed(line))
        w.add(r.end())
        assert len(timeline.read(Env(), "run")) == 8
    # A stamp is the first reading's; what another process appends is read back.
    assert {e["t"] for e in timeline.read(Env(), "run") if e["source"] == "ray_train"
            and e["t_from"] == "read"} == {1000.0}
    timeline.append(Env(), "run", [timeline.event("worker_lost", "chaos", t=2000.0, job="run-1", by="chaos")])
    assert [e["kind"] for e in w.others()] == ["worker_lost"] and w.others() == []
    # Attached to the job that started at 1000: all of it is this job's. A
    # job of the same id submitted now (a new cluster) is another job.
    assert len(timeline.Writer(Env(), "run", "run-1", since=1000.0).events) == 9
    assert timeline.Writer(Env(), "run", "run-1").events == []
    assert len(timeline.Writer(Env(), "run", "run-2").events) == 9


# -- the pod watch (GKE): what lost a worker, in Kubernetes' words ------------------------------
def pod(name: str, uid: str = "u1", node: str | None = "gke-tpu-1", **status) -> dict:
    return {"metadata": {"name": name, "uid": uid, "labels": {"ray.io/node-type": "worker",
                                                                "ray.io/worker-group-replica-name": "tpu-group-x1"}},
            "spec": {"nodeName": node},
            "status": {"phase": "Running", "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-12-01T10:00:00Z"}], **status}}


def test_the_pod_watch_says_a_pod_scheduled_and_what_lost_one():
    from playbooks.runs import pod_watch
    a, b, c = pod("w-a"), pod("w-b", "u2"), pod("w-c", "u3", node=None, phase="Pending")
    assert pod_watch.pod_changes({}, {"w-a": a}, [], 5.0)[0]["kind"] == "scheduled"  # a first look sees it placed
    # Spot: the kubelet shut the node down (GKE's graceful node shutdown).
    shut = pod("w-a", deletionTimestamp="2026-12-01T10:05:00Z", reason="Terminated",
               message="Pod was terminated in response to imminent node shutdown.")
    shut["status"]["conditions"].append({"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet",
                                         "message": "Pod was terminated in response to imminent node shutdown.",
                                         "lastTransitionTime": "2026-12-01T10:04:59Z"})
    [lost] = pod_watch.pod_changes({"w-a": a}, {"w-a": shut}, [], 100.0, capacity="spot")
    assert (lost["kind"], lost["by"], lost["pod"], lost["slice"]) == ("worker_lost", "preemption", "w-a", "tpu-group-x1")
    assert "TerminationByKubelet" in lost["cause"] and lost["t"] == 1796119499.0
    assert pod_watch.pod_changes({"w-a": a}, {"w-a": shut}, [], 100.0)[0]["by"] == "maintenance"  # on-demand
    assert pod_watch.pod_changes({"w-a": shut}, {"w-a": shut}, [], 101.0) == []  # said once
    # A container that failed; a pod gone with its node; a new pod scheduled.
    oom = pod("w-b", "u2", phase="Failed", containerStatuses=[
        {"name": "ray-worker", "restartCount": 0, "state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}])
    [failed] = pod_watch.pod_changes({"w-b": b}, {"w-b": oom}, [], 100.0)
    assert failed["by"] == "pod failed" and failed["cause"] == "container ray-worker OOMKilled (exit code 137)"
    gone = pod_watch.pod_changes({"w-b": b}, {}, [{"involvedObject": {"name": "w-b"}, "type": "Warning",
                                             "reason": "NodeNotReady", "message": "Node is not ready"}], 100.0)
    assert [(e["by"], e["cause"]) for e in gone] == [("node gone", "NodeNotReady: Node is not ready")]
    assert pod_watch.pod_changes({"w-b": b}, {}, [], 100.0)[0]["by"] == "deleted"
    placed = pod("w-c", "u3", node="gke-tpu-2")
    [s] = pod_watch.pod_changes({"w-c": c}, {"w-c": placed}, [], 100.0)
    assert (s["kind"], s["node"], s["slice"]) == ("scheduled", "gke-tpu-2", "tpu-group-x1")


def test_a_scheduled_pod_carries_its_nodes_pool_each_node_read_once_none_where_it_cannot_be_read():
    """The node pool of a scheduled pod's node (GKE's label), from one read
    of the node per node name; a node that is gone or could not be read
    gives no pool, never a guess, and is not read again."""
    from playbooks.cloud import pods as P
    from playbooks.core.errors import ProbeFailed
    from playbooks.core.facts import ABSENT
    from playbooks.runs import pod_watch
    reads: list[str] = []

    def read(node: str):
        reads.append(node)
        if node == "gke-broken":
            raise ProbeFailed("kubectl", f"kubectl get node {node}", 1, "", "Unable to connect to the server",
                              why="could not look (exit code 1): Unable to connect to the server")
        if node == "gke-gone":
            return ABSENT
        return {"metadata": {"name": node, "labels": {P.NODEPOOL_LABEL: "v6e-16-1"}}}

    notes: list[str] = []
    pools = pod_watch.NodePools(read, notes.append)
    [a] = pod_watch.pod_changes({}, {"w-a": pod("w-a")}, [], 5.0, pools=pools)
    assert (a["kind"], a["slice"], a["node"], a["pool"]) == ("scheduled", "tpu-group-x1", "gke-tpu-1", "v6e-16-1")
    [b] = pod_watch.pod_changes({}, {"w-b": pod("w-b", "u2")}, [], 6.0, pools=pools)
    assert b["pool"] == "v6e-16-1" and reads == ["gke-tpu-1"]  # the same node: not read again
    for node in ("gke-broken", "gke-gone"):
        for _ in range(2):
            [c] = pod_watch.pod_changes({}, {"w-c": pod("w-c", "u3", node=node)}, [], 7.0, pools=pools)
            assert "pool" not in c and c["node"] == node
    assert reads == ["gke-tpu-1", "gke-broken", "gke-gone"]
    assert len(notes) == 1 and "node gke-broken's pool not read" in notes[0] and "Unable to connect" in notes[0]
    assert "pool" not in pod_watch.pod_changes({}, {"w-a": pod("w-a")}, [], 5.0)[0]  # no reader: no pool


def test_the_node_read_is_one_kubectl_get_of_the_node_that_tells_absent_from_could_not_look(monkeypatch):
    from playbooks.access import connectors, kube_api
    from playbooks.cloud import kube_objects
    from playbooks.cloud import pods as P
    from playbooks.core.connector import Ran
    from playbooks.core.errors import PlaybookError
    from playbooks.core.facts import ABSENT
    from tests.conftest import env
    e = env("dev")
    argv = P.node_command(e, "gke-n-1").argv
    g = kube_api.parse_get(list(argv))  # the connector's client shortcut answers it (no process)
    assert g is not None and g.refs == [("node", "gke-n-1")] and g.ignore_not_found
    answers = {"": Ran(0, "", "", 0.1), "{": Ran(0, json.dumps({"metadata": {"name": "gke-n-1"}}), "", 0.1),
               "x": Ran(1, "", "Unable to connect to the server", 0.1)}

    class Via:
        def __init__(self, r):
            self.r = r

        def run(self, argv, timeout=None):
            assert list(argv) == list(P.node_command(e, "gke-n-1").argv)
            return self.r

    for k, r in answers.items():
        monkeypatch.setattr(connectors, "connector", lambda _env, r=r: Via(r))
        if k == "x":
            with pytest.raises(PlaybookError, match=r"could not look .*Unable to connect to the server"):
                kube_objects.node(e, "gke-n-1")
        else:
            got = kube_objects.node(e, "gke-n-1")
            assert (got is ABSENT) if k == "" else got["metadata"]["name"] == "gke-n-1"


def test_the_watchs_first_look_records_the_pods_already_placed_with_their_pools_of_no_job(tmp_path, monkeypatch):
    """The pods placed before the watch began: where each slice is (its
    pool), at the time it was placed, of no job (a follow again adds none
    twice); later looks: the job's, each new node read once."""
    from playbooks.cloud import kube_objects
    from playbooks.cloud import pods as P
    from playbooks.config import paths
    from playbooks.runs import follow
    monkeypatch.setattr(paths, "here", lambda rel: tmp_path / rel)
    env = WatchedEnv(30, "report")
    env.capacity = "on-demand"
    looks = [[pod("w-a", node="gke-p0-0"), pod("w-b", "u2", node="gke-p1-0")]]
    reads: list[str] = []

    def node(_env, name):
        reads.append(name)
        return {"metadata": {"name": name, "labels": {P.NODEPOOL_LABEL: name[4:6]}}}

    monkeypatch.setattr(kube_objects, "pods_and_events", lambda _env: (looks[-1], []))
    monkeypatch.setattr(kube_objects, "node", node)
    for _ in range(2):  # a follow, then a follow again of the same job
        f = follow.Follower(FakeContext(), env, "run", "run-1", job={"start_time": T0 * 1000})
        w = follow.Watch(f, "http://127.0.0.1:8265", None, 1.0, clock=lambda: T0 + 50)
        w.pods()
        w.pods()
    sched = [e for e in timeline.read(env, "run") if e["kind"] == "scheduled"]
    assert [(e["pod"], e["pool"], e.get("job")) for e in sched] == [("w-a", "p0", None), ("w-b", "p1", None)]
    assert sched[0]["t"] == 1796119200.0  # when it was placed (its PodScheduled condition)
    looks.append([pod("w-a", node="gke-p0-0"), pod("w-c", "u3", node="gke-p1-1")])
    w.pods()
    [new] = [e for e in timeline.read(env, "run") if e["kind"] == "scheduled" and e["pod"] == "w-c"]
    assert (new["pool"], new["job"]) == ("p1", "run-1")
    assert reads == ["gke-p0-0", "gke-p1-0", "gke-p0-0", "gke-p1-0", "gke-p1-1"]  # once per node, per watch


# -- the watch beside a followed job ------------------------------------------------------------
class FakeContext:
    """What a follower asks of its step: the mode, a look at the job, a
    command run, lines said."""

    acting = True

    def __init__(self, status: str = "RUNNING"):
        self.said: list[str] = []
        self.writes: list[str] = []
        self.ran: list[str] = []
        self.status = status

    def echo(self, line: str) -> None:
        self.writes.append(line)
        self.said.extend(line.split("\n"))  # one write may hold lines that belong together

    def note(self, text: str) -> None:
        self.said.append(f"note {text}")

    def peek(self, fact) -> dict:
        return {"status": self.status, "start_time": (T0 - 100) * 1000}

    def act(self, command) -> None:
        self.ran.append(command.line())


class WatchedEnv:
    name, kind, ray_ip, dashboard_port, tpu = "e", "local", "127.0.0.1", 8265, "v6e"
    platform = PLATFORMS["local"]  # what Environment.platform gives for its kind

    def __init__(self, stall_after: int | None, stall_action: str):
        self.stall_after, self.stall_action = stall_after, stall_action


@pytest.mark.parametrize("action", ["report", "stop"])
def test_a_stalled_job_is_said_once_with_its_cause_and_stopped_when_asked(tmp_path, monkeypatch, action):
    from playbooks.config import paths
    from playbooks.runs import follow
    monkeypatch.setattr(paths, "here", lambda rel: tmp_path / rel)
    ctx, env = FakeContext(), WatchedEnv(30, action)
    f = follow.Follower(ctx, env, "run", "run-1")
    lines = [f"(RayTrainWorker pid=1) trainer event: {json.dumps(e)}"
             for e in start() + steps(1, 5, 27)]
    for line in lines:
        f.line(line)
    timeline.append(env, "run", [ev(32, "worker_hung", by="chaos", host="tpu-group-1-0",
                                    cause="SIGSTOP of its training worker, pid 7 (chaos.hang-worker)")])
    now = [T0 + 40.0]
    w = follow.Watch(f, "http://127.0.0.1:8265", None, 1.0, clock=lambda: now[0])
    w.tick()
    assert not [s for s in ctx.said if s.startswith("stalled")]  # 9 s without a step: not yet
    now[0] = T0 + 31 + 30
    w.tick()
    w.tick()
    stalled = [s for s in ctx.said if s.startswith("stalled")]
    assert len(stalled) == 1 and stalled[0].endswith("(30 s; last step 5; p90 step 1.0 s)")
    assert "  why: chaos (tpu-group-1-0): SIGSTOP of its training worker, pid 7 (chaos.hang-worker)" in ctx.said
    assert next(w for w in ctx.writes if w.startswith("stalled")).endswith(
        "\n  why: chaos (tpu-group-1-0): SIGSTOP of its training worker, pid 7 (chaos.hang-worker)")  # one write
    assert ctx.ran == (["ray job stop --address http://127.0.0.1:8265 run-1"] if action == "stop" else [])
    assert f.stopped == (action == "stop")
    f.line(f"(RayTrainWorker pid=1) trainer event: {json.dumps(ev(70, 'step', 6, seconds=39.0))}")
    assert ctx.said[-1] == "stall ended: step 6 after 39 s without a step"
    kinds = [e["kind"] for e in timeline.read(env, "run")]
    assert kinds.count("stall_started") == 1 and kinds.count("stall_ended") == 1
    assert ("stopped" in kinds) == (action == "stop") and "submitted" in kinds


def test_a_job_that_is_not_running_is_not_stalled(tmp_path, monkeypatch):
    from playbooks.config import paths
    from playbooks.runs import follow
    monkeypatch.setattr(paths, "here", lambda rel: tmp_path / rel)
    ctx, env = FakeContext(status="PENDING"), WatchedEnv(30, "stop")
    f = follow.Follower(ctx, env, "run", "run-1")
    for e in start():
        f.line(f"trainer event: {json.dumps(e)}")
    follow.Watch(f, "http://127.0.0.1:8265", None, 1.0, clock=lambda: T0 + 10_000).tick()
    assert ctx.said == [] and ctx.ran == []


def test_status_says_a_running_job_is_stalled_from_its_log_and_its_chaos(tmp_path, monkeypatch):
    """`invoke status` reads the job's log (the trainer's events carry their
    time; Ray's lines, stamped when read, do not count) and what the chaos
    tasks recorded in the run's timeline."""
    from playbooks.cli import status
    from playbooks.config import paths
    from playbooks.core.facts import Completed
    monkeypatch.setattr(paths, "here", lambda rel: tmp_path / rel)
    now = time.time()

    def log(events: list[dict]) -> Completed:
        text = "\n".join(["(TrainController pid=9) Started training worker group of size 2:"]
                         + [f"(RayTrainWorker pid=1) trainer event: {json.dumps(dict(e, t=now - 100 + e['t'] - T0))}"
                            for e in events])
        return Completed("ray job logs ...", 0, text, "")

    env = WatchedEnv(30, "report")
    fact = status.stall_fact(env, "run-1")
    line = fact.parse(log(start() + steps(1, 5, 27)))  # the last step 100 - 31 = 69 s ago
    assert line.startswith("stalled: no step since ") and line.endswith("(1 min; last step 5; p90 step 1.0 s)")
    assert fact.parse(log(start() + steps(1, 5, 27) + [ev(95, "step", 6, seconds=1.0)])) == ""
    # A worker lost (recorded by chaos) 10 s ago: the job is recovering, not stalled.
    timeline.append(env, "run", [timeline.event("worker_lost", "chaos", t=now - 10, job="run-1", by="chaos")])
    assert fact.parse(log(start() + steps(1, 5, 27))) == ""
    with pytest.raises(Exception, match="could not read it"):
        fact.parse(Completed("ray job logs ...", 1, "", "RuntimeError: no such job"))


def test_a_short_stall_after_is_looked_for_often_enough_to_see_a_10s_hang(tmp_path, monkeypatch):
    """stall_after: 5 and a worker frozen 10 s: the watch looks every fifth
    of stall_after (1 s), not every 30 s heartbeat, so it sees the stall
    before the steps come again (the soak's hung-resumed missed it at 30 s)."""
    from playbooks.config import paths
    from playbooks.runs import follow, stall
    assert (stall.look_every(30, None), stall.look_every(30, 600), stall.look_every(30, 60),
            stall.look_every(30, 5)) == (30, 30, 12, 1.0)
    monkeypatch.setattr(paths, "here", lambda rel: tmp_path / rel)
    ctx, env = FakeContext(), WatchedEnv(5, "report")
    f = follow.Follower(ctx, env, "run", "run-1")
    for e in start() + steps(1, 5, 27):
        f.line(f"(RayTrainWorker pid=1) trainer event: {json.dumps(e)}")
    now = [T0 + 31.0]  # the last step; frozen until 41
    w = follow.Watch(f, "http://127.0.0.1:8265", None, stall.look_every(30, env.stall_after), clock=lambda: now[0])
    while now[0] < T0 + 41.0:
        w.tick()
        now[0] += w.interval
    assert [s for s in ctx.said if s.startswith("stalled")], ctx.said
    # Looked at every heartbeat (30 s), the same hang is missed: no look falls inside it.
    ctx2 = FakeContext()
    f2 = follow.Follower(ctx2, env, "run2", "run2-1")
    for e in start() + steps(1, 5, 27):
        f2.line(f"(RayTrainWorker pid=1) trainer event: {json.dumps(e)}")
    now[0] = T0 + 31.0
    w2 = follow.Watch(f2, "http://127.0.0.1:8265", None, 30.0, clock=lambda: now[0])
    w2.tick()
    now[0] += 30.0
    for n, t in enumerate(range(41, 61), start=6):  # the steps again from 41, one a second
        f2.line(f"(RayTrainWorker pid=1) trainer event: {json.dumps(ev(t, 'step', n, seconds=1.0))}")
    w2.tick()
    assert not [s for s in ctx2.said if s.startswith("stalled")]


def test_a_loss_after_a_notice_says_the_notice_and_its_save():
    """A host given a notice (trainer/notice.py's notice_received): the
    incident of the loss it announced says so, the save at step 16 is where
    the next group resumes: no step replayed."""
    events = start() + steps(1, 15, 27) + [
        ev(42.2, "notice_received", 15, ranks=[1], grace_s=14.1, save_asked=True),
        ev(43.0, "step", 16, seconds=1.0), ev(43.5, "checkpoint_saved", 16, seconds=0.3),
        ev(45, "failure", 16, decision="RETRY"), ev(60, "workers_restarted", workers=1),
        ev(62, "restore_started", 16), ev(63, "restored", 16, seconds=1.0), *steps(17, 20, 70),
        ev(75, "job_end", status="SUCCEEDED")]
    r = goodput.account(events, "run")
    [i] = r["incidents"]
    assert (i["lost_at_step"], i["restored_from_step"], i["replayed_steps"]) == (16, 16, 0)
    assert i["notice"] == "a notice to go, 14 s ahead (ranks 1); its save asked at step 15"
    assert "      after a notice to go, 14 s ahead (ranks 1); its save asked at step 15" in goodput.lines(r)
    # A loss with no notice before it says none.
    plain = goodput.account(start() + steps(1, 15, 27) + incident(42.5) + [ev(100, "job_end")], "run")
    assert "notice" not in plain["incidents"][0]
