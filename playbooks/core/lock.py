"""A lock one process holds at a time on this machine, that says who holds it.

``flock`` on a file that holds the holder's pid: the kernel drops the lock
when its process ends, however it ends, so a crashed holder never leaves a
stale lock behind (and nobody is ever told to delete a lock file).
"""
from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


def holder(path: Path) -> str:
    """The pid written in the lock file by its holder ("?" when unknown)."""
    try:
        return path.read_text().split()[0]
    except (OSError, IndexError):
        return "?"


@contextmanager
def machine_lock(path: Path, what: str, on_wait: Callable[[str], None], every: float = 30.0,
                 poll: float = 0.5) -> Iterator[None]:
    """Hold the lock at ``path`` for the block. While another process holds
    it, ``on_wait`` is told so at once, then every ``every`` seconds, with
    the holder's pid and the time waited."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        start = time.monotonic()
        told = None
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                waited = time.monotonic() - start
                if told is None or waited - told >= every:
                    on_wait(f"waiting for pid {holder(path)}, which holds {path} ({what}): {waited:.0f}s")
                    told = waited
                time.sleep(poll)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
