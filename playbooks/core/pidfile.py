"""Pid files of the background processes this project started (a Ray head,
a port-forward): where they are, whether their process still runs, and
stopping it. Everything goes through a connector, so the file and the
process may be on this machine or on a controller host."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from .command import quote
from .connector.base import Connector
from .facts import Fact


class PidFile:
    """``<dir>/<name>.pid`` holding JSON: pid, the command line marker, when.
    The file and the process are on the host of ``via`` (a connector: this
    machine or a controller), ``dir`` relative to its root."""

    def __init__(self, directory: str | Path, name: str, marker: str, via: Connector):
        self.via = via
        self.path = Path(directory) / f"{name}.pid"
        self.name = name
        self.marker = marker

    def read(self) -> dict | None:
        data = self.via.read(str(self.path))
        try:
            d = json.loads(data) if data else None
        except ValueError:
            return None
        return d if isinstance(d, dict) else None

    def pid(self) -> int | None:
        d = self.read()
        try:
            return int(d["pid"]) if d and "pid" in d else None
        except (TypeError, ValueError):
            return None

    def alive(self) -> bool:
        pid = self.pid()
        return pid is not None and pid > 0 and self.via.alive(pid, self.marker)

    def write(self, pid: int, **extra: Any) -> None:
        text = json.dumps({"pid": pid, "marker": self.marker, "started": time.time(), **extra})
        self.via.write(str(self.path), text.encode())

    def stop(self, grace: float = 10.0) -> None:
        """Stop its process tree, then forget it."""
        pid = self.pid()
        if pid and self.alive():
            self.via.terminate(pid, grace)
        self.remove()

    def remove(self) -> None:
        self.via.remove(str(self.path))


def running_fact(pf: PidFile, shown: str) -> Fact:
    """A fact: is the process of this pid file running? Shown as the shell's
    ``kill -0 $(cat <pid file>)``; a dry run assumes it is not."""
    return Fact(name=f"{pf.name} process", python=pf.alive, display=f"kill -0 $(cat {quote(shown)})",
                assumed=False, describe=lambda a: "running" if a else "not running")
