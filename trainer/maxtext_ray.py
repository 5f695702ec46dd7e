"""What both trainer scripts share: the job's layout, MaxText's entry point,
and the checks that make a wrong job fail loudly.

Shipped to the Ray cluster with the trainers (the job's working directory).
Everything that differs between GKE and this machine (worker counts,
topology, platform) comes from the job's environment, set by the playbook;
without it the tutorial's values apply: 2 slices of v6e 4x4, 4 hosts each.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import threading
import time
from dataclasses import dataclass

import deferred_import  # beside this module, in the job's working directory
import health_check  # beside this module, in the job's working directory
import heartbeat  # beside this module, in the job's working directory
import notice
import preemption_sync
import yaml

# Set by the playbook in the job's runtime environment.
ENV_SLICES = "TRAINER_SLICES"
ENV_HOSTS_PER_SLICE = "TRAINER_HOSTS_PER_SLICE"
ENV_TOPOLOGY = "TRAINER_TOPOLOGY"
ENV_CHIPS_PER_HOST = "TRAINER_CHIPS_PER_HOST"
ENV_ACCELERATOR = "TRAINER_ACCELERATOR_TYPE"
ENV_WORKER_REQUIREMENTS = "TRAINER_WORKER_REQUIREMENTS"
ENV_STORAGE_PATH = "TRAINER_STORAGE_PATH"
ENV_EXPECTED_MODEL = "TRAINER_EXPECTED_MODEL"
# Elastic: how often a healthy worker group looks for slices that came (Ray
# Train's default, 60 s, when unset).
ENV_RESIZE_INTERVAL = "TRAINER_RESIZE_INTERVAL_S"
# Elastic: the worker-group failures Ray Train recovers from over the job's
# life (FailureConfig.max_failures; -1: no limit). Preemptions Ray
# recognizes count apart (max_preemption_failures, Ray's -1: no limit).
ENV_MAX_FAILURES = "TRAINER_MAX_FAILURES"
MAX_FAILURES = 3
# Elastic: the seconds over which those failures count (0: the job's whole
# life, Ray Train's own count); elastic_control.FailureBudget keeps it.
ENV_FAILURE_WINDOW = "TRAINER_FAILURE_WINDOW_S"

MODEL_KEYS = ("base_emb_dim", "base_num_query_heads", "base_num_kv_heads", "base_num_decoder_layers",
              "base_mlp_dim", "head_dim", "vocab_size")


@dataclass(frozen=True)
class Layout:
    slices: int = 2
    hosts_per_slice: int = 4
    topology: str = "4x4"
    chips_per_host: int = 4
    accelerator_type: str = "TPU-V6E"
    resize_interval_s: float | None = None

    @classmethod
    def from_env(cls, environ=os.environ) -> Layout:
        d = cls()
        interval = environ.get(ENV_RESIZE_INTERVAL)
        return cls(
            slices=int(environ.get(ENV_SLICES, d.slices)),
            hosts_per_slice=int(environ.get(ENV_HOSTS_PER_SLICE, d.hosts_per_slice)),
            topology=environ.get(ENV_TOPOLOGY, d.topology),
            chips_per_host=int(environ.get(ENV_CHIPS_PER_HOST, d.chips_per_host)),
            accelerator_type=environ.get(ENV_ACCELERATOR, d.accelerator_type),
            resize_interval_s=float(interval) if interval else None,
        )

    @property
    def workers(self) -> int:
        return self.slices * self.hosts_per_slice


def scaling_config(layout: Layout, elastic: bool):
    from ray.train.v2.api.config import ScalingConfig

    workers = (layout.hosts_per_slice, layout.workers) if elastic else layout.workers
    interval = ({"elastic_resize_monitor_interval_s": layout.resize_interval_s}
                if elastic and layout.resize_interval_s is not None else {})
    return ScalingConfig(
        use_tpu=True,
        num_workers=workers,
        topology=layout.topology,
        accelerator_type=layout.accelerator_type,
        resources_per_worker={"TPU": layout.chips_per_host},
        placement_strategy="SPREAD",
        **interval,
    )


# Imported by MaxText 0.2.5 (or what it imports) at its import, used only
# inside functions a job may never call: imported at their first use instead
# (deferred_import.py says how). Each was found with `python -X importtime`.
# Those after Vertex AI's client took MaxText's import from 6.1 CPU-seconds
# (that one alone deferred) to 3.9-4.1 (this machine idle, 2026-12-06).
DEFERRED = (
    "google.cloud.aiplatform",  # Vertex AI TensorBoard (use_vertex_tensorboard)
    "sympy",                    # maxtext/layers/engram.py: sympy.isprime, DeepSeek's Engram layer
    "scipy.stats",              # ml_goodput_measurement's goodput_utils: median_abs_deviation
    "fastapi", "uvicorn",       # pathwaysutils/profiling.py: its profiling server
)
# Packages whose submodules MaxText imports while their __init__ (which only
# gathers names) can wait: tokamax's kernels, called by MoE layers.
DEFERRED_PACKAGES = ("tokamax",)

# Set on the training workers only (worker_runtime_env): preimport() acts there.
ENV_PREIMPORT = "TRAINER_PREIMPORT"
PREIMPORT = ("maxtext.configs.pyconfig", "maxtext.trainers.pre_train.train")


def worker_runtime_env() -> dict:
    """The training workers' runtime environment: the pinned MaxText (a
    requirements file in the working directory) where the workers do not
    have it, and the mark that has them import MaxText at once."""
    out: dict = {"env_vars": {ENV_PREIMPORT: "1"}}
    req = os.environ.get(ENV_WORKER_REQUIREMENTS)
    if req:
        out["pip"] = {"packages": _requirements(req)}
    return out


def preimport() -> None:
    """The job's worker_process_setup_hook (every worker process of the job
    runs it as it starts): on a training worker, import MaxText in the
    background, while Ray Train makes the worker group (its actors, the
    train context, jax.distributed.initialize) instead of after it: MaxText
    0.2.5's import takes 6-10 s of CPU, the largest part of a restart. The
    training function's own import then finds it done (or waits for it); a
    failure here is only that import's, which the function's import says."""
    if not os.environ.get(ENV_PREIMPORT):
        return

    def load() -> None:
        import importlib

        with contextlib.suppress(Exception):
            defer_unused()
            for name in PREIMPORT:
                importlib.import_module(name)

    threading.Thread(target=load, name="preimport-maxtext", daemon=True).start()


def defer_unused() -> list[str]:
    """Before MaxText's import: what it imports but the job may never use
    waits for its first use (``DEFERRED``); the names now waiting."""
    return ([name for name in DEFERRED if deferred_import.defer(name)]
            + [name for name in DEFERRED_PACKAGES if deferred_import.defer(name, package=True)])


def _requirements(path: str) -> list[str]:
    with open(path) as f:
        return [line for line in (raw.split("#", 1)[0].strip() for raw in f) if line]


def absolute_config(argv: list[str]) -> list[str]:
    """argv[1] is MaxText's config file; workers run elsewhere, so make it absolute."""
    argv = list(argv)
    if len(argv) > 1 and argv[1].endswith(".yml"):
        argv[1] = os.path.abspath(argv[1])
    return argv


def overrides(argv: list[str]) -> dict[str, str]:
    out = {}
    for a in argv[2:]:
        if "=" in a:
            k, v = a.split("=", 1)
            out[k] = v
    return out


class ConfigError(SystemExit):
    pass


def check_model_config(argv: list[str]) -> dict:
    """Refuse a job whose model config MaxText would not find: it would only
    log a WARNING and train its default model instead."""
    if len(argv) < 2 or not argv[1].endswith(".yml"):
        raise ConfigError("usage: python <trainer> base.yml key=value ...")
    base = argv[1]
    if not os.path.isfile(base):
        raise ConfigError(f"MaxText config {base} not found")
    model = overrides(argv).get("model_name")
    if not model:
        with open(base) as f:
            model = (yaml.safe_load(f) or {}).get("model_name", "default")
    if model == "default":
        return {}
    path = os.path.join(os.path.dirname(base), "models", f"{model}.yml")
    if not os.path.isfile(path):
        raise ConfigError(
            f"model config {path} not found beside {base}: MaxText would train its default model "
            f"instead of {model}. Ship models/{model}.yml with base.yml.")
    with open(path) as f:
        return yaml.safe_load(f) or {}


def expected_model(argv: list[str]) -> dict:
    """The model dimensions the job asks for: the model config, then the
    command-line overrides (when override_model_config=true)."""
    model = check_model_config(argv)
    ov = overrides(argv)
    dims = {k: model.get(k) for k in MODEL_KEYS}
    if ov.get("override_model_config", "").lower() == "true":
        for k in MODEL_KEYS:
            if k in ov:
                dims[k] = int(ov[k])
    return dims


def assert_model_applied(config, expected: dict) -> None:
    """After MaxText read its config: its dimensions must be the model's."""
    wrong = []
    for k, want in expected.items():
        if want is None:
            continue
        have = getattr(config, k, None)
        if have != want:
            wrong.append(f"{k}={have} (want {want})")
    if wrong:
        raise ConfigError(
            f"MaxText did not apply the config of model {getattr(config, 'model_name', '?')}: "
            + ", ".join(wrong))


def llama_params(d: dict) -> int:
    """Parameters of a llama-style decoder with these dimensions."""
    e, q, kv, layers, mlp, hd, vocab = (int(d[k]) for k in MODEL_KEYS)
    attn = e * q * hd + 2 * e * kv * hd + q * hd * e
    per_layer = attn + 3 * e * mlp + 2 * e
    return 2 * vocab * e + layers * per_layer + e


# -- CPU simulation of multi-slice --------------------------------------------
def _simulated() -> bool:
    return os.environ.get("JAX_PLATFORMS", "").split(",")[0] == "cpu"


def patch_hybrid_mesh(processes_per_slice: int) -> None:
    """On CPU every device reports slice_index 0, so JAX's hybrid mesh sees
    one slice. Ray ranks workers slice by slice, so a slice is
    ``process_index // processes_per_slice``: build the mesh from that."""
    import numpy as np
    from jax.experimental import mesh_utils

    original = mesh_utils.create_hybrid_device_mesh
    if getattr(original, "_simulated_slices", False):
        return

    def hybrid(mesh_shape, dcn_mesh_shape, devices=None, **kw):
        import jax

        devices = list(devices if devices is not None else jax.devices())
        want = int(np.prod(dcn_mesh_shape))
        have = len({getattr(d, "slice_index", 0) for d in devices})
        if have == want:
            return original(mesh_shape, dcn_mesh_shape, devices, **kw)
        groups: dict[int, list] = {}
        for d in sorted(devices, key=lambda d: (d.process_index, d.id)):
            groups.setdefault(d.process_index // processes_per_slice, []).append(d)
        if len(groups) != want:
            raise ValueError(f"{len(groups)} simulated slices, but the DCN mesh {dcn_mesh_shape} needs {want}")
        per_slice = [np.array(g).reshape(mesh_shape) for _, g in sorted(groups.items())]
        index = np.arange(want).reshape(dcn_mesh_shape)
        blocks = np.vectorize(lambda i: per_slice[i], otypes=[object])(index)
        return np.block(blocks.tolist())

    hybrid._simulated_slices = True
    mesh_utils.create_hybrid_device_mesh = hybrid


def patch_compile_cache_key() -> bool:
    """On CPU, each process of a group keys the persistent compilation cache
    apart from the others: the pinned jax 0.12.0.1 hashes the devices'
    topology fingerprint into the key (jax/_src/cache_key.py
    ``_hash_accelerator_config``), and the CPU client's fingerprint differs
    from process to process (measured: the key's only differing entry).
    Only process 0 writes entries (compiler.py ``_cache_write``), so the
    simulated host of rank 1 never found one and compiled the whole step
    again at every restart of a two-slice group. TPU hosts of one topology
    share a fingerprint and read what process 0 wrote. Here the key hashes
    each device's kind instead (that module's own fallback where a backend
    gives no topology): the same on every process of this machine, the
    device assignment and the XLA flags (each simulated host's device
    count) still in the key. False, and nothing changed, where the pinned
    jax's functions are not there."""
    try:
        from jax._src import cache_key
    except ImportError:
        return False
    hash_devices = getattr(cache_key, "_hash_devices", None)
    if hash_devices is None or not hasattr(cache_key, "_hash_accelerator_config"):
        return False
    cache_key._hash_accelerator_config = hash_devices
    return True


# -- the run's timeline: this job's events, one JSON line each -----------------
# The playbook that follows the job reads them from its log (``trainer event:
# {...}``), each with the time it happened here (not when the log reached the
# follower): the run's events.jsonl, its goodput, its stall watch.
EVENT = "trainer event: "
# Compiles shorter than this are left out (JAX compiles many small functions
# while MaxText sets up; they are part of its startup).
COMPILE_MIN_S = 0.5
# jax.monitoring's spans of one compile: tracing, lowering, the XLA compile.
COMPILE_SPANS = {"/jax/core/compile/jaxpr_trace_duration": "trace",
                 "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
                 "/jax/core/compile/backend_compile_duration": "compile"}


def event(kind: str, t: float | None = None, step: int | None = None, **fields) -> dict:
    """Print one event of the run's timeline, as one JSON line."""
    e = {"t": round(time.time() if t is None else t, 3), "kind": kind, "step": step, **fields}
    print(EVENT + json.dumps(e, default=str), flush=True)
    return e


class MaxTextEvents(logging.Handler):
    """MaxText's (and Orbax's) own log lines, as events with the time they
    were logged: each step, a checkpoint save (from "Waited ... seconds for
    step N to finish before starting checkpointing" to the save started), a
    restore (from
    "restoring from this run's directory step N" to Orbax's "Finished load"),
    and the first step of this worker group (after a restore, or not).

    On another host (``peer_rank``): only the steps it finishes, as
    ``peer_step`` events with its rank."""

    STEP = re.compile(r"^completed step: (\d+), seconds: ([\d.]+)")
    # The rest of MaxText's step line: what the summary and the metrics read.
    METRICS = re.compile(r"TFLOP/s/device: ([\d.]+), Tokens/s/device: ([\d.]+), total_weights: \d+, "
                         r"loss: ([\d.]+|nan|inf)")
    PARAMETERS = re.compile(r"^number parameters: ([\d.]+) billion")
    # The save holds the training from when the step it saves has finished
    # (MaxText first waits for it: that wait is the step's own time).
    SAVE_START = re.compile(r"^(?:Waiting for step (\d+) to finish before checkpoint|Waited [\d.e-]+ seconds for step "
                            r"(\d+) to finish before starting checkpointing)")
    SAVED = re.compile(r"^(?:Started an asynchronous checkpoint save for step|Saved a checkpoint at step) (\d+)")
    # Orbax's CheckpointManager (0.12.8, checkpoint_manager.py ``_finalize``):
    # "done on all hosts" ends every finalize, also one it skipped after a
    # save error ("Checkpointer failed ... Skipping finalization", primary
    # host only); the step's directory is then checked as Orbax checks it.
    FINALIZE_DONE = re.compile(r"\[step=(\d+)\] CheckpointManager Save Finalize is done on all hosts")
    FINALIZE_FAILED = re.compile(r"\[step=(\d+)\] Checkpointer failed: one or more items may not be finalized")
    RESTORE = re.compile(r"^restoring from this run's directory step (\d+)")
    RESTORED = re.compile(r"Finished load in ([\d.]+) seconds @ .*?(\d+)/?$")
    STOPPED = re.compile(r"^Training stopped: .*termination signal")

    def __init__(self, peer_rank: int | None = None) -> None:
        super().__init__(logging.INFO)
        self.peer_rank = peer_rank
        self.saving: dict[int, float] = {}
        self.saved: dict[int, float] = {}  # step -> when it had finished (its save's start)
        self.restoring: tuple[int, float] | None = None
        self.restored: int | None = None
        self.stepped = False
        self.last_step: int | None = None
        self.last_step_t = 0.0
        self.stopped_on_notice = False
        self.failed: set[int] = set()  # steps whose finalization Orbax skipped
        self.checkpoint_dir: str | None = None  # MaxText's, once its config is read

    def finalized(self, step: int, t: float) -> dict:
        """The ``checkpoint_finalized`` event of step N's save: finalized
        when Orbax finished it and its directory is a finalized checkpoint."""
        start = self.saved.get(step)
        seconds = round(t - start, 3) if start is not None else None
        why = None
        if step in self.failed:
            why = "Orbax skipped its finalization after a save error (the worker's log has it)"
        elif self.checkpoint_dir and not step_finalized(self.checkpoint_dir, step):
            why = f"Orbax ended the save, but {self.checkpoint_dir.rstrip('/')}/{step} is not a finalized checkpoint"
        return event("checkpoint_finalized", t, step, seconds=seconds, finalized=why is None,
                     **({"why": why} if why else {}))

    def finish(self) -> dict | None:
        """After MaxText returned: on a preemption notice it saves step N and
        stops before it logs N (its line would come a step later): the step
        ran. Its event, after the last step's line (which MaxText logs one
        step late, after the save began)."""
        if not self.stopped_on_notice or not self.saved:
            return None
        step = max(self.saved)
        if self.last_step is not None and step <= self.last_step:
            return None
        self.last_step = step
        return event("step", max(self.saved[step], self.last_step_t + 0.001), step, seconds=None,
                     unlogged="saved on a preemption notice, then MaxText stopped")

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):  # never let the timeline break the training
            self.line(record.getMessage().strip(), record.created)

    def line(self, msg: str, t: float) -> dict | None:
        if (m := self.STEP.match(msg)):
            step = int(m.group(1))
            if self.peer_rank is not None:
                return event("peer_step", t, step, seconds=float(m.group(2)), rank=self.peer_rank)
            out = event("step", t, step, seconds=float(m.group(2)), **step_metrics(msg))
            self.last_step, self.last_step_t = step, t
            if not self.stepped:
                self.stepped = True
                if self.restored is not None:
                    return event("first_step_after_restore", t, step, restored_from=self.restored)
                return event("first_step", t, step)
            return out
        if self.peer_rank is not None:
            return None
        if (m := self.PARAMETERS.match(msg)):
            return event("parameters", t, billion=float(m.group(1)))
        if (m := self.SAVE_START.match(msg)):
            self.saving[int(m.group(1) or m.group(2))] = t
        elif (m := self.SAVED.match(msg)):
            step = int(m.group(1))
            start = self.saving.pop(step, t)
            self.saved[step] = start
            return event("checkpoint_saved", t, step, seconds=round(t - start, 3))
        elif (m := self.FINALIZE_FAILED.search(msg)):
            self.failed.add(int(m.group(1)))
        elif (m := self.FINALIZE_DONE.search(msg)):
            return self.finalized(int(m.group(1)), t)
        elif self.STOPPED.match(msg):
            self.stopped_on_notice = True
        elif (m := self.RESTORE.match(msg)):
            self.restoring = (int(m.group(1)), t)
            return event("restore_started", t, int(m.group(1)))
        elif (m := self.RESTORED.search(msg)) and self.restoring is not None:
            step, start = self.restoring
            self.restoring, self.restored = None, step
            return event("restored", t, step, seconds=round(t - start, 3))
        return None


def step_finalized(checkpoint_dir: str, step: int) -> bool:
    """Whether ``<checkpoint_dir>/<step>`` is a finalized checkpoint, by
    Orbax's own rule (a renamed directory, or a commit file on GCS); a look
    that fails counts as not finalized."""
    import asyncio

    from orbax.checkpoint._src.path import temporary_paths

    try:
        return bool(asyncio.run(temporary_paths.is_path_finalized(os.path.join(checkpoint_dir, str(step)))))
    except Exception:
        return False


def step_metrics(msg: str) -> dict:
    """Of MaxText's step line: TFLOP/s and tokens/s per device, the loss
    (None when not finite)."""
    m = MaxTextEvents.METRICS.search(msg)
    if not m:
        return {}
    loss = float(m.group(3))
    return {"tflops_per_device": float(m.group(1)), "tokens_per_s_per_device": float(m.group(2)),
            "loss": loss if loss == loss and loss not in (float("inf"), float("-inf")) else None}


def compile_span(name: str, start: float, end: float, **kw) -> list[dict]:
    """jax.monitoring's time span of a compile's part, as two events."""
    phase = COMPILE_SPANS.get(name)
    if phase is None or end - start < COMPILE_MIN_S:
        return []
    what = str(kw.get("fun_name", "?"))
    return [event("compile_started", start, phase=phase, function=what),
            event("compile_ended", end, phase=phase, function=what, seconds=round(end - start, 3))]


class Progress(logging.Handler):
    """What this process's MaxText has done, from its own log lines: the
    last step it finished, the last checkpoint it saved, and whether it
    stopped early (MaxText's "Training stopped: ..." after a preemption
    notice). On every host; the controller asks rank 0 (``progress()``)."""

    STOPPED = re.compile(r"^Training stopped: (.+)")
    # MaxText stops this way after a SIGTERM (JAX's preemption notice), once
    # the hosts agreed on a step and its checkpoint is saved.
    NOTICE = "termination signal"

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.last_step: int | None = None
        self.restored: int | None = None  # the step this process's group restored from
        self.last_saved: int | None = None
        # The last save was only started (MaxText's asynchronous save): Orbax
        # finalizes it in the background, and no line says when. A group
        # torn down now loses it (the next restores the save before).
        self.save_pending = False
        self.stopped: str | None = None
        self.ended = False

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            self.line(record.getMessage().strip())

    def line(self, msg: str) -> None:
        if (m := MaxTextEvents.STEP.match(msg)):
            self.last_step = int(m.group(1))
        elif (m := MaxTextEvents.RESTORE.match(msg)):
            self.restored = int(m.group(1))
        elif (m := MaxTextEvents.SAVED.match(msg)):
            self.last_saved = int(m.group(1))
            self.save_pending = msg.startswith("Started an asynchronous")
        elif (m := self.STOPPED.match(msg)):
            self.stopped = m.group(1)

    @property
    def at_step(self) -> int | None:
        """The step this process's group is at: the last step line it read,
        else the step it restored from. MaxText writes a step's line only
        after the next step (maxtext/common/metric_logger.py,
        ``buffer_and_write_metrics``: a queue of one), so a group that has
        just restored has logged none yet; None: a fresh group before its
        first line."""
        return self.last_step if self.last_step is not None else self.restored

    @property
    def for_notice(self) -> bool:
        return bool(self.stopped) and self.NOTICE in (self.stopped or "")

    def state(self) -> dict:
        return {"last_step": self.last_step, "last_saved": self.last_saved, "save_pending": self.save_pending,
                "stopped": self.stopped,
                "stopped_for_notice": self.for_notice, "ended": self.ended}


PROGRESS = Progress()


def progress() -> dict:
    """This process's MaxText progress (run in a worker by the controller)."""
    return PROGRESS.state()


def ready() -> bool:
    """Run in a worker before its train context is made: that it could be
    sent proves this module imports there."""
    return True


def preemption_notice() -> bool:
    """Send this process SIGTERM, as a preemption would, where JAX's
    preemption service is up (jax.distributed.initialize starts it: its
    notifier, not Ray's handler, takes the signal): the hosts then agree on
    a step, and MaxText saves there and stops. False where it is not up (the
    signal would end the process)."""
    import signal

    from jax._src import distributed

    if getattr(distributed.global_state, "preemption_sync_manager", None) is None:
        return False
    os.kill(os.getpid(), signal.SIGTERM)
    return True


class StoppedEarly(RuntimeError):
    """MaxText stopped before its last step after a preemption notice (its
    checkpoint is saved): a failure to Ray Train, never a finished run."""


_WATCHING = threading.Lock()
_watching = False
_events: MaxTextEvents | None = None  # this process's (rank 0's or a peer's)


def watch_events(peer_rank: int | None = None) -> None:
    """In this process, once. Rank 0 of the worker group: compiles, through
    jax.monitoring's time spans; steps, saves and restores, through MaxText's
    own log lines. A peer (``peer_rank``): the steps it finishes."""
    global _watching
    with _WATCHING:
        if _watching:
            return
        _watching = True
    if peer_rank is None:
        import jax.monitoring

        jax.monitoring.register_event_time_span_listener(compile_span)
    listen_to_maxtext(peer_rank)


def listen_to_maxtext(peer_rank: int | None = None) -> MaxTextEvents:
    """MaxText (max_logging) and Orbax log through absl: its "absl" logger's
    records, at INFO (what a Ray worker already shows; without it the
    records of MaxText's INFO lines would not even be made)."""
    global _events
    logger = _absl_info()
    handler = MaxTextEvents(peer_rank)
    logger.addHandler(handler)
    _events = handler
    return handler


def _absl_info() -> logging.Logger:
    logger = logging.getLogger("absl")
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    return logger


def watch_progress() -> None:
    """Every host: ``PROGRESS`` reads this process's MaxText lines."""
    logger = _absl_info()
    if PROGRESS not in logger.handlers:
        logger.addHandler(PROGRESS)


def train_loop_per_worker(config: dict) -> None:
    """Ray Train's per-worker function: MaxText with the job's argv."""
    import ray
    import ray.train

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    # Placed and running, with JAX's distributed service up: Ray Train's JAX
    # backend ran jax.distributed.initialize on every worker before this.
    event("worker_started", rank=rank, workers=world, slice=os.environ.get("TPU_NAME"),
          host=os.environ.get("TPU_WORKER_ID"), hostname=socket.gethostname(), cwd=os.getcwd())
    if rank == 0:
        steps = overrides(config["argv"]).get("steps", "")
        event("jax_initialized", workers=world, **({"steps": int(steps)} if steps.isdigit() else {}))
    health = health_check.Settings.from_env()
    if health.enabled:
        # Every host checks itself and learns every other's verdict: a sick
        # host fails the whole group here (HostUnhealthy, naming it), before
        # MaxText's first collective would hang on it. Before the compile
        # listener: the checks' own compiles are not the training's.
        health_check.gate(rank, health, emit=event)
    if rank == 0:
        watch_events()
    elif os.environ.get("TPU_WORKER_ID", "0") == "0":
        # The first host of every other slice says the steps it finishes: when
        # rank 0's host is lost, its last step may not have been logged, and a
        # survivor's is where the group was lost (goodput's "lost at").
        watch_events(peer_rank=rank)
    watch_progress()
    beat = heartbeat.Heartbeat(event, {"rank": rank, "slice": os.environ.get("TPU_NAME"),
                                       "host": os.environ.get("TPU_WORKER_ID"), "hostname": socket.gethostname(),
                                       "pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id()},
                               lambda: PROGRESS.last_step, heartbeat.interval()).start()
    # Rank 0 turns a notice (Ray draining a node of the group) into a save.
    told = notice.NoticeWatch(event, lambda: PROGRESS.at_step, preemption_notice,
                              notice.poll_interval()).start() if rank == 0 else None
    try:
        run_maxtext(config["argv"], config["layout"], world, rank)
    finally:
        if told is not None:
            told.stop()
        beat.stop()
        if rank == 0 and _events is not None:
            _events.finish()
        PROGRESS.ended = True


def max_failures(environ=os.environ) -> int:
    """The job's ``max_failures`` (the inventory's, checked there), else 3."""
    raw = environ.get(ENV_MAX_FAILURES, "")
    return int(raw) if raw else MAX_FAILURES


def failure_window(environ=os.environ) -> float:
    """The job's ``failure_window`` in seconds (0: the job's whole life)."""
    raw = environ.get(ENV_FAILURE_WINDOW, "")
    return float(raw) if raw else 0.0


def ray_max_failures(environ=os.environ) -> int:
    """What Ray Train's own count allows: the budget over the job's whole
    life, or no limit when a window counts them (FailureBudget ends the job)."""
    return -1 if failure_window(environ) > 0 and max_failures(environ) >= 0 else max_failures(environ)


def fit(argv: list[str], elastic: bool, callbacks: tuple = ()) -> None:
    """The trainers' main: a JaxTrainer over TPU slices running MaxText.
    Elastic: between one slice and all of them, ``max_failures`` recoveries
    from a failed worker group (the inventory's, 3 by default), and the
    elastic trainer's controller callbacks (elastic_control.py: given by
    maxtext_elastic_trainer.py, so this module never imports it back)."""
    import ray
    from ray.train.v2.api.config import FailureConfig, RunConfig
    from ray.train.v2.jax import JaxTrainer

    # The arguments as this process received them, one JSON line: `ray job
    # submit` joins them into a shell command line on the head, so this is
    # the proof that every value arrived as it was given.
    print("trainer argv: " + json.dumps(list(argv[1:])), flush=True)
    argv = absolute_config(argv)
    check_model_config(argv)
    layout = Layout.from_env()
    run_config = RunConfig(
        name="maxtext_jaxtrainer",
        storage_path=os.environ.get(ENV_STORAGE_PATH),
        worker_runtime_env=worker_runtime_env(),
        **({"failure_config": FailureConfig(max_failures=ray_max_failures()), "callbacks": list(callbacks)}
           if elastic else {}),
    )
    trainer = JaxTrainer(
        train_loop_per_worker=train_loop_per_worker,
        train_loop_config={"argv": argv, "layout": layout},
        scaling_config=scaling_config(layout, elastic=elastic),
        run_config=run_config,
    )
    trainer.fit()
    print("Training complete!", flush=True)
    ray.shutdown()


def per_rank(argv: list[str], rank: int) -> list[str]:
    """MaxText's metrics_file is written by every process (not only rank 0):
    one file per rank, <name>.rank<N><ext>."""
    out = []
    for a in argv:
        if a.startswith("metrics_file=") and a != "metrics_file=":
            root, ext = os.path.splitext(a[len("metrics_file="):])
            a = f"metrics_file={root}.rank{rank}{ext}"
            os.makedirs(os.path.dirname(root) or ".", exist_ok=True)
        out.append(a)
    return out


def run_maxtext(argv: list[str], layout: Layout, world_size: int, rank: int = 0) -> None:
    """The body of ``train_loop_per_worker``: MaxText's pre-training main."""
    argv = per_rank(list(argv), rank)
    if _simulated():
        slices = max(1, world_size // layout.hosts_per_slice)
        argv = [a for a in argv if not a.startswith("num_slices=")] + [f"num_slices={slices}"]
        patch_hybrid_mesh(layout.hosts_per_slice)
        shared = patch_compile_cache_key()
        print(f"simulated TPU: {world_size} host(s) = {slices} slice(s) of {layout.hosts_per_slice}; compilation "
              f"cache keys {'shared by every host, as on a TPU' if shared else 'per host (jax not patched)'}",
              flush=True)
    expected = expected_model(argv)
    defer_unused()
    from maxtext.configs import pyconfig
    from maxtext.trainers.pre_train.train import main as maxtext_main

    config = pyconfig.initialize(argv)
    assert_model_applied(config, expected)
    if all(v is not None for v in expected.values()):
        model, billion = getattr(config, "model_name", "?"), round(llama_params(expected) / 1e9, 3)
        print(f"model check: {model} applied, {billion:.3f} billion parameters expected", flush=True)
        if rank == 0:
            event("model_check", model=model, expected_billion=billion)
    if rank == 0:
        save_schedule(config)
    preemption_sync.guard()  # MaxText's loop runs on this thread
    try:
        maxtext_main(argv)
    except RuntimeError as e:
        if not already_done(e, rank):
            raise
        return
    stopped_early(int(config.steps))


def save_schedule(config) -> dict:
    """Rank 0, once per worker group: the saves MaxText will make (its
    checkpoint_period, on or off, the first and the last step's), for the
    run's accounting of saves due (playbooks/runs/saves.py)."""
    if _events is not None:
        _events.checkpoint_dir = str(getattr(config, "checkpoint_dir", "") or "") or None
    return event("save_schedule", checkpoint_period=int(config.checkpoint_period),
                 enabled=bool(config.enable_checkpointing), steps=int(config.steps),
                 async_checkpointing=bool(getattr(config, "async_checkpointing", False)),
                 save_checkpoint_on_start=bool(getattr(config, "save_checkpoint_on_start", False)),
                 save_checkpoint_on_completion=bool(getattr(config, "save_checkpoint_on_completion", False)))


# MaxText's refusal to start a run whose checkpoint already holds its last step.
DONE = re.compile(r"Requested training up to step (\d+), but a checkpoint already exists at step (\d+)")


def already_done(e: Exception, rank: int = 0) -> bool:
    """A new worker group of a run that an earlier group finished: a resize
    Ray Train decided as the last step was being saved. The run is done, not
    failed (MaxText raises RuntimeError; Ray Train would retry it until its
    failures run out and end the job FAILED with every step trained)."""
    m = DONE.search(str(e))
    if not m or int(m.group(2)) < int(m.group(1)) - 1:
        return False
    if rank == 0:
        print(f"the run is complete: its checkpoint holds step {m.group(2)} of {m.group(1)}; nothing left to "
              "train", flush=True)
    return True


def stopped_early(steps: int, p: Progress = PROGRESS) -> None:
    """MaxText returns as if done when a preemption notice (SIGTERM) stopped
    it: raise, so that Ray Train restarts the group (it restores the step
    just saved) instead of taking the run as finished."""
    last = max((s for s in (p.last_step, p.last_saved) if s is not None), default=None)
    if p.for_notice and (last is None or last < steps - 1):
        raise StoppedEarly(f"MaxText stopped after step {last} of {steps} ({p.stopped}): its checkpoint at step "
                           f"{p.last_saved} is saved; the next worker group resumes there")
