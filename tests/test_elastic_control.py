"""The elastic trainer's additions to Ray Train's controller
(trainer/elastic_control.py) and what they read of MaxText (its progress,
its stop on a preemption notice), each cause on its own: Ray's real
classes and MaxText 0.2.5's real log lines, Ray's calls answered in the
test. The whole of it runs in the e2e and the soak (bench/soak.py)."""
import json
import sys

import pytest

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "trainer"))
import elastic_control as ec
from ray.exceptions import ActorDiedError, GetTimeoutError, NodeDiedError, RayActorError, RaySystemError
from ray.train.v2._internal.exceptions import WorkerGroupStartupFailedError
from ray.train.v2._internal.execution.controller.state import (
    ResizingState,
    RestartingState,
    RunningState,
)
from ray.train.v2._internal.execution.failure_handling import FailureDecision
from ray.train.v2._internal.execution.scaling_policy import ResizeDecision

import maxtext_ray as mr

# MaxText 0.2.5's own lines (as a worker logged them) when a SIGTERM reached
# rank 0 after step 19: the hosts agree on step 20, save it, stop, and only
# then log step 19 (its metrics are one step behind).
STOP_ON_NOTICE = [
    "completed step: 18, seconds: 0.399, TFLOP/s/device: 0.003, Tokens/s/device: 321.138, total_weights: 1024, "
    "loss: 6.985, lm_loss: 6.985, perplexity: 1079.869",
    "Waiting for step 20 to finish before checkpoint...",
    "Waited 0.7485098838806152 seconds for step 20 to finish before starting checkpointing.",
    "[process=0] Saving checkpoint at step 20 due to preemption.",
    "[process=0] Saving checkpoint at step 20",
    "Started an asynchronous checkpoint save for step 20",
    "Training stopped: Job received termination signal (SIGTERM).",
    "completed step: 19, seconds: 0.382, TFLOP/s/device: 0.003, Tokens/s/device: 334.792, total_weights: 1024, "
    "loss: 6.961, lm_loss: 6.961, perplexity: 1054.297",
]


def progress_of(lines) -> mr.Progress:
    p = mr.Progress()
    for line in lines:
        p.line(line)
    return p


# -- a new group of a run already finished --------------------------------------
def test_a_new_group_of_a_run_whose_checkpoint_holds_its_last_step_is_done_not_failed():
    """The soak's in-save, rep 3: the grow came as the last step was saved;
    the new group's MaxText refused to start, and Ray Train retried that
    until the job FAILED with every step trained."""
    done = RuntimeError("Requested training up to step 40, but a checkpoint already exists at step 39 (which means "
                        "40 steps have been completed). Did you mean to continue training past step 40 ...")
    assert mr.already_done(done)
    assert not mr.already_done(RuntimeError("Requested training up to step 40, but a checkpoint already exists "
                                            "at step 30"))
    assert not mr.already_done(RuntimeError("some other failure"))


# -- MaxText stopped by a preemption notice --------------------------------------
def test_a_stop_on_a_preemption_notice_before_the_last_step_is_a_failure_not_a_finished_run():
    p = progress_of(STOP_ON_NOTICE)
    assert p.state() == {"last_step": 19, "last_saved": 20, "save_pending": True,
                         "stopped": "Job received termination signal (SIGTERM).",
                         "stopped_for_notice": True, "ended": False}
    with pytest.raises(mr.StoppedEarly, match=r"after step 20 of 40 .*checkpoint at step 20 is saved"):
        mr.stopped_early(40, p)
    mr.stopped_early(21, p)  # the save was of the last step: the run is done


def test_other_stops_and_a_run_to_its_end_are_not_failures():
    mr.stopped_early(40, progress_of(STOP_ON_NOTICE[:1]))  # MaxText ran its steps (no stop line)
    target = progress_of([*STOP_ON_NOTICE[:1], "Training stopped: Target loss self.config.target_eval_loss=2.0 "
                                               "is achieved."])
    assert not target.for_notice
    mr.stopped_early(40, target)


def test_the_step_saved_on_a_notice_is_a_step_of_the_timeline_after_the_last_logged_one(capsys):
    """MaxText logs step 19 after it stopped, and never step 20, whose
    save came first: rank 0's events say 20 ran, after 19's line."""
    h = mr.MaxTextEvents()
    times = [100.0, 100.4, 100.5, 100.6, 100.6, 100.7, 100.8, 101.2]
    for line, t in zip(STOP_ON_NOTICE, times):
        h.line(line, t)
    capsys.readouterr()
    e = h.finish()
    assert e is not None and (e["kind"], e["step"], e["seconds"]) == ("step", 20, None)
    assert e["t"] == pytest.approx(101.201) and "preemption notice" in e["unlogged"]
    assert json.loads(capsys.readouterr().out[len(mr.EVENT):]) == e
    assert h.finish() is None  # said once


def test_no_step_is_added_without_a_stop_on_a_notice(capsys):
    h = mr.MaxTextEvents()
    for line in [*STOP_ON_NOTICE[:6], STOP_ON_NOTICE[7]]:
        h.line(line, 100.0)
    assert h.finish() is None


# -- FreshClusterView: a retry sized from the hosts alive ------------------------
class Clock:
    def __init__(self):
        self.t = 0.0

    def monotonic(self):
        return self.t

    def time(self):
        return 1_000_000.0 + self.t

    def sleep(self, s):
        self.t += s


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(ec.time, "monotonic", c.monotonic)
    monkeypatch.setattr(ec.time, "time", c.time)
    monkeypatch.setattr(ec.time, "sleep", c.sleep)
    return c


def node(alive, port):
    return {"Alive": alive, "NodeManagerAddress": "127.0.0.2", "NodeManagerPort": port}


def test_a_retry_waits_until_ray_marks_dead_the_host_that_no_longer_answers_then_looks_again(monkeypatch, clock,
                                                                                            capsys):
    """Host a was killed (its raylet refuses), host b lives: Ray still lists
    a as alive for 3 s; the retry waits that long, not for b, then has the
    coordinator look afresh."""
    view = ec.FreshClusterView()
    view.nodes = {"a", "b"}
    monkeypatch.setattr(ec, "answers", lambda addr, port: port == 2)
    monkeypatch.setattr(ec, "gcs_nodes", lambda: {"a": node(clock.t < 3, 1), "b": node(True, 2)})
    looks = []
    monkeypatch.setattr(view, "look_again", lambda: looks.append(clock.t) or True)
    view.before_controller_execute_failure_decision(FailureDecision.RAISE)
    assert looks == [] and clock.t == 0  # no retry: nothing to size
    view.before_controller_execute_failure_decision(FailureDecision.RETRY)
    assert looks == [3.0]
    e = json.loads(capsys.readouterr().out.splitlines()[-1][len(mr.EVENT):])
    assert (e["kind"], e["nodes_gone"], e["seconds"]) == ("cluster_view", 1, 3.0)


def test_the_wait_for_a_host_ray_never_marks_dead_is_bounded(monkeypatch, clock):
    monkeypatch.setenv(ec.ENV_LOSS_SETTLE, "4")
    view = ec.FreshClusterView()
    view.nodes = {"a"}
    monkeypatch.setattr(ec, "answers", lambda addr, port: False)
    monkeypatch.setattr(ec, "gcs_nodes", lambda: {"a": node(True, 1)})
    assert view.settle() == (["a"], []) and 4.0 <= clock.t <= 4.5


def test_a_host_that_answers_or_that_ray_has_marked_dead_is_not_waited_for(monkeypatch, clock):
    view = ec.FreshClusterView()
    view.nodes = {"a", "b", "c"}
    monkeypatch.setattr(ec, "answers", lambda addr, port: port == 1)
    monkeypatch.setattr(ec, "gcs_nodes", lambda: {"a": node(True, 1), "b": node(False, 2)})  # c: not listed
    assert view.settle() == ([], []) and clock.t == 0


def test_a_retry_after_a_notice_waits_for_the_drained_host_to_go_until_its_deadline(monkeypatch, clock, capsys):
    """Host a was given a notice (Ray drains it; it still answers and lives
    until its deadline, 15 s on): a retry placed now would land on it and
    be lost with it. The retry waits until Ray marks it dead (at 12 s),
    bounded by the deadline plus the settle time; host b is not waited for."""
    view = ec.FreshClusterView()
    view.nodes = {"a", "b"}
    monkeypatch.setattr(ec, "answers", lambda addr, port: True)
    monkeypatch.setattr(ec, "gcs_nodes", lambda: {"a": node(clock.t < 12, 1), "b": node(True, 2)})
    deadline_ms = (1_000_000.0 + 15) * 1000
    monkeypatch.setattr(ec, "draining", lambda: {"a": deadline_ms, "z": 0})  # z: not this group's
    monkeypatch.setattr(view, "look_again", lambda: True)
    view.before_controller_execute_failure_decision(FailureDecision.RETRY)
    e = json.loads(capsys.readouterr().out.splitlines()[-1][len(mr.EVENT):])
    assert (e["nodes_gone"], e["nodes_drained"], e["seconds"]) == (0, 1, 12.0)
    # A drained host that never goes: the wait ends at its deadline plus the settle time.
    monkeypatch.setenv(ec.ENV_LOSS_SETTLE, "4")
    monkeypatch.setattr(ec, "gcs_nodes", lambda: {"a": node(True, 1), "b": node(True, 2)})
    clock.t = 0.0
    assert view.settle() == ([], ["a"]) and 19.0 <= clock.t <= 19.5


def test_a_group_ended_by_a_notice_is_a_preemption_not_a_failure_of_the_budget(capsys):
    """Ray Train's controller waits out a notice in its PreemptingState and
    counts the restart as a preemption; so does the budget: ten notices in
    an hour leave the job's three failures whole."""
    from ray.train.v2._internal.execution.controller.state import PreemptingState
    from ray.train.v2.api.preemption import PreemptionInfo
    b = ec.FailureBudget(3, 3600.0, clock=lambda: 0.0)
    preempting = PreemptingState(preemption_info=PreemptionInfo(deadline_ms=None, preempted_node_to_ranks={}),
                                 detected_at_s=0.0)
    for _ in range(10):
        b.after_controller_state_update(RunningState(), preempting)
        b.before_controller_execute_failure_decision(FailureDecision.RETRY)
    assert (len(b.times), b.preemptions) == (0, 10)
    b.after_controller_state_update(preempting, RunningState())
    b.before_controller_execute_failure_decision(FailureDecision.RETRY)  # a loss with no notice: the job's
    assert (len(b.times), b.preemptions) == (1, 10)
    events = [json.loads(line.split("trainer event: ", 1)[1]) for line in capsys.readouterr().out.splitlines()
              if "trainer event: " in line]
    assert [e.get("preemptions") for e in events] == list(range(1, 11)) + [None]


def test_a_real_raylet_port_answers_and_a_closed_one_does_not():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert ec.answers("127.0.0.1", port)
    assert not ec.answers("127.0.0.1", port, timeout=0.5)


def test_while_a_group_runs_the_view_is_made_afresh_before_each_resize_look(monkeypatch, clock):
    view = ec.FreshClusterView()
    view.every = 5.0
    looks = []
    monkeypatch.setattr(view, "look_again", lambda: looks.append(clock.t) or setattr(view, "last_look", clock.t))
    for t in range(0, 13):
        clock.t = float(t)
        view.after_controller_state_update(None, RunningState())
    view.after_controller_state_update(None, RestartingState(training_failed_error=None))
    assert looks == [5.0, 10.0]


# -- SaveBeforeResize: a grow replays no step -------------------------------------
class Worker:
    """A worker of the group: execute_async runs the function here (ray.get is the identity)."""

    def __init__(self, progress, rank):
        self.progress, self.calls = progress, []
        self.distributed_context = type("D", (), {"world_rank": rank})()

    def execute_async(self, fn):
        self.calls.append(fn.__name__)
        if fn is mr.preemption_notice:
            self.progress["noticed"] = True
            return True
        return dict(self.progress)


class Group:
    def __init__(self, workers):
        self.workers = workers

    def get_workers(self):
        return self.workers


def saver(monkeypatch, *progresses):
    monkeypatch.setattr(ec.ray, "get", lambda x, timeout=None: x)
    workers = [Worker(p, i) for i, p in enumerate(progresses)]
    s = ec.SaveBeforeResize()
    s.after_worker_group_start(Group(list(reversed(workers))))
    return s, workers


def grow():
    return ResizeDecision(num_workers=4, resources_per_worker={"TPU": 4})


def events(capsys):
    return [json.loads(ln[len(mr.EVENT):]) for ln in capsys.readouterr().out.splitlines() if ln.startswith(mr.EVENT)]


def test_a_grow_of_a_running_group_saves_first_and_waits_for_every_host_to_stop(monkeypatch, clock, capsys):
    rank0 = {"last_step": 18, "last_saved": 10, "ended": False}
    s, (w0, w1) = saver(monkeypatch, rank0, {"ended": True})

    real_sleep = clock.sleep

    def sleep(t):  # the hosts stop 1 s after the notice, rank 0 saved step 20
        real_sleep(t)
        if clock.t >= 1:
            rank0.update(ended=True, last_saved=20, stopped_for_notice=True)
    monkeypatch.setattr(ec.time, "sleep", sleep)
    s.after_controller_state_update(None, ResizingState(scaling_decision=grow()))
    s.before_controller_execute_resize_decision(grow())
    assert w0.calls[:2] == ["progress", "preemption_notice"] and "preemption_notice" not in w1.calls
    e = events(capsys)[-1]
    assert (e["kind"], e["step"], e["asked_after"], e["outcome"], e["workers_from"], e["workers"]) == \
        ("save_before_resize", 20, 18, "saved", 2, 4)


def test_a_resize_after_a_failure_or_of_a_group_with_nothing_new_saves_nothing(monkeypatch, clock, capsys):
    s, (w0,) = saver(monkeypatch, {"last_step": 18, "last_saved": 10, "ended": False})
    s.before_controller_execute_resize_decision(grow())  # a restart after a failure: no ResizingState came
    assert w0.calls == []
    s.after_controller_state_update(None, ResizingState(scaling_decision=grow()))
    w0.progress.update(last_saved=18)
    s.before_controller_execute_resize_decision(grow())
    assert w0.calls == ["progress"]
    assert events(capsys)[-1]["outcome"] == "not needed: nothing new since its last save"
    # A save of the last step only started (asynchronous, not finalized): asked.
    s.after_controller_state_update(None, ResizingState(scaling_decision=grow()))
    w0.progress.update(save_pending=True)
    asked = len(w0.calls)
    s.before_controller_execute_resize_decision(grow())
    assert w0.calls[asked:asked + 2] == ["progress", "preemption_notice"]
    s.after_controller_state_update(None, ResizingState(scaling_decision=grow()))
    w0.progress.update(last_step=None, last_saved=None, save_pending=False)
    s.before_controller_execute_resize_decision(grow())
    assert events(capsys)[-1]["outcome"] == "not needed: no step since its start"


def test_a_save_that_does_not_come_is_waited_for_only_as_long_as_the_timeout(monkeypatch, clock, capsys):
    monkeypatch.setenv(ec.ENV_SAVE_TIMEOUT, "7")
    s, _ = saver(monkeypatch, {"last_step": 18, "last_saved": 10, "ended": False})
    s.after_controller_state_update(None, ResizingState(scaling_decision=grow()))
    s.before_controller_execute_resize_decision(grow())
    e = events(capsys)[-1]
    assert e["outcome"] == "no save within the timeout" and e["step"] is None and 7 <= clock.t <= 8
    # A group that ends without stopping for the notice (it trained on to its
    # last step) is said as that, not as a timeout; a worker gone, as that.
    s, (w0,) = saver(monkeypatch, {"last_step": 18, "last_saved": 10, "ended": False})
    monkeypatch.setattr(ec.time, "sleep", lambda t: w0.progress.update(ended=True, last_step=39, last_saved=39))
    s.after_controller_state_update(None, ResizingState(scaling_decision=grow()))
    s.before_controller_execute_resize_decision(grow())
    e = events(capsys)[-1]
    assert e["outcome"] == "no save: MaxText ran on to step 39 and ended, not stopping at the notice" and e["step"] is None


class Unanswered(Worker):
    """A worker whose looks after the notice raise ``error`` (ray.get raises it)."""

    def __init__(self, progress, rank, error):
        super().__init__(progress, rank)
        self.error = error

    def execute_async(self, fn):
        if fn is mr.progress and self.progress.get("noticed"):
            raise self.error
        return super().execute_async(fn)


@pytest.mark.parametrize("error, said", [
    (ActorDiedError(), "no save: a worker is gone (ActorDiedError)"),
    (NodeDiedError("node 1 died"), "no save: a worker is gone (NodeDiedError)"),
    (GetTimeoutError("timed out"), "no save: a worker did not answer within 30 s"),
    (ValueError("bad progress"), "no save: the workers could not be asked (ValueError: bad progress)"),
])
def test_a_save_not_waited_for_names_why_a_worker_gone_only_when_ray_says_it_is(monkeypatch, clock, capsys, error,
                                                                                 said):
    monkeypatch.setattr(ec.ray, "get", lambda x, timeout=None: x)
    w0 = Unanswered({"last_step": 18, "last_saved": 10, "ended": False}, 0, error)
    s = ec.SaveBeforeResize()
    s.after_worker_group_start(Group([w0]))
    s.after_controller_state_update(None, ResizingState(scaling_decision=grow()))
    s.before_controller_execute_resize_decision(grow())
    assert events(capsys)[-1]["outcome"] == said


def test_the_notice_is_sent_only_where_jaxs_preemption_service_takes_it(monkeypatch):
    from jax._src import distributed
    sent = []
    monkeypatch.setattr(mr.os, "kill", lambda pid, sig: sent.append(sig))
    monkeypatch.setattr(distributed.global_state, "preemption_sync_manager", None)
    assert mr.preemption_notice() is False and sent == []
    monkeypatch.setattr(distributed.global_state, "preemption_sync_manager", object())
    import signal
    assert mr.preemption_notice() is True and sent == [signal.SIGTERM]


# -- RetryStartFailures: a worker that cannot load the trainer ------------------------
def raising_get(refs, timeout=None):
    """ray.get of Failing's answers: an error among them raised."""
    for r in refs:
        if isinstance(r, Exception):
            raise r
    return refs


class Failing:
    def __init__(self, error):
        self.error = error

    def execute_async(self, fn):
        return self.error


def test_a_worker_that_cannot_load_the_trainer_fails_the_start_as_retryable_up_to_the_bound(monkeypatch, capsys):
    monkeypatch.setattr(ec.ray, "get", raising_get)
    monkeypatch.setenv(ec.ENV_START_RETRIES, "2")
    cb = ec.RetryStartFailures()
    lost = RaySystemError("System error: No module named 'maxtext_ray'")
    assert cb.before_init_train_context([Failing(True), Failing(True)]) == {}
    for n in (1, 2):
        with pytest.raises(WorkerGroupStartupFailedError, match=f"No module named 'maxtext_ray'.*start {n} of 2"):
            cb.before_init_train_context([Failing(True), Failing(lost)])
    with pytest.raises(RaySystemError):
        cb.before_init_train_context([Failing(lost)])
    decisions = [e["decision"] for e in events(capsys) if e["kind"] == "start_failed"]
    assert decisions == ["RETRY", "RETRY", "RAISE"]
    # Ray Train's own retryable case goes through as it is, uncounted.
    with pytest.raises(RayActorError):
        cb.before_init_train_context([Failing(RayActorError())])
    assert cb.failures == 3


def test_a_start_that_works_gives_the_next_starts_the_whole_retry_budget_again(monkeypatch, capsys):
    """A run whose group failed to start twice (then started), and later,
    after a lost slice, fails to start twice again: each time within the
    bound of 2, so retried, never raised for the earlier starts' failures."""
    monkeypatch.setattr(ec.ray, "get", raising_get)
    monkeypatch.setenv(ec.ENV_START_RETRIES, "2")
    cb = ec.RetryStartFailures()
    lost = RaySystemError("System error: No module named 'maxtext_ray'")
    for _ in range(2):  # two incidents, each with two failed starts, then a start that works
        for n in (1, 2):
            with pytest.raises(WorkerGroupStartupFailedError, match=f"start {n} of 2 retried"):
                cb.before_init_train_context([Failing(lost)])
        assert cb.before_init_train_context([Failing(True)]) == {}
        cb.after_worker_group_start(Group([]))
    decisions = [e["decision"] for e in events(capsys) if e["kind"] == "start_failed"]
    assert decisions == ["RETRY"] * 4


def test_the_elastic_trainer_gives_ray_train_these_callbacks_and_a_fixed_one_none(monkeypatch):
    import maxtext_elastic_trainer

    given: dict = {}
    monkeypatch.setattr(mr, "fit", lambda argv, elastic, callbacks=(): given.update(elastic=elastic,
                                                                                   callbacks=callbacks))
    maxtext_elastic_trainer.main(["trainer", "base.yml"])
    kinds = [type(c).__name__ for c in given["callbacks"]]
    assert given["elastic"] and kinds == ["FreshClusterView", "SaveBeforeResize", "RetryStartFailures"]
    from ray.train.v2._internal.execution.callback import ControllerCallback, WorkerGroupCallback
    from ray.train.v2.api.callback import UserCallback
    for c in ec.callbacks():
        # Not UserCallbacks: Ray Train appends these to its own (the controller's and the worker group's hooks).
        assert isinstance(c, (ControllerCallback, WorkerGroupCallback)) and not isinstance(c, UserCallback)


# -- the failure budget: max_failures within a window, not over the job's life ---------
def test_failures_spread_over_more_than_the_window_never_spend_the_budget(capsys):
    now = [0.0]
    b = ec.FailureBudget(3, 3600.0, clock=lambda: now[0])
    for _ in range(10):  # ten lost hosts, each 20 minutes after the last: at most 3 in any hour
        now[0] += 1200.0
        b.before_controller_execute_failure_decision(FailureDecision.RETRY)
    assert len(b.times) == 3
    events = [json.loads(line.split("trainer event: ", 1)[1]) for line in capsys.readouterr().out.splitlines()
              if "trainer event: " in line]
    assert [e["failures"] for e in events] == [1, 2, 3] + [3] * 7 and events[0]["window_s"] == 3600.0


def test_one_failure_more_than_the_budget_within_the_window_ends_the_job():
    now = [0.0]
    b = ec.FailureBudget(3, 3600.0, clock=lambda: now[0])
    for _ in range(3):
        now[0] += 60.0
        b.before_controller_execute_failure_decision(FailureDecision.RETRY)
    b.before_controller_execute_failure_decision(FailureDecision.RAISE)  # not a retry: not counted
    now[0] += 60.0
    with pytest.raises(ec.FailureBudgetSpent, match=r"4 worker-group failures within 3600 s \(max_failures 3 per "
                                                     r"failure_window 3600 s\)"):
        b.before_controller_execute_failure_decision(FailureDecision.RETRY)


def test_a_window_leaves_ray_trains_own_count_unlimited_and_none_keeps_it(monkeypatch):
    env = {mr.ENV_MAX_FAILURES: "3", mr.ENV_FAILURE_WINDOW: "3600"}
    assert mr.ray_max_failures(env) == -1 and mr.failure_window(env) == 3600.0
    assert mr.ray_max_failures({mr.ENV_MAX_FAILURES: "3", mr.ENV_FAILURE_WINDOW: "0"}) == 3
    assert mr.ray_max_failures({mr.ENV_MAX_FAILURES: "-1", mr.ENV_FAILURE_WINDOW: "3600"}) == -1
    assert mr.ray_max_failures({}) == mr.MAX_FAILURES
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert isinstance(ec.callbacks()[0], ec.FailureBudget)
    monkeypatch.setenv(mr.ENV_FAILURE_WINDOW, "0")
    assert not any(isinstance(c, ec.FailureBudget) for c in ec.callbacks())


def test_a_spent_budget_is_a_controller_error_ray_train_does_not_retry():
    """Read in the pinned Ray 2.60's controller: a callback's exception
    becomes a ControllerError, which its default failure policy raises."""
    from ray.train.v2._internal.execution.callback_manager import CallbackManager
    from ray.train.v2._internal.execution.failure_handling.default import DefaultFailurePolicy
    from ray.train.v2.api.config import FailureConfig
    from ray.train.v2.api.exceptions import ControllerError
    manager = CallbackManager([ec.FailureBudget(0, 60.0)])
    with pytest.raises(ControllerError) as err:
        manager.invoke("before_controller_execute_failure_decision", FailureDecision.RETRY)
    policy = DefaultFailurePolicy(FailureConfig(max_failures=-1))
    assert policy.make_decision(err.value) == FailureDecision.RAISE


def poll(*errors):
    """Ray Train 2.60's poll of a worker group, one worker per error."""
    from ray.train.v2._internal.execution.worker_group.poll import WorkerGroupPollStatus, WorkerStatus
    return WorkerGroupPollStatus({i: WorkerStatus(running=False, error=e) for i, e in enumerate(errors)})


def test_a_failure_of_the_health_gate_alone_leaves_the_jobs_budget_for_its_losses(capsys):
    """A sick host found by the gate (every worker's error its
    HostUnhealthy, as Ray Train hands it over) counts in the gate's own
    budget: a loss, the gate's failure and a retry before Ray saw the node
    gone leave one failure of the job's three."""
    import health_check
    from ray.train.v2._internal.exceptions import UserExceptionWithTraceback
    sick = UserExceptionWithTraceback(health_check.HostUnhealthy("vm: devices 3 of 4"), "Traceback ...")
    now = [0.0]
    b = ec.FailureBudget(3, 3600.0, clock=lambda: now[0])
    b.after_worker_group_poll_status(poll(RuntimeError("node died")))          # the loss
    b.before_controller_execute_failure_decision(FailureDecision.RETRY)
    for _ in range(3):                                                         # the gate, three times
        b.after_worker_group_poll_status(poll(sick, health_check.HostUnhealthy("all gathered")))
        b.before_controller_execute_failure_decision(FailureDecision.RETRY)
    b.after_worker_group_poll_status(poll(RuntimeError("actor died")))          # a retry on the node set aside
    b.before_controller_execute_failure_decision(FailureDecision.RETRY)
    assert (len(b.times), len(b.gate_times)) == (2, 3)
    events = [json.loads(line.split("trainer event: ", 1)[1]) for line in capsys.readouterr().out.splitlines()
              if "trainer event: " in line]
    assert [e.get("gate_failures") for e in events] == [None, 1, 2, 3, None]
    # A gate that keeps failing (the host never set aside) still ends the job, in one line.
    b.after_worker_group_poll_status(poll(sick))
    with pytest.raises(ec.FailureBudgetSpent, match=r"the health gate failed 4 worker groups within 3600 s"):
        b.before_controller_execute_failure_decision(FailureDecision.RETRY)
    # A failure with one error that is not the gate's is the job's.
    b.after_worker_group_poll_status(poll(sick, RuntimeError("oom")))
    b.before_controller_execute_failure_decision(FailureDecision.RETRY)
    assert len(b.times) == 3
    assert ec.gate_failure(sick) and not ec.gate_failure(RuntimeError("HostUnhealthy")) and not ec.gate_failure(None)
