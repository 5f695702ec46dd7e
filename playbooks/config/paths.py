"""Every path the project keeps, in one place.

All of it is under ``.state/`` of the project, relative to a connector's
root (this project on this machine; ``remote_dir`` on a controller host),
so the same relative path names the same thing wherever the commands run.
``here(path)`` is its absolute form on this machine (for what must be read
or written here: a local job's folders, the kept metrics, the logs).

    .state/last-error.txt                     the traceback of an internal error
    .state/preflight/                         AOT compiles: their work folders and results cache
    .state/gcloud-tokens/<hash>.json          gcloud tokens with an expiry, kept between runs (0600)
    .state/<env>/runs/<stamp>-<task>/         one task run: a log per command, job.log (a task that
                                              only looks: its newest 20 kept, cli/session.py's KEEP_LOGS)
    .state/<env>/lock                         one changing run at a time: who holds it, since when
    .state/<env>/nodes/<node>.pid             the local twin's Ray nodes (pid, marker)
    .state/<env>/quarantine.json              the hosts set aside: which, why, since when, by what
    .state/<env>/logs/<node>.log              their output
    /tmp/ray-twin-<hash>/                     a simulated TPU host's own Ray folder (node_temp)
    .state/<env>/port-forward.pid, .log       the Ray dashboard's port-forward (GKE)
    .state/<env>/prices.json                  the v6e prices read from the Cloud Billing Catalog, dated
    .state/<env>/training/<run>/              a run's kept metrics and plot
    .state/<env>/training/<run>/events.jsonl  its timeline: one JSON line per event (goodput, stalls)
    .state/<env>/training/<run>/maxtext-metrics.rank<N>.jsonl  a local job's MaxText metrics, per rank
    .state/<env>/training/<run>/goodput-library.json  ml-goodput-measurement's figure of an ended run, kept
    .state/<env>/data/, jax_cache/, ...       what a local job writes (MaxText, libtpu, Ray Train)
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from playbooks.config.project import ROOT

# Where a run's state lives: .state in the project's folder, or the absolute
# folder this variable names. The watch in a GKE head pod is given the
# bucket as the head mounts it (``runs/cluster_watch.HEAD_STATE``): its
# timelines, run logs and record of hosts set aside outlive the head pod
# and the working_dir Ray unpacks for each upload of the project (which
# changes with the code's hash and which Ray may collect), and a restarted
# head's watch finds them. A value that is not an absolute path is ignored.
STATE_ENV = "TPU_PLAYBOOKS_STATE"
STATE = os.environ.get(STATE_ENV, "") if os.path.isabs(os.environ.get(STATE_ENV, "")) else ".state"


def here(rel: str) -> Path:
    """A project path, absolute on this machine."""
    return Path(rel) if rel.startswith("/") else ROOT / rel


def shown(path: str | Path) -> str:
    """A path as a transcript shows it: relative to the project when inside it."""
    p = Path(path)
    try:
        return str(p.relative_to(ROOT)) if p.is_absolute() else str(p)
    except ValueError:
        return str(p)


def last_error() -> Path:
    return ROOT / STATE / "last-error.txt"


def env_dir(env: str) -> str:
    return f"{STATE}/{env}"


def env_lock(env: str) -> str:
    """The environment's lock on this machine: held by a changing run (and
    its chain), it names its holder (``core/lock.py``)."""
    return f"{STATE}/{env}/lock"


def run_logs(env: str, stamp: str, task: str) -> str:
    return f"{STATE}/{env}/runs/{stamp}-{task}"


# A followed job's driver log, in its task run's folder (`train`, `logs --follow`).
JOB_LOG = "job.log"


def gcloud_tokens() -> Path:
    """gcloud's tokens with an expiry, kept between runs (gcloud_credentials)."""
    return ROOT / STATE / "gcloud-tokens"


def prices_cache(env: str) -> str:
    return f"{STATE}/{env}/prices.json"


def runs(env: str) -> str:
    return f"{STATE}/{env}/runs"


def quarantine(env: str) -> str:
    """The hosts set aside (runs/quarantine_record.py)."""
    return f"{STATE}/{env}/quarantine.json"


# -- the local twin -------------------------------------------------------------
def maintenance(env: str) -> str:
    """The twin's simulated host maintenance: each host's scheduled time
    (chaos.maintenance writes it as GKE labels a TPU node)."""
    return f"{STATE}/{env}/maintenance.json"


def nodes(env: str) -> str:
    """Pid files of the local Ray nodes this project started."""
    return f"{STATE}/{env}/nodes"


def node_log(env: str, node: str) -> str:
    return f"{STATE}/{env}/logs/{node}.log"


def node_temp(env: str, node: str) -> str:
    """A simulated TPU host's own Ray temp folder (`ray start --temp-dir`: its
    session, logs and runtime_resources), as each TPU pod on GKE has its own
    disk. Nodes sharing one folder share the job's unpacked working
    directory, which Ray 2.60's working_dir plugin deletes and unpacks again
    on each node's first use (``download_and_unpack_package(...,
    overwrite=True)`` in ray/_private/runtime_env/working_dir.py): a worker
    starting elsewhere meanwhile finds no trainer module. Outside the project
    and short, because Ray binds unix sockets under it (at most 107 bytes):
    /tmp/ray-twin-<12 hex digits of the environment and the node>. Another
    checkout's cluster of the same names is another Ray session, so another
    folder inside it (``session_<its head's start>``)."""
    digest = hashlib.sha256(f"{env}\0{node}".encode()).hexdigest()[:12]
    return f"/tmp/ray-twin-{digest}"


# -- the port-forward to a GKE Ray head ---------------------------------------------
def forward_dir(env: str) -> str:
    return f"{STATE}/{env}"


def forward_log(env: str) -> str:
    return f"{STATE}/{env}/port-forward.log"


# -- training runs ------------------------------------------------------------------
def training(env: str) -> str:
    return f"{STATE}/{env}/training"


def run_dir(env: str, run: str) -> str:
    """A run's kept records: metrics.jsonl, metrics.png, MaxText's own metrics files."""
    return f"{STATE}/{env}/training/{run}"


def hang_dir(env: str, run: str, stamp: str) -> str:
    """A diagnosed hang's evidence: each worker's stack, evidence.json."""
    return f"{run_dir(env, run)}/hangs/{stamp}"


# What a local job's MaxText metrics_file is (the trainer adds .rank<N>).
MAXTEXT_METRICS = "maxtext-metrics.jsonl"


def maxtext_metrics(env: str, run: str) -> str:
    """A local run's MaxText metrics_file, as the job is given it."""
    return f"{run_dir(env, run)}/{MAXTEXT_METRICS}"


def events(env: str, run: str) -> str:
    """A run's timeline, the same locally and on GKE: one JSON line per event
    (the followed job log's, the chaos tasks', the pod watch's)."""
    return f"{run_dir(env, run)}/events.jsonl"


def goodput_library(env: str, run: str) -> str:
    """The second opinion on an ended run's goodput (goodput_reference.py),
    kept with the records it was computed from."""
    return f"{run_dir(env, run)}/goodput-library.json"


def local_job(env: str) -> dict[str, str]:
    """Where a local job writes, absolute (the job's processes run elsewhere):
    all of it under .state/<env>/ (MaxText and libtpu otherwise write to
    ~/jax_cache and /tmp)."""
    base = ROOT / STATE / env
    return {"data": f"{base}/data/", "jax_cache": f"{base}/jax_cache", "xla_dump": f"{base}/xla_dump/",
            "tpu_logs": f"{base}/tpu_logs", "ray_results": f"{base}/ray_results"}


# -- the AOT preflight -------------------------------------------------------------------
PREFLIGHT = f"{STATE}/preflight"
PREFLIGHT_CACHE_VAR = "PLAYBOOK_PREFLIGHT_CACHE"


def preflight_cache() -> Path:
    """Cached compile results: .state/preflight/cache/, or the folder that
    $PLAYBOOK_PREFLIGHT_CACHE names (tests start from a cold one)."""
    return Path(os.environ.get(PREFLIGHT_CACHE_VAR) or ROOT / PREFLIGHT / "cache")


def preflight_tpu_logs(key: str) -> str:
    return f"{PREFLIGHT}/tpu_logs/{key}"
