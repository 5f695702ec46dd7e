"""The soak's judgement (bench/soak_checks.py): each scenario's "did the
fault happen as described" and each pass criterion, fed a good run and then
bad ones: every criterion fails on the run it is there to catch."""
from __future__ import annotations

import copy

import pytest

from bench import soak_checks as S

T0 = 1_800_000_000.0


def ev(t: float, kind: str, **f) -> dict:
    return {"t": T0 + t, "kind": kind, "step": f.pop("step", None), "source": f.pop("source", "trainer"), **f}


def started(t: float, rank: int, slice_: int, workers: int = 2) -> dict:
    return ev(t, "worker_started", rank=rank, workers=workers, slice=f"tpu-group-{slice_}", host="0", job="j-1")


SAVED = {"known": True, "due": 5, "finalized": 5, "missing": [], "line": "saves: 5 of 5 finalized"}


def back_20s_run() -> tuple[dict, dict, list[dict]]:
    """A host (rank 0's) lost after step 14, the job on one slice, then
    grown back: the facts, the goodput report and the events."""
    events = [ev(0, "submitted", source="train", job="j-1"),
              started(5, 0, 0), started(5.1, 1, 1),
              ev(6, "workers_started", workers=2, source="ray_train", n=1),
              *[ev(10 + s, "step", step=s, seconds=1.0) for s in range(1, 15)],
              ev(25, "worker_lost", by="chaos", host="tpu-group-0-0", target="rank0", source="chaos"),
              ev(28, "failure", source="ray_train", decision="RETRY", n=1),
              ev(30, "workers_restarted", workers=1, source="ray_train", n=1),
              started(31, 0, 1, workers=1),
              ev(35, "restore_started", step=10), ev(36, "restored", step=10, seconds=1.0),
              *[ev(40 + s, "step", step=s, seconds=1.0) for s in range(11, 31)],
              ev(71, "resize", workers_from=1, workers=2, source="ray_train", n=1),
              ev(80, "workers_restarted", workers=2, source="ray_train", n=2),
              started(81, 0, 0), started(81.1, 1, 1),
              *[ev(90 + s, "step", step=s, seconds=1.0) for s in range(31, 41)],
              ev(131, "job_end", source="train", job="j-1", status="SUCCEEDED")]
    g = {"start": T0, "end": T0 + 131, "wall_s": 131.0, "steps": {"counted": 40, "replayed": 4}, "saves": SAVED,
         "incidents": [{"kind": "worker_lost", "at": T0 + 25, "lost_at_step": 14, "restored_from_step": 10,
                        "replayed_steps": 4, "recover_s": 26.0},
                       {"kind": "resize", "at": T0 + 71, "lost_at_step": 30, "restored_from_step": 30,
                        "replayed_steps": 0, "recover_s": 20.0}]}
    facts = {"rc": 0, "outcome": "job j-1 SUCCEEDED at step 40", "target_steps": 40, "t_before": T0 - 20,
             "t_after": T0 + 140, "jobs": 1}
    return facts, g, events


def test_a_good_run_passes_every_criterion_and_was_exercised():
    facts, g, events = back_20s_run()
    v = S.verdict("back-20s", facts, g, events)
    assert v.exercised == []
    assert [c.name for c in v.checks if c.ok is not True] == []
    assert v.ok


def bad(change) -> S.Verdict:
    facts, g, events = copy.deepcopy(back_20s_run())
    change(facts, g, events)
    return S.verdict("back-20s", facts, g, events)


def failed(v: S.Verdict) -> list[str]:
    return [c.name for c in v.checks if c.ok is False]


@pytest.mark.parametrize("criterion,change", [
    ("SUCCEEDED", lambda f, g, e: f.update(rc=1, outcome="job j-1 FAILED")),
    ("SUCCEEDED", lambda f, g, e: f.update(outcome="job j-1 STOPPED")),
    ("every step counted once", lambda f, g, e: g["steps"].update(counted=39)),
    ("every incident recovered", lambda f, g, e: g["incidents"][0].update(recover_s=None)),
    ("every incident recovered", lambda f, g, e: g.update(incidents=[])),
    ("no step replayed at a grow", lambda f, g, e: g["incidents"][1].update(replayed_steps=3)),
    ("the incidents' replayed steps were run again", lambda f, g, e: g["steps"].update(replayed=2)),
    ("saves accounted", lambda f, g, e: g.update(saves={"known": False, "line": "saves: schedule unknown"})),
    ("saves accounted", lambda f, g, e: g.pop("saves")),
    ("wall within the soak's stopwatch", lambda f, g, e: g.update(end=T0 + 200)),      # an end after the train ended
    ("wall within the soak's stopwatch", lambda f, g, e: g.update(wall_s=20.0)),       # most of the run uncounted
    ("wall within the soak's stopwatch", lambda f, g, e: f.pop("t_after")),
])
def test_each_criterion_fails_on_the_run_it_is_there_to_catch(criterion, change):
    v = bad(change)
    assert criterion in failed(v)
    assert not v.ok


def test_a_grow_folded_into_the_restart_is_not_applied_not_passed():
    facts, g, events = back_20s_run()
    g["incidents"] = g["incidents"][:1]
    v = S.verdict("back-5s", facts, g, events)
    grow = next(c for c in v.checks if c.name == "no step replayed at a grow")
    assert grow.ok is None and "no grow" in grow.detail
    assert v.not_applied() and v.ok


@pytest.mark.parametrize("scenario,change,why", [
    # --target=rank0 killed the host that held rank 1
    ("back-20s", lambda f, g, e: e.__setitem__(slice(1, 3), [started(5, 1, 0), started(5.1, 0, 1)]), "held rank 1"),
    # a peer aimed at, rank 0's host killed
    ("back-60s", lambda f, g, e: None, "held rank 0"),
    # the kill came before step 12
    ("back-20s", lambda f, g, e: e.__setitem__(slice(3, 18), e[3:6]), "not after step 12"),
    # no kill at all
    ("back-20s", lambda f, g, e: e.__setitem__(slice(0), []) or e.remove(
        next(x for x in e if x["kind"] == "worker_lost")), "0 host(s) killed"),
    # back-never: never went on with one slice
    ("back-never", lambda f, g, e: [x.update(workers=2) for x in e if x["kind"] == "workers_restarted"],
     "never went on with one slice"),
    # in-save: the save finished before the kill
    ("in-save", lambda f, g, e: f.update(saving_step=10, restored_from=10), "finished before the kill"),
    # in-compile: the kill came after the first step
    ("in-compile", lambda f, g, e: e.insert(3, ev(7, "compile_started")), "not in the first compile"),
    # hung-resumed: no freeze recorded
    ("hung-resumed", lambda f, g, e: None, "no worker frozen and resumed"),
    # hang-stop: the follower never stopped the job
    ("hang-stop", lambda f, g, e: e.append(ev(30, "worker_hung", by="chaos", host="tpu-group-0-0")),
     "did not stop the stalled job"),
])
def test_a_fault_that_did_not_happen_as_described_is_not_exercised(scenario, change, why):
    facts, g, events = copy.deepcopy(back_20s_run())
    change(facts, g, events)
    v = S.verdict(scenario, facts, g, events)
    assert any(why in x for x in v.exercised), v.exercised
    assert not v.ok and v.failures()[0].startswith("not exercised: ")


def test_in_save_exercised_when_the_kill_cut_the_save_short():
    facts, _g, events = back_20s_run()
    for e in events:
        if e["kind"] == "worker_lost":
            e["host"] = "tpu-group-1-0"  # a peer
    facts.update(saving_step=15, restored_from=10)
    assert S.exercised("in-save", facts, events) == []


def test_two_lost_needs_the_second_kill_while_the_first_host_is_down():
    facts, _g, events = back_20s_run()
    events.append(ev(40, "worker_lost", by="chaos", host="tpu-group-1-0", source="chaos"))
    assert S.exercised("two-lost", facts, events) == []
    late = [dict(e, t=T0 + 100) if e["kind"] == "worker_lost" and e["host"] == "tpu-group-1-0" else e
            for e in events]
    assert any("the first host was back" in x for x in S.exercised("two-lost", facts, late))


def test_the_hang_must_be_seen_as_a_stall_that_recovered():
    facts, g, events = back_20s_run()
    events = [e for e in events if e["kind"] != "worker_lost"] + [
        ev(26, "worker_hung", by="chaos", host="tpu-group-0-0"), ev(36, "worker_resumed", by="chaos")]
    g["incidents"] = [{"kind": "stall", "at": T0 + 26, "lost_at_step": 14, "restored_from_step": None,
                       "replayed_steps": 0, "recover_s": 11.0}]
    g["steps"]["replayed"] = 0
    assert S.exercised("hung-resumed", facts, events) == []
    assert "the hang seen as a stall" not in failed(S.verdict("hung-resumed", facts, g, events))
    g["incidents"] = []
    assert "the hang seen as a stall" in failed(S.verdict("hung-resumed", facts, g, events))


def test_a_stopped_stall_must_count_its_replayed_steps():
    facts, g, events = back_20s_run()
    events += [ev(26, "worker_hung", by="chaos", host="tpu-group-0-0"), ev(50, "stopped", source="train")]
    facts["jobs"] = 2
    # As 010859f reported it: the stall "recovered" when the job was stopped, 0 steps replayed.
    g["incidents"] = [{"kind": "stall", "at": T0 + 26, "lost_at_step": 16, "restored_from_step": None,
                       "replayed_steps": 0, "recover_s": 20.2}]
    g["steps"]["replayed"] = 6
    assert "the stopped stall's steps replayed" in failed(S.verdict("hang-stop", facts, g, events))
    # Ended by the stop, resumed by the next job from 10: 6 replayed.
    g["incidents"] = [{"kind": "stall", "at": T0 + 26, "lost_at_step": 16, "restored_from_step": 10,
                       "replayed_steps": 6, "recover_s": None, "ended": "stopped (by the follower)",
                       "resumed_s": 60.0}]
    assert failed(S.verdict("hang-stop", facts, g, events)) == []
    g["incidents"][0]["replayed_steps"] = 0
    assert failed(S.verdict("hang-stop", facts, g, events)) == [
        "the stopped stall's steps replayed", "the incidents' replayed steps were run again"]
    g["incidents"][0].update(replayed_steps=6, resumed_s=None)  # no job resumed it
    assert "every incident recovered" in failed(S.verdict("hang-stop", facts, g, events))


# -- the watch in the cluster: a hang that never resumes, a host sick (issue 36) --------
def hang_never_run() -> tuple[dict, dict, list[dict]]:
    """A worker frozen for good after step 14, nobody following: the watch
    names and sets aside its host, the job goes on with one slice."""
    events = [ev(0, "submitted", source="watch", job="j-1"),
              started(5, 0, 0), started(5.1, 1, 1),
              ev(6, "workers_started", workers=2, source="ray_train", n=1),
              *[ev(10 + s, "step", step=s, seconds=1.0) for s in range(1, 15)],
              ev(25, "worker_hung", by="chaos", host="tpu-group-1-0", source="chaos"),
              ev(40, "stall_started", source="watch", job="j-1"),
              ev(41, "hang_diagnosed", source="watch", culprits=["tpu-group-1-0"], job="j-1"),
              ev(42, "quarantined", source="watch", host="tpu-group-1-0", by="stall_action: restart", job="j-1"),
              ev(44, "failure", source="ray_train", decision="RETRY", n=1),
              ev(46, "workers_restarted", workers=1, source="ray_train", n=1),
              started(47, 0, 0, workers=1),
              ev(50, "restore_started", step=10), ev(51, "restored", step=10, seconds=1.0),
              *[ev(55 + s, "step", step=s, seconds=1.0) for s in range(11, 41)],
              ev(96, "job_end", source="watch", job="j-1", status="SUCCEEDED")]
    g = {"start": T0, "end": T0 + 96, "wall_s": 96.0, "steps": {"counted": 40, "replayed": 4}, "saves": SAVED,
         "incidents": [{"kind": "stall", "at": T0 + 25, "lost_at_step": 14, "restored_from_step": 10,
                        "replayed_steps": 4, "recover_s": 41.0}]}
    facts = {"rc": 0, "outcome": "job j-1 SUCCEEDED (detached)", "target_steps": 40, "t_before": T0 - 5,
             "t_after": T0 + 100, "jobs": 1, "followers": 0}
    return facts, g, events


# The soak's median time to recover, as a table of docs/ gives it (``latest_recovery``).
RECOVERY = S.Recovery(63.2, "docs/elastic.md bench:soak", "2026-12-04", "de18366")


def sick_run(kind: str) -> tuple[dict, dict, list[dict]]:
    """Host tpu-group-1-0 sick (after step 14, or before the job), failed by
    the gate, set aside by the watch; for "back", released and taken back."""
    facts, g, events = hang_never_run()
    events = [e for e in events if e["kind"] not in ("worker_hung", "stall_started", "hang_diagnosed",
                                                     "quarantined")]
    gate = ev(30 if kind == "back" else 8, "health_gate", job="j-1", unhealthy=[
        {"slice": "tpu-group-1", "host": "0", "failed": ["devices"]}])
    sick = ev(25 if kind == "back" else -10, "host_sickened", by="chaos", host="tpu-group-1-0", source="chaos")
    set_aside = ev(31 if kind == "back" else 9, "quarantined", source="watch", host="tpu-group-1-0",
                   by="health gate", job="j-1")
    events += [sick, gate, set_aside, started(97, 1, 1)]
    events.sort(key=lambda e: e["t"])
    facts.update(sick_host="tpu-group-1-0", released_at=T0 + 96.5, sick_before_job=kind == "start",
                 refusal_rc=1, refusal="job j-2 FAILED: the health gate failed on host tpu-group-1-0 (devices)")
    g["incidents"][0]["kind"] = "failure"
    return facts, g, events


@pytest.mark.parametrize("scenario,run", [("hang-never", hang_never_run), ("sick-back", lambda: sick_run("back")),
                                          ("sick-start", lambda: sick_run("start"))])
def test_a_good_watched_run_passes_every_criterion_and_was_exercised(scenario, run):
    facts, g, events = run()
    v = S.verdict(scenario, facts, g, events, RECOVERY)
    assert v.exercised == []
    assert [c.text() for c in v.checks if c.ok is not True and c.name != "no step replayed at a grow"] == []
    assert v.ok


def _culprit(e: list[dict], name: str) -> None:
    next(x for x in e if x["kind"] == "hang_diagnosed")["culprits"] = [name]


@pytest.mark.parametrize("scenario,criterion,change", [
    ("hang-never", "acted by the watch in the cluster, nobody following", lambda f, g, e: f.update(followers=1)),
    ("hang-never", "acted by the watch in the cluster, nobody following",
     lambda f, g, e: next(x for x in e if x["kind"] == "quarantined").update(source="train")),
    ("hang-never", "the culprit named right", lambda f, g, e: _culprit(e, "tpu-group-0-0")),
    ("hang-never", "the culprit named right",
     lambda f, g, e: e.remove(next(x for x in e if x["kind"] == "hang_diagnosed"))),
    ("hang-never", "the culprit set aside",
     lambda f, g, e: next(x for x in e if x["kind"] == "quarantined").update(host="tpu-group-0-0")),
    ("hang-never", "hang to the first step after the restart within stall_after + the median recovery",
     lambda f, g, e: [x.update(t=x["t"] + 200) for x in e if x["kind"] == "step" and x["t"] > T0 + 42]),
    ("sick-back", "the sick host set aside by the gate",
     lambda f, g, e: e.remove(next(x for x in e if x["kind"] == "quarantined"))),
    ("sick-back", "released and healthy, taken back", lambda f, g, e: e.pop()),
    ("sick-start", "a job that is not elastic refused, naming the host", lambda f, g, e: f.update(refusal_rc=0)),
    ("sick-start", "a job that is not elastic refused, naming the host",
     lambda f, g, e: f.update(refusal="job j-2 FAILED: see the log")),
])
def test_each_watch_criterion_fails_on_the_run_it_is_there_to_catch(scenario, criterion, change):
    facts, g, events = copy.deepcopy(hang_never_run() if scenario == "hang-never" else
                                     sick_run(scenario.split("-")[1]))
    change(facts, g, events)
    v = S.verdict(scenario, facts, g, events, RECOVERY)
    assert criterion in failed(v), [c.text() for c in v.checks]
    assert not v.ok


@pytest.mark.parametrize("scenario,change,why", [
    ("hang-never", lambda f, g, e: e.append(ev(60, "worker_resumed", by="chaos", source="chaos")), "was resumed"),
    ("hang-never", lambda f, g, e: e.remove(next(x for x in e if x["kind"] == "worker_hung")), "no worker frozen"),
    ("sick-back", lambda f, g, e: e.remove(next(x for x in e if x["kind"] == "host_sickened")), "no host made sick"),
    ("sick-back", lambda f, g, e: e.remove(next(x for x in e if x["kind"] == "health_gate")),
     "no health gate found host tpu-group-1-0 sick"),
    ("sick-back", lambda f, g, e: next(x for x in e if x["kind"] == "host_sickened").update(t=T0 + 12),
     "not after step 12"),
    ("sick-start", lambda f, g, e: f.update(sick_before_job=False), "no host was sick before the job"),
])
def test_a_watched_fault_that_did_not_happen_is_not_exercised(scenario, change, why):
    facts, g, events = copy.deepcopy(hang_never_run() if scenario == "hang-never" else
                                     sick_run(scenario.split("-")[1]))
    change(facts, g, events)
    v = S.verdict(scenario, facts, g, events)
    assert any(why in x for x in v.exercised), v.exercised


def test_the_soak_counts_a_follow_of_its_own_inventory_only(tmp_path):
    import os
    import subprocess
    import sys
    import time

    from bench.soak import followers
    inv = tmp_path / "inventory.yaml"
    base = followers(inv)
    code = "import time; time.sleep(30)"
    mine = subprocess.Popen(["bash", "-c", f"exec -a /x/.venv/bin/invoke {sys.executable} -c '{code}' train"],
                            env={**os.environ, "INVOKE_PLAYBOOK_INVENTORY": str(inv)})
    other = subprocess.Popen(["bash", "-c", f"exec -a /x/.venv/bin/invoke {sys.executable} -c '{code}' logs"],
                             env={**os.environ, "INVOKE_PLAYBOOK_INVENTORY": str(tmp_path / "other.yaml")})
    watch = subprocess.Popen(["bash", "-c", f"exec {sys.executable} -c '{code}' -m invoke watch"],
                             env={**os.environ, "INVOKE_PLAYBOOK_INVENTORY": str(inv)})
    try:
        deadline = time.monotonic() + 10
        while followers(inv) < base + 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert followers(inv) == base + 1
    finally:
        for p in (mine, other, watch):
            p.kill()
            p.wait()


def many_lost_run() -> tuple[dict, dict, list[dict]]:
    """Four of a peer's hosts lost in one job, a window apart: one failure
    counted in each window of 60 s (budget 3), each restart restoring a
    later checkpoint (10, 20, 30, 40)."""
    events = [ev(0, "submitted", source="watch", job="j-1"), started(5, 0, 0), started(5.1, 1, 1),
              *[ev(10 + s, "step", step=s, seconds=1.0) for s in range(1, 15)]]
    for k in range(4):
        t = 25 + 70 * k
        events += [ev(t, "worker_lost", by="chaos", host="tpu-group-1-0", target="peer", source="chaos"),
                   ev(t + 2, "failure_counted", failures=1, budget=3, window_s=60.0),
                   started(t + 10, 0, 0), started(t + 10.1, 1, 1),
                   ev(t + 12, "restore_started", step=10 * (k + 1)),
                   *[ev(t + 14 + s / 10, "step", step=s, seconds=1.0) for s in range(10 * (k + 1), 10 * (k + 2) + 4)]]
    events.sort(key=lambda e: e["t"])
    facts, g, _ = hang_never_run()
    return facts, g, events


def test_a_sick_host_found_by_its_own_checks_is_exercised_its_failed_collective_alone_is_not():
    facts, g, events = sick_run("back")
    gate = next(x for x in events if x["kind"] == "health_gate")
    events.remove(gate)
    own = ev(30, "health_checked", job="j-1", slice="tpu-group-1", host="0", ok=False,
             checks={"devices": {"ok": False, "detail": "devices 3 of 4"}, "collective": {"ok": False}})
    assert S.verdict("sick-back", facts, g, events + [own]).exercised == []
    only_collective = dict(own, checks={"devices": {"ok": True}, "collective": {"ok": False}})
    assert any("no health gate found" in x for x in S.verdict("sick-back", facts, g, events + [only_collective]).exercised)


def test_many_lost_passes_with_one_failure_per_window_and_fails_past_the_budget_or_within_the_old_one():
    facts, g, events = many_lost_run()
    v = S.verdict("many-lost", facts, g, events)
    assert v.exercised == [] and "more hosts lost than the old budget, each window within its own" not in failed(v)
    over = [dict(e, failures=4) if e["kind"] == "failure_counted" else e for e in events]
    assert "more hosts lost than the old budget, each window within its own" in failed(
        S.verdict("many-lost", facts, g, over))
    three = [e for e in events if not (e["kind"] == "worker_lost" and e["t"] > T0 + 200)]
    assert any("3 host(s) killed by chaos, 4 planned" in x for x in S.verdict("many-lost", facts, g, three).exercised)
    uncounted = [e for e in events if e["kind"] != "failure_counted"]
    assert "more hosts lost than the old budget, each window within its own" in failed(
        S.verdict("many-lost", facts, g, uncounted))


def test_many_lost_fails_when_no_loss_restores_a_later_checkpoint_than_the_one_before():
    """The soak of 2026-12-06 killed the next host before the restarted
    group's first save: every restart restored step 10, and the job never
    trained on between losses (a days-long run must)."""
    facts, g, events = many_lost_run()
    what = "trained on between losses: each restored a later checkpoint"
    assert what not in failed(S.verdict("many-lost", facts, g, events))
    always_ten = [dict(e, step=10) if e["kind"] == "restore_started" else e for e in events]
    assert what in failed(S.verdict("many-lost", facts, g, always_ten))
    one_missing = [e for e in events if not (e["kind"] == "restore_started" and e["step"] == 30)]
    assert what in failed(S.verdict("many-lost", facts, g, one_missing))


def test_a_trains_job_id_is_its_jobs_never_its_watchs():
    """The soak of 2026-12-04: with the watch in the cluster submitted
    first, the first `--submission-id=` a train prints is its watch's; the
    in-compile scenario looked for the compile in the watch's events."""
    from bench.soak import job_id
    watch = ("  apply  ray job submit --address http://127.0.0.12:8305 --no-wait --submission-id=rayjob-elastic-8b-1-watch "
             "--entrypoint-num-cpus 0 -- env -C /x python -m invoke watch --job=rayjob-elastic-8b-1")
    assert job_id(watch) is None
    assert job_id("  apply  ray job submit --address a --submission-id=rayjob-elastic-8b-1 -- python x.py") == \
        "rayjob-elastic-8b-1"
    assert job_id("  note   job rayjob-elastic-8b-3 of run rayjob-elastic-8b is already RUNNING: following it, not "
                  "submitting another") == "rayjob-elastic-8b-3"
    assert job_id("apply ray job submit --submission-id=run-watchful-2") == "run-watchful-2"


# -- a notice, then the loss (issue 37) ---------------------------------------------------
def notice_run(grace: int = 30, saved: bool = True) -> tuple[dict, dict, list[dict]]:
    """A peer's host given a notice after step 14: the trainer takes it,
    the save of step 15 is finalized (or, too short a notice, cut), the
    host killed at the grace's end, the job on one slice, then two again."""
    facts, g, events = back_20s_run()
    kill = next(e for e in events if e["kind"] == "worker_lost")
    kill.update(host="tpu-group-1-0", target="peer", t=T0 + (26.5 if saved else 24.8))
    events += [ev(24, "notice_given", by="chaos", host="tpu-group-1-0", grace_s=grace, source="chaos"),
               ev(24.5, "notice_received", step=14, ranks=[1], grace_s=grace - 0.5, save_asked=True)]
    if saved:
        events.append(ev(25.5, "checkpoint_finalized", step=15, seconds=0.4, finalized=True))
    events.sort(key=lambda e: e["t"])
    g["incidents"][0].update(notice="a notice to go, 30 s ahead (ranks 1); its save asked at step 14",
                             lost_at_step=15 if saved else 14, restored_from_step=15 if saved else 10,
                             replayed_steps=0 if saved else 4)
    g["steps"]["replayed"] = 0 if saved else 4
    if not saved:
        events += [ev(36, "checkpoint_finalized", step=10, seconds=0.4, finalized=True)]
        g["saves"] = {"known": True, "due": 4, "finalized": 3, "line": "saves: 3 of 4 finalized",
                      "missing": [{"step": None, "after_step": 14, "name": "a save asked after step 14",
                                   "due_by": ["asked by a notice to a host"], "why": "the worker went before it"}]}
        facts["checkpoint_period"] = 5
        facts["said_before"] = ("note   a notice of 1 s is shorter than a save (1.9 s to finalized, measured): the "
                                "save it asks for will be cut")
    return facts, g, events


def test_a_good_notice_run_passes_every_criterion_and_was_exercised():
    facts, g, events = notice_run()
    v = S.verdict("notice", facts, g, events)
    assert v.exercised == [] and [c.name for c in v.checks if c.ok is not True] == [] and v.ok
    names = {c.name for c in v.checks}
    assert {"the notice's save finalized before the host went", "no step replayed after the notice"} <= names
    facts, g, events = notice_run(grace=1, saved=False)
    v = S.verdict("notice-short", facts, g, events)
    assert v.exercised == [] and [c.name for c in v.checks if c.ok is not True] == [] and v.ok
    assert {"at most one checkpoint period replayed", "the notice's save reported not finalized",
            "restored only from a finalized save", "said before the notice that it cannot hold a save"} <= {
        c.name for c in v.checks}


@pytest.mark.parametrize("scenario,criterion,change", [
    ("notice", "the notice's save finalized before the host went",
     lambda f, g, e: e.remove(next(x for x in e if x["kind"] == "checkpoint_finalized"))),
    ("notice", "no step replayed after the notice", lambda f, g, e: g["incidents"][0].update(replayed_steps=2)),
    ("notice", "no step replayed after the notice", lambda f, g, e: g["incidents"][0].pop("notice")),
    ("notice-short", "at most one checkpoint period replayed",
     lambda f, g, e: g["incidents"][0].update(replayed_steps=7)),
    ("notice-short", "the notice's save reported not finalized", lambda f, g, e: g["saves"].update(missing=[])),
    ("notice-short", "said before the notice that it cannot hold a save",
     lambda f, g, e: f.update(said_before="note   a notice of 1 s holds a save")),
    ("notice-short", "restored only from a finalized save",
     lambda f, g, e: next(x for x in e if x["kind"] == "restore_started").update(step=12)),
])
def test_each_notice_criterion_fails_on_the_run_it_is_there_to_catch(scenario, criterion, change):
    facts, g, events = copy.deepcopy(notice_run() if scenario == "notice" else notice_run(1, saved=False))
    change(facts, g, events)
    v = S.verdict(scenario, facts, g, events)
    assert criterion in failed(v) and not v.ok


@pytest.mark.parametrize("scenario,change,why", [
    ("notice", lambda f, g, e: e.remove(next(x for x in e if x["kind"] == "notice_given")), "no notice given"),
    ("notice", lambda f, g, e: next(x for x in e if x["kind"] == "notice_given").update(grace_s=5),
     "the notice gave 5 s, not 30"),
    ("notice", lambda f, g, e: e.remove(next(x for x in e if x["kind"] == "notice_received")),
     "the trainer took no notice"),
    ("notice-short", lambda f, g, e: e.append(ev(24.7, "checkpoint_finalized", step=15, seconds=0.2,
                                                 finalized=True)), "the notice's save finished before the kill"),
])
def test_a_notice_that_did_not_happen_as_described_is_not_exercised(scenario, change, why):
    facts, g, events = copy.deepcopy(notice_run() if scenario == "notice" else notice_run(1, saved=False))
    change(facts, g, events)
    events.sort(key=lambda e: e["t"])
    v = S.verdict(scenario, facts, g, events)
    assert any(why in x for x in v.exercised), v.exercised


def test_a_save_cut_by_a_kill_must_be_reported_missing():
    facts, g, events = back_20s_run()
    for e in events:
        if e["kind"] == "worker_lost":
            e["host"] = "tpu-group-1-0"
    facts.update(saving_step=15, restored_from=10)
    g["saves"] = {"known": True, "due": 4, "finalized": 3, "line": "saves: 3 of 4 finalized", "missing": [
        {"step": 15, "name": "step 15", "due_by": ["its schedule"], "why": "cut: the worker group went 1.0 s after"}]}
    check = next(c for c in S.verdict("in-save", facts, g, events).checks
                 if c.name == "the cut save reported not finalized")
    assert check.ok
    g["saves"]["missing"] = []
    check = next(c for c in S.verdict("in-save", facts, g, events).checks
                 if c.name == "the cut save reported not finalized")
    assert check.ok is False and "not among the saves lost" in check.detail
    # Cut, then saved again by the next group (its step replayed): still reported.
    g["saves"]["cut"] = [{"step": 15, "name": "step 15", "due_by": ["its schedule"], "why": "cut: ...",
                          "saved_again": True}]
    assert next(c for c in S.verdict("in-save", facts, g, events).checks
                if c.name == "the cut save reported not finalized").ok


def maintenance_run() -> tuple[dict, dict, list[dict]]:
    """notice_run, the notice the watch's before a maintenance chaos scheduled, nobody following."""
    facts, g, events = notice_run()
    for e in events:
        if e["kind"] == "notice_given":
            e.update(by="maintenance", source="watch", grace_s=20.0)
    events.append(ev(2, "maintenance_scheduled", by="chaos", host="tpu-group-1-0", source="chaos", at=T0 + 26.5))
    events.sort(key=lambda e: e["t"])
    facts["followers"] = 0
    return facts, g, events


def test_a_maintenance_noticed_by_the_watch_passes_and_one_it_did_not_notice_is_not_exercised():
    facts, g, events = maintenance_run()
    v = S.verdict("maintenance", facts, g, events)
    assert v.exercised == [] and [c.name for c in v.checks if c.ok is not True] == [] and v.ok
    assert "no step replayed after the notice" in {c.name for c in v.checks}
    # The chaos notice alone is not the watch's.
    facts, g, events = maintenance_run()
    next(e for e in events if e["kind"] == "notice_given").update(by="chaos")
    assert any("no notice given" in x for x in S.verdict("maintenance", facts, g, events).exercised)
    facts, g, events = maintenance_run()
    events.remove(next(e for e in events if e["kind"] == "maintenance_scheduled"))
    assert any("no maintenance scheduled" in x for x in S.verdict("maintenance", facts, g, events).exercised)


# -- figures that mean what they say (issue 63, item 8) -------------------------------------
@pytest.mark.parametrize("saves,ok", [
    # Any saves line passed before: one missing, named nowhere.
    ({"known": True, "due": 6, "finalized": 5, "missing": [], "line": "saves: 5 of 6 finalized"}, False),
    # One missing, named without its cause.
    ({"known": True, "due": 6, "finalized": 5, "line": "saves: 5 of 6 finalized; missing: step 30",
      "missing": [{"step": 30, "name": "step 30", "why": None}]}, False),
    # One still in progress when the run ended: not made, not named missing.
    ({"known": True, "due": 6, "finalized": 5, "missing": [], "in_progress": [{"step": 40, "name": "step 40"}],
      "line": "saves: 5 of 6 finalized (1 in progress: step 40 being written)"}, False),
    ({"known": True, "due": 6, "finalized": 6, "missing": [], "line": "saves: 6 of 6 finalized"}, True),
    ({"known": True, "due": 6, "finalized": 5, "line": "saves: 5 of 6 finalized; missing: step 30 (cut: ...)",
      "missing": [{"step": 30, "name": "step 30", "why": "cut: the worker group went 1.6 s after the save began"}]},
     True),
])
def test_saves_accounted_only_when_made_equals_due_or_each_missing_save_is_named_with_its_cause(saves, ok):
    facts, g, events = back_20s_run()
    g["saves"] = saves
    [check] = [c for c in S.verdict("back-20s", facts, g, events).checks if c.name == "saves accounted"]
    assert check.ok is ok, check.text()
    assert check.detail.startswith(saves["line"])
    if not ok:
        assert "not named with a cause" in check.detail or "no cause said" in check.detail


def test_a_notices_save_a_later_group_restored_from_was_finalized_though_no_line_said_so():
    """The twin's maintenance run: the notice's save of step 15 begun, its
    group gone before any finalization line came out, the next group
    restored from step 15: the checkpoint decides."""
    facts, g, events = maintenance_run()
    events.remove(next(e for e in events if e["kind"] == "checkpoint_finalized"))
    v = S.verdict("maintenance", facts, g, events)
    assert "the notice's save finalized before the host went" in failed(v)  # no line, no restore from it
    events += [ev(25.2, "checkpoint_saved", step=15, seconds=0.3)]
    for e in events:
        if e["kind"] in ("restore_started", "restored"):
            e["step"] = 15
    events.sort(key=lambda e: e["t"])
    v = S.verdict("maintenance", facts, g, events)
    [check] = [c for c in v.checks if c.name == "the notice's save finalized before the host went"]
    assert check.ok and check.detail == "step 15: no finalization said: a later group restored from it"
    # A save begun that no group restored from is no proof.
    for e in events:
        if e["kind"] in ("restore_started", "restored"):
            e["step"] = 10
    assert "the notice's save finalized before the host went" in failed(S.verdict("maintenance", facts, g, events))


def soak_page(*tables: tuple[str, str, str, float]) -> str:
    """A page of docs/ with soak tables (marker, date, commit, median) as
    bench/soak.py writes them: doc_table.write's stamp, soak.recovery's line."""
    from bench.soak import Result, recovery
    out = ["# A page", ""]
    for name, date, commit, median in tables:
        r = Result("hang-never", 1, goodput={"incidents": [{"kind": "worker_lost", "recover_s": median}]})
        out += [f"<!-- bench:{name} -->",
                f"Written by `bench/soak.py --repeat 3 --load --only hang-never` on {date} at commit `{commit}` "
                "(2 CPU cores, load average 5.0 at the end).", "", "9 of 9 runs passed in 40 min.", "",
                "| rep | scenario | outcome | goodput (ours / library) | incidents |", "| --- | --- | --- | --- | --- |",
                "", recovery([r]), f"<!-- /bench:{name} -->", ""]
    return "\n".join(out)


def test_the_hang_bound_is_stall_after_plus_the_newest_soak_tables_median_and_names_it():
    pages = {"elastic.md": soak_page(("soak", "2026-12-04", "de18366", 63.2)),
             "quarantine.md": soak_page(("older", "2026-12-06", "193c3e8", 79.2), ("newer", "2026-12-09", "abc1234",
                                                                                  20.0))}
    newest = S.latest_recovery(pages)
    assert newest == S.Recovery(20.0, "docs/quarantine.md bench:newer", "2026-12-09", "abc1234")
    facts, g, events = hang_never_run()  # 41.0 s from the hang to the first step after the restart
    name = "hang to the first step after the restart within stall_after + the median recovery"
    [check] = [c for c in S.verdict("hang-never", facts, g, events, newest).checks if c.name == name]
    assert check.ok is False and check.detail == ("41.0 s (bound 35 s: stall_after 15 s plus the median 20 s of "
                                                  "docs/quarantine.md bench:newer, 2026-12-09 at commit abc1234)")
    # A newest table with another median: another bound.
    pages["elastic.md"] = soak_page(("soak", "2026-12-10", "fed4321", 63.2))
    [check] = [c for c in S.verdict("hang-never", facts, g, events, S.latest_recovery(pages)).checks
               if c.name == name]
    assert check.ok and "(bound 78.2 s: stall_after 15 s plus the median 63.2 s of docs/elastic.md bench:soak, " \
                        "2026-12-10 at commit fed4321)" in check.detail
    # No table: the bound cannot be said, and the check fails saying so.
    [check] = [c for c in S.verdict("hang-never", facts, g, events, S.latest_recovery({})).checks if c.name == name]
    assert check.ok is False and "no soak table" in check.detail


def test_of_one_date_the_later_commit_then_the_later_in_the_page_is_the_newest():
    page = soak_page(("a", "2026-12-07", "3d3e69a", 43.2), ("b", "2026-12-07", "c2e9781", 81.3))
    assert S.latest_recovery({"quarantine.md": page}).table == "docs/quarantine.md bench:b"
    times = {"3d3e69a": 2.0, "c2e9781": 1.0}
    assert S.latest_recovery({"quarantine.md": page}, times.__getitem__).table == "docs/quarantine.md bench:a"
    # A table judged again (--rescore) is dated by its runs: the first date of its stamp.
    judged = ("<!-- bench:watch-soak -->\nWritten by `bench/soak.py --repeat 3 --load --only hang-never` (run on "
              "2026-12-06 at commit `193c3e8`, 2 CPU cores, 66 min), judged again by `bench/soak.py --rescore` on "
              "2026-12-08 at commit `825f08d` (2 CPU cores).\n\ntime to recover from a lost host (the loss to the "
              "first step after it), 18 incidents: median 79.2 s, p90 93.1 s, range 44.0-134.3 s\n"
              "<!-- /bench:watch-soak -->\n")
    assert S.soak_tables("quarantine.md", judged) == [S.Recovery(79.2, "docs/quarantine.md bench:watch-soak",
                                                                 "2026-12-06", "193c3e8")]
