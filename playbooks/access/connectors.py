"""Where an environment's effects happen: this machine, or the controller
host its inventory names (every command, file, HTTP read and kill of the GKE
plays then runs there, over one SSH connection). A local environment and the
AOT compile always run here."""
from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from playbooks.config import paths as P
from playbooks.config import tutorial as T
from playbooks.config.choices import platform
from playbooks.config.project import ROOT
from playbooks.core.command import Command
from playbooks.core.connector import Connector, LocalConnector, SshConnector

_local: LocalConnector | None = None
_remote: dict[tuple, SshConnector] = {}


# What a child process here is given of this process's environment: what
# gcloud, gsutil, kubectl (and its auth plugin), curl, ray and JAX read, by
# name or prefix. Anything else (tokens of other tools, INVOKE_* settings,
# a shell's functions) is not passed.
PASSED_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TERM", "TMPDIR", "KUBECONFIG",
    "NO_GCE_CHECK", "VIRTUAL_ENV", "SSH_AUTH_SOCK", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "no_proxy", "all_proxy",
})
PASSED_PREFIXES = ("LC_", "CLOUDSDK_", "GOOGLE_", "GCE_", "GCLOUD_", "BOTO_", "USE_GKE_", "KUBE", "RAY_", "JAX_",
                   "XLA_", "TPU_", "LIBTPU", "PYTHON", "XDG_", "SSL_CERT_", "TF_", "HF_")


def passed(name: str) -> bool:
    return name in PASSED_NAMES or name.startswith(PASSED_PREFIXES)


def tool_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """This machine's child environment, stated: the passed variables of
    ``environ`` (this process's), with this interpreter's bin folder first
    on PATH, so ``ray`` is the locked Ray even when the venv is not
    activated."""
    source = os.environ if environ is None else environ
    env = {k: v for k, v in source.items() if passed(k)}
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    return env


def this_machine() -> LocalConnector:
    """This machine's connector, with the client libraries as speed-ups of
    kubectl and `ray job logs` (the same answers, no process)."""
    global _local
    if _local is None:
        from playbooks.access.gcloud_credentials import GcloudCredentials, TokenCache
        from playbooks.access.gcp_api import GcloudShortcut, processes_only
        from playbooks.access.kube_api import KubectlShortcut
        from playbooks.access.ray_api import RayJobLogs
        # one config-helper for the run's Google reads and its kubernetes client, none while a token kept
        # by an earlier run is good
        gcloud = GcloudCredentials(TokenCache(P.gcloud_tokens()))
        shortcuts: tuple = (GcloudShortcut(gcloud), KubectlShortcut(gcloud), RayJobLogs())
        if processes_only():  # every command its process (a pod has no kubectl: the client stays there)
            shortcuts = (KubectlShortcut(),) if in_a_head_pod() else ()
        _local = LocalConnector(ROOT, tool_env(), shortcuts=shortcuts)
    return _local


def in_a_head_pod(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process is the watch in a GKE Ray head pod (its job sets
    IN_CLUSTER_ENV): its effects happen there, never on a controller."""
    from playbooks.access.kube_api import in_cluster
    return in_cluster(os.environ if environ is None else environ)


# In the head pod: where the watch's commands reach the Ray dashboard (the
# head's own; `kubectl port-forward` is this machine's way in), as its job
# says (runs/cluster_watch.py).
DASHBOARD_ENV = "TPU_PLAYBOOKS_DASHBOARD"
HEAD_DASHBOARD = f"http://127.0.0.1:{T.DASHBOARD_PORT}"


def head_dashboard(environ: Mapping[str, str] | None = None) -> str:
    return (os.environ if environ is None else environ).get(DASHBOARD_ENV) or HEAD_DASHBOARD


def controller(env: Any) -> str | None:
    if in_a_head_pod():
        return None
    return env.get("controller") if platform(env).cloud else None


def connector(env: Any) -> Connector:
    """The connector of this environment's commands (made once per run; an
    SSH connection opens on its first use, so a dry run never connects)."""
    target = controller(env)
    if not target:
        return this_machine()
    key = (target, env.get("gateway"), env.get("identity_file"), env.get("known_hosts"), env.get("remote_dir"))
    if key not in _remote:
        _remote[key] = SshConnector(target, env.get("remote_dir") or "tpu-playbooks", gateway=env.get("gateway"),
                                    identity_file=env.get("identity_file"), known_hosts=env.get("known_hosts"))
    return _remote[key]


def in_process(env: Any) -> Callable[[Command, bool], str | None]:
    """For a dry run, whose Runner has no connector (nothing may start):
    what would answer a command of ``env`` in-process instead of its
    process, on the connector it would run on (this machine for one marked
    ``here``), from its command line alone (``Connector.in_process``; the
    bool: streamed). Nothing connects: an SSH connection opens on its
    first use, and this asks none."""
    def answers(command: Command, streamed: bool) -> str | None:
        where = this_machine() if command.here else connector(env)
        return where.in_process(command.argv, command.env, streamed)
    return answers


def close_all() -> None:
    for c in _remote.values():
        c.close()
    _remote.clear()


atexit.register(close_all)
