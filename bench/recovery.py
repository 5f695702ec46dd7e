"""Time to recover from a lost TPU host, with and without the persistent
compilation cache, on the local cluster.

    .venv/bin/python bench/recovery.py [--steps 60] [--lose-at 15] [--runs without,with]

Each run is the elastic job a user would run: `invoke train --elastic
--fresh --steps=N` in one process; when ~`--lose-at` steps are done,
`invoke chaos.delete-worker --restore-after=0` kills one simulated TPU host
(a lost slice); once the job runs again on the slice left, `invoke up`
brings the host back and the job grows back to both slices and ends.

The runs differ only in `jax_cache_dir` (MaxText's key: it calls
jax.experimental.compilation_cache.set_cache_dir):

- without: a fresh, empty folder, so the worker group restarted after the
  loss (a new mesh: one slice) compiles everything again;
- with: the folder the `without` run filled (it compiled both shapes, two
  slices and one), so the restarted group loads its executables.

Figures, per run, from the job's log (`jax_debug_log_modules=
jax._src.dispatch,jax._src.compiler` makes JAX log each compile's seconds
and each persistent-cache hit):

- compile s after the restore: the sum of JAX's "Finished XLA compilation
  ... in X sec" of a worker of the group restarted after the loss (the
  largest sum over its workers), and how many executables came from the
  persistent cache ("Persistent compilation cache hit");
- recover s: from the kill (the chaos task's "killed TPU host" line) to the
  first training step of the restarted group (the issue's "time to
  recover"), with its parts: until Ray Train started the smaller group,
  and from there to the first step (restore, compile, the step).

Times are when the lines reached this process (Ray forwards the workers'
output within about a second; the same for both runs). Uses its own
environment (bench-recovery: ray_ip 127.0.0.9, gcs_port 7100,
dashboard_port 8290, its own .state folder) and stops its cluster at the end.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import doc_table  # noqa: E402
from playbooks.runs.events import GROUP_LINE as GROUP  # noqa: E402
from playbooks.runs.job_log import STEP_LINE as STEP  # noqa: E402
from playbooks.runs.job_log import WORKER, clean  # noqa: E402

INVOKE = str(Path(sys.executable).parent / "invoke")
ENV = "bench-recovery"
COMPILED = re.compile(r"Finished XLA compilation of (\S+) in ([\d.]+) sec")
HIT = re.compile(r"Persistent compilation cache hit for '([^']+)'")
LOGS = re.compile(r"^logs: (\S+)")
RESTORED = re.compile(r"restoring from this run's directory step (\d+)")
DEBUG_MODULES = "jax._src.dispatch,jax._src.compiler"


def local_env() -> dict:
    base = yaml.safe_load((ROOT / "inventory.yaml").read_text())["environments"]["local"]
    return {**base, "ray_ip": "127.0.0.9", "gcs_port": 7100, "dashboard_port": 8290}


@dataclass
class Run:
    name: str
    cache: Path
    lines: list[tuple[float, str]] = field(default_factory=list)   # (arrival, console line)
    lost_at: float | None = None
    job_log: Path | None = None
    rc: int | None = None

    def first(self, pattern: re.Pattern, after: float, least: int = 0,
              most: int | None = None) -> tuple[float, str] | None:
        """The first line from ``after`` on that matches (and whose first
        number group is at least ``least`` and at most ``most``)."""
        for t, ln in self.lines:
            if t >= after and (m := pattern.search(ln)) and (not least or int(m.group(1)) >= least) \
                    and (most is None or int(m.group(1)) <= most):
                return t, ln
        return None


class Follow:
    """`invoke train` in the background, each line of its output kept with
    the time it arrived."""

    def __init__(self, run: Run, argv: list[str], env: dict):
        self.run = run
        self.p = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, bufsize=1)
        self.cv = threading.Condition()
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            with self.cv:
                self.run.lines.append((time.monotonic(), clean(line.rstrip("\n"))))
                self.cv.notify_all()
        with self.cv:
            self.run.rc = self.p.wait()
            self.cv.notify_all()

    def wait_for(self, pattern: re.Pattern, after: float = 0.0, least: int = 0,
                 minutes: float = 20, most: int | None = None) -> tuple[float, str]:
        deadline = time.monotonic() + minutes * 60
        with self.cv:
            while True:
                hit = self.run.first(pattern, after, least, most)
                if hit:
                    return hit
                if self.run.rc is not None:
                    tail = "\n".join(ln for _, ln in self.run.lines[-40:])
                    sys.exit(f"{self.run.name}: the job ended (exit {self.run.rc}) before {pattern.pattern!r}:\n{tail}")
                if time.monotonic() > deadline:
                    sys.exit(f"{self.run.name}: no {pattern.pattern!r} within {minutes:g} minutes")
                self.cv.wait(timeout=5)


def invoke(env: dict, *args: str, timeout: float = 900, check: bool = True) -> tuple[float, str]:
    """Run a task to its end; (when its 'changed' line came, its output).
    A failure ends the benchmark, unless ``check`` is false."""
    p = subprocess.Popen([INVOKE, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, bufsize=1)
    out, changed = [], None
    assert p.stdout is not None
    for line in p.stdout:
        out.append(line)
        if changed is None and line.startswith("changed:"):
            changed = time.monotonic()
    rc = p.wait(timeout=timeout)
    if rc != 0 and check:
        sys.exit(f"invoke {' '.join(args)} failed (exit {rc}):\n{''.join(out[-30:])}")
    return changed or time.monotonic(), "".join(out)


def one_run(run: Run, env: dict, steps: int, lose_at: int) -> None:
    argv = [INVOKE, "train", "--elastic", "--fresh", f"--steps={steps}", "--set", f"jax_cache_dir={run.cache}",
            "--set", f"jax_debug_log_modules={DEBUG_MODULES}"]
    job = Follow(run, argv, env)
    try:
        job.wait_for(STEP, least=lose_at, minutes=30)
        run.lost_at, chaos = invoke(env, "chaos.delete-worker", "--restore-after=0", timeout=300)
        if "killed TPU host" not in chaos:
            sys.exit(f"{run.name}: chaos.delete-worker killed nothing:\n{chaos}")
        started, _ = job.wait_for(GROUP, after=run.lost_at, most=1)  # the one-slice group
        job.wait_for(STEP, after=started)
        # The host back (the job grows back if it has steps left); the figures
        # are taken already: a host that does not come back is only said.
        _, up = invoke(env, "up", timeout=600, check=False)
        if "failed=0" not in up:
            print(f"  note: `invoke up` did not bring the host back: {up.strip().splitlines()[-1]}", flush=True)
        job.t.join(timeout=1800)
    finally:
        if job.p.poll() is None:
            job.p.terminate()
            job.p.wait(60)
    if run.rc != 0:
        tail = "\n".join(ln for _, ln in run.lines[-40:])
        sys.exit(f"{run.name}: invoke train failed (exit {run.rc}):\n{tail}")
    logs = next((m.group(1) for _, ln in run.lines if (m := LOGS.match(ln))), None)
    run.job_log = ROOT / logs / "job.log" if logs else None


def compile_after_loss(log: Path) -> dict:
    """From the job's log: the workers of the group Ray Train started after
    the first resize down (a worker speaks first just before its
    controller's "Started training worker group" line: a group's workers are
    those first heard after the line of the group before it, and before
    the line of the group after it); per worker its compile seconds and
    persistent-cache hits."""
    groups: list[tuple[int, int]] = []                  # (line number, size)
    first: dict[str, int] = {}                          # worker pid -> the line it first spoke on
    compiled: dict[str, list[tuple[str, float]]] = {}
    hits: dict[str, int] = {}
    for n, raw in enumerate(log.read_text(errors="replace").splitlines()):
        line = clean(raw)
        if (g := GROUP.search(line)):
            groups.append((n, int(g.group(1))))
            continue
        w = WORKER.search(line)
        if not w:
            continue
        pid = w.group(1) or w.group(2)
        first.setdefault(pid, n)
        if (m := COMPILED.search(line)):
            compiled.setdefault(pid, []).append((m.group(1), float(m.group(2))))
        elif HIT.search(line):
            hits[pid] = hits.get(pid, 0) + 1
    sizes = [size for _, size in groups]
    k = next((i for i in range(1, len(groups)) if sizes[i] < sizes[i - 1]), None)
    if k is None:
        sys.exit(f"{log}: no smaller worker group after the loss (groups {sizes})")
    since, until = groups[k - 1][0], groups[k + 1][0] if k + 1 < len(groups) else float("inf")
    pids = [p for p, n in first.items() if since < n < until]
    if not pids:
        sys.exit(f"{log}: no worker output in the group after the loss")
    per = {p: sum(s for _, s in compiled.get(p, [])) for p in pids}
    worst = max(pids, key=lambda p: per[p])
    train = max((s for n, s in compiled.get(worst, []) if "train_step" in n), default=0.0)
    return {"compile_s": per[worst], "train_step_s": train, "compiles": len(compiled.get(worst, [])),
            "hits": hits.get(worst, 0), "groups": sizes}


def figures(run: Run) -> dict:
    assert run.lost_at is not None and run.job_log is not None
    started = run.first(GROUP, run.lost_at, most=1)
    assert started, run.name
    restored = run.first(RESTORED, started[0])
    first = run.first(STEP, started[0])
    assert first, run.name
    out = compile_after_loss(run.job_log)
    out.update(detect_s=started[0] - run.lost_at, recover_s=first[0] - run.lost_at,
               restart_to_step_s=first[0] - started[0],
               restored_step=int(RESTORED.search(restored[1]).group(1)) if restored else None,  # type: ignore[union-attr]
               first_step=int(STEP.search(first[1]).group(1)))  # type: ignore[union-attr]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--lose-at", type=int, default=15, help="the step after which the host is killed")
    ap.add_argument("--runs", default="without,with",
                    help="in order: 'without' (a fresh cache folder) and 'with' (the last one filled)")
    ap.add_argument("--write", action="store_true", help="write the table, dated, into docs/benchmarks.md")
    a = ap.parse_args()
    names = a.runs.split(",")
    if any(n not in ("without", "with") for n in names) or names[0] == "with":
        sys.exit("--runs: a list of 'without' and 'with', starting with 'without' (it fills the cache)")
    tmp = Path(tempfile.mkdtemp(prefix="bench-recovery-"))
    inv = tmp / "inventory.yaml"
    inv.write_text(yaml.safe_dump({"default": ENV, "environments": {ENV: local_env()}}))
    shutil.rmtree(ROOT / ".state" / ENV, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("INVOKE_")}
    env.update({"INVOKE_PLAYBOOK_INVENTORY": str(inv), "HOME": str(tmp), "RAY_USAGE_STATS_ENABLED": "0",
                "PYTHONUNBUFFERED": "1"})
    results: list[tuple[Run, dict]] = []
    cache = tmp / "cache-0"
    try:
        invoke(env, "up", timeout=600)
        for i, name in enumerate(names):
            if name == "without":
                cache = tmp / f"cache-{i}"
                cache.mkdir()
            run = Run(name, cache)
            print(f"run {i + 1}/{len(names)}: {name} cache ({cache})", flush=True)
            one_run(run, env, a.steps, a.lose_at)
            results.append((run, figures(run)))
            print(f"  {results[-1][1]}", flush=True)
    finally:
        subprocess.run([INVOKE, "teardown", "--yes"], cwd=ROOT, env=env, capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    lines = [f"Recovery after a lost TPU host: the local cluster, 2 simulated v6e slices, the tiny "
             f"llama3-8b-shaped model, {a.steps} steps, a host killed after step {a.lose_at}.", "",
             "| cache | compile s after the restore (cache hits) | train_step compile s | detect s (kill to new "
             "group) | new group to first step s | recover s (kill to first step) | restored step |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {run.name} | {f['compile_s']:.1f} ({f['hits']}) | {f['train_step_s']:.2f} | {f['detect_s']:.1f} | "
              f"{f['restart_to_step_s']:.1f} | {f['recover_s']:.1f} | {f['restored_step']} |" for run, f in results]
    print("\n" + "\n".join(lines))
    if a.write:
        doc_table.write("benchmarks.md", "recovery", f"bench/recovery.py --steps {a.steps} --lose-at {a.lose_at} "
                        f"--runs {a.runs}", lines)


if __name__ == "__main__":
    main()
