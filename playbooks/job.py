"""A training job: the tutorial's MaxText job for a model, with the
inventory's and the user's changes, checked before anything runs; how it is
submitted (`ray job submit`); where its checkpoints are, and how `--fresh`
removes exactly them. The plays that submit and follow it are
``plays/train.py`` and ``plays/preflight.py`` (its fit, ``fit.py``)."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import hosts, maxtext_args, metrics, paths
from . import tutorial as T
from .clients import fact, gcloud
from .core.command import Command, quote
from .core.errors import InputError, ProbeFailed, shown_value
from .core.facts import ABSENT, Action, Completed, Fact, assume
from .endpoints import dashboard
from .maxtext_args import run_name_problem
from .project import ROOT
from .schema import Environment

KEY = re.compile(r"^[a-z_][a-z0-9_]{0,63}$")
MODELS = tuple(T.TRAIN_ARGS)
WORKING_DIR = "trainer"
MAX_STEPS = 10_000_000
MAX_VALUE = 1024  # characters of one --set value

# Named sets of changes (--preset). Proven by `bench/preflight.py` (an AOT
# compile for 2 x v6e-16): the smallest change of the tutorial's 70B job
# that fits its 32 chips.
PRESETS: dict[str, dict[str, tuple[tuple[str, str], ...]]] = {
    "llama3-70b": {"fits": (("per_device_batch_size", "1"), ("optimizer_memory_host_offload", "true"))},
}


@dataclass
class Job:
    """One job: its trainer, its MaxText arguments (in order) and the
    variables of its runtime environment, where it is submitted, and where
    its data lives (``local_data`` on this machine; ``bucket`` on GKE)."""

    model: str
    elastic: bool
    trainer: str
    args: list[tuple[str, str]]
    env_vars: dict[str, str]
    address: str
    env: Environment
    fresh: bool = False
    local_data: Path | None = None
    bucket: str | None = None
    preset: str = ""

    def arg(self, key: str) -> str | None:
        for k, v in self.args:
            if k == key:
                return v
        return None

    @property
    def run_name(self) -> str:
        return self.arg("run_name") or "run"

    @property
    def steps(self) -> int:
        return int(self.arg("steps") or 0)

    def argv(self) -> list[str]:
        return ["python", self.trainer, T.BASE_CONFIG] + [f"{k}={v}" for k, v in self.args]


def _set(args: list[tuple[str, str]], key: str, value: str) -> None:
    for i, (k, _) in enumerate(args):
        if k == key:
            args[i] = (k, value)
            return
    args.append((key, value))


def parse_sets(sets: list[str] | tuple[str, ...]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for s in sets or ():
        shown = shown_value(s)
        if not isinstance(s, str) or "=" not in s:
            raise InputError(f"--set {shown}: must be key=value (a MaxText config key and its value)")
        k, v = s.split("=", 1)
        if not KEY.match(k):
            raise InputError(f"--set {shown}: key {shown_value(k)} is not a MaxText config key (lowercase "
                             f"letters, digits, _; at most 64)")
        if v == "":
            raise InputError(f"--set {shown}: value is empty")
        if len(v) > MAX_VALUE:
            raise InputError(f"--set {shown}: the value is {len(v)} characters (at most {MAX_VALUE})")
        if k == "model_name":
            raise InputError(f"--set {shown}: choose the model with --model (allowed: {', '.join(MODELS)})")
        if any(k == have for have, _ in out):
            raise InputError(f"--set {shown}: {k} is set twice ({k}={dict(out)[k]} before); say it once")
        why = maxtext_args.unknown_key(k)
        if why:
            raise InputError(f"--set {shown}: {k!r} {why}")
        why = maxtext_args.bad_value(k, v) or maxtext_args.path_problem(k, v)
        if why:
            raise InputError(f"--set {shown}: {shown_value(v)} {why}")
        out.append((k, v))
    return out


def build_job(env: Environment, model: str, elastic: bool = False, steps: int | None = None,
              sets: list[str] | tuple[str, ...] = (), fresh: bool = False, preset: str = "") -> Job:
    if model not in T.TRAIN_ARGS:
        raise InputError(f"--model {shown_value(model)} is not allowed (allowed: {', '.join(MODELS)})")
    if preset and preset not in PRESETS.get(model, {}):
        have = ", ".join(PRESETS.get(model, {})) or "none"
        raise InputError(f"--preset {shown_value(preset)} is not defined for {model} (defined: {have})")
    if steps is not None and steps < 1:
        raise InputError(f"--steps {steps} must be at least 1")
    extra = parse_sets(sets)
    given = dict(extra)
    if steps is not None and "steps" in given:
        raise InputError(f"--steps {steps} and --set steps={given['steps']} say two things: give one")
    for k, v in (PRESETS[model][preset] if preset else ()):
        if k in given and given[k] != v:
            raise InputError(f"--preset {preset} sets {k}={v}, --set {k}={given[k]} says otherwise: give one")
    args = list(T.TRAIN_ARGS[model])
    if elastic:
        _set(args, "run_name", T.ELASTIC_RUN_NAME[model])
    env_vars = {
        "TRAINER_SLICES": str(env.slices),
        "TRAINER_HOSTS_PER_SLICE": str(env.hosts_per_slice),
        "TRAINER_TOPOLOGY": env.topology,
        "TRAINER_CHIPS_PER_HOST": str(env.chips_per_host),
        "TRAINER_ACCELERATOR_TYPE": T.ACCELERATOR_TYPE,
    }
    job = Job(model, elastic, T.ELASTIC_TRAINER if elastic else T.TRAINER, args, env_vars, dashboard(env), env,
              fresh, preset=preset)
    if env.kind == "local":
        p = paths.local_job(env.name)
        _set(args, "base_output_directory", p["data"])
        _set(args, "jax_cache_dir", p["jax_cache"])
        _set(args, "dump_hlo_local_dir", p["xla_dump"])
        env_vars.update({
            "JAX_PLATFORMS": "cpu",
            "XLA_FLAGS": f"--xla_force_host_platform_device_count={env.devices_per_host}",
            "TPU_LOG_DIR": p["tpu_logs"],
            "TRAINER_STORAGE_PATH": p["ray_results"],
            # Every step line, not one per worker group ("repeated Nx").
            "RAY_DEDUP_LOGS": "0",
            # A lost simulated host is noticed sooner than the 60 s default.
            "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "30",
            # An elastic job takes in a slice that came (late, or back)
            # within 10 s, not Ray Train's 60 s default.
            "TRAINER_RESIZE_INTERVAL_S": "10",
            # This cluster's address for what the job's actors look up
            # through Ray's state API (Ray Train's placement group cleaner
            # asks whether its controller lives): without it Ray takes the
            # newest Ray cluster on this machine, another checkout's, finds no
            # such controller there and removes this job's placement groups.
            "RAY_ADDRESS": f"{env.ray_ip}:{env.gcs_port}",
        })
        job.local_data = Path(p["data"])
    else:
        if env.worker_packages == "requirements":
            env_vars["TRAINER_WORKER_REQUIREMENTS"] = "requirements.txt"
        job.bucket = env.gs_bucket
    for k, v in (env.train_overrides or {}).items():
        _set(args, k, maxtext_args.as_text(v))
    for k, v in (PRESETS[model][preset] if preset else ()):
        _set(args, k, v)
    if steps is not None:
        _set(args, "steps", str(steps))
    for k, v in extra:
        _set(args, k, v)
    if env.kind == "local" and job.arg("metrics_file") is None:
        # MaxText's own per-step metrics (each rank its own file; kept as the
        # run's metrics.jsonl after the job).
        _set(args, "metrics_file", str(metrics.maxtext_file(env, job.run_name)))
    if elastic:
        check_elastic(job)
    why = run_name_problem(job.run_name)
    if why:
        raise InputError(f"run_name {shown_value(job.run_name)} {why}")
    clash = maxtext_args.overridden_model_keys(model, job.args)
    if clash:
        raise InputError(f"{model}: the job sets {', '.join(clash)}; MaxText refuses to change a model's own "
                         f"config unless override_model_config=true (--set override_model_config=true)")
    return job


def check_elastic(job: Job) -> None:
    """Elastic training changes the slice count: a fixed DCN split cannot follow."""
    for k, v in job.args:
        if k.startswith("dcn_") and k.endswith("_parallelism") and v not in ("1", "-1"):
            raise InputError(f"--elastic: {k}={v} fixes the slice count, but elastic training runs on 1 to "
                             f"N slices; use --set {k}=-1 (fill from the slices present)")


def runtime_env(job: Job) -> str:
    return json.dumps({"excludes": list(T.RUNTIME_EXCLUDES), "env_vars": job.env_vars})


def submit_command(job: Job, submission_id: str) -> Command:
    return Command(("ray", "job", "submit", "--address", job.address, "--working-dir", WORKING_DIR,
                    "--runtime-env-json", runtime_env(job), f"--submission-id={submission_id}", "--",
                    *job.argv()))


# -- checkpoints of the run ------------------------------------------------
def _steps_in(names: list[str]) -> list[int]:
    return sorted(int(n) for n in names if n.isdigit())


class _Some(list):
    """The dry run's stand-in for checkpoints it cannot list, so that
    --fresh shows the delete it would make."""


def checkpoints_place(job: Job) -> tuple[str, str]:
    """Where MaxText keeps the run's checkpoints (<base_output_directory>/
    <run_name>/checkpoints/): ("local", path), ("gcs", gs://...) or
    ("unseen", why) for a path on the TPU workers this machine cannot see."""
    base = job.arg("base_output_directory") or ""
    if job.local_data is not None:
        root = Path(base) if Path(base).is_absolute() else ROOT / base
        return "local", str(root / job.run_name / "checkpoints")
    if base.startswith("gs://"):
        return "gcs", f"{base.rstrip('/')}/{job.run_name}/checkpoints/"
    mount = T.BUCKET_MOUNT.rstrip("/")
    if base.rstrip("/") == mount or base.startswith(mount + "/"):
        # /data is the bucket, mounted by GCS FUSE in every Ray pod.
        sub = base[len(mount):].strip("/")
        prefix = f"gs://{job.bucket}/" + (f"{sub}/" if sub else "")
        return "gcs", f"{prefix}{job.run_name}/checkpoints/"
    return "unseen", (f"base_output_directory={base} is a path on the TPU workers, not the bucket "
                      f"({T.BUCKET_MOUNT} or gs://)")


def checkpoints_fact(job: Job) -> Fact:
    kind, where = checkpoints_place(job)
    def describe(s: Any) -> str:
        return ("checkpoints, to show what --fresh deletes" if isinstance(s, _Some)
                else f"checkpoint steps {s}" if s else "none")
    if kind == "local":
        path = Path(where)

        def look():
            if not path.is_dir():
                return ABSENT
            return _steps_in([p.name for p in path.iterdir() if p.is_dir()])

        f = Fact(name="checkpoints", python=look, display=f"ls {quote(paths.shown(path))}", describe=describe)
    else:
        def parse(c: Completed) -> Any:
            if c.ok:
                return _steps_in([line.rstrip("/").rsplit("/", 1)[-1] for line in c.stdout.split()])
            if "matched no objects" in c.stderr:
                return ABSENT
            raise ProbeFailed("checkpoints", c.line, c.rc, c.stdout, c.stderr,
                              why=f"could not look: {c.first_error_line()}")

        f = fact("checkpoints", gcloud("storage", "ls", where), parse, describe=describe)
    return assume(f, _Some([0])) if job.fresh else f


def remove_checkpoints(job: Job) -> Command | Action:
    """Exactly the run's checkpoints folder (or prefix): never a wildcard
    (run_name and base_output_directory hold none), never outside the run."""
    kind, where = checkpoints_place(job)
    if kind == "gcs":
        return gcloud("storage", "rm", "--recursive", where)
    path = Path(where)

    def rm():
        if path.is_symlink():
            raise InputError(f"{path} is a symbolic link: --fresh deletes only a real checkpoints folder")
        hosts.this_machine().remove_tree(str(path))

    return Action(f"rm -r {quote(paths.shown(path))}", rm)

