"""The watch in the cluster (``stall_watch: cluster``): beside each training
job, a Ray job of its own on the Ray head, ``<job>-watch``, that follows
the job to its end as `invoke logs --follow` does and acts as the
inventory says (``stall_action``: a stall reported, the job stopped, or
the hang's culprit quarantined; a host the health gate failed set aside).
It writes the run's timeline; `invoke train` and `logs --follow` only view
what it records, so a laptop that sleeps or a follow interrupted loses
nothing (`invoke train --detach` follows nothing at all).

Its entrypoint is `invoke watch` run by this project's own Python in the
project's folder on the head (``env -C ROOT PYTHON -m invoke watch ...``):
the local twin's head is this machine. On GKE the head is a pod without
this project, kubectl or the rights to cordon a node; the watch there is
not built (``stall_watch: cluster`` is refused on GKE, schema.py), and
`invoke train`'s follow watches, as before.

Ray 2.60 joins an entrypoint's words with ``shlex.join`` and runs it
through a shell on the head: each word arrives as it was (tests prove it
for a project folder with a space and a quote in its name)."""
from __future__ import annotations

import json
import os
import sys
from typing import Any

from playbooks.access.ray_api import ACTIVE
from playbooks.config import paths
from playbooks.core.command import Command

SUFFIX = "-watch"
# The watch's process takes no CPU of the head's from the job's workers.
ENTRYPOINT_CPUS = "0"
# What the watch needs from this machine's environment to find the same
# inventory and state: passed to its job, each only when set here.
PASSED = ("INVOKE_PLAYBOOK_INVENTORY",)


def in_cluster(env: Any) -> bool:
    """Whether this environment's jobs are watched in the cluster."""
    return getattr(env, "stall_watch", "follow") == "cluster"


def watch_id(sid: str) -> str:
    """The watch's own submission id: never a run's job (``ours`` takes
    only ``<run>-<n>``)."""
    return f"{sid}{SUFFIX}"


def is_watch(sid: str) -> bool:
    return sid.endswith(SUFFIX)


def argv(env: Any, run: str, sid: str, elastic: bool) -> tuple[str, ...]:
    """The watch's entrypoint: `invoke watch` in the project's folder, by
    the Python that runs this (the twin's head runs the project's own)."""
    return ("env", "-C", str(paths.ROOT), sys.executable, "-m", "invoke", "watch", f"--env={env.name}",
            f"--run={run}", f"--job={sid}", *(("--elastic",) if elastic else ()))


def runtime_env(environ: Any = os.environ) -> str:
    passed = {k: environ[k] for k in PASSED if environ.get(k)}
    return json.dumps({"env_vars": {**passed, "PYTHONUNBUFFERED": "1"}})


def submit_command(env: Any, address: str, run: str, sid: str, elastic: bool) -> Command:
    """`ray job submit --no-wait` of the watch of job ``sid``."""
    return Command(("ray", "job", "submit", "--address", address, "--no-wait", f"--submission-id={watch_id(sid)}",
                    "--entrypoint-num-cpus", ENTRYPOINT_CPUS, "--runtime-env-json", runtime_env(), "--",
                    *argv(env, run, sid, elastic)))


def watching(listed: Any, sid: str) -> dict | None:
    """The watch of job ``sid`` among the Jobs API's jobs, when it runs."""
    for j in listed if isinstance(listed, list) else []:
        if isinstance(j, dict) and j.get("submission_id") == watch_id(sid) and j.get("status") in ACTIVE:
            return j
    return None
