"""Every second of a run's ledger at the time it happened: Ray's lines
(which carry no time) read after a dropped port-forward keep their place
(one incident, at its real time; the chips change when the new group
started), and say how uncertain they are; a stall the follower stopped is
not a recovery, its replayed steps counted when the next job resumes; the
time between jobs is neither scheduling nor the job's."""
from __future__ import annotations

import json

import pytest

from playbooks.runs import cost, goodput, timeline

T0 = 1_800_000_000.0
PF_DROPS, RECONNECT = 42.0, 342.0  # the port-forward down for 300 s (reconnect_timeout's default)


def trainer(t: float, kind: str, step: int | None = None, **fields) -> str:
    e = {"t": T0 + t, "kind": kind, "step": step, **fields}
    return f"\x1b[36m(RayTrainWorker pid=7)\x1b[0m trainer event: {json.dumps(e)}"


def ctl(text: str) -> str:
    return f"\x1b[36m(TrainController pid=3)\x1b[0m {text}"


def recorded_log() -> list[tuple[float, str]]:
    """(real time written, line) of a job's log: two workers, steps 0-15,
    the port-forward drops; while it is down a host is lost (Ray marks its
    node dead, Ray Train retries with one worker, restores step 10 and goes
    on); read again when the port-forward is back."""
    out = [(10.2, ctl("Started training worker group of size 2: ")),
           (10.0, trainer(10.0, "worker_started", rank=0, workers=2, slice="s0", host="0")),
           (10.1, trainer(10.1, "worker_started", rank=1, workers=2, slice="s1", host="0")),
           (10.0, trainer(10.0, "jax_initialized", workers=2, steps=40))]
    out += [(26.0 + s, trainer(26.0 + s, "step", s, seconds=1.0 if s else 16.0)) for s in range(16)]
    out += [(47.0, "(raylet) The node with node id: abc and address: 10.0.0.4 and node name: 10.0.0.4 has been "
                   "marked dead because the detector has missed too many heartbeats from it. This can happen"),
            (48.0, ctl("[FailurePolicy] RETRY")), (48.0, ctl("  Source: worker group")),
            (48.0, ctl("  Error count: 1 (max allowed: 3)")), (48.0, ctl("Error: Training failed due to worker errors:")),
            (60.0, trainer(60.0, "worker_started", rank=0, workers=1, slice="s0", host="0")),
            (60.2, ctl("Started training worker group of size 1: ")),
            (60.0, trainer(60.0, "jax_initialized", workers=1, steps=40)),
            (65.0, trainer(65.0, "restore_started", 10)), (66.0, trainer(66.0, "restored", 10, seconds=1.0)),
            (80.0, trainer(80.0, "step", 11, seconds=14.0)),
            (80.0, trainer(80.0, "first_step_after_restore", 11, restored_from=10))]
    out += [(81.0 + i, trainer(81.0 + i, "step", s, seconds=1.0)) for i, s in enumerate(range(12, 40))]
    return out


def replay(lines: list[tuple[float, str]], watch_every: float | None = None) -> list[dict]:
    """The log through the follower's reader: a line written before the
    port-forward dropped is read 0.3 s after it was written; one written
    while it was down, at the reconnect; later ones live again."""
    now = [T0]
    r = timeline.Reader("run-1", clock=lambda: now[0])
    out: list[dict] = []
    reconnected = False
    for written, line in sorted(lines, key=lambda x: x[0]) if False else lines:
        read = written + 0.3 if written < PF_DROPS or written > RECONNECT else RECONNECT
        if read >= RECONNECT and not reconnected:
            now[0] = T0 + RECONNECT
            r.reconnected()
            reconnected = True
        now[0] = max(now[0], T0 + read)
        out += r.feed(line)
    return out + r.end()


def chaos_lost() -> dict:
    """The chaos task's own record of the host it killed, at its real time."""
    return {"t": T0 + 45.0, "kind": "worker_lost", "step": None, "source": "chaos", "job": "run-1", "by": "chaos",
            "host": "s1"}


def timeline_of(read: list[dict]) -> list[dict]:
    return [{"t": T0, "kind": "submitted", "step": None, "source": "train", "job": "run-1", "n": 1}, *read,
            chaos_lost(), {"t": T0 + 120.0, "kind": "job_end", "step": 39, "source": "train", "job": "run-1",
                           "status": "SUCCEEDED", "n": 1}]


def test_a_loss_while_the_port_forward_was_down_is_one_incident_at_its_real_time():
    events = timeline_of(replay(recorded_log()))
    by = {(e["kind"], e.get("n")): e for e in events if e["source"] in ("ray", "ray_train")}
    # The groups at the trainer's own start of each, not at the reconnect.
    assert by[("workers_started", 1)]["t"] == T0 + 10.0
    restarted = by[("workers_restarted", 1)]
    assert (restarted["t"], restarted["t_from"], restarted["t_read"]) == (T0 + 60.0, "trainer", T0 + RECONNECT)
    # The failure and the node marked dead: between the last step before
    # them (15, at 41) and the new group's start (60), and saying so.
    for kind in ("failure", "worker_lost"):
        e = by[(kind, 1)]
        assert e["t_from"] == "between" and T0 + 41.0 <= e["t"] <= T0 + 60.0, e
        assert e["t_uncertain_s"] == pytest.approx(9.5) and e["t_read"] == T0 + RECONNECT
    r = goodput.account(events, "run")
    [i] = r["incidents"]
    assert (i["kind"], i["at"], i["lost_at_step"], i["restored_from_step"], i["replayed_steps"]) == (
        "worker_lost", T0 + 45.0, 15, 10, 5)
    assert i["recover_s"] == pytest.approx(35.0)
    # How uncertain: the two events' windows, in the report and its text.
    u = r["uncertain"]
    assert [e["kind"] for e in u["events"]] == ["worker_lost", "failure"]
    assert all(e["within_s"] == pytest.approx(9.5) for e in u["events"])
    assert u["seconds"] == pytest.approx(19.0)
    text = "\n".join(goodput.lines(r))
    assert "times not exact: 2 of Ray's lines" in text and "+/-9.5 s" in text and "up to 19.0 s" in text
    # The chips: both slices' until the host was lost at 45 (its real time),
    # then one's, the new group's from 60; nothing changes at the reconnect.
    basis = cost.Basis(slices=2, hosts_per_slice=1, chips_per_host=4)
    periods = [(p.t, p.billed.k * 4, p.used.k * 4) for p in cost.ledger(timeline.ordered(events), basis)][1:]
    assert periods == [(T0 + 10.0, 8, 8), (T0 + 45.0, 4, 4), (T0 + 60.0, 4, 4), (T0 + 120.0, 4, 0)]


def test_read_as_it_is_written_a_line_keeps_the_time_it_was_read():
    lines = recorded_log()
    live = [(w, ln) for w, ln in lines]
    now = [T0]
    r = timeline.Reader("run-1", clock=lambda: now[0])
    out = []
    for written, line in live:
        now[0] = max(now[0], T0 + written + 0.3)
        out += r.feed(line)
    failure = next(e for e in out if e["kind"] == "failure")
    assert (failure["t"], failure["t_from"]) == (T0 + 48.3, "read") and "t_uncertain_s" not in failure
    assert not goodput.account(timeline_of(out))["uncertain"]["events"]


def test_a_line_held_for_its_bound_is_timed_after_a_while_without_one():
    now = [T0 + 100.0]
    r = timeline.Reader("run-1", clock=lambda: now[0])
    assert r.feed(trainer(99.9, "step", 3, seconds=1.0))[0]["kind"] == "step"
    r.reconnected()
    now[0] = T0 + 400.0
    assert r.feed(ctl("[FailurePolicy] RETRY")) == [] and r.feed(ctl("Error: boom")) == []
    assert r.flush(T0 + 401.0) == []  # not yet: a trainer event may bound it
    [e] = r.flush(T0 + 400.0 + timeline.HOLD_S)
    assert e["kind"] == "failure" and e["t_from"] == "between" and e["t"] == pytest.approx(T0 + 249.95, abs=0.01)
    assert e["t_uncertain_s"] == pytest.approx(150.05)


# -- a stall the follower stopped, resumed by the next job ---------------------------------------
def ev(t: float, kind: str, step: int | None = None, job: str = "run-1", **fields) -> dict:
    return {"t": T0 + t, "kind": kind, "step": step, "source": "test", "job": job, **fields}


def hang_stop() -> list[dict]:
    """The soak's hang-stop: steps to 16 (a save at 10), a worker hung, the
    stall said and the job stopped (stall_action: stop); `invoke train`
    resumes the run from checkpoint 10 in a second job."""
    j1 = [ev(0, "submitted"), ev(10, "workers_started", workers=2), ev(10, "worker_started", workers=2),
          ev(10, "jax_initialized", workers=2), ev(26, "step", 0, seconds=16.0),
          *[ev(26 + s, "step", s, seconds=1.0) for s in range(1, 17)], ev(36.5, "checkpoint_saved", 10, seconds=0.3),
          ev(43, "worker_hung", by="chaos", host="s1"), ev(103, "stall_started", 16, since=T0 + 42.0),
          ev(103.5, "stopped", 16, by="stall_action: stop"), ev(105, "job_end", 16, status="STOPPED")]
    j2 = [ev(300, "submitted", job="run-2"), ev(330, "workers_started", job="run-2", workers=2),
          ev(330, "worker_started", job="run-2", workers=2), ev(331, "jax_initialized", job="run-2", workers=2),
          ev(335, "restore_started", 10, job="run-2"), ev(336, "restored", 10, job="run-2", seconds=1.0),
          ev(350, "step", 11, job="run-2", seconds=14.0),
          ev(350, "first_step_after_restore", 11, job="run-2", restored_from=10),
          *[ev(351 + i, "step", s, job="run-2", seconds=1.0) for i, s in enumerate(range(12, 31))],
          ev(371, "job_end", 30, job="run-2", status="SUCCEEDED")]
    return j1 + j2


def test_a_stall_the_follower_stopped_is_not_a_recovery_and_the_next_job_replays_its_steps():
    r = goodput.account(hang_stop(), "run")
    [i] = r["incidents"]
    assert (i["kind"], i["lost_at_step"], i["restored_from_step"], i["replayed_steps"]) == ("stall", 16, 10, 6)
    assert i["ended"] == "stopped (stall_action: stop)" and i["recover_s"] is None
    assert i["resumed_s"] == pytest.approx(350.0 - 42.0)
    assert r["steps"]["replayed"] == 6
    text = "\n".join(goodput.lines(r))
    assert "6 steps replayed" in text and "not recovered: stopped (stall_action: stop)" in text
    assert "recovered in" not in text


def test_a_stall_the_jobs_end_ended_is_not_recovered_and_says_so_when_no_job_resumed_it():
    evs = [e for e in hang_stop() if e["job"] == "run-1" and e["kind"] != "stopped"]
    [i] = goodput.account(evs, "run")["incidents"]
    assert i["ended"] == "job ended (STOPPED)" and i["recover_s"] is None and i["replayed_steps"] is None
    assert "resumed_s" not in i


def test_the_time_between_jobs_is_its_own_and_scheduling_only_from_a_submit_to_its_group():
    r = goodput.account(hang_stop(), "run")
    assert r["badput_s"]["between_jobs"] == pytest.approx(300.0 - 105.0)
    assert r["badput_s"]["scheduling"] == pytest.approx(10.0 + 30.0)
    assert r["badput_s"]["other"] == pytest.approx(2.0)  # the second job's last step to its end
    segs = goodput.segments(hang_stop())
    assert (T0 + 105.0, T0 + 300.0, "between_jobs") in segs


def test_the_cost_says_how_many_chip_hours_its_uncertain_times_may_move_between_causes():
    """Ray's failure and node-dead lines read after the reconnect are timed
    within +/-9.5 s (41-60 s): the chips billed in that window (8 until the
    loss at 45, 4 after) may belong to the cause beside theirs."""
    events = timeline_of(replay(recorded_log()))
    r, segs = goodput.account_with_segments(events, "run")
    basis = cost.Basis(slices=2, hosts_per_slice=1, chips_per_host=4, options=["on-demand", "spot"],
                       rates=[2.0, 1.0])
    c = cost.report(events, segs, goodput.CAUSES, basis, True, r["uncertain"])
    assert c["uncertain_chip_hours"] == pytest.approx(round((4 * 8 + 15 * 4) / 3600, 4))
    assert "of the causes' below may belong to the cause beside theirs" in "\n".join(cost.header_lines(c))
    # Read live, no line is uncertain: nothing said.
    assert "uncertain_chip_hours" not in cost.report(events, segs, goodput.CAUSES, basis, True, None)
