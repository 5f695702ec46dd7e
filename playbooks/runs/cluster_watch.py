"""The watch in the cluster (``stall_watch: cluster``): beside each training
job, a Ray job of its own on the Ray head, ``<job>-watch``, that follows
the job to its end as `invoke logs --follow` does and acts as the
inventory says (``stall_action``: a stall reported, the job stopped, or
the hang's culprit quarantined; a host the health gate failed set aside).
It writes the run's timeline; `invoke train` and `logs --follow` only view
what it records, so a laptop that sleeps or a follow interrupted loses
nothing (`invoke train --detach` follows nothing at all).

Its entrypoint is `invoke watch`:

- on the local twin, run by this project's own Python in the project's
  folder (``env -C ROOT PYTHON -m invoke watch ...``): the twin's head is
  this machine, and the watch writes the same files a follow would;
- on GKE, in the head pod (`runs/watch_records.py` says how its records
  come back). The head has neither this project nor its packages nor
  kubectl: the project's folder goes as the job's working_dir (Ray's
  upload, .gitignore'd files and EXCLUDES left out), the three packages the
  watch imports as its pip runtime env at the lock's pins, and every
  kubectl command is answered by the `kubernetes` client with the pod's
  own service account (``access/kube_api.py``, in-cluster mode), whose
  rights the ``raycluster`` play grants (``manifests/ray-watch-rbac.yaml``).
  Its state (timelines, run logs, its record of hosts set aside) is kept in
  the run's bucket as the head mounts it (``HEAD_STATE``), not in the
  working_dir: a restarted head's watch finds it.
  No gcloud runs there: the watch never makes a node pool again.

Ray 2.60 joins an entrypoint's words with ``shlex.join`` and runs it
through a shell on the head: each word arrives as it was (tests prove it
for a project folder with a space and a quote in its name)."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from playbooks.access import connectors
from playbooks.access.kube_api import IN_CLUSTER_ENV
from playbooks.access.ray_api import ACTIVE
from playbooks.config import paths
from playbooks.config.versions import pinned
from playbooks.core.command import Command
from playbooks.core.errors import InputError

SUFFIX = "-watch"
# The watch's process takes no CPU of the head's from the job's workers.
ENTRYPOINT_CPUS = "0"
# What the watch needs from this machine's environment to find the same
# inventory and state: passed to its job, each only when set here.
PASSED = ("INVOKE_PLAYBOOK_INVENTORY",)
# In the head pod: where the watch's commands reach the Ray dashboard.
DASHBOARD_ENV, HEAD_DASHBOARD = connectors.DASHBOARD_ENV, connectors.HEAD_DASHBOARD
# What the watch imports beyond the standard library and Ray (which the
# image has): installed in the head by Ray's pip runtime env, at the lock's
# pins (tests/test_cluster_watch.py runs the watch with nothing else).
PACKAGES = ("invoke", "PyYAML", "kubernetes")
# Not shipped to the head: what the watch never reads (Ray also leaves out
# what .gitignore names: .venv, .state).
EXCLUDES = (".git", "tests", "docs", "bench", ".ci", "**/__pycache__")
WORKING_DIR = "."
# In the head pod: the run's bucket as the head mounts it (the tutorial's
# gcsfuse volume, `mountPath: /data` in manifests/ray-cluster.*.yaml), and
# the watch's state folder in it (paths.STATE_ENV): what the watch records
# outlives the head pod and each working_dir Ray unpacks, and a restarted
# head's watch reads it again (tests/test_cluster_watch.py holds the
# manifests' head mount to BUCKET_MOUNT).
BUCKET_MOUNT = "/data"
HEAD_STATE = f"{BUCKET_MOUNT}/.tpu-playbooks"
# How long `invoke train` waits for the watch it submitted to run before it
# submits the job: on GKE Ray first installs PACKAGES in the head (a minute
# or two; pip's own retries when PyPI is slow).
START_WITHIN = 600.0
# Looked at after 0.25 s, then twice as long each time, up to every 2 s: on
# the twin the watch runs within a second of its submit (a first look at
# 2 s lost 1-2 s of every `invoke train`), on GKE after minutes.
LOOK_EVERY = 2.0
FIRST_LOOK = 0.25


def look_after(looks: int) -> float:
    """The wait before the next look at a watch starting, after ``looks`` looks."""
    return min(LOOK_EVERY, FIRST_LOOK * 2 ** min(looks, 8))


def unstarted_hint(env: Any) -> str:
    """What to do about a watch that did not start, where it runs."""
    if env.platform.cloud:
        return (" (the head pod installs the watch's packages from PyPI: it must reach it; `ray job logs "
                "--address ... <job>-watch` says why; or set stall_watch: follow)")
    return ""


def in_cluster(env: Any) -> bool:
    """Whether this environment's jobs are watched in the cluster."""
    return env.stall_watch == "cluster"


def in_head_pod(env: Any) -> bool:
    """Whether this environment's watch runs in a GKE head pod (its project
    shipped, its records taken back from its log)."""
    return in_cluster(env) and env.platform.cloud


def watch_id(sid: str) -> str:
    """The watch's own submission id: never a run's job (``ours`` takes
    only ``<run>-<n>``)."""
    return f"{sid}{SUFFIX}"


def is_watch(sid: str) -> bool:
    return sid.endswith(SUFFIX)


def argv(env: Any, run: str, sid: str, elastic: bool) -> tuple[str, ...]:
    """The watch's entrypoint: `invoke watch` in the project's folder, by
    the Python that runs this (the twin's head runs the project's own), or
    on GKE by the head's Python in the folder shipped (its working_dir)."""
    words = ("-m", "invoke", "watch", f"--env={env.name}", f"--run={run}", f"--job={sid}",
             *(("--elastic",) if elastic else ()))
    if env.platform.cloud:
        return ("python", *words)
    return ("env", "-C", str(paths.ROOT), sys.executable, *words)


def shipped_inventory(environ: Any = os.environ) -> str | None:
    """The inventory the watch in a head pod reads: the one this run reads,
    as a path inside the folder shipped (None: the project's own
    inventory.yaml). One outside the project cannot go with it: refused."""
    value = environ.get("INVOKE_PLAYBOOK_INVENTORY")
    if not value:
        return None
    p = Path(os.path.expanduser(value))
    p = (p if p.is_absolute() else Path(os.getcwd()) / p).resolve()
    try:
        return str(p.relative_to(paths.ROOT.resolve()))
    except ValueError:
        raise InputError(f"INVOKE_PLAYBOOK_INVENTORY {value!r} is outside this project ({paths.ROOT}): the watch in "
                         f"the cluster (stall_watch: cluster) ships the project's folder to the Ray head and reads "
                         f"the inventory there; move the file into the project, or set stall_watch: follow") from None


def excludes(shipped: str | None) -> list[str]:
    """EXCLUDES, less the folder that holds the inventory shipped (Ray
    leaves out what .gitignore names too: an inventory there does not go)."""
    top = shipped.split("/", 1)[0] if shipped and "/" in shipped else None
    return [x for x in EXCLUDES if x != top]


def runtime_env(env: Any = None, environ: Any = os.environ) -> str:
    if env is not None and env.platform.cloud:
        shipped = shipped_inventory(environ)
        return json.dumps({
            "excludes": excludes(shipped),
            "pip": {"packages": [f"{p}=={pinned(p)}" if pinned(p) else p for p in PACKAGES]},
            "env_vars": {IN_CLUSTER_ENV: "1", DASHBOARD_ENV: HEAD_DASHBOARD, "PYTHONUNBUFFERED": "1",
                         paths.STATE_ENV: HEAD_STATE,
                         **({"INVOKE_PLAYBOOK_INVENTORY": shipped} if shipped else {})}})
    passed = {k: environ[k] for k in PASSED if environ.get(k)}
    return json.dumps({"env_vars": {**passed, "PYTHONUNBUFFERED": "1"}})


def submit_command(env: Any, address: str, run: str, sid: str, elastic: bool) -> Command:
    """`ray job submit --no-wait` of the watch of job ``sid`` (on GKE with
    the project as its working_dir)."""
    shipped = ("--working-dir", WORKING_DIR) if env.platform.cloud else ()
    return Command(("ray", "job", "submit", "--address", address, "--no-wait", f"--submission-id={watch_id(sid)}",
                    "--entrypoint-num-cpus", ENTRYPOINT_CPUS, *shipped, "--runtime-env-json", runtime_env(env), "--",
                    *argv(env, run, sid, elastic)))


def watching(listed: Any, sid: str) -> dict | None:
    """The watch of job ``sid`` among the Jobs API's jobs, when it runs."""
    for j in listed if isinstance(listed, list) else []:
        if isinstance(j, dict) and j.get("submission_id") == watch_id(sid) and j.get("status") in ACTIVE:
            return j
    return None
