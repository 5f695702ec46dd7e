"""A simulated TPU host's process: it runs the host's `ray start --block`
as its child, and starts it again when it fails to start (as a pod's
container that exits is started again); a late host of the rehearsal
(rehearse_late_slice) first waits.

    python -m playbooks.twin.host_process [--join-after=SECONDS] ray start ... --block ...

With ``--join-after`` it waits SECONDS, or until it gets SIGUSR1 (`kill -USR1
<its pid>`: the slice joins now, when a rehearsal or a test wants it at a
moment of the job rather than of the clock). Its pid is the host's (the pid
file, a re-run, `status`, teardown and chaos see one process tree
throughout: its command line holds the pid file's marker, `ray start` and
Ray's node are its children; chaos's kill and teardown end the whole tree,
so a host they end is not started again).

Ray gives a node 30 s to register with the GCS (``raylet_start_wait_time_s``
in ray/_private/node.py, not configurable); on a machine loaded past its
cores a `ray start` can run out of it ("The current node timed out during
startup") and exit: a host brought back by chaos, or a late slice, would
then never join (seen in the soak under load, and in the e2e with three
pytest workers). A `ray start` that exits non-zero before ``STARTED_AFTER``
seconds is started again, up to ``ATTEMPTS`` times in all; one that ran
longer had started, and its end is the host's. SIGTERM and SIGINT are
passed on to `ray start`, which stops its node; this process then ends
with it.

A host started again (chaos brought it back, a sick host healed) rejoins
the same Ray session with the same ``--temp-dir``, and a new node's log
monitor forwards every worker log it finds in the session's logs folder
from its start: the output of the workers that died with the host before
would reach the job's driver a second time, after the new worker group's
(seen in the e2e: a killed worker's steps 10-16 again after the one-slice
group started, taken for that group's). A pod that comes back on GKE has
a fresh disk. So before each `ray start`, the logs of workers no longer
alive are set aside into the folder's ``old/``, where Ray's own log
monitor moves them (``_close_all_files`` in ray/_private/log_monitor.py),
which it does not read.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from playbooks.core import procs

ATTEMPTS = 3
# Ray's 30 s for the node to register, and the time `ray start` takes before
# it starts waiting for that (its GCS connection, its processes) on a loaded
# machine.
STARTED_AFTER = 90.0
AGAIN_AFTER = 2.0


def wait_for_join(seconds: float) -> None:
    """``seconds``, or until SIGUSR1; a later SIGUSR1 is ignored (the host
    has joined)."""
    s = {signal.SIGUSR1}
    signal.pthread_sigmask(signal.SIG_BLOCK, s)
    signal.sigtimedwait(s, seconds)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, s)


# A worker's output, as Ray 2.60 names it: worker-<worker id>-<job id>-<pid>.out or .err.
WORKER_LOG = re.compile(r"^worker-[0-9a-f]+-[0-9a-f]+-(\d+)\.(out|err)$")
TEMP_DIR = "--temp-dir="


def set_aside_dead_workers_logs(command: Sequence[str]) -> list[str]:
    """The logs of workers no longer alive in the session this node last
    joined (``--temp-dir``'s ``session_latest``), moved into its logs'
    ``old/``; the names moved. A live worker's (another checkout's cluster
    of the same names shares the folder) stays."""
    temp = next((a[len(TEMP_DIR):] for a in command if a.startswith(TEMP_DIR)), None)
    if temp is None:
        return []
    logs = Path(temp) / "session_latest" / "logs"
    moved = []
    try:
        names = sorted(os.listdir(logs))
    except OSError:
        return []
    for name in names:
        m = WORKER_LOG.match(name)
        if m and not procs.alive(int(m.group(1))):
            try:
                (logs / "old").mkdir(exist_ok=True)
                os.replace(logs / name, logs / "old" / name)
                moved.append(name)
            except OSError:
                continue
    return moved


def run(command: Sequence[str], attempts: int = ATTEMPTS, started_after: float = STARTED_AFTER,
        again_after: float = AGAIN_AFTER) -> int:
    """``command`` to its end, started again (``attempts`` in all) while it
    exits non-zero within ``started_after`` seconds; its exit status."""
    child: subprocess.Popen | None = None
    stopping = False

    def pass_on(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, pass_on)
    signal.signal(signal.SIGINT, pass_on)
    rc = 1
    for attempt in range(1, attempts + 1):
        if stopping:
            return rc
        moved = set_aside_dead_workers_logs(command)
        if moved:
            print(f"TPU host: {len(moved)} log(s) of workers no longer alive set aside into logs/old/ of the Ray "
                  f"session this host last joined (a new node of that session would send them to the job again)",
                  flush=True)
        start = time.monotonic()
        child = subprocess.Popen(list(command))
        rc = child.wait()
        ran = time.monotonic() - start
        if stopping or rc == 0 or ran >= started_after or attempt == attempts:
            return rc
        print(f"TPU host: `{command[0]} {command[1] if len(command) > 1 else ''}` exited {rc} after {ran:.0f}s, "
              f"before its node started: starting it again ({attempt + 1} of {attempts})", flush=True)
        time.sleep(again_after)
    return rc


JOIN_AFTER = "--join-after="


def main(argv: Sequence[str]) -> int:
    late = argv[0][len(JOIN_AFTER):] if argv and argv[0].startswith(JOIN_AFTER) else None
    command = argv[1:] if late is not None else argv
    if not command:
        print(f"usage: python -m playbooks.twin.host_process [{JOIN_AFTER}SECONDS] COMMAND...", file=sys.stderr)
        return 2
    if late is not None:
        wait_for_join(float(late))
    return run(command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
