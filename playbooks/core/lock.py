"""A lock one process holds at a time on this machine, that says who holds it.

``flock`` on a file that holds its holder's record (one JSON line: pid,
user@host, what it runs, since when): the kernel drops the lock when its
process ends, however it ends, so a crashed holder never leaves a stale lock
behind (and nobody is ever told to delete a lock file). A waiter is told who
holds it and since when; with a ``wait`` limit, past it, it is refused
(``Busy``), in one line.
"""
from __future__ import annotations

import contextlib
import fcntl
import getpass
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .errors import PlaybookError


@dataclass(frozen=True)
class Holder:
    """Who holds a lock: its pid, user@host, what it runs, since when
    (seconds since the epoch); "" / None where the lock file does not say."""

    pid: str = "?"
    who: str = ""
    doing: str = ""
    since: float | None = None

    def __str__(self) -> str:
        bits = [b for b in (self.who, f"`{self.doing}`" if self.doing else "") if b]
        if self.since is not None:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(self.since))
            bits.append(f"since {stamp}, {_ago(time.time() - self.since)} ago")
        return f"pid {self.pid}" + (f" ({', '.join(bits)})" if bits else "")


def _ago(seconds: float) -> str:
    s = max(0, int(seconds))
    return f"{s}s" if s < 60 else f"{s // 60}m{s % 60:02d}s" if s < 3600 else f"{s // 3600}h{s % 3600 // 60:02d}m"


def holder(path: Path) -> Holder:
    """Who the lock file says holds it (a file of only a pid, as older
    holders wrote it, says only that)."""
    try:
        text = path.read_text().strip()
    except OSError:
        return Holder()
    try:
        rec = json.loads(text)
        return Holder(str(rec.get("pid", "?")), str(rec.get("who", "")), str(rec.get("doing", "")),
                      float(rec["since"]) if isinstance(rec.get("since"), (int, float)) else None)
    except (ValueError, AttributeError):
        return Holder(text.split()[0] if text else "?")


def me(doing: str = "") -> dict:
    """This process's record, as the lock file keeps it."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return {"pid": os.getpid(), "who": f"{user}@{socket.gethostname()}", "doing": doing, "since": time.time()}


class Busy(PlaybookError):
    """The lock is held by another process, and waiting for it was not
    allowed (``wait`` 0) or did not end within ``wait`` seconds."""

    exit_code = 75  # EX_TEMPFAIL: try again later

    def __init__(self, what: str, holder: Holder, path: str, waited: float, hint: str = ""):
        self.what, self.holder, self.path, self.waited, self.hint = what, holder, path, waited, hint
        super().__init__(f"{what}: {holder} holds {path}" + (f"; waited {waited:.0f}s" if waited >= 0.5 else "")
                         + (f"; {hint}" if hint else ""))


@contextmanager
def machine_lock(path: Path, what: str, on_wait: Callable[[str], None], every: float = 30.0,
                 poll: float = 0.5, wait: float | None = None, doing: str = "", shown: str = "") -> Iterator[None]:
    """Hold the lock at ``path`` (named ``shown`` in what it says) for the
    block (``what``: what it keeps to one at a time; ``doing``: what this
    process runs, kept for a waiter to read). While another process holds it, ``on_wait`` is told so at once,
    then every ``every`` seconds: who, since when, the time waited. Past
    ``wait`` seconds (None: no limit; 0: at once) it raises Busy."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        _acquire(fd, path, shown or str(path), what, on_wait, every, poll, wait)
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(me(doing)) + "\n").encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)


def _acquire(fd: int, path: Path, shown: str, what: str, on_wait: Callable[[str], None], every: float, poll: float,
             wait: float | None) -> None:
    start = time.monotonic()
    told = None
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            waited = time.monotonic() - start
            if wait is not None and waited >= wait:
                raise Busy(what, holder(path), shown, waited) from None
            if told is None or waited - told >= every:
                limit = f" of at most {wait:.0f}s" if wait is not None else ""
                on_wait(f"waiting for {holder(path)}, which holds {shown} ({what}): {waited:.0f}s{limit}")
                told = waited
            time.sleep(poll)
