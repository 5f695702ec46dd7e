"""A save's and a step's seconds as an environment's runs measured them
(what ``job/save_period.py`` chooses a checkpoint period from): the
newest run of the model whose timeline has both. From the trainer's
events: ``checkpoint_saved`` (seconds: the save's blocking part),
``checkpoint_finalized`` (seconds from the save's start to its
finalization, where ``finalized`` is true) and MaxText's ``step`` seconds
past each worker group's first two (``cost.group_step_seconds``). Medians
each. Pure but for ``read``, which reads this machine's timelines."""
from __future__ import annotations

import statistics
from typing import Any

from playbooks.config import paths
from playbooks.job.save_period import Times
from playbooks.runs import events as E
from playbooks.runs import timeline
from playbooks.runs.cost import group_step_seconds, model_of


def _seconds(events: list[dict], kind: str, finalized: bool = False) -> list[float]:
    return [float(s) for e in events if e.get("kind") == kind and (not finalized or e.get("finalized") is True)
            and (s := E.number(e.get("seconds"))) is not None and s >= 0]


def of_run(name: str, events: list[dict]) -> Times | None:
    """The run's medians, or None when it measured no save or no step."""
    saves, steps = _seconds(events, E.CHECKPOINT_SAVED), group_step_seconds(events)
    if not saves or not steps:
        return None
    whole = _seconds(events, E.CHECKPOINT_FINALIZED, finalized=True)
    save, step = statistics.median(saves), statistics.median(steps)
    end = statistics.median(whole) if whole else save
    said = (f"{end:.3g} s to finalized ({len(whole)} saves)" if whole else
            "none recorded finalized: the blocking part stands for the whole")
    basis = (f"run {name}'s median save {save:.3g} s blocking ({len(saves)} saves), {said}, median step "
             f"{step:.3g} s ({len(steps)} steps)")
    return Times(save, max(save, end), step, basis, measured=True)


def newest(runs: list[tuple[str, list[dict]]], model: str | None = None) -> Times | None:
    """The newest run's (``runs`` newest first) of ``model`` (any when None)
    that measured a save and a step."""
    for name, evs in runs:
        if model is not None and model_of(evs) != model:
            continue
        if (t := of_run(name, evs)) is not None:
            return t
    return None


def read(env: Any, model: str | None = None) -> Times | None:
    """The environment's newest measured times (this machine's timelines)."""
    root = paths.here(paths.training(env.name))
    files = sorted(root.glob(f"*/{timeline.FILE}"), key=lambda p: p.stat().st_mtime, reverse=True)
    return newest([(f.parent.name, timeline.read(env, f.parent.name)) for f in files], model)
