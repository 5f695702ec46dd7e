"""A benchmark's table, written into its page of docs/ between its markers
(``<!-- bench:NAME -->`` ... ``<!-- /bench:NAME -->``), headed by the
command that measured it, the date, the commit and the machine: a figure
in the docs comes from a script, with its date, never from prose."""
from __future__ import annotations

import datetime
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def markers(name: str) -> tuple[str, str]:
    return f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"


def machine() -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{os.cpu_count()} CPU cores, load average {load:.1f} at the end"


def commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return (out.stdout.strip() or "unknown") + (" + changes" if dirty else "")


def write(page: str, name: str, command: str, lines: list[str], stamp: str | None = None) -> Path:
    """Replace the table between NAME's markers in docs/PAGE (``../README.md``:
    the project's README), headed by ``stamp`` and the date, commit and
    machine (by default: the command that wrote it); exits with one line when
    the page or its markers are missing."""
    path = (ROOT / "docs" / page).resolve()
    begin, end = markers(name)
    text = path.read_text() if path.is_file() else ""
    if begin not in text or end not in text.split(begin, 1)[1]:
        raise SystemExit(f"{path.relative_to(ROOT)} has no {begin} ... {end} markers")
    head, rest = text.split(begin, 1)
    tail = rest.split(end, 1)[1]
    stamp = (stamp or f"Written by `{command}`.").rstrip(".") + (
        f" on {datetime.date.today().isoformat()} at commit `{commit()}` ({machine()}).")
    path.write_text(head + begin + "\n" + stamp + "\n\n" + "\n".join(lines).rstrip("\n") + "\n" + end + tail)
    print(f"wrote the table into {path.relative_to(ROOT)}")
    return path
