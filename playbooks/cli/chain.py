"""The tasks of one command line, as a chain (`invoke network cluster
nodepools`). Invoke runs them one after another, each its own run; this
executor (Invoke's config key ``tasks.executor_class``, set in the project's
``invoke.yaml``) makes the whole chain known while they run, so that the
first task can do first what a later one needs before anything is made: the
capacity checks (``plan.chained``). It also keeps each task's ``--env``:
one environment for the whole chain (``chosen_env``).

Light on purpose: Invoke imports it before every run, `invoke --list`
included."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from invoke import Executor

_current: tuple[str, ...] = ()
_envs: tuple[tuple[str, str], ...] = ()  # (task, its --env) of each task of the chain given one
_at_end: list[Callable[[], None]] = []


def current() -> tuple[str, ...]:
    """The task names of the command line being run, in order (empty when
    a task is called otherwise)."""
    return _current


def at_end(release: Callable[[], None]) -> None:
    """Call ``release`` when the chain ends, however it ends (what its
    tasks hold for the whole chain: the environment's lock)."""
    _at_end.append(release)


class ChainExecutor(Executor):
    """Invoke's executor, with the chain known while it runs."""

    def execute(self, *tasks: Any) -> Any:
        global _current
        global _envs
        calls = self.normalize(tasks)
        names = tuple(call.called_as or call.task.name for call in calls)
        _current = names
        _envs = tuple((name, str(call.kwargs.get("env"))) for name, call in zip(names, calls)
                      if call.kwargs.get("env"))
        try:
            return super().execute(*tasks)
        finally:
            _current, _envs = (), ()
            while _at_end:
                _at_end.pop()()


def chosen_env(own: str) -> str | None:
    """The environment a task's ``--env`` names: its own, else the one
    another task of its chain names (`invoke network --env dev cluster`
    runs both on dev); None: none given (playbook.env decides). Tasks of
    one chain that name two environments are refused before any runs."""
    from playbooks.core.errors import InputError

    given = list(_envs) or ([("", own)] if own else [])
    named = sorted({e for _, e in given})
    if len(named) > 1:
        each = ", ".join(f"{task} --env {e}" for task, e in given)
        raise InputError(f"--env: one command line acts on one environment, but its tasks name {len(named)} "
                         f"({each}): run them as separate commands")
    return own or (named[0] if named else None)
