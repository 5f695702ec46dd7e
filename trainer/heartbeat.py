"""Every training worker's heartbeat: a ``heartbeat`` event every
``TRAINER_HEARTBEAT_S`` seconds (30 by default), from a daemon thread, with
who the worker is (rank, slice, host in the slice, hostname, pid, Ray node
id) and the last step its MaxText finished.

What it tells the hang diagnosis (playbooks/runs/hang_diagnosis.py): a
process that is frozen (stopped, its host gone, its Python wedged holding
the GIL) stops beating; a worker blocked in a collective waiting for a
peer keeps beating (the collective waits outside the GIL) with its last
step standing still. Its cost: one line of about 250 bytes per worker per
interval (64 hosts at 30 s: about 2 MB of driver log an hour); the
follower keeps each worker's last one in memory, never in the run's
timeline.

Shipped to the Ray cluster with the trainers; imports nothing of theirs
(the event printer and the step are handed in)."""
from __future__ import annotations

import os
import threading
from collections.abc import Callable

ENV_HEARTBEAT_S = "TRAINER_HEARTBEAT_S"
DEFAULT_S = 30.0
MIN_S = 1.0


def interval(environ=os.environ) -> float:
    """The job's interval (at least a second), else 30 s; a value that is
    not a number is the default (the playbook writes it, checked)."""
    try:
        return max(MIN_S, float(environ.get(ENV_HEARTBEAT_S, DEFAULT_S)))
    except ValueError:
        return DEFAULT_S


class Heartbeat:
    """A worker's beat: ``beat()`` prints one event (its last step asked of
    ``last_step`` each time); ``start()`` beats every ``every`` seconds on a
    daemon thread until ``stop()``."""

    def __init__(self, emit: Callable[..., object], who: dict, last_step: Callable[[], int | None],
                 every: float):
        self.emit, self.who, self.last_step, self.every = emit, dict(who), last_step, every
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="trainer-heartbeat")

    def beat(self) -> None:
        try:
            step = self.last_step()
        except Exception:  # never let the heartbeat break the training
            step = None
        self.emit("heartbeat", step=step, every=self.every, **self.who)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.beat()

    def start(self) -> Heartbeat:
        self.beat()  # the first at once: a worker that never beats again is known from its start
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
