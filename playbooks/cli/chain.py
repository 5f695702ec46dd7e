"""The tasks of one command line, as a chain (`invoke network cluster
nodepools`). Invoke runs them one after another, each its own run; this
executor (Invoke's config key ``tasks.executor_class``, set in the project's
``invoke.yaml``) makes the whole chain known while they run, so that the
first task can do first what a later one needs before anything is made: the
capacity checks (``plan.chained``).

Light on purpose: Invoke imports it before every run, `invoke --list`
included."""
from __future__ import annotations

from typing import Any

from invoke import Executor

_current: tuple[str, ...] = ()


def current() -> tuple[str, ...]:
    """The task names of the command line being run, in order (empty when
    a task is called otherwise)."""
    return _current


class ChainExecutor(Executor):
    """Invoke's executor, with the chain known while it runs."""

    def execute(self, *tasks: Any) -> Any:
        global _current
        names = tuple(call.called_as or call.task.name for call in self.normalize(tasks))
        _current = names
        try:
            return super().execute(*tasks)
        finally:
            _current = ()
