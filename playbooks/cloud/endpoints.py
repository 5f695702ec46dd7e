"""Where an environment's Ray dashboard answers, and how it is reached: the
local twin's head listens on ``ray_ip``; a GKE cluster's head is reached
through ``kubectl port-forward`` on localhost (its command and pid file)."""
from __future__ import annotations

from playbooks.access import connectors
from playbooks.cloud.gke import kube
from playbooks.config import paths
from playbooks.config import tutorial as T
from playbooks.config.schema import Environment
from playbooks.core.command import Command
from playbooks.core.pidfile import PidFile


def dashboard(env: Environment) -> str:
    """The Ray dashboard's address (the Jobs and State APIs), where the
    environment's commands run."""
    if env.platform.simulated:
        return f"http://{env.ray_ip}:{env.dashboard_port}"
    if connectors.in_a_head_pod():
        # The watch in the head pod: the head's own dashboard (runs/cluster_watch.py).
        return connectors.head_dashboard()
    return f"http://localhost:{env.dashboard_port}"


def forward_pidfile(env: Environment) -> PidFile:
    """On the host that runs the port-forward (this machine or the
    controller), so a later run finds and stops it."""
    return PidFile(paths.forward_dir(env.name), "port-forward", marker="port-forward", via=connectors.connector(env))


def forward_command(env: Environment) -> Command:
    return Command(kube(env, "port-forward", f"svc/{T.HEAD_SERVICE}", f"{env.dashboard_port}:{T.DASHBOARD_PORT}",
                        "--namespace", env.namespace).argv,
                   background=True, log=paths.forward_log(env.name), pid_file=forward_pidfile(env))
