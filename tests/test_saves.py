"""Every scheduled save accounted for (``playbooks/runs/saves.py``): on
synthetic timelines, each save due (every ``checkpoint_period``, the last
step, each asked by a notice or before a resize) finalized, or missing and
why; counted once when a later group trains its step again; a save still
being written not missing; no schedule said, no guess. And the line where
a user reads it: `invoke goodput` (its lines and --json) and `invoke
status` (the run's job row)."""
from __future__ import annotations

import json

from playbooks.runs import events as E
from playbooks.runs import goodput, saves, timeline
from tests.test_goodput import T0, ev
from tests.test_goodput_report import RECORDED

SCHEDULE = {"checkpoint_period": 10, "enabled": True, "steps": 30}


def group(t: float, workers: int = 2, restarted: bool = False, schedule: dict | None = SCHEDULE) -> list[dict]:
    """A worker group starting at ``t``: Ray Train's line, the trainer's start, its save schedule."""
    out = [ev(t, E.WORKERS_RESTARTED if restarted else E.WORKERS_STARTED, workers=workers),
           ev(t + 0.5, E.JAX_INITIALIZED, steps=30)]
    return out + ([ev(t + 1, E.SAVE_SCHEDULE, **schedule)] if schedule is not None else [])


def train(first: int, last: int, t: float, saved: tuple[int, ...] = (), finalized: tuple[int, ...] = ()) -> list[dict]:
    """Steps first..last, one a second from ``t``; a save of each step in
    ``saved`` begun 0.3 s before its step line (MaxText logs a step after
    the save it began), 0.2 s of it blocking; those in ``finalized`` said
    finalized 0.5 s after their step."""
    out = []
    for i, n in enumerate(range(first, last + 1)):
        at = t + i
        out.append(ev(at, E.STEP, n, seconds=1.0))
        if n in saved:
            out.append(ev(at - 0.3, E.CHECKPOINT_SAVED, n, seconds=0.2))
        if n in finalized:
            out.append(ev(at + 0.5, E.CHECKPOINT_FINALIZED, n, seconds=1.0, finalized=True))
    return out


def start() -> list[dict]:
    return [ev(0, E.SUBMITTED)] + group(10)


def line(events: list[dict]) -> str:
    return saves.account(events)["line"]


def test_a_run_whose_every_save_was_finalized():
    """Step 0 (save_checkpoint_on_start), every 10th step, the last (29, forced)."""
    events = start() + train(0, 29, 20, saved=(0, 10, 20, 29), finalized=(0, 10, 20, 29)) + [
        ev(50, E.JOB_END, status="SUCCEEDED")]
    r = saves.account(events)
    assert r["line"] == "saves: 4 of 4 finalized"
    assert [s["step"] for s in r["saves"]] == [0, 10, 20, 29]
    assert r["schedule"] == {"checkpoint_period": 10, "enabled": True, "steps": 30}


def test_the_rule_is_maxtexts():
    s = saves.Schedule(10, True, 30)
    assert [n for n in range(30) if saves.periodic(n, s)] == [0, 10, 20, 29]
    assert [n for n in range(30) if saves.periodic(n, saves.Schedule(10, True, 30, on_start=False))] == [10, 20, 29]
    assert [n for n in range(30) if saves.periodic(n, saves.Schedule(10, True, 30, on_completion=False))] == [0, 10, 20]
    assert [n for n in range(30) if saves.periodic(n, saves.Schedule(10, False, 30))] == []
    assert [n for n in range(21) if saves.periodic(n, saves.Schedule(10, True, 21))] == [0, 10, 20]


def cut() -> list[dict]:
    """Saves of 0 and 10 finalized; the save of 20 begun at 39.7 - 0.2 =
    39.5, its host lost at 43, the job failed."""
    return start() + train(0, 22, 20, saved=(0, 10, 20), finalized=(0, 10)) + [
        ev(43, E.WORKER_LOST, by="chaos", host="tpu-group-1-0"), ev(46, E.FAILURE, decision="RAISE"),
        ev(47, E.JOB_END, status="FAILED")]


CUT = "saves: 2 of 3 finalized; missing: step 20 (cut: the worker group went 3.5 s after the save began)"


def test_a_save_cut_by_a_loss():
    assert line(cut()) == CUT


def test_a_skipped_save():
    events = start() + train(0, 15, 20, saved=(0,), finalized=(0,)) + [ev(40, E.JOB_END, status="STOPPED")]
    r = saves.account(events)
    assert r["line"] == "saves: 1 of 2 finalized; missing: step 10 (skipped: step 10 trained, no save begun)"
    assert saves.lines(r) == ["saves: 1 of 2 finalized", "  step 10: skipped: step 10 trained, no save begun"]


def test_a_notices_save_made():
    """A notice after step 12: MaxText saves at its next step, 13, and stops."""
    events = start() + train(0, 13, 20, saved=(0, 10, 13), finalized=(0, 10, 13)) + [
        ev(32.2, E.NOTICE_RECEIVED, 12, node="node-1", host="tpu-group-1-0", slice=1, deadline=T0 + 62,
           grace_s=30),
        ev(40, E.WORKER_LOST, by="preemption", host="tpu-group-1-0"), ev(41, E.JOB_END, status="FAILED")]
    r = saves.account(events)
    assert r["line"] == "saves: 3 of 3 finalized"
    assert r["saves"][-1]["due_by"] == ["a save begun", "asked by a notice to tpu-group-1-0"]


def test_a_notices_save_never_begun():
    events = start() + train(0, 12, 20, saved=(0, 10), finalized=(0, 10)) + [
        ev(32.2, E.NOTICE_RECEIVED, 12, node="node-1", host="tpu-group-1-0", slice=1, deadline=T0 + 34, grace_s=2),
        ev(32.4, E.NOTICE_RECEIVED, 12, node="node-2", host="tpu-group-1-1", slice=1, deadline=T0 + 34, grace_s=2),
        ev(34, E.WORKER_LOST, by="preemption", host="tpu-group-1-0"), ev(36, E.JOB_END, status="FAILED")]
    r = saves.account(events)
    # Two notices before one save: one save asked.
    assert r["line"] == ("saves: 2 of 3 finalized; missing: after step 12 (the worker went before it: asked by a "
                         "notice to tpu-group-1-0; asked by a notice to tpu-group-1-1)")
    assert r["missing"][0]["step"] is None and r["missing"][0]["after_step"] == 12


def test_a_replayed_steps_save_by_a_later_group_finalizes_it():
    """Group 1's save of 20 cut; group 2 restores 10, trains 11-29 again and saves 20 (and 29): counted once."""
    events = start() + train(0, 22, 20, saved=(0, 10, 20), finalized=(0, 10)) + [
        ev(43, E.WORKER_LOST, by="chaos", host="tpu-group-1-0"), ev(46, E.FAILURE, decision="RETRY"),
        *group(50, restarted=True), ev(52, E.RESTORE_STARTED, 10), ev(53, E.RESTORED, 10, seconds=1.0),
        *train(11, 29, 60, saved=(20, 29), finalized=(20, 29)), ev(90, E.JOB_END, status="SUCCEEDED")]
    r = saves.account(events)
    assert r["headline"] == "saves: 4 of 4 finalized"
    # The cut save is still said: a restore never took it, the next group saved its step again.
    assert r["line"] == ("saves: 4 of 4 finalized; cut, then saved again by a later group: step 20 (cut: the worker "
                         "group went 3.5 s after the save began)")
    assert [(c["step"], c["saved_again"]) for c in r["cut"]] == [(20, True)]
    assert saves.lines(r)[-1] == "  step 20: cut: the worker group went 3.5 s after the save began; saved again by " \
                                 "a later group"
    assert {s["step"]: s["attempts"] for s in r["saves"]} == {0: 1, 10: 1, 20: 2, 29: 1}


def test_a_replayed_step_cut_twice_says_its_last_attempt():
    events = start() + train(0, 22, 20, saved=(0, 10, 20), finalized=(0, 10)) + [
        ev(43, E.WORKER_LOST, by="chaos"), ev(46, E.FAILURE, decision="RETRY"), *group(50, restarted=True),
        *train(11, 20, 60, saved=(20,)), ev(70, E.WORKER_LOST, by="chaos"), ev(72, E.JOB_END, status="FAILED")]
    assert line(events) == ("saves: 2 of 3 finalized; missing: step 20 (cut: the worker group went 1.5 s after the "
                            "save began)")


def test_a_save_still_being_written_is_not_missing():
    events = start() + train(0, 21, 20, saved=(0, 10, 20), finalized=(0, 10))
    r = saves.account(events)
    assert r["line"] == "saves: 2 of 3 finalized (1 in progress: step 20 being written)"
    assert r["missing"] == []
    # Once the next save has begun, its finalization is overdue (Orbax finishes one before the next).
    later = start() + train(0, 29, 20, saved=(0, 10, 20, 29), finalized=(0, 10))
    assert line(later) == ("saves: 2 of 4 finalized (1 in progress: step 29 being written); missing: step 20 "
                           "(not finalized: none said before the save of step 29 began)")


def test_a_running_groups_periodic_step_with_no_save_yet_is_not_missing():
    events = start() + train(0, 10, 20, saved=(0,), finalized=(0,))
    assert line(events) == "saves: 1 of 2 finalized (1 in progress: step 10 not begun yet)"
    assert line(events + train(11, 11, 31)) == ("saves: 1 of 2 finalized; missing: step 10 (skipped: step 10 "
                                                "trained, no save begun)")


def test_a_save_orbax_did_not_finalize_says_why():
    events = start() + train(0, 12, 20, saved=(0, 10), finalized=(0,)) + [
        ev(31, E.CHECKPOINT_FINALIZED, 10, finalized=False, why="OSError: [Errno 28] No space left on device")]
    assert line(events) == ("saves: 1 of 2 finalized; missing: step 10 (not finalized: OSError: [Errno 28] No space "
                            "left on device)")


def test_a_save_before_a_resize():
    base = start() + train(0, 14, 20, saved=(0, 10), finalized=(0, 10)) + [
        ev(35, E.RESIZE, workers_from=2, workers=4)]
    saved = base + [ev(35.6, E.CHECKPOINT_SAVED, 15, seconds=0.2), ev(36, E.CHECKPOINT_FINALIZED, 15, finalized=True),
                    ev(37, E.SAVE_BEFORE_RESIZE, 15, asked_after=14, seconds=2.0, outcome="saved", workers_from=2,
                       workers=4), *group(40, workers=4, restarted=True)]
    r = saves.account(saved)
    assert r["line"] == "saves: 3 of 3 finalized" and r["saves"][-1]["due_by"] == ["a save begun", "before a resize"]
    none = base + [ev(37, E.SAVE_BEFORE_RESIZE, None, asked_after=14, seconds=2.0,
                      outcome="no save: a worker is gone (ActorDiedError)"), *group(40, workers=4, restarted=True)]
    assert line(none) == ("saves: 2 of 3 finalized; missing: after step 14 (the worker went before it: before a "
                          "resize, no save: a worker is gone (ActorDiedError))")
    needless = base + [ev(35.1, E.SAVE_BEFORE_RESIZE, 14, outcome="not needed: nothing new since its last save"),
                       *group(40, workers=4, restarted=True)]
    assert line(needless) == "saves: 2 of 2 finalized"


def test_a_run_with_no_schedule_says_it_is_unknown():
    events = [ev(0, E.SUBMITTED), ev(10, E.WORKERS_STARTED, workers=2)] + train(
        0, 22, 20, saved=(0, 10, 20)) + [ev(50, E.JOB_END, status="SUCCEEDED")]
    r = saves.account(events)
    assert r["line"] == ("saves: schedule unknown (no save_schedule event: the run's trainer is older than it); "
                         "3 begun")
    assert r["known"] is False and saves.lines(r) == [r["line"]]


def test_checkpointing_off_none_due():
    events = [ev(0, E.SUBMITTED)] + group(10, schedule={"checkpoint_period": 10, "enabled": False, "steps": 30}) + \
        train(0, 29, 20) + [ev(50, E.JOB_END, status="SUCCEEDED")]
    assert line(events) == "saves: none due (checkpointing off: enable_checkpointing=false)"


def test_the_rule_gives_the_saves_maxtext_made_on_a_recorded_run():
    """The recorded run (checkpoint_period 10, 60 steps, from before the
    trainer said its schedule): MaxText began exactly the saves the rule
    gives, step 0 and the last step among them."""
    events = timeline.parse(RECORDED.read_text())
    begun = sorted({e["step"] for e in events if e["kind"] == E.CHECKPOINT_SAVED})
    assert begun == [n for n in range(60) if saves.periodic(n, saves.Schedule(10, True, 60))] == \
        [0, 10, 20, 30, 40, 50, 59]


def test_goodput_says_the_saves_and_its_json_carries_them():
    r = goodput.account(cut(), "run")
    text = goodput.lines(r)
    at = text.index("  saves: 2 of 3 finalized")
    assert text[at + 1] == "    step 20: cut: the worker group went 3.5 s after the save began"
    doc = json.loads(json.dumps(r))
    assert (doc["saves"]["due"], doc["saves"]["finalized"]) == (3, 2)
    assert doc["saves"]["missing"] == [{"step": 20, "after_step": None, "name": "step 20", "due_by": ["a save begun",
                                        "its schedule"], "state": "missing", "why": "cut: the worker group went 3.5 s after "
                                        "the save began", "attempts": 1}]


def test_status_says_the_saves_in_the_runs_job_row(tmp_path, monkeypatch):
    from playbooks.cli import status
    from playbooks.config import paths
    from tests.test_goodput import WatchedEnv
    monkeypatch.setattr(paths, "here", lambda rel: tmp_path / rel)
    env = WatchedEnv(30, "report")
    timeline.append(env, "run", start() + train(0, 15, 20, saved=(0,), finalized=(0,)))
    listed = [{"submission_id": "run-1", "status": "RUNNING", "start_time": (T0 + 0) * 1000}]
    rows = status.job_rows(env, listed)
    assert rows[0]["saves"] == "saves: 1 of 2 finalized; missing: step 10 (skipped: step 10 trained, no save begun)"
    doc = {"environment": "e", "kind": "local", "seconds": 1.0, "items": [], "jobs": rows, "diagnosis": None}
    table = status.table(doc)
    assert table[table.index(next(t for t in table if t.startswith("    run-1  RUNNING"))) + 1] == (
        "      saves: 1 of 2 finalized; missing: step 10 (skipped: step 10 trained, no save begun)")


def test_a_periodic_step_a_survivor_finished_after_the_loss_went_with_its_worker():
    """Rank 0's host lost during step 20: another slice's host still says it (``peer_step``); no save began."""
    events = start() + train(0, 19, 20, saved=(0, 10), finalized=(0, 10)) + [
        ev(39.5, E.WORKER_LOST, by="chaos", host="tpu-group-0-0"), ev(40.2, E.PEER_STEP, 20, rank=1),
        ev(42, E.FAILURE, decision="RAISE"), ev(43, E.JOB_END, status="FAILED")]
    assert line(events) == ("saves: 2 of 3 finalized; missing: step 20 (the worker went before it: step 20 trained "
                            "as its group went)")
    # A notice's save asked, not begun yet, while its group still runs: in progress, not missing.
    asked = start() + train(0, 12, 20, saved=(0, 10), finalized=(0, 10)) + [
        ev(32.2, E.NOTICE_RECEIVED, 12, host="tpu-group-1-0")]
    assert line(asked) == "saves: 2 of 3 finalized (1 in progress: after step 12 asked)"


# -- the audit agrees with the checkpoints (issue 63, item 8) ----------------------------------
def maintenance_notice(step: int | None = None) -> list[dict]:
    """The twin's maintenance run: a notice after step 29 (its event with
    no step: rank 0 had read no step line of its group), MaxText saves step
    30 and stops; its group goes 1.6 s after the save began, before any
    finalization line came out; the next group restores from step 30 (0
    steps replayed) and finishes."""
    schedule = dict(SCHEDULE, steps=40)
    return [ev(0, E.SUBMITTED), *group(10, schedule=schedule),
            *train(0, 29, 20, saved=(0, 10, 20), finalized=(0, 10, 20)),
            ev(49.5, E.NOTICE_RECEIVED, step, host="tpu-group-1-0", ranks=[1], grace_s=20.0, save_asked=True),
            ev(49.9, E.CHECKPOINT_SAVED, 30, seconds=0.2), ev(50.0, E.STEP, 30, seconds=None),
            ev(51.3, E.FAILURE, decision="RETRY"), *group(60, workers=1, restarted=True, schedule=schedule),
            ev(62, E.RESTORE_STARTED, 30), ev(63, E.RESTORED, 30, seconds=1.0),
            *train(31, 39, 70, saved=(39,), finalized=(39,)), ev(80, E.JOB_END, status="SUCCEEDED")]


def test_a_save_a_later_group_restored_from_was_finalized_though_no_line_said_so():
    r = saves.account(maintenance_notice())
    assert r["line"] == ("saves: 5 of 5 finalized; finalized with no line said so: step 30 (a later worker group "
                         "restored from it)")
    [s30] = [s for s in r["saves"] if s["step"] == 30]
    assert (s30["state"], s30["proof"]) == ("finalized", saves.RESTORED_PROOF) and r["cut"] == []
    assert "asked by a notice to tpu-group-1-0" in s30["due_by"]
    assert saves.lines(r)[-1] == "  step 30: finalized, no line said so: a later worker group restored from it"
    # A restore from an earlier step proves nothing of a later save: the cut save is still missing.
    assert line(cut()) == CUT


def test_a_save_whose_step_directory_orbax_finalized_on_disk_was_finalized():
    """cut()'s save of step 20: no line said it finalized; its directory on disk says."""
    r = saves.account(cut(), on_disk=(0, 10, 20))
    assert r["line"] == ("saves: 3 of 3 finalized; finalized with no line said so: step 20 (its step directory is "
                         "finalized on disk (Orbax's marker))")
    assert r["on_disk"] == [0, 10, 20] and r["missing"] == []
    # Only the marker counts: a folder without it (not in on_disk), or none looked at, leaves the save missing.
    assert saves.account(cut(), on_disk=(0, 10))["line"] == CUT
    assert saves.account(cut())["on_disk"] is None


def test_a_notice_that_said_no_step_names_the_step_it_was_asked_at():
    [inc] = goodput.account(maintenance_notice(), "run")["incidents"][:1]
    assert inc["notice"] == ("a notice to go, 20 s ahead (ranks 1); its save asked at step 29 (the timeline's; the "
                             "notice said none)")
    [inc] = goodput.account(maintenance_notice(29), "run")["incidents"][:1]
    assert inc["notice"] == "a notice to go, 20 s ahead (ranks 1); its save asked at step 29"


def test_status_counts_the_saves_against_the_checkpoints_it_looks_at(tmp_path, monkeypatch):
    from playbooks.cli import status
    from playbooks.config import paths
    from playbooks.config.schema import load_inventory
    from playbooks.job.spec import Checkpoints, run_checkpoints
    monkeypatch.setattr(paths, "here", lambda rel: tmp_path / rel)
    env = load_inventory().env("local")
    timeline.append(env, "run", cut())
    listed = [{"submission_id": "run-1", "status": "FAILED", "start_time": (T0 + 0) * 1000}]
    looked = []

    def look(fact):
        looked.append(fact.key)
        return Checkpoints((0, 10, 20))
    [row] = status.job_rows(env, listed, look)
    assert looked == [run_checkpoints(env, "run").key]
    assert (row["checkpoint"], row["saves"]) == (20, "saves: 3 of 3 finalized; finalized with no line said so: step "
                                                     "20 (its step directory is finalized on disk (Orbax's marker))")
