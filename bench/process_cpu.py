"""Where a command's CPU goes, by kind of process: every process that ends
while it runs (Linux process accounting: exact CPU seconds of each, short
ones included), named by its command line (sampled from /proc every 0.2 s;
one that lived less than that is named by its executable's name only).

    .venv/bin/python bench/process_cpu.py [--write] [--top N] -- COMMAND ...   (as root)

Needs root and the `acct` package (`accton`, `dump-acct`: `apt-get install
acct`). Processes still running when the command ends (a daemon it left)
are not counted. `--write` writes the table, dated, into docs/tests.md
(between its `process-cpu` markers)."""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import doc_table  # noqa: E402

# (kind, words any of which in a process's program names it: its command
# line up to its first option), first match wins.
KINDS = (
    ("gcloud config config-helper (the auth plugin's token)", ("config-helper",)),
    ("gke-gcloud-auth-plugin", ("gke-gcloud-auth",)),
    ("gsutil", ("gsutil",)),
    ("gcloud", ("google-cloud-sdk", "gcloud")),
    ("kubectl", ("kubectl",)),
    ("Ray workers (training workers, Ray Train's actors, job supervisors)", ("default_worker", "ray::")),
    ("Ray's dashboard, its modules and agents", ("dashboard/", "ray-dashboard-", "ray.dashboard")),
    ("Ray's daemons (raylet, GCS, log monitor, runtime env agent)",
     ("raylet", "gcs_server", "log_monitor", "runtime_env", "ray/_private")),
    ("ray CLI (start, job submit, job logs)", ("bin/ray",)),
    ("invoke", ("/invoke ", "-m invoke ")),
    ("pytest and its workers", ("pytest", "exec(eval(sys.stdin")),
    ("sshd", ("sshd",)),
)


def program(cmdline: str) -> str:
    """A command line up to its first option (``--...``): the program and its script."""
    head = []
    for word in cmdline.split():
        if word.startswith("--"):
            break
        head.append(word)
    return " ".join(head)


def kind(cmdline: str, comm: str) -> str:
    text = (program(cmdline) or comm) + " "
    for name, words in KINDS:
        if any(w in text for w in words):
            return name
    return f"other ({comm})" if not cmdline else f"other ({Path(cmdline.split()[0]).name})"


RAY_WORKER = re.compile(r"setup_worker\.py|default_worker\.py|^ray::")


def sample(out: dict[int, str], stop: threading.Event) -> None:
    """pid -> command line of every process seen, until ``stop``."""
    while not stop.is_set():
        for p in os.listdir("/proc"):
            # A Ray worker names itself after it starts (ray::IDLE, then ray::Actor.method or a task's
            # name): read it again, and keep each name it had.
            if p.isdigit() and (int(p) not in out or RAY_WORKER.search(out[int(p)])):
                try:
                    cmd = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                cmd = cmd.strip()
                if cmd and int(p) not in out:
                    out[int(p)] = cmd
                elif cmd.startswith("ray::") and cmd not in out[int(p)]:
                    out[int(p)] = f"{cmd} < {out[int(p)]}"
        stop.wait(0.2)


def records(pacct: Path) -> list[tuple[str, float, int]]:
    """(comm, CPU seconds, pid) of each process accounted."""
    text = subprocess.run(["dump-acct", str(pacct)], capture_output=True, text=True, check=True).stdout
    out = []
    for line in text.splitlines():
        f = [x.strip() for x in line.split("|")]
        out.append((f[0], (float(f[2]) + float(f[3])) / 100, int(f[9])))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="write the table, dated, into docs/tests.md")
    ap.add_argument("--top", type=int, default=0, metavar="N", help="also print the N processes that spent the most")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if a.top < 0:
        raise SystemExit(f"process_cpu.py: --top {a.top}: must be 0 or more (how many processes to name)")
    if not command:
        raise SystemExit("process_cpu.py: no command given (after --)")
    if os.geteuid() != 0 or not (shutil.which("accton") and shutil.which("dump-acct")):
        raise SystemExit("process_cpu.py: needs root and the acct package (accton, dump-acct): apt-get install acct")
    names: dict[int, str] = {}
    stop = threading.Event()
    with tempfile.TemporaryDirectory() as t:
        pacct = Path(t) / "pacct"
        pacct.touch()
        subprocess.run(["accton", str(pacct)], check=True, capture_output=True)
        sampler = threading.Thread(target=sample, args=(names, stop), daemon=True)
        sampler.start()
        start = time.monotonic()
        try:
            rc = subprocess.run(command, cwd=ROOT).returncode
        finally:
            wall = time.monotonic() - start
            subprocess.run(["accton", "off"], capture_output=True)
            stop.set()
            sampler.join()
        recs = records(pacct)
    cpu: collections.Counter[str] = collections.Counter()
    n: collections.Counter[str] = collections.Counter()
    for comm, seconds, pid in recs:
        k = kind(names.get(pid, ""), comm)
        cpu[k] += seconds
        n[k] += 1
    total = sum(cpu.values())
    lines = [f"- `{' '.join(command)}`: exit {rc}, {wall:.0f} s; {total:.0f} CPU-seconds in {len(recs)} processes "
             f"that ended ({total / wall:.2f} cores on average).", "",
             "| kind of process | processes (shell wrappers included) | CPU-seconds | share |",
             "| --- | --- | --- | --- |"]
    for k, v in cpu.most_common():
        if v >= 1.0:
            lines.append(f"| {k} | {n[k]} | {v:.0f} | {v / total:.0%} |")
    print("\n".join(lines))
    for comm, seconds, pid in sorted(recs, key=lambda r: -r[1])[:a.top]:
        print(f"{seconds:7.1f} s  pid {pid}  {names.get(pid, comm)[:160]}")
    if a.write:
        doc_table.write("tests.md", "process-cpu", "bench/process_cpu.py -- " + " ".join(command), lines)
    print(json.dumps({"rc": rc}))
    sys.exit(rc)


if __name__ == "__main__":
    main()
