"""What the elastic trainer adds to Ray Train's controller, so that a run
survives a lost host, a host that comes back, a worker that cannot start,
and many losses over days: four callbacks for the controller of the pinned
Ray 2.60.0, given
to it through ``RunConfig(callbacks=...)`` (Ray Train appends callbacks that
are not ``UserCallback``s to its own: ray/train/v2/api/data_parallel_trainer.py,
``_create_default_callbacks``). Each answers one cause, read in Ray's code:

- ``FreshClusterView``: the elastic scaling policy sizes a worker group from
  the AutoscalingCoordinator's view of the nodes, which it refreshes every
  20 s (ray/data/_internal/cluster_autoscaler/default_autoscaling_coordinator.py,
  ``TICK_INTERVAL_S``). After a host dies, the retry counted it for up to 20 s
  and waited for a placement group it could not get; a host that came back
  was seen up to 20 s late. After a failure this callback waits until Ray
  has marked dead every node of the failed group that no longer answers
  (bounded), then has the coordinator look again (``get_reserved_resources(
  recompute=True)``): the retry is sized from the hosts alive. While a
  group runs it has it look again before each resize consideration.
- ``SaveBeforeResize``: a resize restarts the worker group, which restores
  the newest checkpoint: a grow replayed every step since the last periodic
  save. Before a resize of a group that has trained since its last save, it
  sends rank 0's process SIGTERM: JAX's preemption notifier catches it, the
  hosts agree on a step (``multihost_utils.reached_preemption_sync_point``),
  and MaxText (``enable_autocheckpoint=true``) saves there, waits for the
  save and stops; the new group restores that step. Bounded; a save that
  does not come leaves the resize as Ray would do it.
- ``RetryStartFailures``: a worker that cannot run the job's code (its
  working directory missing on its node, say) fails ``init_train_context``
  with a ``RaySystemError``, which Ray Train takes as fatal (only a
  ``RayActorError`` becomes a retryable ``WorkerGroupStartupFailedError``:
  ray/train/v2/_internal/execution/worker_group/worker_group.py). Before the
  context is made, each worker proves it can import the trainer; one that
  cannot fails the start as a ``WorkerGroupStartupFailedError``, retried,
  at most ``TRAINER_START_RETRIES`` times in a row (a start that works
  gives the next ones the whole budget again).

- ``FailureBudget``: Ray Train counts ``max_failures`` over the job's whole
  life; with a ``failure_window`` (the inventory's, 3600 s by default) this
  counts them within the window instead, Ray's own count unlimited.

Each prints what it did as a timeline event (``trainer event: {...}``).
"""
from __future__ import annotations

import os
import socket
import time
from typing import Any

import ray
from ray.train.v2._internal.exceptions import WorkerGroupStartupFailedError
from ray.train.v2._internal.execution.callback import ControllerCallback, WorkerGroupCallback
from ray.train.v2._internal.execution.controller.state import PreemptingState, ResizingState, RunningState
from ray.train.v2._internal.execution.failure_handling import FailureDecision

import maxtext_ray

# How long a retry waits for Ray to mark dead the nodes that stopped
# answering: Ray's own detection is 5 missed health checks 3 s apart, plus
# the check's timeout (RAY_health_check_*).
ENV_LOSS_SETTLE = "TRAINER_LOSS_SETTLE_S"
LOSS_SETTLE_S = 30.0
# How long a retry waits for a drained node with no deadline to go.
NOTICE_WAIT_S = 120.0
# How long a resize waits for the save before it.
ENV_SAVE_TIMEOUT = "TRAINER_RESIZE_SAVE_TIMEOUT_S"
SAVE_TIMEOUT_S = 600.0
# How many failed starts of a worker group (a worker that cannot import the
# trainer) are retried.
ENV_START_RETRIES = "TRAINER_START_RETRIES"
START_RETRIES = 3
# A node "answers" when its raylet accepts a connection within this.
CONNECT_TIMEOUT_S = 2.0
POLL_S = 0.5
# The scaling policy keeps the coordinator's answer for 1 s
# (ElasticScalingPolicy.GET_RESERVED_RESOURCES_INTERVAL_S): a retry's
# decision must come after it.
POLICY_CACHE_S = 1.0


def _seconds(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    try:
        return float(raw) if raw else default
    except ValueError:
        return default


def answers(address: str, port: int, timeout: float = CONNECT_TIMEOUT_S) -> bool:
    """Whether a node's raylet accepts a TCP connection (a killed raylet's
    port refuses at once; a deleted pod's address does not answer)."""
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


def draining() -> dict[str, int]:
    """Ray's draining nodes (a notice), ``{node id: deadline, epoch ms; 0: none}``, as Ray Train's own
    PreemptionWatcher reads them; none when Ray cannot say."""
    try:
        return dict(ray._private.state.state.get_draining_nodes())
    except Exception:
        return {}


def gcs_nodes() -> dict[str, dict]:
    """Ray's node table (the GCS), by node id."""
    return {n["NodeID"]: n for n in ray.nodes()}


class _Group(WorkerGroupCallback):
    """The running worker group's workers (rank order), None between groups."""

    def __init__(self) -> None:
        self.workers: list | None = None

    def after_worker_group_start(self, worker_group: Any) -> None:
        self.workers = sorted(worker_group.get_workers(), key=lambda w: w.distributed_context.world_rank)

    def before_worker_group_shutdown(self, worker_group: Any) -> None:
        self.workers = None

    def after_worker_group_abort(self, worker_group_context: Any) -> None:
        self.workers = None


class FreshClusterView(ControllerCallback, _Group):
    def __init__(self) -> None:
        super().__init__()
        self.requester: str | None = None
        self.every = 10.0
        self.last_look = 0.0
        self.last_running = 0.0
        self.nodes: set[str] = set()  # the nodes of the last group that started

    def after_controller_start(self, train_run_context: Any) -> None:
        # The elastic policy's requester id (ScalingPolicy.after_controller_start).
        self.requester = f"train-{train_run_context.run_id}"
        interval = getattr(train_run_context.scaling_config, "elastic_resize_monitor_interval_s", None)
        if interval:
            self.every = max(1.0, float(interval) / 2)

    def after_worker_group_start(self, worker_group: Any) -> None:
        super().after_worker_group_start(worker_group)
        self.nodes = {w.metadata.node_id for w in self.workers or []}

    def look_again(self) -> bool:
        """The coordinator's view of the nodes, made afresh."""
        if self.requester is None:
            return False
        from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
            get_or_create_autoscaling_coordinator,
        )

        self.last_look = time.monotonic()
        try:
            coordinator = get_or_create_autoscaling_coordinator()
            ray.get(coordinator.get_reserved_resources.remote(self.requester, recompute=True), timeout=10)
            return True
        except Exception as e:  # never let the view break the controller: Ray's own tick goes on
            print(f"trainer: could not refresh the cluster view: {e}", flush=True)
            return False

    def settle(self) -> tuple[list[str], list[str]]:
        """Wait (bounded) until Ray has marked dead each node of the last
        group that no longer answers, and each that Ray drains (a notice:
        it goes at its deadline; a retry placed there would be lost with
        it); the nodes found gone, and those drained."""
        table = gcs_nodes()
        gone = [n for n in self.nodes if (table.get(n) or {}).get("Alive")
                and not answers(table[n]["NodeManagerAddress"], int(table[n]["NodeManagerPort"]))]
        drains = {n: d for n, d in draining().items() if n in self.nodes and (table.get(n) or {}).get("Alive")}
        settle_s = _seconds(ENV_LOSS_SETTLE, LOSS_SETTLE_S)
        deadline = time.monotonic() + settle_s + max(
            [max(0.0, d / 1000 - time.time()) if d else NOTICE_WAIT_S for d in drains.values()], default=0.0)
        waiting = list({*gone, *drains})
        while waiting and time.monotonic() < deadline:
            time.sleep(POLL_S)
            table = gcs_nodes()
            waiting = [n for n in waiting if (table.get(n) or {}).get("Alive")]
        return gone, sorted(drains)

    def before_controller_execute_failure_decision(self, failure_decision: Any) -> None:
        if failure_decision != FailureDecision.RETRY:
            return
        start = time.time()
        gone, drained = self.settle()
        self.look_again()
        # The policy's last look (at the last healthy poll) must be older
        # than its cache, or the retry is sized from that look.
        time.sleep(max(0.0, POLICY_CACHE_S - (time.monotonic() - self.last_running)))
        maxtext_ray.event("cluster_view", t=time.time(), nodes_gone=len(gone),
                          **({"nodes_drained": len(drained)} if drained else {}),
                          seconds=round(time.time() - start, 3))

    def after_controller_state_update(self, previous_state: Any, current_state: Any) -> None:
        if isinstance(current_state, RunningState):
            self.last_running = time.monotonic()  # just after the policy's decision of this loop
            if self.last_running - self.last_look >= self.every:
                self.look_again()


class SaveBeforeResize(ControllerCallback, _Group):
    def __init__(self) -> None:
        super().__init__()
        self.resizing = False  # the policy resized a running group (not a restart after a failure)

    def after_controller_state_update(self, previous_state: Any, current_state: Any) -> None:
        if isinstance(current_state, ResizingState):
            self.resizing = True

    def before_controller_execute_resize_decision(self, scaling_decision: Any) -> None:
        workers, resizing, self.resizing = self.workers, self.resizing, False
        if not resizing or not workers or scaling_decision.num_workers == len(workers):
            return
        start = time.time()
        what = {"workers_from": len(workers), "workers": scaling_decision.num_workers}
        try:
            p = ray.get(workers[0].execute_async(maxtext_ray.progress), timeout=30)
        except Exception as e:
            maxtext_ray.event("save_before_resize", t=start, outcome=f"not asked: rank 0 did not answer ({e})"[:200],
                              **what)
            return
        # Nothing new: the last step's save is done. One only started (an
        # asynchronous save, not yet finalized) is not: the resize would tear
        # it down half-written (the soak's back-60s restored the save before
        # it), so rank 0 is asked, and its next step's save waits for it.
        saved = p.get("last_step") == p.get("last_saved") and not p.get("save_pending")
        if p.get("last_step") is None or saved or p.get("ended"):
            why = "no step since its start" if p.get("last_step") is None else "nothing new since its last save"
            maxtext_ray.event("save_before_resize", t=start, step=p.get("last_step"), outcome=f"not needed: {why}",
                              **what)
            return
        try:
            sent = ray.get(workers[0].execute_async(maxtext_ray.preemption_notice), timeout=30)
        except Exception as e:
            sent = False
            p["why"] = str(e)[:200]
        if not sent:
            maxtext_ray.event("save_before_resize", t=start, step=p.get("last_step"),
                              outcome=f"not asked: {p.get('why') or 'no JAX preemption service'}", **what)
            return
        saved, outcome = self._wait(workers, _seconds(ENV_SAVE_TIMEOUT, SAVE_TIMEOUT_S))
        maxtext_ray.event("save_before_resize", t=time.time(), step=saved, asked_after=p.get("last_step"),
                          seconds=round(time.time() - start, 3), outcome=outcome, **what)

    @staticmethod
    def _wait(workers: list, timeout: float) -> tuple[int | None, str]:
        """Until every worker's MaxText has stopped (or the timeout): the
        step rank 0 saved at (or None), and what happened."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                ps = ray.get([w.execute_async(maxtext_ray.progress) for w in workers], timeout=30)
            except Exception as e:  # the resize goes on without the save, the cause said as what it is
                return None, f"no save: {why_no_answer(e)}"
            if all(p.get("ended") for p in ps):
                if ps[0].get("stopped_for_notice"):
                    return ps[0].get("last_saved"), "saved"
                # Seen once in the soak (in-save, rep 3): JAX set its sync
                # point to a step MaxText had passed, and the group trained on.
                return None, f"no save: MaxText ran on to step {ps[0].get('last_step')} and ended, not stopping " \
                             "at the notice"
            time.sleep(POLL_S)
        return None, "no save within the timeout"


# Ray's errors for a worker that is no more: its actor died or cannot be
# reached (RayActorError: ActorDiedError, ActorUnavailableError), its
# process crashed, its node died.
WORKER_GONE: tuple[type[BaseException], ...] = (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError,
                                                 ray.exceptions.NodeDiedError)


def why_no_answer(e: BaseException) -> str:
    """Why the workers did not answer a look, in words: only Ray's own
    errors for a worker (or its node) that died are "a worker is gone"; a
    timeout is a worker that did not answer; anything else is named as the
    error it is."""
    if isinstance(e, WORKER_GONE):
        return f"a worker is gone ({type(e).__name__})"
    if isinstance(e, ray.exceptions.GetTimeoutError):
        return "a worker did not answer within 30 s"
    said = " ".join(str(e).split())[:200]
    return f"the workers could not be asked ({type(e).__name__}{': ' + said if said else ''})"


class RetryStartFailures(WorkerGroupCallback):
    """A group's failed starts, counted from its last start that worked:
    each start that succeeds gives the next ones the whole budget again (a
    run that loses a slice twice, hours apart, is not refused the second
    time for the first one's failed starts)."""

    def __init__(self) -> None:
        self.failures = 0

    def after_worker_group_start(self, worker_group: Any) -> None:
        self.failures = 0

    def before_init_train_context(self, workers: list) -> dict:
        limit = int(_seconds(ENV_START_RETRIES, START_RETRIES))
        try:
            ray.get([w.execute_async(maxtext_ray.ready) for w in workers], timeout=300)
        except ray.exceptions.RayActorError:
            raise  # Ray Train's own retryable case
        except Exception as e:
            self.failures += 1
            cause = str(e).strip().splitlines()[-1][:300] if str(e).strip() else type(e).__name__
            retried = self.failures <= limit
            maxtext_ray.event("start_failed", t=time.time(), error=cause, count=self.failures, limit=limit,
                              decision="RETRY" if retried else "RAISE")
            if retried:
                raise WorkerGroupStartupFailedError(
                    f"a worker could not load the trainer ({cause}); start {self.failures} of {limit} retried") from e
            raise
        return {}


class FailureBudgetSpent(RuntimeError):
    """More failures within the window than the budget: the job ends."""


def gate_failure(error: Any) -> bool:
    """A worker's error that is its health gate's (HostUnhealthy: the group
    stopped before MaxText because a host failed its checks), as Ray Train
    2.60 hands it over (UserExceptionWithTraceback around it, or itself)."""
    base = getattr(error, "_base_exc", error)
    return type(base).__name__ == "HostUnhealthy"


class FailureBudget(ControllerCallback, WorkerGroupCallback):
    """``max_failures`` within any ``failure_window`` seconds, not over the
    job's whole life: Ray Train counts worker-group failures from the job's
    start and never forgets one, so a days-long elastic run ended on its
    fourth lost host however far apart they came. With a window, Ray's own
    count is unlimited (maxtext_ray.ray_max_failures) and this callback
    counts each failure Ray Train decides to retry; past the budget it
    raises, which Ray Train's controller takes as a controller error it does
    not retry (controller.py, ``_run_controller_hook``): the job fails with
    this line. First among the callbacks, so a spent budget ends the job
    before the others prepare a retry.

    A group that ended on a notice (Ray's PreemptingState: a host drained)
    is a preemption, as Ray Train counts it: not in the budget.

    A failure whose every worker error is the health gate's (a sick host
    found, set aside by the watch) is the gate working, not the job failing:
    it counts in a budget of its own, as many gate failures in the same
    window (a host the watch never sets aside, with stall_action report,
    still ends the job), and leaves the job's budget for its losses."""

    def __init__(self, budget: int, window: float, clock: Any = time.monotonic) -> None:
        self.budget, self.window, self.clock = budget, window, clock
        self.times: list[float] = []
        self.gate_times: list[float] = []
        self.gated = False  # the last poll's errors were all the health gate's
        self.preempting = False  # the controller waits out a notice (Ray's PreemptingState)
        self.preemptions = 0

    def after_controller_state_update(self, previous_state: Any, current_state: Any) -> None:
        self.preempting = isinstance(current_state, PreemptingState)

    def counted(self, **extra: Any) -> None:
        """The ``failure_counted`` event: the job's failures in the window, and ``extra``."""
        maxtext_ray.event("failure_counted", t=time.time(), failures=len(self.times), budget=self.budget,
                          window_s=self.window, **extra)

    def after_worker_group_poll_status(self, worker_group_status: Any) -> None:
        errors = worker_group_status.errors
        if errors:
            self.gated = all(gate_failure(e) for e in errors.values())

    def before_controller_execute_failure_decision(self, failure_decision: Any) -> None:
        gated, self.gated = self.gated, False
        if failure_decision != FailureDecision.RETRY:
            return
        if self.preempting:
            # A group that ended on a notice (a host Ray drains): Ray Train
            # counts it as a preemption (max_preemption_failures), not a
            # failure; so does this budget.
            self.preemptions += 1
            self.counted(preemptions=self.preemptions)
            return
        now = self.clock()
        if gated:
            self.gate_times = [t for t in self.gate_times if t > now - self.window] + [now]
        else:
            self.times = [t for t in self.times if t > now - self.window] + [now]
        self.counted(**({"gate_failures": len(self.gate_times)} if gated else {}))
        counted = len(self.gate_times if gated else self.times)
        if counted <= self.budget:
            return
        within = f"within {self.window:g} s (max_failures {self.budget} per failure_window {self.window:g} s)"
        raise FailureBudgetSpent(f"failure budget spent: the health gate failed {counted} worker groups {within}: a "
                                 f"sick host is not being set aside (stall_action: restart sets it aside)" if gated
                                 else f"failure budget spent: {counted} worker-group failures {within}")


def budget() -> list:
    """The failure budget's callback, when the job counts in a window."""
    window, most = maxtext_ray.failure_window(), maxtext_ray.max_failures()
    return [FailureBudget(most, window)] if window > 0 and most >= 0 else []


def callbacks() -> list:
    return [*budget(), FreshClusterView(), SaveBeforeResize(), RetryStartFailures()]
