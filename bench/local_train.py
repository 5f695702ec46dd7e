"""Local training benchmark: the same tiny llama3-shaped config run
(1) directly with MaxText in one process of 4 CPU devices, without and
with jax.distributed initialized first (Ray Train's JAX backend initializes
it on every worker: on CPU, Gloo's collectives), (2) through
`invoke train` on one simulated slice (one host process of the same 4
devices: Ray, Ray Train's JaxTrainer and the trainer's callbacks around the
same step), cold (no local cluster) and warm (cluster already up), and
(3) through `invoke train` on the default two slices (2 processes x 4
devices on this machine's cores: the twin's shape, not a like-for-like
figure). Prints tokens/s/device (median over steps past compilation) and
the time from the command to the first training step. The like-for-like
ratio is (2) warm over (1) without jax.distributed: MaxText with nothing
else initialized (Gloo's collectives slow its step on CPU and would hide a
fixed cost of the trainer). The trainer's fixed costs, in seconds: per step,
(2) warm's median step time minus (1)'s; per start, the time from (2)
cold's job start (the Jobs API's start time, the run's `submitted` event)
to its first step (its first `step` event) minus (1)'s from its process
start to its first step: MaxText's import and a compile from an empty
compilation cache in both (the warm run finds the cache the cold one
filled, and is said apart). (1) with jax.distributed is kept as the figure
of every multi-host job's own collectives.

    .venv/bin/python bench/local_train.py [--steps N]

Uses its own environment (bench-local: its own ports and .state folder);
stops its cluster at the end.
"""
from __future__ import annotations

import argparse
import json
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
from playbooks.runs import events as E  # noqa: E402
from playbooks.runs.job_log import STEP_LINE  # noqa: E402
from playbooks.runs.train_summary import Summary, step_line_event  # noqa: E402

INVOKE = str(Path(sys.executable).parent / "invoke")
ENV = "bench-local"          # the default shape: two slices
ONE = "bench-local-1"        # one slice: the same devices as MaxText alone


def local_env(slices: int = 2) -> dict:
    base = yaml.safe_load((ROOT / "inventory.yaml").read_text())["environments"]["local"]
    if slices == 1:
        return {**base, "slices": 1, "gcs_port": 6700, "dashboard_port": 8295, "ray_ip": "127.0.0.5"}
    return {**base, "gcs_port": 6600, "dashboard_port": 8285, "ray_ip": "127.0.0.4"}


# MaxText alone, with jax.distributed initialized first (one process), as
# Ray Train's JAX backend does on every worker and as MaxText itself does on
# a multi-host slice. On CPU that gives JAX Gloo's collectives over loopback
# instead of in-process ones (measured here: most of the gap between
# `invoke train` and MaxText without it); on a TPU the collectives run on ICI
# either way.
DISTRIBUTED = ("import socket, sys, jax; s = socket.socket(); s.bind(('127.0.0.1', 0)); "
               "port = s.getsockname()[1]; s.close(); jax.distributed.initialize(f'127.0.0.1:{port}', 1, 0); "
               "from absl import app; from maxtext.trainers.pre_train import train; "
               "sys.argv = ['train', *sys.argv[1:]]; app.run(train.main)")


def direct(steps: int, tmp: Path, distributed: bool = False) -> dict:
    """MaxText alone, one process, one slice's worth of devices."""
    env = local_env()
    ov = {**env["train_overrides"], "steps": steps}
    args = [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in ov.items()]
    main = ["-c", DISTRIBUTED] if distributed else ["-m", "maxtext.trainers.pre_train.train"]
    argv = [sys.executable, *main, str(ROOT / "trainer" / "base.yml"),
            f"base_output_directory={tmp}/direct{'-distributed' if distributed else ''}", "run_name=bench",
            "dataset_type=synthetic",
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


def job_to_first_step(events: list[dict]) -> float | None:
    """Seconds from a run's newest job's start (its ``submitted`` event:
    when Ray made the job) to that job's first training step (its first
    ``step`` event); None when either is missing."""
    submitted = [e for e in events if e.get("kind") == E.SUBMITTED]
    if not submitted:
        return None
    job = submitted[-1].get("job")
    steps = [float(e["t"]) for e in events if e.get("kind") == E.STEP and e.get("job") == job]
    return min(steps) - float(submitted[-1]["t"]) if steps else None


def newest_run_events(env: str) -> list[dict]:
    """The events of the environment's newest training run (its timeline file)."""
    runs = sorted((ROOT / ".state" / env / "training").glob("*/events.jsonl"), key=lambda p: p.stat().st_mtime)
    if not runs:
        return []
    return [json.loads(line) for line in runs[-1].read_text().splitlines() if line.strip().startswith("{")]


def fixed_costs(bare: dict, warm: dict, cold: dict) -> dict:
    """What the trainer adds to MaxText with nothing else initialized: the
    ratio of their tokens/s/device (``warm``: the cluster up), and its fixed
    cost in seconds per step (median step time minus bare MaxText's) and
    per start (``cold``'s job start to its first step minus bare MaxText's
    process start to its first step: import and a compile from an empty
    compilation cache in both)."""
    start = cold.get("job_first")
    return {"ratio": warm["tok"] / bare["tok"], "per_step_s": warm["step_s"] - bare["step_s"],
            "per_start_s": None if start is None else start - bare["first"]}


def fixed_cost_lines(bare: dict, warm: dict, cold: dict) -> list[str]:
    """The like-for-like figures as the page says them."""
    c = fixed_costs(bare, warm, cold)
    start = ("not measured (the run's timeline has no submitted or step event)" if c["per_start_s"] is None else
             f"**{c['per_start_s']:.1f} s** (the cold run's job start to its first step, {cold['job_first']:.1f} s, "
             f"against MaxText's process start to its first step, {bare['first']:.1f} s: a compile from an empty "
             f"cache in both)")
    again = ("" if warm.get("job_first") is None else
             f" A second start, with the compilation cache the first filled: {warm['job_first']:.1f} s from its "
             f"job's start to its first step.")
    return [f"Like for like (the same 4 devices in one process; MaxText with nothing else initialized, no "
            f"jax.distributed; what Ray, Ray Train, jax.distributed and the trainer's callbacks add around MaxText's "
            f"step): `invoke train` warm / MaxText directly = **{c['ratio']:.2f}** of its tokens/s/device "
            f"(goal >= 0.95).", "",
            f"The trainer's fixed cost: per step **{c['per_step_s']:.3f} s** (median step {warm['step_s']:.3f} s "
            f"against {bare['step_s']:.3f} s); per start {start}.{again}"]


def through_invoke(steps: int, inv: Path, home: Path, env: str) -> dict:
    e = {k: v for k, v in os.environ.items() if not k.startswith("INVOKE_")}
    e.update({"INVOKE_PLAYBOOK_INVENTORY": str(inv), "HOME": str(home), "INVOKE_PLAYBOOK_ENV": env})
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
            "wall": time.monotonic() - start, "job_first": job_to_first_step(newest_run_events(env))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--write", action="store_true", help="write the table, dated, into docs/benchmarks.md")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        inv = tmp / "inventory.yaml"
        inv.write_text(yaml.safe_dump({"default": ONE, "environments": {ONE: local_env(1), ENV: local_env(2)}}))
        e = {k: v for k, v in os.environ.items() if not k.startswith("INVOKE_")}
        e.update({"INVOKE_PLAYBOOK_INVENTORY": str(inv), "HOME": str(tmp)})
        for name in (ONE, ENV):
            shutil.rmtree(ROOT / ".state" / name, ignore_errors=True)
        try:
            d = direct(a.steps, tmp)
            dd = direct(a.steps, tmp, distributed=True)
            cold = through_invoke(a.steps, inv, tmp, ONE)
            warm = through_invoke(a.steps, inv, tmp, ONE)
            subprocess.run([INVOKE, "teardown", "--yes"], cwd=ROOT, env={**e, "INVOKE_PLAYBOOK_ENV": ONE},
                           capture_output=True)
            through_invoke(a.steps, inv, tmp, ENV)  # starts the two slices' cluster
            two = through_invoke(a.steps, inv, tmp, ENV)
        finally:
            for name in (ONE, ENV):
                subprocess.run([INVOKE, "teardown", "--yes"], cwd=ROOT, env={**e, "INVOKE_PLAYBOOK_ENV": name},
                               capture_output=True)
    lines = [f"Local training: {a.steps} steps of the tiny llama3-8b-shaped model on this machine's CPU "
             f"({os.cpu_count()} cores).", "",
             "| run | tokens/s/device (median) | step s (median) | command to first step s | wall s |",
             "| --- | --- | --- | --- | --- |"]
    for name, r in (("MaxText directly (1 process, 4 CPU devices)", d),
                    ("MaxText directly, jax.distributed initialized first (1 process, Gloo's CPU collectives)", dd),
                    ("`invoke train`, one slice (1 process, 4 devices), cold (starts the cluster)", cold),
                    ("`invoke train`, one slice, warm (cluster up)", warm),
                    ("`invoke train`, two slices (2 processes x 4 devices), warm", two)):
        lines.append(f"| {name} | {r['tok']:.1f} | {r['step_s']:.3f} | {r['first']:.1f} | {r['wall']:.1f} |")
    lines += ["", *fixed_cost_lines(d, warm, cold), "",
              f"With jax.distributed initialized in MaxText too (as every multi-host MaxText job has it): "
              f"{warm['tok'] / dd['tok']:.2f}; MaxText itself drops to {dd['tok'] / d['tok']:.2f} with it "
              f"initialized: on this CPU twin, JAX's collectives then go through Gloo on loopback, which slows the "
              f"step and hides the trainer's fixed cost in it.",
              "",
              f"Two slices, for what it is: {two['tok'] / d['tok']:.2f} of MaxText's tokens/s/device, with 8 "
              f"devices in 2 processes sharing {os.cpu_count()} cores (the twin's shape: it measures the "
              f"machine, not the trainer)."]
    print("\n" + "\n".join(lines))
    if a.write:
        doc_table.write("benchmarks.md", "local-train", f"bench/local_train.py --steps {a.steps}", lines)


if __name__ == "__main__":
    main()
