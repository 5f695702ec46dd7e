"""Preflight benchmark: the ahead-of-time compiles of the tutorial's jobs for
2 x v6e-16 (32 chips), each as `invoke preflight` runs it: wall time, peak
host RSS of the compile, and the per-chip memory the compiler reports.

    .venv/bin/python bench/fit_compiles.py [--only 8b|70b|70b-fits]

No cache: every compile is cold (JAX's compilation cache did not help here).
Minutes each on a 2-core machine.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import doc_table  # noqa: E402
from playbooks.config.schema import load_inventory  # noqa: E402
from playbooks.job import fit as pf  # noqa: E402
from playbooks.job import spec as tr  # noqa: E402

CASES = {
    "8b": ("llama3-8b", ""),
    "70b": ("llama3-70b", ""),
    "70b-fits": ("llama3-70b", "fits"),
}


def compile_once(env, model: str, preset: str, logs: Path) -> tuple[pf.Fit, float, float]:
    job = tr.build_job(env, model, preset=preset)
    args = pf.compile_args(env, job)
    cmd = pf.compile_command(args, "bench")
    e = dict(os.environ)
    e["PATH"] = str(Path(sys.executable).parent) + os.pathsep + e.get("PATH", "")
    e["TPU_LOG_DIR"] = str(logs)
    start = time.monotonic()
    p = subprocess.Popen(list(cmd.argv), cwd=ROOT, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = p.stdout.read()
    _, _status, usage = os.wait4(p.pid, 0)
    wall = time.monotonic() - start
    text = "\n".join(f.read_text(errors="replace") for f in (logs / "tpu_driver.INFO", logs / "tpu_driver.ERROR")
                     if f.exists())
    return pf.parse_compile(out, text, wall), wall, usage.ru_maxrss / 1024 ** 2


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=sorted(CASES))
    ap.add_argument("--write", action="store_true", help="write the table, dated, into docs/preflight.md")
    a = ap.parse_args()
    os.chdir(ROOT)
    env = load_inventory().env("dev")
    rows = []
    with tempfile.TemporaryDirectory() as t:
        for name, (model, preset) in CASES.items():
            if a.only and name != a.only:
                continue
            fit, wall, rss = compile_once(env, model, preset, Path(t) / name)
            rows.append((name, model, preset, fit, wall, rss))
            print(f"{name}: {'fits' if fit.fits else 'does not fit'} in {wall:.0f}s", flush=True)
    lines = [f"The preflight's compiles for 2 x v6e-16 (maxtext {pf.installed('maxtext')}, jax "
             f"{pf.installed('jax')}, libtpu {pf.installed('libtpu')}), each cold, on this machine's CPU.", "",
             "| job | result | wall s | peak host RSS | per chip |", "| --- | --- | --- | --- | --- |"]
    for _name, model, preset, fit, wall, rss in rows:
        job = f"{model}" + (f" `--preset={preset}`" if preset else ", the tutorial's flags")
        if fit.fits:
            per = (f"{fit.total:.2f} of {fit.capacity:.2f} GiB (margin {fit.margin:.2f} GiB): arguments "
                   f"{fit.arguments:.2f}, outputs {fit.outputs:.2f} (aliased {fit.aliased:.2f}), temporaries "
                   f"{fit.temporaries:.2f}" + (f"; {fit.host:.2f} GiB offloaded to host" if fit.host else ""))
        elif fit.needed is not None:
            per = f"temporaries need {fit.needed:.2f} GiB of {fit.capacity:.2f} GiB HBM"
        else:
            per = f"error: {fit.error}"
        lines.append(f"| {job} | {'fits' if fit.fits else '**does not fit**'} | {wall:.0f} | {rss:.2f} GB | {per} |")
    print("\n" + "\n".join(lines))
    if a.write:
        command = "bench/fit_compiles.py" + (f" --only {a.only}" if a.only else "")
        doc_table.write("preflight.md", "fit-compiles", command, lines)


if __name__ == "__main__":
    main()
