"""The goodput sweep's parts, each on its own: a handler claims its seconds,
the carving gives each second to the cause that wins it. (Whole timelines,
real and hand-made, are in test_goodput.py and test_goodput_report.py.)"""
import pytest

from playbooks.runs import events as E
from playbooks.runs.goodput import PRODUCTIVE, Incident, Sweep, _sweep


def ev(kind, t, step=None, **kw):
    return {"kind": kind, "t": float(t), "step": step, "source": "train", "job": "j-1", **kw}


def swept(evs, end=None):
    s = Sweep(evs, float(evs[0]["t"]), float(end if end is not None else evs[-1]["t"]))
    s.run()
    return s


# -- the carving -------------------------------------------------------------------------------------------
def test_the_carving_gives_each_second_to_the_highest_ranked_interval_then_the_phase():
    base = [(0.0, 10.0, "startup"), (10.0, 20.0, "other")]
    intervals = [(2.0, 6.0, "compile"), (4.0, 8.0, "stall"), (12.0, 15.0, PRODUCTIVE)]
    assert _sweep(base, intervals, 0.0, 20.0) == [
        (0.0, 2.0, "startup"), (2.0, 4.0, "compile"), (4.0, 8.0, "stall"), (8.0, 10.0, "startup"),
        (10.0, 12.0, "other"), (12.0, 15.0, PRODUCTIVE), (15.0, 20.0, "other")]


def test_the_carving_clips_intervals_to_the_wall_time_and_adds_up_to_it():
    segs = _sweep([(0.0, 10.0, "startup")], [(-5.0, 3.0, "compile"), (9.0, 40.0, "checkpoint")], 0.0, 10.0)
    assert segs == [(0.0, 3.0, "compile"), (3.0, 9.0, "startup"), (9.0, 10.0, "checkpoint")]
    assert sum(b - a for a, b, _ in segs) == 10.0


# -- the phases ------------------------------------------------------------------------------------------
def test_time_after_a_step_is_replayed_when_a_loss_comes_next_else_other():
    lost = swept([ev(E.SUBMITTED, 0), ev(E.STEP, 10, 1, seconds=1.0), ev(E.WORKER_LOST, 14)])
    assert (10.0, 14.0, "replayed") in lost.base
    ended = swept([ev(E.SUBMITTED, 0), ev(E.STEP, 10, 1, seconds=1.0), ev(E.JOB_END, 14)])
    assert (10.0, 14.0, "other") in ended.base


def test_a_submission_schedules_and_the_group_line_starts_up_or_restarts():
    s = swept([ev(E.SUBMITTED, 0), ev(E.WORKERS_STARTED, 5), ev(E.STEP, 9, 1, seconds=1.0),
               ev(E.FAILURE, 12), ev(E.WORKERS_RESTARTED, 15), ev(E.STEP, 20, 2, seconds=1.0)])
    assert s.base[:2] == [(0.0, 5.0, "scheduling"), (5.0, 9.0, "startup")]
    assert (12.0, 15.0, "restart") in s.base and (15.0, 20.0, "restart") in s.base


# -- the handlers ----------------------------------------------------------------------------------------
def test_a_step_said_by_rank_0_and_a_peer_counts_once_and_said_again_is_a_new_group():
    s = swept([ev(E.SUBMITTED, 0), ev(E.STEP, 10, 1, seconds=2.0), ev(E.PEER_STEP, 10.1, 1, rank=4),
               ev(E.STEP, 11, 2), ev(E.STEP, 12, 1, seconds=1.0)])
    assert (s.counted, s.replayed) == (2, 1)
    assert (8.0, 10.0, PRODUCTIVE) in s.intervals and (10.0, 11.0, PRODUCTIVE) in s.intervals
    assert (11.0, 12.0, "replayed") in s.intervals  # step 1 again: its group's previous step is 2


def test_a_peers_step_alone_counts_when_rank_0s_host_was_lost_first():
    s = swept([ev(E.SUBMITTED, 0), ev(E.STEP, 10, 1, seconds=1.0), ev(E.PEER_STEP, 11, 2, rank=4)])
    assert s.counted == 2 and s.max_done == 2


def test_a_step_the_old_group_finishes_after_the_loss_moves_the_loss_and_ends_nothing():
    s = swept([ev(E.SUBMITTED, 0), ev(E.STEP, 10, 4, seconds=1.0), ev(E.WORKER_LOST, 11, host="h1"),
               ev(E.PEER_STEP, 11.2, 5, rank=4)])
    [inc] = s.incidents
    assert inc is s.open  # still open at the timeline's end
    assert inc.lost_at_step == 5 and inc.recover_s is None  # not recovered yet


def test_recovery_is_the_first_step_of_a_new_group_with_what_was_replayed():
    s = swept([ev(E.SUBMITTED, 0), ev(E.STEP, 10, 7, seconds=1.0),
               ev(E.WORKER_LOST, 11, host="h1", by="chaos"), ev(E.FAILURE, 14, decision="RETRY"),
               ev(E.WORKERS_RESTARTED, 16), ev(E.RESTORE_STARTED, 18, 5), ev(E.RESTORED, 20, 5, seconds=2.0),
               ev(E.STEP, 30, 6, seconds=1.0)])
    [inc] = s.incidents
    assert inc == Incident(E.WORKER_LOST, 11.0, "chaos (h1)", 7, restored_from_step=5, replayed_steps=2,
                           recover_s=19.0, failures=1, detect_s=3.0, first_step=6)
    assert (14.0, 16.0, "restart") in s.base and (11.0, 14.0, "detection") in s.base
    assert (18.0, 20.0, "restore") in s.intervals
    assert (29.0, 30.0, "replayed") in s.intervals  # step 6 ran before the loss


def test_without_a_restore_event_the_step_restored_is_the_one_before_the_first_step():
    s = swept([ev(E.SUBMITTED, 0), ev(E.STEP, 10, 7, seconds=1.0), ev(E.RESIZE, 11, workers_from=2, workers=1),
               ev(E.WORKERS_RESTARTED, 13), ev(E.STEP, 20, 8, seconds=1.0)])
    [inc] = s.incidents
    assert (inc.kind, inc.restored_from_step, inc.replayed_steps, inc.first_step) == (E.RESIZE, 7, 0, 8)
    assert inc.by == "Ray Train resized the worker group 2 -> 1"


def test_a_stall_is_blamed_on_a_worker_hung_in_the_minute_before_it_and_ends_at_the_next_step():
    s = swept([ev(E.SUBMITTED, 0), ev(E.STEP, 10, 3, seconds=1.0), ev(E.WORKER_HUNG, 12, host="h0", by="chaos"),
               ev(E.STALL_STARTED, 40, since=10.0), ev(E.STEP, 70, 4, seconds=1.0)])
    [inc] = s.incidents
    assert (inc.kind, inc.by, inc.lost_at_step, inc.recover_s) == ("stall", "chaos (h0)", 3, 60.0)
    assert (10.0, 70.0, "stall") in s.intervals


def test_a_stall_said_twice_is_one_and_the_jobs_end_closes_it_not_recovered():
    s = swept([ev(E.SUBMITTED, 0), ev(E.STEP, 10, 3, seconds=1.0), ev(E.STALL_STARTED, 40, since=10.0),
               ev(E.STALL_STARTED, 50, since=10.0), ev(E.JOB_END, 55, status="FAILED")])
    assert [i.kind for i in s.incidents] == ["stall"]
    assert s.incidents[0].by == "no cause recorded" and s.incidents[0].recover_s is None
    assert s.incidents[0].ended == "job ended (FAILED)" and (10.0, 55.0, "stall") in s.intervals


@pytest.mark.parametrize("kind, cause", [(E.COMPILE_ENDED, "compile"), (E.CHECKPOINT_SAVED, "checkpoint")])
def test_compile_and_checkpoint_events_overlay_their_seconds_back_from_their_time(kind, cause):
    s = swept([ev(E.SUBMITTED, 0), ev(kind, 10, seconds=4.0), ev(E.JOB_END, 12)])
    assert s.intervals == [(6.0, 10.0, cause)]


def test_an_incident_not_recovered_from_is_reported_open():
    s = swept([ev(E.SUBMITTED, 0), ev(E.STEP, 10, 2, seconds=1.0), ev(E.WORKER_LOST, 11, host="h1")], end=30)
    [inc] = s.incidents
    assert inc.recover_s is None and inc.report()["recover_s"] is None
    assert s.base[-1] == (11.0, 30.0, "detection")
