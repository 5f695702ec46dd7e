"""A notice to go, turned into a save: when Ray drains a node of the worker
group (a host told it will go), rank 0 asks MaxText to save at its next
step and stop, before the node goes.

Where a notice comes from: Ray's drain of a node with a deadline
(``ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION
--deadline-remaining-seconds N``, the GCS's ``DrainNode``). On GKE the
worker pod's preStop hook gives it when the pod is told to terminate (a
Spot VM's preemption, which GKE passes on as the pod's graceful
termination; a maintenance; a pod deleted with a grace period):
``manifests/ray-cluster.tpu-multi-slice*.yaml``. On the twin,
``invoke chaos.preempt-worker`` gives it as that hook would. A pod's own
SIGTERM does not reach the training worker on GKE (the container's first
process is ``ray start --block``, which stops the node's processes), so
the drain is the one path, the same on both.

How it reaches the job: Ray Train 2.60's PreemptionWatcher (one per
worker group, ray/train/v2/_internal/execution/preemption.py) polls Ray's
draining nodes every ``RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S`` (the job sets
1 s; Ray's default is 5) and marks every worker of the group with the
drain (``mark_preempt``: the nodes, the ranks of their slices, the
deadline); its controller waits for the group to end (``PreemptingState``)
and counts the restart as a preemption (``max_preemption_failures``, no
limit by default), not a failure.

What this module does with it: rank 0 reads its worker's mark (the
worker's own train context, no barrier: ``ray.train.get_preemption_info()``
is a barrier of every worker, which MaxText's loop never reaches) and sends
itself SIGTERM (``maxtext_ray.preemption_notice``): JAX's preemption
service takes it, the hosts agree on a step, MaxText
(``enable_autocheckpoint=true``) saves there, waits for the save and
stops. The elastic trainer then waits for the drained node to go
(``elastic_control.FreshClusterView``) and goes on without it from that
save: no step replayed.

Shipped to the Ray cluster with the trainers; imports nothing of theirs
(the event printer, the last step and the notice are handed in)."""
from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable

ENV_POLL_S = "TRAINER_NOTICE_POLL_S"
POLL_S = 0.5


def poll_interval(environ=os.environ) -> float:
    try:
        return max(0.2, float(environ.get(ENV_POLL_S, POLL_S)))
    except ValueError:
        return POLL_S


def marked() -> dict | None:
    """This worker's preemption mark (Ray Train's PreemptionInfo), as
    fields: nodes, ranks, deadline (epoch s, None: none said); None: none."""
    from ray.train.v2._internal.execution.context import get_train_context

    info = get_train_context().preemption_context.preemption_info
    if info is None:
        return None
    return {"nodes": list(info.preempted_node_ids), "ranks": list(info.preempted_ranks),
            "deadline": info.deadline_ms / 1000 if info.deadline_ms else None}


class NoticeWatch:
    """Rank 0's watch of the group's preemption mark: at the first mark
    seen, one ``notice_received`` event and one ``notify()``; then it
    stops. ``look`` answers the mark (a failed look is skipped: the next
    one may answer)."""

    def __init__(self, emit: Callable[..., object], last_step: Callable[[], int | None],
                 notify: Callable[[], bool], every: float = POLL_S,
                 look: Callable[[], dict | None] = marked) -> None:
        self.emit, self.last_step, self.notify = emit, last_step, notify
        self.every, self.look = every, look
        self.received: dict | None = None
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="trainer-notice")

    def check(self) -> bool:
        """One look; True once the notice is taken (and acted on)."""
        if self.received is not None:
            return True
        try:
            mark = self.look()
        except Exception:  # the context not made yet, or going: look again next time
            return False
        if not mark:
            return False
        now = time.time()
        deadline = mark.get("deadline")
        try:
            sent, why = bool(self.notify()), None
        except Exception as e:  # the worker saves nothing; say why
            sent, why = False, f"{type(e).__name__}: {e}"[:200]
        if not sent and why is None:
            why = "no JAX preemption service in this process"
        self.received = {**mark, "grace_s": round(deadline - now, 1) if deadline else None, "save_asked": sent,
                         **({"why": why} if why else {})}
        step = None
        with contextlib.suppress(Exception):
            step = self.last_step()
        self.emit("notice_received", t=now, step=step, **self.received)
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            if self.check():
                return

    def start(self) -> NoticeWatch:
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
