"""This machine's processes, through its /proc: liveness, a process tree,
and stopping a whole tree by pid (never by name, never ``ray stop``), as the
local connector does them. ``alive_from`` reads /proc texts through any
reader, so a connector for another host uses it over its own files.

The bottom layer: nothing of the project is imported here (pid files, which
go through a connector, are ``pidfile.py``)."""
from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path


def _read(path: str) -> bytes | None:
    try:
        return Path(path).read_bytes()
    except OSError:
        return None


def _stat_fields(stat: bytes | None) -> list[str]:
    """The fields of a /proc/<pid>/stat text after the command's name."""
    return stat.decode(errors="replace").rsplit(")", 1)[-1].split() if stat else []


def stat_state(stat: bytes | None) -> str:
    """The state letter of a /proc/<pid>/stat text ("" when there is none)."""
    parts = _stat_fields(stat)
    return parts[0] if parts else ""


PF_KTHREAD = 0x00200000  # a kernel thread (Linux's include/linux/sched.h): no command line, ever


def kernel_thread(stat: bytes | None) -> bool:
    parts = _stat_fields(stat)
    return len(parts) > 6 and parts[6].isdigit() and bool(int(parts[6]) & PF_KTHREAD)


_GONE = ("", "Z", "X")

# A process in the middle of an exec has an empty /proc/<pid>/cmdline: the
# kernel gives it its new memory first and the new program's arguments a
# little later (Linux's load_elf_binary), and the file is read from that
# memory. A spawned program is such a process twice over (the shell's fork,
# then `setsid`, then the program): its cmdline is read again, up to this
# many times EXEC_PAUSE apart, before its empty command line is taken as its
# answer. Measured here (2026-12-07): a shell that execs itself 3,000 times,
# looked at without a pause, was "not alive" in 1,736 of 50,820 looks; the
# SSH connector's tests failed on it twice in a week.
EXEC_LOOKS = 50
EXEC_PAUSE = 0.01


def alive_from(read: Callable[[str], bytes | None], pid: int, marker: str = "") -> bool:
    """The process exists, is not a zombie, and its command line holds
    ``marker`` (so a recycled pid is not mistaken for ours); /proc read with
    ``read`` (this machine's files, or a connector's). A process found in
    the middle of an exec is looked at again (``EXEC_LOOKS``)."""
    if pid <= 0:
        return False
    for look in range(EXEC_LOOKS):
        try:
            stat = read(f"/proc/{pid}/stat")
            if stat_state(stat) in _GONE:
                return False
            if not marker:
                return True
            if kernel_thread(stat):  # a recycled pid: never ours, and never a command line
                return False
            cmdline = read(f"/proc/{pid}/cmdline") or b""
        except OSError:
            # A /proc file opened while the process ran and read once it had
            # ended fails (ESRCH; over SFTP a bare "Failure"). Gone now is an
            # answer; a process still there whose files cannot be read is not.
            if stat_state(read(f"/proc/{pid}/stat")) in _GONE:
                return False
            raise
        if cmdline or look == EXEC_LOOKS - 1:
            break
        time.sleep(EXEC_PAUSE)  # in an exec: its new arguments come next
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
    """SIGTERM a process tree, as tree() lists it (its root first), and
    SIGKILL what is left of it after ``grace`` seconds. Returns the pids
    that had to be killed.

    The root is told first, and the rest once it has gone (or after half
    the grace): a process that manages its children stops them in its own
    order. `ray start --block` stops its raylet before its GCS in about 2 s
    (measured here, a twin's head); a SIGTERM to every process at once
    leaves the raylet waiting on a GCS that is going, and the whole tree
    then waits out the grace."""
    pids = [p for p in pids if alive(p)]
    if not pids:
        return []
    deadline = time.monotonic() + grace
    root, rest = pids[0], pids[1:]
    with contextlib.suppress(ProcessLookupError):
        os.kill(root, signal.SIGTERM)
    first = time.monotonic() + grace / 2
    while time.monotonic() < first and alive(root):
        time.sleep(poll)
    for p in rest:
        if alive(p):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGTERM)
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(poll)
    killed = []
    for p in pids:
        if alive(p):
            try:
                os.kill(p, signal.SIGKILL)
                killed.append(p)
            except ProcessLookupError:
                pass
    return killed


def kill_now(pids: Iterable[int]) -> None:
    """SIGKILL at once: a host lost without warning (preemption)."""
    for p in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


# A process SIGKILLed is not gone when kill() returns: it must still run its
# exit, which frees its memory first. Measured here (2026-12-07): right
# after kill(), a `sh` was still alive in 7 of 20 looks and a process
# holding 200 MB in 18 of 20; a simulated TPU host (a Ray node with its
# object store), killed by chaos on a loaded machine, was still alive when
# chaos looked whether to bring it back, and was left down (the soak's
# many-lost). Longer than this, a process is stuck in the kernel.
KILL_WAIT = 10.0


def wait_gone(pids: Iterable[int], alive_now: Callable[[int], bool] = alive, poll: float = 0.02,
              timeout: float = KILL_WAIT) -> None:
    """Wait until none of ``pids`` is alive (``alive_now``: this machine's
    /proc, or a connector's; a zombie is gone); OSError naming those still
    alive after ``timeout`` seconds."""
    pids = list(pids)
    deadline = time.monotonic() + timeout
    while (left := [p for p in pids if alive_now(p)]) and time.monotonic() < deadline:
        time.sleep(poll)
    if left:
        raise OSError(f"pid(s) {', '.join(map(str, left))} still running {timeout:g} s after SIGKILL")
