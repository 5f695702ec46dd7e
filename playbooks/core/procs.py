"""Background processes this project started: pid files, liveness, and
stopping a whole process tree by pid (never by name, never ``ray stop``)."""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

if TYPE_CHECKING:
    from .connector import Connector


def _read(path: str) -> bytes | None:
    try:
        return Path(path).read_bytes()
    except OSError:
        return None


def stat_state(stat: bytes | None) -> str:
    """The state letter of a /proc/<pid>/stat text ("" when there is none)."""
    if not stat:
        return ""
    parts = stat.decode(errors="replace").rsplit(")", 1)[-1].split()
    return parts[0] if parts else ""


def _state(pid: int) -> str:
    return stat_state(_read(f"/proc/{pid}/stat"))


def alive_from(read: "Callable[[str], bytes | None]", pid: int, marker: str = "") -> bool:
    """The process exists, is not a zombie, and its command line holds
    ``marker`` (so a recycled pid is not mistaken for ours); /proc read with
    ``read`` (this machine's files, or a connector's)."""
    if pid <= 0 or stat_state(read(f"/proc/{pid}/stat")) in ("", "Z", "X"):
        return False
    if not marker:
        return True
    cmdline = read(f"/proc/{pid}/cmdline") or b""
    return marker in cmdline.replace(b"\0", b" ").decode(errors="replace")


def alive(pid: int, marker: str = "") -> bool:
    return alive_from(_read, pid, marker)


def children_map() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        out.setdefault(ppid, []).append(int(d.name))
    return out


def tree(pid: int) -> list[int]:
    """pid and all its descendants, parents first (a snapshot)."""
    kids = children_map()
    out, todo = [], [pid]
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def terminate(pids: Iterable[int], grace: float = 10.0, poll: float = 0.2) -> list[int]:
    """SIGTERM these processes, SIGKILL what is left after ``grace`` seconds.
    Returns the pids that had to be killed."""
    pids = [p for p in pids if _state(p) not in ("", "Z", "X")]
    for p in pids:
        try:
            os.kill(p, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_state(p) not in ("", "Z", "X") for p in pids):
        time.sleep(poll)
    killed = []
    for p in pids:
        if _state(p) not in ("", "Z", "X"):
            try:
                os.kill(p, signal.SIGKILL)
                killed.append(p)
            except ProcessLookupError:
                pass
    return killed


def kill_now(pids: Iterable[int]) -> None:
    """SIGKILL at once: a host lost without warning (preemption)."""
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def running_fact(pf: "PidFile", shown: str):
    """A fact: is the process of this pid file running? Shown as the shell's
    ``kill -0 $(cat <pid file>)``; a dry run assumes it is not."""
    from .command import quote
    from .facts import Fact

    return Fact(name=f"{pf.name} process", python=pf.alive, display=f"kill -0 $(cat {quote(shown)})",
                assumed=False, describe=lambda a: "running" if a else "not running")


class PidFile:
    """``<dir>/<name>.pid`` holding JSON: pid, the command line marker, when.
    The file and the process are on the host of ``via`` (a connector: this
    machine or a controller), ``dir`` relative to its root."""

    def __init__(self, directory, name: str, marker: str, via: "Connector"):
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

    def write(self, pid: int, **extra) -> None:
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
