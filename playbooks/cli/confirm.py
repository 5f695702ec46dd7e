"""Before a task deletes a user's data (teardown; `train --fresh` on GKE):
say what it deletes and ask for the environment's name, unless `--yes` was
given on that command. Without a terminal to ask on, it is refused in one
line. Only a run that acts asks: check mode and dry runs delete nothing."""
from __future__ import annotations

import sys

from playbooks.core.errors import InputError
from playbooks.core.runner import Mode


def confirm(task: str, env_name: str, mode: Mode, what: str, yes: bool) -> None:
    """Return when the deletion may go on; raise (exit 2 without a terminal,
    exit 1 on any answer but the environment's name) when it may not."""
    if mode is not Mode.APPLY or yes:
        return
    if not sys.stdin.isatty():
        raise InputError(f"{task} deletes {what}; confirm with --yes (stdin is not a terminal)")
    try:
        answer = input(f"Delete {what}? Type the environment name ({env_name}) to confirm: ")
    except EOFError:  # Ctrl-D: no answer is no
        answer = ""
        print()
    if answer.strip() != env_name:
        from invoke.exceptions import Exit
        raise Exit(f"{task.split()[0]} cancelled", code=1)
