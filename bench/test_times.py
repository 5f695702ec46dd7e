"""How long the tests take: `make check`'s selection and `make test`'s whole
run, as those targets run pytest (three workers), each test file's
test-seconds summed (what the workers spend on it) and the wall time, and
the machine's speed before and after (a fixed loop's CPU-seconds).

    .venv/bin/python bench/test_times.py [--only check|test] [--write] [--timeline FILE]

`--write` writes the table, dated, into docs/tests.md (between its
markers). The lint, the type check and `compileall` that the make targets
run first are timed too.
"""
from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import doc_table  # noqa: E402

PY = str(Path(sys.executable))


def make_commands(target: str) -> tuple[dict[str, list[str]], list[str]]:
    """What `make <target>` runs, read from `make -n` (the Makefile is the
    one home of each command and of the test selection): the commands
    before pytest, by name (ruff, mypy, compileall), and pytest's arguments;
    a target that runs pytest more than once is refused (this times one
    run). The setup scripts (bootstrap, test-deps) are left out."""
    import subprocess
    out = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    first: dict[str, list[str]] = {}
    pytests: list[list[str]] = []
    for line in out.splitlines():
        argv = shlex.split(line.split(">", 1)[0])
        if not argv or argv[0].startswith("scripts/"):
            continue
        if argv[1:3] == ["-m", "pytest"]:
            pytests.append(argv[3:])
        else:
            first[argv[2] if argv[1:2] == ["-m"] else Path(argv[0]).name] = argv
    if len(pytests) != 1:
        raise SystemExit(f"`make -n {target}` runs pytest {len(pytests)} times (this times one run): {out!r}")
    return first, pytests[0]


# A fixed piece of work on one core (a loop of Python arithmetic), timed in
# CPU-seconds before and after the run: this machine's speed moves a run's
# CPU-seconds by a fifth from one session to the next, with no change of
# code. Two readings, not the run's own speed: on 2026-12-07 it read
# 2.12-2.41 in runs of 697-733 s alike (docs/tests.md).
GAUGE = "import time\nt = time.process_time()\nx = 0\nfor i in range(20_000_000):\n    x += i * i\n" \
        "print(time.process_time() - t)"


def gauge() -> float:
    import subprocess
    return float(subprocess.run([PY, "-c", GAUGE], capture_output=True, text=True, check=True).stdout)


def timed(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, int]:
    import subprocess
    start = time.monotonic()
    done = subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    return time.monotonic() - start, done.returncode


def busy_seconds() -> tuple[float, int]:
    """The machine's CPU seconds spent busy so far (every process, /proc/stat:
    all but idle and iowait), and its cores."""
    import os
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK"), os.cpu_count() or 1


def cpu_per_file(tests: list[dict]) -> dict[str, float]:
    """Each test file's CPU seconds: its pytest worker's and those of the
    processes its tests started and waited for (tests/conftest.py's CPU_LOG
    lines, one per test)."""
    out: dict[str, float] = {}
    for t in tests:
        out[f"tests/{t['file']}"] = out.get(f"tests/{t['file']}", 0.0) + t["own"] + t["children"]
    return out


def per_file(junit: Path) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Each test file's test times, and the tests that failed with what
    pytest said (its report's failure text)."""
    files: dict[str, list[float]] = {}
    failed = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = ".".join(case.get("classname", "?").split(".")[:2])
        files.setdefault(module.replace(".", "/") + ".py", []).append(float(case.get("time") or 0))
        for c in case:
            if c.tag in ("failure", "error"):
                failed[f"{module.replace('.', '/')}.py::{case.get('name')}"] = c.text or c.get("message") or ""
    return files, failed


def sample_busy(out: list[tuple[float, float]], stop) -> None:
    """(time, the machine's busy CPU-seconds so far) every second, until ``stop``."""
    while not stop.is_set():
        out.append((time.time(), busy_seconds()[0]))
        stop.wait(1.0)


def run(selection: list[str], tmp: Path, name: str) -> dict:
    import json
    import os
    import threading
    junit, log = tmp / f"{name}.xml", tmp / f"{name}-cpu.jsonl"
    before = gauge()
    busy = busy_seconds()[0]
    samples: list[tuple[float, float]] = []
    stop = threading.Event()
    sampler = threading.Thread(target=sample_busy, args=(samples, stop), daemon=True)
    sampler.start()
    wall, rc = timed([PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *selection],
                     env={**os.environ, "PLAYBOOK_TEST_CPU_LOG": str(log)})
    stop.set()
    sampler.join()
    now, cores = busy_seconds()
    busy = now - busy
    speed = (before, gauge())
    files, failed = per_file(junit) if junit.is_file() else ({}, {"(pytest wrote no report)": ""})
    tests = [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []
    return {"wall": wall, "rc": rc, "files": files, "failed": failed, "cpu": cpu_per_file(tests), "busy": busy,
            "cores": cores, "tests": tests, "busy_samples": samples, "gauge": speed}


def table(check: dict | None, full: dict | None, first: dict[str, float]) -> list[str]:
    lines = []
    pre = sum(first.values())
    for r, target in ((check, "check"), (full, "test")):
        if r is None:
            continue
        n = sum(len(t) for t in r["files"].values())
        outcome = "all passed" if r["rc"] == 0 else f"{len(r['failed'])} failed (exit {r['rc']}): " + ", ".join(
            f"`{t}`" for t in r["failed"])
        lines.append(f"- `make {target}`: pytest {r['wall']:.0f} s for {n} tests ({outcome}); with the lint, the "
                     f"types and compileall ({pre:.0f} s: " + ", ".join(f"{k} {v:.0f} s" for k, v in first.items())
                     + f") {r['wall'] + pre:.0f} s.")
    shown = full or check
    assert shown is not None
    lines.append(f"- The machine's {shown['cores']} cores were busy {shown['busy']:.0f} CPU-seconds of the "
                 f"{shown['wall'] * shown['cores']:.0f} the pytest run's wall time gave them "
                 f"({shown['busy'] / (shown['wall'] * shown['cores']):.0%}); the rest is waiting (every worker, or "
                 "the others while one runs a single process).")
    lines.append(f"- The machine's speed (a fixed loop of Python arithmetic on one core, `GAUGE`): "
                 f"{shown['gauge'][0]:.2f} CPU-seconds before the run, {shown['gauge'][1]:.2f} after (less is "
                 "faster).")
    lines += ["", f"Where the workers' time goes ({'make test' if full else 'make check'}), by test file "
              "(CPU-seconds: the test's pytest worker and the processes it started and waited for, such as "
              "`invoke`, gcloud and kubectl; not the local Ray nodes, which outlive the command that starts "
              "them):", "",
              "| test file | tests | test-seconds | CPU-seconds |", "| --- | --- | --- | --- |"]
    for f, times in sorted(shown["files"].items(), key=lambda kv: -sum(kv[1])):
        lines.append(f"| `{f}` | {len(times)} | {sum(times):.1f} | {shown['cpu'].get(f, 0.0):.1f} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=("check", "test"))
    ap.add_argument("--write", action="store_true", help="write the table, dated, into docs/tests.md")
    ap.add_argument("--timeline", type=Path, metavar="FILE",
                    help="write each test's start, worker, wall and CPU seconds and the machine's busy CPU-seconds "
                         "each second (JSON), to see where the cores wait")
    a = ap.parse_args()
    commands, check_args = make_commands("check")
    _, test_args = make_commands("test")
    first = {k: timed(v)[0] for k, v in commands.items()}
    with tempfile.TemporaryDirectory() as t:
        check = run(check_args, Path(t), "check") if a.only in (None, "check") else None
        full = run(test_args, Path(t), "test") if a.only in (None, "test") else None
    lines = table(check, full, first)
    print("\n".join(lines))
    for r in (check, full):
        for test, why in (r or {}).get("failed", {}).items():   # why it failed, not in the table
            print(f"\n{test} failed:\n{why[-6000:]}", file=sys.stderr)
    if a.timeline:
        import json
        a.timeline.write_text(json.dumps({k: {"tests": r["tests"], "busy": r["busy_samples"], "cores": r["cores"]}
                                          for k, r in (("check", check), ("test", full)) if r is not None}))
    if a.write:
        doc_table.write("tests.md", "test-times", "bench/test_times.py" + (f" --only {a.only}" if a.only else ""),
                        lines)
    sys.exit(0 if all(r is None or r["rc"] == 0 for r in (check, full)) else 1)


if __name__ == "__main__":
    main()
