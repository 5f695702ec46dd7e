"""Preflight benchmark: the ahead-of-time compiles of the tutorial's jobs for
2 x v6e-16 (32 chips), each as `invoke preflight` runs it: wall time, peak
host RSS of the compile, and the per-chip memory the compiler reports.

    .venv/bin/python bench/fit_compiles.py [--only 8b|70b|70b-fits]
    .venv/bin/python bench/fit_compiles.py --out-of-sample [--only NAME] [--write]

No cache: every compile is cold (JAX's compilation cache did not help here).
Minutes each on a 2-core machine, one at a time (the preflight's machine
lock: libtpu takes one of its own).

``--out-of-sample``: the HBM estimate (playbooks/job/memory.py) against
compiles its two fitted constants did not see (they were fitted to the
8B and 70B-preset compiles above: 2 x v6e-16, 16384 tokens a chip,
remat_policy full): other batch sizes, another sequence length at the same
tokens, another remat policy, a v5p topology. Each row's error is the
estimate's total over the compiler's, less one; ``--write`` puts the table
into docs/preflight.md (hbm-error), which tests/test_bench_figures.py holds
the estimate's "too close to call" band to.
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
from playbooks.core.lock import machine_lock  # noqa: E402
from playbooks.job import fit as pf  # noqa: E402
from playbooks.job import memory  # noqa: E402
from playbooks.job import spec as tr  # noqa: E402

CASES = {
    "8b": ("llama3-8b", ""),
    "70b": ("llama3-70b", ""),
    "70b-fits": ("llama3-70b", "fits"),
}
# Out of sample: (environment, model, extra settings). dev is 2 x v6e-16;
# std-v5p 2 x v5p-32 (a 2x2x4 slice, 16 chips: the golden environment of
# that generation, tests/goldens/generations-inventory.yaml).
OUT_OF_SAMPLE = {
    "8b-batch2": ("dev", "llama3-8b", (("per_device_batch_size", "2"),)),
    "8b-batch6": ("dev", "llama3-8b", (("per_device_batch_size", "6"),)),
    "8b-seq8192": ("dev", "llama3-8b", (("per_device_batch_size", "2"), ("max_target_length", "8192"))),
    "8b-save-qkv": ("dev", "llama3-8b", (("remat_policy", "save_qkv_proj"),)),
    "8b-v5p": ("std-v5p", "llama3-8b", ()),
}
GOLDEN_INVENTORY = ROOT / "tests" / "goldens" / "generations-inventory.yaml"


def compile_once(env, model: str, preset: str, logs: Path, extra: pf.Extra = ()) -> tuple[pf.Fit, float, float]:
    """The preflight's compile of the job (plus ``extra``), as `invoke
    preflight` runs it, under its machine lock."""
    job = tr.build_job(env, model, preset=preset)
    args = pf.compile_args(env, job, extra)
    cmd = pf.compile_command(args, "bench")
    e = dict(os.environ)
    e["PATH"] = str(Path(sys.executable).parent) + os.pathsep + e.get("PATH", "")
    e["TPU_LOG_DIR"] = str(logs)
    logs.mkdir(parents=True, exist_ok=True)
    with machine_lock(pf.COMPILE_LOCK, "one TPU compile at a time on a machine: libtpu's own lock",
                      lambda line: print(f"  ... {line}", flush=True)):
        start = time.monotonic()
        p = subprocess.Popen(list(cmd.argv), cwd=ROOT, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
        out = p.stdout.read()
        _, _status, usage = os.wait4(p.pid, 0)
        wall = time.monotonic() - start
    text = "\n".join(f.read_text(errors="replace") for f in (logs / "tpu_driver.INFO", logs / "tpu_driver.ERROR")
                     if f.exists())
    return pf.parse_compile(out, text, wall, pf.hbm_of(args)), wall, usage.ru_maxrss / 1024 ** 2


def error(estimated: float, compiled: float) -> float:
    """The estimate's error: its total over the compiler's, less one (+ an
    overestimate, - an underestimate)."""
    return estimated / compiled - 1


def error_row(name: str, where: str, extra: pf.Extra, est: memory.Estimate, fit: pf.Fit, wall: float) -> str:
    """One row of the out-of-sample table; the error only where the compile
    gives its total (a job that does not fit gives its temporaries alone)."""
    change = ", ".join(f"`{k}={v}`" for k, v in extra) or "the tutorial's flags"
    if fit.fits and fit.total:
        got, err = f"{fit.total:.2f} of {fit.capacity:.2f}", f"{100 * error(est.total, fit.total):+.1f} %"
    elif fit.needed is not None:
        got, err = f"does not fit: temporaries alone {fit.needed:.2f} of {fit.capacity:.2f}", "not measured"
    else:
        got, err = f"error: {fit.error}", "not measured"
    return (f"| {name} | llama3-8b on {where}, {change} | {est.total:.2f} ({est.words()}) | {got} | {err} "
            f"| {wall:.0f} |")


def out_of_sample(only: str | None, tmp: Path) -> list[str]:
    """The out-of-sample compiles, one at a time, and their table."""
    envs = {"dev": load_inventory().env("dev"), "std-v5p": load_inventory(GOLDEN_INVENTORY).env("std-v5p")}
    rows = []
    for name, (env_name, model, extra) in OUT_OF_SAMPLE.items():
        if only and name != only:
            continue
        env = envs[env_name]
        got = pf.estimates(env, tr.build_job(env, model), extra)
        assert not isinstance(got, str), got
        fit, wall, _rss = compile_once(env, model, "", tmp / name, extra)
        rows.append(error_row(name, pf.shape_name(env, env.slices), extra, got[0][1], fit, wall))
        print(rows[-1], flush=True)
    return [f"The HBM estimate (`playbooks/job/memory.py`) against compiles its two fitted constants did not see "
            f"(maxtext {pf.installed('maxtext')}, jax {pf.installed('jax')}, libtpu {pf.installed('libtpu')}), GiB "
            f"per chip; error = estimate / compile - 1.", "",
            "| case | job | estimate | compile | error | compile wall s |", "| --- | --- | --- | --- | --- | --- |",
            *rows]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=sorted({*CASES, *OUT_OF_SAMPLE}))
    ap.add_argument("--out-of-sample", action="store_true",
                    help="the estimate's error on compiles it was not fitted to")
    ap.add_argument("--write", action="store_true", help="write the table, dated, into docs/preflight.md")
    a = ap.parse_args()
    os.chdir(ROOT)
    if a.out_of_sample:
        with tempfile.TemporaryDirectory() as t:
            lines = out_of_sample(a.only, Path(t))
        print("\n" + "\n".join(lines))
        if a.write:
            doc_table.write("preflight.md", "hbm-error", "bench/fit_compiles.py --out-of-sample"
                            + (f" --only {a.only}" if a.only else ""), lines)
        return
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
