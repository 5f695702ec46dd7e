"""Local training benchmark: the same tiny llama3-shaped config run
(1) directly with MaxText in one process, (2) through `invoke train` (Ray +
JaxTrainer, 2 simulated slices), cold (no local cluster) and warm (cluster
already up). Prints tokens/s/device (median over steps past compilation) and
the time from the command to the first training step.

    .venv/bin/python bench/local_train.py [--steps N]

Uses its own environment (bench-local: its own ports and .state folder);
stops its cluster at the end.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import doc_table  # noqa: E402
from playbooks.runs.job_log import STEP_LINE  # noqa: E402
from playbooks.runs.train_summary import Summary, step_line_event  # noqa: E402

INVOKE = str(Path(sys.executable).parent / "invoke")
ENV = "bench-local"


def local_env() -> dict:
    base = yaml.safe_load((ROOT / "inventory.yaml").read_text())["environments"]["local"]
    return {**base, "gcs_port": 6600, "dashboard_port": 8285, "ray_ip": "127.0.0.4"}


def direct(steps: int, tmp: Path) -> dict:
    """MaxText alone, one process, one slice's worth of devices."""
    env = local_env()
    ov = {**env["train_overrides"], "steps": steps}
    args = [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in ov.items()]
    argv = [sys.executable, "-m", "maxtext.trainers.pre_train.train", str(ROOT / "trainer" / "base.yml"),
            f"base_output_directory={tmp}/direct", "run_name=bench", "dataset_type=synthetic",
            "model_name=llama3-8b", "skip_jax_distributed_system=true", f"jax_cache_dir={tmp}/jax_cache",
            f"dump_hlo_local_dir={tmp}/xla", *args]
    e = {**os.environ, "JAX_PLATFORMS": "cpu", "TPU_LOG_DIR": str(tmp / "tpu_logs"),
         "XLA_FLAGS": f"--xla_force_host_platform_device_count={env['devices_per_host']}"}
    start = time.monotonic()
    p = subprocess.Popen(argv, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first = None
    s = Summary()
    for line in p.stdout:
        if first is None and STEP_LINE.search(line):
            first = time.monotonic() - start
        if (e := step_line_event(line)) is not None:
            s.add(e)
    assert p.wait() == 0, "direct MaxText run failed"
    return {"tok": s.median_tokens_per_device, "step_s": s.median_step_seconds, "first": first,
            "wall": time.monotonic() - start}


def through_invoke(steps: int, inv: Path, home: Path) -> dict:
    e = {k: v for k, v in os.environ.items() if not k.startswith("INVOKE_")}
    e.update({"INVOKE_PLAYBOOK_INVENTORY": str(inv), "HOME": str(home)})
    start = time.monotonic()
    p = subprocess.Popen([INVOKE, "train", "--fresh", f"--steps={steps}"], cwd=ROOT, env=e,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first = None
    s = Summary()
    out = []
    for line in p.stdout:
        out.append(line)
        if first is None and STEP_LINE.search(line):
            first = time.monotonic() - start
        if (e := step_line_event(line)) is not None:  # the console hides the trainer's events
            s.add(e)
    if p.wait() != 0:
        sys.exit("invoke train failed:\n" + "".join(out[-40:]))
    return {"tok": s.median_tokens_per_device, "step_s": s.median_step_seconds, "first": first,
            "wall": time.monotonic() - start}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--write", action="store_true", help="write the table, dated, into docs/benchmarks.md")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        inv = tmp / "inventory.yaml"
        inv.write_text(yaml.safe_dump({"default": ENV, "environments": {ENV: local_env()}}))
        shutil.rmtree(ROOT / ".state" / ENV, ignore_errors=True)
        e = {k: v for k, v in os.environ.items() if not k.startswith("INVOKE_")}
        e.update({"INVOKE_PLAYBOOK_INVENTORY": str(inv), "HOME": str(tmp)})
        try:
            d = direct(a.steps, tmp)
            cold = through_invoke(a.steps, inv, tmp)
            warm = through_invoke(a.steps, inv, tmp)
        finally:
            subprocess.run([INVOKE, "teardown", "--yes"], cwd=ROOT, env=e, capture_output=True)
    lines = [f"Local training: {a.steps} steps of the tiny llama3-8b-shaped model on this machine's CPU.", "",
             "| run | tokens/s/device (median) | step s (median) | command to first step s | wall s |",
             "| --- | --- | --- | --- | --- |"]
    for name, r in (("MaxText directly (1 process, 4 CPU devices)", d),
                    ("`invoke train`, cold (starts the cluster)", cold),
                    ("`invoke train`, warm (cluster up)", warm)):
        lines.append(f"| {name} | {r['tok']:.1f} | {r['step_s']:.3f} | {r['first']:.1f} | {r['wall']:.1f} |")
    lines += ["", f"`invoke train` / direct tokens/s/device: {warm['tok'] / d['tok']:.2f} (2 processes x 4 devices "
                  f"on {os.cpu_count()} cores vs 1 x 4)."]
    print("\n" + "\n".join(lines))
    if a.write:
        doc_table.write("benchmarks.md", "local-train", f"bench/local_train.py --steps {a.steps}", lines)


if __name__ == "__main__":
    main()
