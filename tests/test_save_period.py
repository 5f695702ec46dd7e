"""The checkpoint period: Young's and Daly's first-order optimum in steps,
what a loss replays at it, what a notice gives a save, the times a run
measured, and where a job's period comes from (auto, the inventory,
train_overrides, --set); a job that can be taken back saving before its
end, and `train` promising a resume only from a checkpoint it saves."""
from __future__ import annotations

import math

import pytest

from playbooks.config.choices import FLEX_START, ON_DEMAND, SPOT
from playbooks.core.errors import InputError
from playbooks.job import fit, memory, save_plan
from playbooks.job.save_period import (
    FALLBACK_PERIOD,
    Mtbi,
    Plan,
    Times,
    line,
    notice_text,
    optimum_seconds,
    period_steps,
    replay_text,
)
from playbooks.job.spec import build_job
from playbooks.runs import save_times
from tests.conftest import env

DAY = 86400.0


def test_the_optimum_is_the_square_root_of_twice_the_save_times_the_mtbi():
    # Young 1974: T = sqrt(2 x delta x M). A 60 s save, one interruption a day: 3220 s.
    assert optimum_seconds(60, DAY) == pytest.approx(math.sqrt(2 * 60 * DAY))
    assert round(optimum_seconds(60, DAY)) == 3220
    # Four times the save, twice the interval.
    assert optimum_seconds(240, DAY) == pytest.approx(2 * optimum_seconds(60, DAY))


def test_the_period_in_steps_is_rounded_and_held_between_one_and_the_jobs_steps():
    # 8 s saves, a day between interruptions, 2 s steps: 1175.8 s / 2 = 587.9 steps.
    assert period_steps(8, DAY, 2, 10_000) == 588
    assert period_steps(8, DAY, 2, 100) == 100          # at most the job's steps
    assert period_steps(0.001, 60, 100, 100) == 1        # at least one step
    assert period_steps(8, 3600, 2, 10_000) == 120      # an hour: sqrt(57600) = 240 s


def test_a_loss_replays_at_most_a_period_in_seconds_chip_hours_and_dollars():
    said = replay_text(100, 2.0, 32, (86.4, 86.4))       # 32 chips at $2.70
    assert said == "at most 100 steps (~200 s, 1.78 chip-hours, $4.80)"
    assert replay_text(100, 2.0, 32, (40.0, 86.4)).endswith("$2.22-4.80)")
    assert replay_text(100, 2.0, 32, None) == "at most 100 steps (~200 s, 1.78 chip-hours)"
    assert replay_text(10, None, 8, None) == "at most 10 steps (their time not known)"


def times(whole: float, measured: bool = True, save: float | None = None) -> Times:
    return Times(save if save is not None else whole, whole, 2.0, "basis", measured)


def test_a_spot_notice_holds_a_save_within_its_15_s_else_names_multi_tier_checkpointing():
    fits = notice_text(SPOT, times(14.0), "LOSS")
    assert "does end within its 15 s: a preemption replays no step" in fits
    short = notice_text(SPOT, times(24.1, measured=False), "at most 100 steps")
    assert "a save of ~24.1 s (estimate) does not end within its 15 s" in short
    assert "replays at most 100 steps" in short
    assert "enable_multi_tier_checkpointing=true" in short and "HighScaleCheckpointing" in short
    # measured without a finalization: the blocking part, a lower bound, said so
    assert "its blocking part: at least" in notice_text(SPOT, times(3.0), "L")
    assert "30 s of graceful termination, the first 15 s" in SPOT.notice
    # A Standard cluster from GKE 1.35.0-gke.1171000 lengthens it (tests/test_spot_grace.py).
    assert "120 s of graceful termination, the first 105 s" in env("dev", capacity="spot").options[0].notice


def test_the_other_options_say_the_notice_that_applies_and_the_twin_none():
    assert "host maintenance, announced days ahead" in notice_text(ON_DEMAND, times(500.0), "L")
    assert "max run duration, 7 days" in notice_text(FLEX_START, times(500.0), "L")
    assert "without a notice" in notice_text(None, times(1.0), "L")
    assert "no save measured or estimated" in notice_text(SPOT, None, "L")


def test_the_line_says_the_period_why_the_loss_and_each_notice():
    p = Plan(588, "auto", Times(8.0, 8.0, 2.0, "run r's", True), Mtbi(24.0, "spot's"), 10_000)
    said = line(p, (SPOT,), 32, (86.4, 86.4))
    assert said.startswith("checkpoint period: 588 steps (auto: sqrt(2 x 8 s a save x 24 h between interruptions) "
                           "= 1176 s / 2 s a step = 588 steps; measured: run r's; MTBI 24 h: spot's)")
    assert "a loss replays at most 588 steps (~1.18e+03 s, 10.5 chip-hours, $28.22)" in said
    assert "does end within its 15 s" in said


def test_a_run_measures_its_median_save_its_finalization_and_its_steps():
    evs = [{"t": 0, "kind": "workers_started", "workers": 2},
           *({"t": i, "kind": "step", "step": i, "seconds": s} for i, s in enumerate([30, 20, 1.0, 1.2, 1.4]))]
    assert save_times.of_run("r", evs) is None  # no save
    evs += [{"t": 9, "kind": "checkpoint_saved", "step": 5, "seconds": 0.5},
            {"t": 10, "kind": "checkpoint_saved", "step": 10, "seconds": 0.7},
            {"t": 11, "kind": "checkpoint_saved", "step": 15, "seconds": 0.9}]
    t = save_times.of_run("r", evs)
    assert (t.save_s, t.whole_s, t.step_s, t.measured) == (0.7, 0.7, 1.2, True)  # the compile's two steps left out
    assert "none recorded finalized" in t.basis
    evs += [{"t": 12, "kind": "checkpoint_finalized", "step": 5, "seconds": 3.0, "finalized": True},
            {"t": 13, "kind": "checkpoint_finalized", "step": 10, "seconds": 99.0, "finalized": False}]
    t = save_times.of_run("r", evs)
    assert t.whole_s == 3.0 and "3 s to finalized (1 saves)" in t.basis
    other = [{"t": 0, "kind": "model_check", "model": "llama3-70b"}, *evs]
    mine = [{"t": 0, "kind": "model_check", "model": "llama3-8b"}, *evs]
    assert save_times.newest([("a", other), ("b", mine)], "llama3-8b").basis.startswith("run b's")
    assert save_times.newest([("a", other), ("b", mine)]).basis.startswith("run a's")  # any model: the newest


def test_the_checkpoint_holds_the_weights_and_adams_two_moments():
    s = fit.settings(build_job(env("dev"), "llama3-8b"))
    assert memory.parameters(s) == 8_030_261_248  # MaxText's own count of llama3-8b
    assert memory.checkpoint_bytes(s) == 8_030_261_248 * 12  # float32 weights, mu and nu


def job_of(e, *sets: str):
    job = build_job(e, "llama3-8b", sets=list(sets))
    save_plan.apply(e, job, None)
    return job


def test_auto_puts_the_estimated_optimum_on_the_command_line():
    e = env("dev")
    job = job_of(e)
    assert job.save_plan.source == "auto" and not job.save_plan.times.measured
    assert job.argv()[-1] == "checkpoint_period=100"  # the optimum (thousands of steps) held at the job's 100
    measured = Times(0.5, 2.0, 1.5, "run r's", True)
    p = save_plan.plan(e, build_job(e, "llama3-8b", steps=100_000), measured)
    assert p.period == round(math.sqrt(2 * 0.5 * 720 * 3600) / 1.5) == 1073


def test_the_estimate_writes_one_copy_from_the_hosts_of_a_replica():
    e = env("dev")  # 2 slices of 4 hosts; the 8B job's DCN axis is data: each slice a copy
    t = save_plan.estimate(e, build_job(e, "llama3-8b"))
    assert t.save_s == pytest.approx(8_030_261_248 * 12 / 4e9)
    assert "(4 hosts x 1 GB/s, assumed)" in t.basis
    t70 = save_plan.estimate(e, build_job(e, "llama3-70b"))  # dcn_fsdp 2: one copy over both slices
    assert "(8 hosts x 1 GB/s, assumed)" in t70.basis


def test_the_period_comes_from_set_then_train_overrides_then_the_inventory_then_auto():
    assert job_of(env("dev", checkpoint_period=25)).save_plan.period == 25
    p = job_of(env("dev", checkpoint_period=25), "checkpoint_period=7").save_plan
    assert (p.period, p.source) == (7, "--set")
    local = job_of(env("local"))  # the shipped twin: train_overrides' 10
    assert (local.save_plan.period, local.save_plan.source) == (10, "train_overrides")
    assert local.argv().count("checkpoint_period=10") == 1
    bare = env("local", train_overrides={"steps": 20})  # nothing measured, nothing to estimate from
    assert job_of(bare).save_plan.period == FALLBACK_PERIOD


def test_the_mtbi_is_the_inventorys_else_the_shortest_of_the_capacity_options():
    assert save_plan.mtbi(env("dev")).hours == 720.0
    assert save_plan.mtbi(env("dev", capacity=["on-demand", "spot"])).hours == 24.0 / 8   # 2 x v6e-16: 8 Spot VMs
    m = save_plan.mtbi(env("dev", capacity="spot", interruption_mtbi_hours=6))
    assert (m.hours, m.basis) == (6.0, "interruption_mtbi_hours")


def test_spots_interval_is_each_vms_so_a_run_on_more_spot_vms_expects_more_interruptions():
    """A slice is lost when any of its VMs is preempted, each on its own: the
    run's MTBI is the assumed day per Spot VM / its VMs (slices x hosts per
    slice), said so; a figure that is not per VM (on-demand's assumed 30
    days, flex-start's 7-day end) and the inventory's own stay as they are."""
    one = save_plan.mtbi(env("dev", capacity="spot", slices=1, topology="2x2"))        # 1 x v6e-4: one VM
    two = save_plan.mtbi(env("dev", capacity="spot"))                                  # 2 x v6e-16: 8 VMs
    four = save_plan.mtbi(env("dev", capacity="spot", slices=4))                        # 4 x v6e-16: 16 VMs
    assert (one.hours, two.hours, four.hours) == (24.0, 3.0, 1.5)
    assert two.basis.startswith("spot's (24 h per VM / 8 VMs: a slice is lost when any of its VMs is), an "
                                "assumption (a day per Spot VM): Google publishes no Spot preemption rate"), two.basis
    assert save_plan.mtbi(env("dev", capacity="flex-start", slices=4)).hours == 168.0
    assert save_plan.mtbi(env("dev", capacity=["on-demand"], slices=4)).hours == 720.0
    assert save_plan.mtbi(env("dev", capacity="spot", slices=4, interruption_mtbi_hours=6)).hours == 6.0


def test_the_compile_does_not_depend_on_the_period():
    e = env("dev")
    a, b = job_of(e), job_of(e, "checkpoint_period=3")
    assert fit.compile_args(e, a) == fit.compile_args(e, b)
    assert not any(x.startswith("checkpoint_period=") for x in fit.compile_args(e, a))


@pytest.mark.parametrize("changes, words", [
    ({"checkpoint_period": 0}, ["key 'checkpoint_period' = 0", "must be auto", "a whole number of steps >= 1"]),
    ({"checkpoint_period": "often"}, ["'often'", "must be auto"]),
    ({"checkpoint_period": True}, ["= True", "must be auto"]),
    ({"checkpoint_period": 50, "train_overrides": {"checkpoint_period": 10}},
     ["= 50", "train_overrides.checkpoint_period = 10 say two things: give one"]),
    ({"interruption_mtbi_hours": 0}, ["key 'interruption_mtbi_hours' = 0", "above 0"]),
    ({"interruption_mtbi_hours": -3.5}, ["= -3.5", "above 0 and at most 87600"]),
])
def test_a_bad_period_or_mtbi_is_refused_in_one_line(changes, words):
    with pytest.raises(InputError) as got:
        env("dev", **changes)
    said = str(got.value)
    assert "\n" not in said and all(w in said for w in words), said


# -- a job that can be taken back saves before its end (issue 64, item 2) ------------------------
def preemption_line(e, job) -> str:
    """What `train` says before a job on preemptible capacity (its one step's reason)."""
    from playbooks.plays import train
    [step] = train.preemption_note(e, job)
    return step.decide(lambda fact: None).reason


def mid_saves(period: int, steps: int) -> list[int]:
    """The steps MaxText saves strictly between step 0 and the last step (``runs/saves.py``'s schedule)."""
    from playbooks.runs.saves import Schedule, periodic
    s = Schedule(period, True, steps)
    return [i for i in range(1, steps - 1) if periodic(i, s)]


@pytest.mark.parametrize("capacity", ["spot", "flex-start", ["reservation", "spot"], ["spot", "on-demand"]])
def test_auto_on_capacity_that_can_be_taken_back_saves_before_the_jobs_last_step(capacity):
    # The default 100-step job: the optimum (949 steps on Spot, 2511 on flex-start) held at half the job.
    e = env("dev", capacity=capacity, **({"reservation": "r1"} if "reservation" in capacity else {}))
    job = job_of(e)
    assert job.argv()[-1] == "checkpoint_period=50" and job.save_plan.first_save == 50
    assert mid_saves(job.save_plan.period, 100) == [50]
    assert "at most 50: half the job's 100 steps, as " in line(job.save_plan, e.options, 32, None)
    assert "capacity can be taken back" in line(job.save_plan, e.options, 32, None)
    # Whatever the job's length, a save lands between step 0's and the last step's.
    for steps in (3, 4, 5, 7, 10, 99, 100, 101, 1000):
        p = save_plan.plan(e, build_job(e, "llama3-8b", steps=steps), None)
        assert p.period < steps - 1 and mid_saves(p.period, steps), (steps, p.period)
    # An optimum shorter than half the job is kept: 0.5 s saves, 1.5 s steps, 100,000 steps (Spot's 24 h: 196).
    long = save_plan.plan(e, build_job(e, "llama3-8b", steps=100_000), Times(0.5, 2.0, 1.5, "run r's", True))
    assert long.period == round(math.sqrt(2 * 0.5 * save_plan.mtbi(e).hours * 3600) / 1.5) < 50_000


def test_auto_where_nothing_takes_the_tpus_back_is_still_held_at_the_jobs_steps():
    job = job_of(env("dev", capacity="on-demand"))
    assert job.argv()[-1] == "checkpoint_period=100" and job.save_plan.first_save is None
    assert "at most the job's 100;" in line(job.save_plan, (ON_DEMAND,), 32, None)


def test_the_twins_auto_period_saves_before_the_end_as_chaos_takes_its_hosts():
    short = job_of(env("local", train_overrides={"steps": 6}))  # nothing to estimate from: the fallback's 10
    assert short.argv()[-1] == "checkpoint_period=3" and short.save_plan.first_save == 3
    assert "10 steps until a run measures them, at most 3: half the job's 6 steps, as the chaos tasks take the " \
           "local twin's hosts" in line(short.save_plan, (None,), 8, None)
    assert job_of(env("local", train_overrides={"steps": 40})).save_plan.period == FALLBACK_PERIOD


def test_train_promises_a_resume_from_a_checkpoint_only_where_one_is_saved_before_the_end():
    # Spot's default 15 s (a cluster older than 1.35.0-gke.1171000): the 8B save's estimate does not end within it.
    e = env("dev", capacity="spot", cluster_version="1.34.1-gke.1829001")
    said = preemption_line(e, job_of(e))
    assert "a preemption ends this job (run again, it resumes from its last checkpoint, saved every 50 steps: at " \
           "most 50 steps replayed)" in said
    # A period the user chose at or past the job's last step: no checkpoint before it, said so.
    for period in (99, 100):
        said = preemption_line(e, job_of(e, f"checkpoint_period={period}"))
        assert "resumes from its last checkpoint" not in said
        assert (f"a preemption before the save of step 99, the job's last, ends this job, and run again it starts "
                f"over where it started (step 0 for a new run): checkpoint_period={period} (from --set) saves no "
                f"checkpoint before it; checkpoint_period=50 would save at step 50") in said
    assert "saved every 98 steps" in preemption_line(e, job_of(e, "checkpoint_period=98"))  # step 98: before 99
    said = preemption_line(e, job_of(env("dev", capacity="spot", checkpoint_period=500)))
    assert "before the save of step 99" in said and "(from the inventory's checkpoint_period)" in said
    # A job of one step: nothing but its own save, no period to suggest.
    one = job_of(e, "steps=1")
    assert one.steps == 1
    said = preemption_line(e, one)
    assert "a preemption before the save of step 0, the job's last, ends this job, and run again it starts over" \
           in said and "would save" not in said and "resumes from its last" not in said


def test_a_save_that_ends_within_the_spot_notice_is_the_one_resumed_from():
    e = env("dev", capacity=["spot", "flex-start"])
    job = build_job(e, "llama3-8b", sets=["checkpoint_period=100"])
    save_plan.apply(e, job, Times(4.0, 5.0, 2.0, "run r's", True))
    said = preemption_line(e, job)
    assert ("a preemption (of a spot or flex-start slice) before the save of step 99, the job's last, ends this "
            "job, and run again it starts over where it started (step 0 for a new run; but a spot notice's save, ~5 "
            "s (measured), ends within the notice: run again, it resumes from that save)") in said
    save_plan.apply(e, job, Times(110.0, 110.0, 2.0, "run r's", True))  # longer than the Spot pools' 105 s
    assert "resumes from that save" not in preemption_line(e, job)
