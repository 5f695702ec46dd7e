"""Keep JAX's preemption sync point reachable while Orbax saves.

JAX's preemption service (``multihost_utils.reached_preemption_sync_point``)
keeps one call counter per process: the step of its latest call. On a
SIGTERM the hosts agree on the fastest counter + 1 as the step to save at,
and the training loop saves when its call reaches it. Orbax 0.12.8's
``CheckpointManager`` asks the same function again from its asynchronous
save's finalize thread (``_finalize_checkpoint``: ``reached_preemption(step)``
of the saved step, for a metric only), so the counter goes back to that
step. A notice in the window until the loop's next call sets a sync point
the loop has already passed: it never saves, and the run trains on (seen
twice in the soak, a resize's save right after a save; a real preemption
there would lose the save the same way).

``guard()``, on the thread that runs MaxText's loop, lets only that thread
reach JAX's counter: Orbax's other threads are answered False (the finalize
records no "saved by preemption" metric; nothing else reads that answer).
``tests/test_trainer.py`` shows the notice missed without it and reached
with it, with the real JAX and Orbax.
"""
from __future__ import annotations

import threading

_loop: threading.Thread | None = None


def guard() -> None:
    """From now on, only this thread's calls reach JAX's sync counter."""
    global _loop
    from orbax.checkpoint import checkpoint_manager as cm

    _loop = threading.current_thread()
    if getattr(cm.CheckpointManager.reached_preemption, "loop_only", False):
        return
    original = cm.CheckpointManager.reached_preemption

    def reached_preemption(self, step: int) -> bool:
        if threading.current_thread() is not _loop:
            return False
        return original(self, step)

    reached_preemption.loop_only = True  # type: ignore[attr-defined]
    cm.CheckpointManager.reached_preemption = reached_preemption  # type: ignore[method-assign]
