"""The run's log folder: one file per command that ran (its line, where,
exit code, whole stdout and stderr) and per in-process fact (its answer or
its error), numbered in the order they came, and a traceback file for a
step that met an error nobody foresaw. ``prune``: the older folders of a
task that only looks, removed."""
from __future__ import annotations

import re
import threading
from pathlib import Path

from .connector.base import Connector
from .facts import Completed


def file_name(label: str) -> str:
    """A label made safe as a file name in the run's log folder."""
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in label)[:60]


class RunLog:
    def __init__(self, folder: Path):
        self.folder = folder
        self._n = 0
        self._lock = threading.Lock()

    def _next(self, label: str) -> Path:
        with self._lock:
            self._n += 1
            n = self._n
        return self.folder / f"{n:03d}-{file_name(label)}.log"

    def command(self, label: str, c: Completed, where: str, by: str = "", program: str = "") -> None:
        """A command's file. ``by``: what answered it in-process instead of
        its process (``Ran.by``), said on the second line, which then
        says no ``program`` process ran for it."""
        how = f", answered in-process by the {by}: no {program or 'command'} process ran" if by else ""
        self._next(label).write_text(f"$ {c.line}\n# on {where}{how}; exit {c.rc} after {c.seconds:.1f}s\n"
                                     f"--- stdout\n{c.stdout}\n--- stderr\n{c.stderr}\n")

    def fact(self, label: str, line: str, where: str, seconds: float, answer: str) -> None:
        self._next(label).write_text(f"$ {line}\n# in-process fact, through {where}; {seconds:.1f}s\n"
                                     f"--- answer\n{answer[:100_000]}\n")

    def traceback(self, step_id: str, text: str) -> Path | None:
        path = self.folder / f"traceback-{file_name(step_id)}.txt"
        try:
            path.write_text(text)
        except OSError:
            return None
        return path


def prune(here: Connector, folder: str, task: str, keep: int, spare: str) -> list[str]:
    """Remove, through the connector ``here``, all but the newest ``keep``
    of ``folder``'s log folders of ``task`` (``<YYYYmmdd-HHMMSS>-<task>``,
    so their names sort by time), never one that holds a file ``spare`` (a
    driver log kept). A folder that cannot be removed stays: pruning never
    stops a task. Returns the names removed."""
    named = re.compile(rf"[0-9]{{8}}-[0-9]{{6}}-{re.escape(task)}")
    try:
        mine = sorted(name for name, is_dir in here.list_dir(folder) or [] if is_dir and named.fullmatch(name))
    except OSError:
        return []
    removed = []
    for name in mine[:max(0, len(mine) - keep)]:
        try:
            if any(n == spare for n, _ in here.list_dir(f"{folder}/{name}") or []):
                continue
            here.remove_tree(f"{folder}/{name}")
        except OSError:
            continue
        removed.append(name)
    return removed
