"""A training job: the tutorial's MaxText job for a model, with the
inventory's and the user's changes, checked before anything runs; how it is
submitted (`ray job submit`); where its checkpoints are, and how `--fresh`
removes exactly them. The plays that submit and follow it are
``plays/train.py`` and ``plays/preflight.py`` (its fit, ``fit.py``)."""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from playbooks.access import connectors
from playbooks.access.cli_clients import fact, gcloud
from playbooks.cloud.endpoints import dashboard
from playbooks.config import maxtext_settings, paths
from playbooks.config import tutorial as T
from playbooks.config.maxtext_settings import run_name_problem
from playbooks.config.project import ROOT
from playbooks.config.schema import Environment
from playbooks.config.tpu import DEFAULT, GENERATIONS, generation
from playbooks.core.command import Command, quote
from playbooks.core.errors import InputError, PlaybookError, ProbeFailed, shown_value
from playbooks.core.facts import ABSENT, Action, Completed, Fact, assume
from playbooks.job import ici

KEY = re.compile(r"^[a-z_][a-z0-9_]{0,63}$")
MODELS = tuple(T.TRAIN_ARGS)
WORKING_DIR = "trainer"
MAX_STEPS = 10_000_000
MAX_VALUE = 1024  # characters of one --set value

# Named sets of changes (--preset). Proven by `bench/fit_compiles.py` (an AOT
# compile for 2 x v6e-16): the smallest change of the tutorial's 70B job
# that fits its 32 chips.
PRESETS: dict[str, dict[str, tuple[tuple[str, str], ...]]] = {
    "llama3-70b": {"fits": (("per_device_batch_size", "1"), ("optimizer_memory_host_offload", "true"))},
}
# The shape each preset was made for, (generation, topology, slices): the
# tutorial's 2 x v6e-16 (DEFAULT, its generation). On another the estimate
# decides, and a misfit names the smallest shape that fits (fit.py).
# tasks.py's --preset help names it (tests/test_shapes.py).
PRESET_SHAPES: dict[tuple[str, str], tuple[str, str, int]] = {("llama3-70b", "fits"): (DEFAULT, "4x4", 2)}


def preset_shape(model: str, preset: str) -> str:
    """The shape a preset was made for, as the lines say it: 2 x v6e-16."""
    gen, topology, slices = PRESET_SHAPES[(model, preset)]
    return f"{slices} x {GENERATIONS[gen].shape(topology)}"


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
    sets: tuple[tuple[str, str], ...] = ()  # the user's --set pairs, as given
    derived: tuple[tuple[str, str], ...] = ()  # the ICI axes taken from the slice's devices (ici.py)
    save_plan: Any = None  # its checkpoint period and why (save_plan.py: save_period.Plan)

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


# The persistent compilation cache of a GKE job, in its bucket: a job
# restarted (a lost slice, elastic) or submitted again loads what it compiled
# before instead of compiling again. MaxText 0.2.5 hands jax_cache_dir to
# jax.experimental.compilation_cache.set_cache_dir (maxtext/configs/pyconfig.py,
# after os.path.expanduser, which leaves gs:// alone). The pinned jax 0.12.0.1
# takes a gs:// path: jax/_src/compilation_cache.py get_file_cache builds an
# LRUCache (jax/_src/lru_cache.py) on jax._src.path.Path, which is
# etils.epath.Path when etils is installed (else it raises "Please install
# the `etils[epath]` package" for a non-local path); epath reads gs:// through
# fsspec and gcsfs (etils/epath/gpath.py: without TensorFlow, the fsspec
# backend); etils 1.15.0, fsspec 2026.9.0 and gcsfs 2026.10.1 are pinned in
# trainer/requirements.txt (and requirements.lock); the workers' credentials
# are the bucket's workload identity (`invoke storage`). Only process 0
# writes an entry (compiler.py _cache_write: "contention for writes on ...
# GCS"); eviction is off (jax_compilation_cache_max_size -1), so no file
# lock is taken on GCS. The GCS FUSE mount (/data/) is not needed. The cache
# is trusted code (jax's set_cache_dir warns): it is the job's own bucket.
COMPILE_CACHE = "jax_cache"

# How often a local elastic job looks for hosts that came (resize_interval
# unset): a local host joins in seconds, so 10 s, not Ray Train's 60.
LOCAL_RESIZE_INTERVAL = 10
# Every job saves a checkpoint when it is told it will be stopped (SIGTERM:
# a preemption, a pod deleted with its grace period, or the elastic
# trainer's save before a resize): MaxText 0.2.5's enable_autocheckpoint
# (maxtext/common/checkpointing.py: on JAX's preemption sync point it saves,
# waits for the save, then stops). The tutorial's jobs leave it off, and
# MaxText then stops at that point without a save: the run resumes from its
# last periodic checkpoint and replays every step since.
AUTOCHECKPOINT = ("enable_autocheckpoint", "true")


def compile_cache(env: Environment) -> str:
    return f"gs://{env.gs_bucket}/{COMPILE_CACHE}"


def set_arg(args: list[tuple[str, str]], key: str, value: str) -> None:
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
        why = maxtext_settings.unknown_key(k)
        if why:
            raise InputError(f"--set {shown}: {k!r} {why}")
        why = maxtext_settings.bad_value(k, v) or maxtext_settings.path_problem(k, v)
        if why:
            raise InputError(f"--set {shown}: {shown_value(v)} {why}")
        out.append((k, v))
    return out


def build_job(env: Environment, model: str, elastic: bool = False, steps: int | None = None,
              sets: list[str] | tuple[str, ...] = (), fresh: bool = False, preset: str = "") -> Job:
    """The job the flags ask for, in this environment: the tutorial's for the
    model, placed here (local or GKE), with the inventory's, the preset's,
    --steps' and --set's changes, in that order; the ICI axes taken from
    the slice's devices where the user set none and the tutorial's do not
    make them (``ici.derived``); checked whole."""
    extra = checked_request(model, steps, sets, preset)
    args = [*T.TRAIN_ARGS[model], AUTOCHECKPOINT]
    if elastic:
        set_arg(args, "run_name", T.ELASTIC_RUN_NAME[model])
    job = Job(model, elastic, T.ELASTIC_TRAINER if elastic else T.TRAINER, args, trainer_env(env, elastic),
              dashboard(env), env, fresh, preset=preset, sets=tuple(extra))
    if env.platform.simulated:
        place_locally(job)
    else:
        place_on_gke(job)
    for k, v in (env.train_overrides or {}).items():
        set_arg(args, k, maxtext_settings.as_text(v))
    for k, v in (PRESETS[model][preset] if preset else ()):
        set_arg(args, k, v)
    if steps is not None:
        set_arg(args, "steps", str(steps))
    for k, v in extra:
        set_arg(args, k, v)
    if not ici.user_set(env, job.sets):
        job.derived = ici.derived(dict(args), ici.slice_devices(env))
        for k, v in job.derived:
            set_arg(args, k, v)
    if env.platform.simulated and job.arg("metrics_file") is None:
        # MaxText's own per-step metrics (each rank its own file; kept as the
        # run's metrics.jsonl after the job).
        set_arg(args, "metrics_file", str(paths.here(paths.maxtext_metrics(env.name, job.run_name))))
    check_whole(job)
    return job


def checked_request(model: str, steps: int | None, sets: list[str] | tuple[str, ...], preset: str
                    ) -> list[tuple[str, str]]:
    """The flags, each checked and none contradicting another: the --set pairs."""
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
    return extra


def trainer_env(env: Environment, elastic: bool) -> dict[str, str]:
    """What the trainer reads of the job's runtime environment (TRAINER_*)."""
    out = {
        "TRAINER_SLICES": str(env.slices),
        "TRAINER_HOSTS_PER_SLICE": str(env.hosts_per_slice),
        "TRAINER_TOPOLOGY": env.topology,
        "TRAINER_CHIPS_PER_HOST": str(env.chips_per_host),
        "TRAINER_ACCELERATOR_TYPE": generation(env).ray_accelerator_type,
        # trainer/health_check.py: the gate before MaxText, and the JAX
        # devices a host must show (the twin's CPU devices per host; on GKE
        # its chips' devices: two a chip on TPU7x).
        "TRAINER_HEALTH_CHECK": "on" if env.health_check else "off",
        "TRAINER_HEALTH_CHECK_TIMEOUT_S": str(env.health_check_timeout),
        "TRAINER_HEALTH_CHECK_HBM_FRACTION": f"{env.health_check_hbm_fraction:g}",
        "TRAINER_DEVICES_PER_HOST": str(env.devices_per_host if env.platform.simulated
                                        else env.chips_per_host * generation(env).devices_per_chip),
        # The trainer's events, never folded by the driver's log dedup (Ray's
        # default on GKE: lines alike but for their numbers, from several
        # workers within 5 s, become one "[repeated Nx]"): every worker's
        # heartbeat reaches the follower.
        "RAY_DEDUP_LOGS_ALLOW_REGEX": "trainer event: ",
        # trainer/notice.py: Ray Train's watch of draining nodes (a notice
        # to go) every second, not Ray's 5 s: a Spot pod's grace is 15 s,
        # and the save must begin and finish within it.
        "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": "1",
    }
    if env.stall_after:
        # trainer/heartbeat.py: each worker's beat, a few within stall_after
        # (the hang diagnosis tells a stopped beat after 3 intervals).
        out["TRAINER_HEARTBEAT_S"] = str(max(1, min(30, env.stall_after // 4)))
    if elastic:
        # trainer/elastic_control.py: the starts it retries, how long a
        # resize waits for its save, and the failures it recovers from
        # within each failure_window (elastic_control.FailureBudget).
        out["TRAINER_START_RETRIES"] = str(env.start_retries)
        out["TRAINER_RESIZE_SAVE_TIMEOUT_S"] = str(env.resize_save_timeout)
        out["TRAINER_MAX_FAILURES"] = str(env.max_failures)
        out["TRAINER_FAILURE_WINDOW_S"] = str(env.failure_window)
    return out


def place_locally(job: Job) -> None:
    """A local job: everything it writes under .state/<env>/, JAX on CPU."""
    env = job.env
    p = paths.local_job(env.name)
    set_arg(job.args, "base_output_directory", p["data"])
    set_arg(job.args, "jax_cache_dir", p["jax_cache"])
    set_arg(job.args, "dump_hlo_local_dir", p["xla_dump"])
    job.env_vars.update({
        # No XLA_FLAGS here: each simulated TPU host's Ray node gives its
        # own (its devices, twin/nodes.py), as a TPU VM has its own chips; a
        # job's runtime env would override every host's, a sick one's
        # (chaos.sicken-worker) too, and the health gate would never see it.
        "JAX_PLATFORMS": "cpu",
        "TPU_LOG_DIR": p["tpu_logs"],
        "TRAINER_STORAGE_PATH": p["ray_results"],
        # Every step line, not one per worker group ("repeated Nx").
        "RAY_DEDUP_LOGS": "0",
        # Every executable in the compilation cache, also those that
        # compile in under a second (jax's default floor, 1 s): a
        # restarted worker group loads MaxText's many small ones instead of
        # compiling them again (on GKE the cache is in the bucket, where
        # each entry is a request: Ray's floor is kept).
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        # Ray Train's controller looks at its workers every second, not
        # every 2 s: a lost host's group (JAX ends it within ~0.1 s) is
        # seen sooner, as the local head's health checks see the host.
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "1",
        # An elastic job takes in a slice that came (late, or back)
        # within 10 s, not Ray Train's 60 s default (resize_interval).
        "TRAINER_RESIZE_INTERVAL_S": str(env.resize_interval or LOCAL_RESIZE_INTERVAL),
        # This cluster's address for what the job's actors look up
        # through Ray's state API (Ray Train's placement group cleaner
        # asks whether its controller lives): without it Ray takes the
        # newest Ray cluster on this machine, another checkout's, finds no
        # such controller there and removes this job's placement groups.
        "RAY_ADDRESS": f"{env.ray_ip}:{env.gcs_port}",
    })
    job.local_data = Path(p["data"])


def place_on_gke(job: Job) -> None:
    """A GKE job: its data in the bucket, its compilation cache there too."""
    env = job.env
    if env.resize_interval is not None:
        job.env_vars["TRAINER_RESIZE_INTERVAL_S"] = str(env.resize_interval)
    if env.worker_packages == "requirements":
        job.env_vars["TRAINER_WORKER_REQUIREMENTS"] = "requirements.txt"
    job.bucket = env.gs_bucket
    set_arg(job.args, "jax_cache_dir", compile_cache(env))


def check_whole(job: Job) -> None:
    """The job with every change: what no single flag could show."""
    if job.elastic:
        check_elastic(job)
    why = run_name_problem(job.run_name)
    if why:
        raise InputError(f"run_name {shown_value(job.run_name)} {why}")
    clash = maxtext_settings.overridden_model_keys(job.model, job.args)
    if clash:
        raise InputError(f"{job.model}: the job sets {', '.join(clash)}; MaxText refuses to change a model's own "
                         f"config unless override_model_config=true (--set override_model_config=true)")


def check_elastic(job: Job) -> None:
    """Elastic training changes the slice count: a fixed DCN split cannot follow."""
    for k, v in job.args:
        if k.startswith("dcn_") and k.endswith("_parallelism") and v not in ("1", "-1"):
            raise InputError(f"--elastic: {k}={v} fixes the slice count, but elastic training runs on 1 to "
                             f"N slices; use --set {k}=-1 (fill from the slices present)")


# Each worker process of the job runs it as it starts: on a training worker
# it imports MaxText while Ray Train makes the worker group
# (trainer/maxtext_ray.py, preimport).
SETUP_HOOK = "maxtext_ray.preimport"


def runtime_env(job: Job) -> str:
    return json.dumps({"excludes": list(T.RUNTIME_EXCLUDES), "env_vars": job.env_vars,
                       "worker_process_setup_hook": SETUP_HOOK})


def submit_command(job: Job, submission_id: str, wait: bool = True) -> Command:
    """`ray job submit`: followed to the job's end (``wait``), else
    ``--no-wait`` (`invoke train --detach`)."""
    return Command(("ray", "job", "submit", "--address", job.address, *(() if wait else ("--no-wait",)),
                    "--working-dir", WORKING_DIR, "--runtime-env-json", runtime_env(job),
                    f"--submission-id={submission_id}", "--", *job.argv()))


# -- checkpoints of the run ------------------------------------------------
# Which step directories are checkpoints: Orbax's own rule, in the pinned
# orbax-checkpoint 0.12.8. MaxText 0.2.5 saves through an Orbax v1
# ocp.training.Checkpointer (maxtext/common/checkpointing.py,
# create_orbax_checkpoint_manager) whose Context sets no atomicity option
# (maxtext/common/checkpoint_context.py, build_context): AtomicityMode.AUTO.
# Then (orbax/checkpoint/_src/path/):
# - atomicity_defaults.py, get_default_temporary_path_class: a gs:// path
#   takes CommitFileTemporaryPath, any other path AtomicRenameTemporaryPath;
# - atomicity.py, AtomicRenameTemporaryPath: a save writes
#   <step>.orbax-checkpoint-tmp-<timestamp>/ and renames it to <step>/ on
#   commit; validate_atomic_rename_final_path: a step is final when its name
#   holds no TMP_DIR_SUFFIX (".orbax-checkpoint-tmp") and it is a directory;
# - atomicity.py, CommitFileTemporaryPath.validate_final: final when the step
#   directory holds COMMIT_SUCCESS_FILE ("commit_success.txt",
#   atomicity_types.py), which finalize() writes last; in 0.12.8
#   AtomicRenameTemporaryPath.finalize writes it too, before its rename;
# - step.py, _StandardNameFormat._build_metadata: a step directory that is not
#   is_path_finalized is no step (latest_step and the restore never see it);
#   names are (0|[1-9]\d*), and TMP_DIR_STEP_PATTERN gives a temporary one's step.
TMP_SUFFIX = ".orbax-checkpoint-tmp"
COMMIT_FILE = "commit_success.txt"
STEP_NAME = re.compile(r"^(0|[1-9]\d*)$")
TMP_STEP = re.compile(r".*?_*?(\d+)" + re.escape(TMP_SUFFIX))
UNFINISHED = f"a save that did not finish (Orbax renames <step>{TMP_SUFFIX}-* to <step> when it commits)"


@dataclass(frozen=True)
class Checkpoints:
    """A run's checkpoints folder as Orbax counts it: the finalized steps,
    and the step directories that are not (name, why), named and ignored.
    ``stand_in``: the dry run's answer for --fresh (it cannot list)."""

    steps: tuple[int, ...] = ()
    partial: tuple[tuple[str, str], ...] = ()
    stand_in: bool = False

    def __bool__(self) -> bool:
        return bool(self.steps or self.partial)

    @property
    def last(self) -> int | None:
        return self.steps[-1] if self.steps else None

    def ignored(self) -> str:
        """The step directories ignored, and why, for a message ("" if none)."""
        return "; ".join(f"{name}: {why}" for name, why in self.partial)

    def describe(self) -> str:
        if self.stand_in:
            return "checkpoints, to show what --fresh deletes"
        if not self:
            return "none"
        out = f"checkpoint steps {list(self.steps)}" if self.steps else "no finalized checkpoint"
        if self.partial:
            out += f"; not finalized, ignored: {', '.join(n for n, _ in self.partial)}"
        return out


def local_checkpoints(entries: list[tuple[str, bool]]) -> Checkpoints:
    """A local (POSIX) checkpoints folder, (name, is a folder) per entry:
    Orbax's atomic-rename rule (the rename is atomic here)."""
    steps, partial = [], []
    for name, is_dir in entries:
        if not is_dir:
            continue
        if STEP_NAME.match(name):
            steps.append(int(name))
        elif TMP_STEP.match(name):
            partial.append((name, UNFINISHED))
    return Checkpoints(tuple(sorted(steps)), tuple(sorted(partial, key=_by_step)))


def gcs_checkpoints(where: str, listing: str) -> Checkpoints:
    """What `gcloud storage ls <checkpoints>/*` shows (each step directory
    with its entries): a step counts only with Orbax's commit_success.txt in
    it. A <step>/ whose <step>.orbax-checkpoint-tmp-*/ is still there is
    not whole either: through GCS FUSE (/data/) the rename copies object by
    object, so the marker may arrive before the rest."""
    dirs: dict[str, set[str]] = {}
    for line in listing.splitlines():
        url = line.strip().removesuffix(":")
        if not url.startswith(where):
            continue
        head, sep, rest = url[len(where):].partition("/")
        if not sep:
            continue  # an object beside the steps, not a step directory
        kids = dirs.setdefault(head, set())
        if rest.split("/", 1)[0]:
            kids.add(rest.split("/", 1)[0])
    tmp_steps = {int(m.group(1)) for n in dirs if (m := TMP_STEP.match(n))}
    steps, partial = [], []
    for name, kids in dirs.items():
        if STEP_NAME.match(name):
            if COMMIT_FILE not in kids:
                partial.append((name, f"no {COMMIT_FILE}: Orbax did not finalize it"))
            elif int(name) in tmp_steps:
                partial.append((name, f"its {name}{TMP_SUFFIX}-* is still there: a rename through GCS FUSE that "
                                      f"did not finish"))
            else:
                steps.append(int(name))
        elif TMP_STEP.match(name):
            partial.append((name, UNFINISHED))
    return Checkpoints(tuple(sorted(steps)), tuple(sorted(partial, key=_by_step)))


def _by_step(item: tuple[str, str]) -> tuple[int, str]:
    m = TMP_STEP.match(item[0]) or STEP_NAME.match(item[0])
    return (int(m.group(1)) if m else -1), item[0]


def checkpoints_place(job: Job) -> tuple[str, str]:
    """Where MaxText keeps the run's checkpoints (<base_output_directory>/
    <run_name>/checkpoints/): ("machine", path) on this machine, ("gcs", gs://...) or
    ("unseen", why) for a path on the TPU workers this machine cannot see."""
    base = job.arg("base_output_directory") or ""
    if job.local_data is not None:
        root = Path(base) if Path(base).is_absolute() else ROOT / base
        return "machine", str(root / job.run_name / "checkpoints")
    if base.startswith("gs://"):
        return "gcs", f"{base.rstrip('/')}/{job.run_name}/checkpoints/"
    if _through_fuse(base):
        # /data is the bucket, mounted by GCS FUSE in every Ray pod.
        sub = base[len(T.BUCKET_MOUNT.rstrip("/")):].strip("/")
        prefix = f"gs://{job.bucket}/" + (f"{sub}/" if sub else "")
        return "gcs", f"{prefix}{job.run_name}/checkpoints/"
    return "unseen", (f"base_output_directory={base} is a path on the TPU workers, not the bucket "
                      f"({T.BUCKET_MOUNT} or gs://)")


def _through_fuse(base: str) -> bool:
    mount = T.BUCKET_MOUNT.rstrip("/")
    return base.rstrip("/") == mount or base.startswith(mount + "/")


def restores_unfinished(job: Job, have: Checkpoints) -> str | None:
    """Why the job would restore from a step that is not whole, or None.
    Through GCS FUSE the workers' Orbax sees a POSIX path and takes any
    <step>/ as final (the rename rule), so a newer <step>/ that the bucket
    shows unfinished is what MaxText would restore from."""
    if job.local_data is not None or not _through_fuse(job.arg("base_output_directory") or ""):
        return None
    newer = [(n, why) for n, why in have.partial if STEP_NAME.match(n) and int(n) > (have.last or -1)]
    if not newer:
        return None
    name, why = newer[-1]
    where = checkpoints_place(job)[1]
    return (f"checkpoint step {name} of run {job.run_name} is not whole ({why}), but the workers read "
            f"{T.BUCKET_MOUNT} as a folder, where Orbax takes any <step>/ as final: MaxText would restore from "
            f"it. Remove it (`gcloud storage rm --recursive {where}{name}/`) to resume from "
            f"{have.last if have.last is not None else 'step 0'}, or start over with --fresh")


def checkpoints_fact(job: Job) -> Fact:
    kind, where = checkpoints_place(job)
    if kind == "machine":
        path = Path(where)

        def look():
            entries = connectors.this_machine().list_dir(str(path))
            return ABSENT if entries is None else local_checkpoints(entries)

        f = Fact(name="checkpoints", python=look, display=f"ls {quote(paths.shown(path))}",
                 describe=Checkpoints.describe)
    else:
        def parse(c: Completed) -> Any:
            if c.ok:
                return gcs_checkpoints(where, c.stdout)
            if "matched no objects" in c.stderr:
                return ABSENT
            raise ProbeFailed("checkpoints", c.line, c.rc, c.stdout, c.stderr,
                              why=f"could not look: {c.first_error_line()}")

        # Each step directory with its entries (one listing per step, not
        # every object of every step).
        f = fact("checkpoints", gcloud("storage", "ls", f"{where}*"), parse, describe=Checkpoints.describe)
    return assume(f, Checkpoints((0,), stand_in=True)) if job.fresh else f


def run_checkpoints(env: Environment, run: str, entrypoint: str = "") -> Fact | None:
    """The checkpoints fact of a run of this environment, where its job
    wrote them (the base_output_directory of its entrypoint, else this
    environment's); None where this machine cannot see them."""
    import shlex
    try:
        words = shlex.split(entrypoint)
    except ValueError:
        words = []
    base = next((w.split("=", 1)[1] for w in words if w.startswith("base_output_directory=")), "")
    try:
        job = build_job(env, MODELS[0], sets=[f"run_name={run}"] + ([f"base_output_directory={base}"] if base else []))
    except InputError:
        return None
    return checkpoints_fact(job) if checkpoints_place(job)[0] != "unseen" else None


def finalized_steps(env: Environment, run: str, look: Callable[[Fact], Any],
                    entrypoint: str = "") -> tuple[int, ...] | None:
    """The steps Orbax counts finalized in a run's checkpoints folder, by
    ``look`` at ``run_checkpoints`` (the look `invoke status` makes for the
    last finalized checkpoint): () where the folder is proven absent; None
    where this machine cannot see it or the look failed."""
    probe = run_checkpoints(env, run, entrypoint)
    if probe is None:
        return None
    try:
        have = look(probe)
    except PlaybookError:
        return None
    if have is ABSENT:
        return ()
    return have.steps if isinstance(have, Checkpoints) and not have.stand_in else None


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
        connectors.this_machine().remove_tree(str(path))

    return Action(f"rm -r {quote(paths.shown(path))}", rm)

