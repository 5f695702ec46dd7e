"""The host (twin) or pod (GKE) a chaos task's ``--target`` names: ``rank0``
or ``peer`` are looked up in the running job's timeline (its last worker
group, ``placement.py``); a name is taken as given. A read-only fact: a dry
run shows the lookup and assumes its answer."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from playbooks.core.command import placeholder
from playbooks.core.facts import Fact
from playbooks.runs import placement, timeline


def running_group(env: Any) -> tuple[str, list[placement.Worker]] | None:
    """The running job of the environment (the newest, when several run)
    and its last worker group; None when no job runs."""
    running = timeline.running_runs(env)
    if not running:
        return None
    run, job = running[-1]
    return job, placement.last_group(timeline.read(env, run), job)


def fact(env: Any, target: str, name_of: Callable[[placement.Worker], str | None], what: str) -> Fact:
    """(name, why) of what ``target`` (rank0 or peer) aims at: ``what`` is
    'TPU host' or 'pod'; name None (with why) when it cannot be told (no
    running job, its group not known yet): never a guess."""
    def look() -> tuple[str | None, str]:
        got = running_group(env)
        if got is None:
            return None, "no job is running: --target=rank0 or peer aims at the running job's workers"
        job, group = got
        name, why = placement.aim(group, target, name_of)
        return name, f"job {job}: {why}"

    return Fact(name=f"the {what} of --target={target}", python=look,
                display=f"# the {what} of the running job's {'rank 0' if target == placement.RANK0 else 'peer'}: "
                        f"its worker_started events in {timeline.events_shown(env)}",
                assumed=(placeholder("TARGET"), f"the {what} of the running job's {target}"),
                describe=lambda v: v[0] or v[1])
