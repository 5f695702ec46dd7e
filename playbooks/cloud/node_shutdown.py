"""A TPU node pool's graceful termination as GKE sets it: the node system
configuration's ``kubeletConfig`` a pool of a capacity option gets in this
environment (``CapacityOption.kubelet_config``, from ``config/choices.py``;
the values and their sources: ``config/spot_grace.py``), how gcloud is
given it, and what a pool read back lacks of it.

gcloud reads the configuration from ``--system-config-from-file``, whose
value may be ``-`` for stdin (gcloud's ``arg_parsers.FileContents``:
"a filename, or "-" representing that stdin should be used as input"), so
the command is fed it by a pipe (``printf '%s' JSON | gcloud ...``): no
file to write where the command runs (this machine or a controller) and
none left behind. The file's format is YAML or JSON (the flag's help).

A pool made without it (before this project set it, or by a gcloud too
old to send it) is lengthened in place by `gcloud container node-pools
update --system-config-from-file` (the same flag on update: gcloud's
surface/container/node_pools/update.py). GKE's "Customizing node system
configuration" page says a change to it usually triggers a rolling update
of the pool's nodes, which re-creates them (read in its Japanese edition,
https://docs.cloud.google.com/kubernetes-engine/docs/how-to/node-system-config?hl=ja):
a running job loses the slice. So the step says it (drift), with the
command, and does not run it."""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from typing import Any

from playbooks.access.cli_clients import fact, gcloud, json_object
from playbooks.cloud.capacity_options import pool_option
from playbooks.cloud.gke import clusters_fact, container_change, nodepool_name
from playbooks.config import spot_grace
from playbooks.config.choices import CapacityOption, capacity_option
from playbooks.config.schema import Environment
from playbooks.core.command import Command
from playbooks.core.errors import ProbeFailed
from playbooks.core.facts import Completed, Fact

FLAG = "--system-config-from-file=-"


def system_config(option: CapacityOption) -> str | None:
    """The node system configuration a pool of ``option`` is given, as
    one line of JSON (None: none)."""
    if not option.kubelet_config:
        return None
    return json.dumps({"kubeletConfig": dict(option.kubelet_config)}, separators=(",", ":"))


def fed(command: Command, option: CapacityOption) -> Command:
    """``command`` (a node-pools create or update) given the option's node
    system configuration on its stdin; unchanged where it has none."""
    text = system_config(option)
    if text is None:
        return command
    return dataclasses.replace(command, argv=(*command.argv, FLAG), pipe_from=Command(("printf", "%s", text)))


def update_command(env: Environment, pool: str, option: CapacityOption) -> Command:
    """`gcloud container node-pools update` that gives an existing pool the
    option's node system configuration (GKE re-creates its nodes)."""
    return fed(container_change(env, "node-pools", "update", pool, f"--location={env.zone}",
                                f"--cluster={env.cluster_name}"), option)


def lacks(option: CapacityOption, p: Any) -> str | None:
    """What a pool read back (``config.kubeletConfig``) lacks of the
    option's configuration, in words (None: nothing)."""
    want = option.kubelet_config
    have: Mapping[str, Any] = ((p or {}).get("config") or {}).get("kubeletConfig") or {}
    off = [f"{k} {have.get(k, 'unset')}, want {v}" for k, v in want.items() if have.get(k) != v]
    if not off:
        return None
    return (f"its Spot VMs do not give the job's pods {option.notice_s} s of a preemption's notice (kubeletConfig: "
            f"{'; '.join(off)}; unset: GKE's default, {spot_grace.DEFAULT_PODS_S} s)")


def _version(c: Completed) -> str:
    v = json_object("gcloud version")(c).get("Google Cloud SDK")
    if not isinstance(v, str) or not v:
        raise ProbeFailed("gcloud version", c.line, c.rc, c.stdout, c.stderr, why="no \"Google Cloud SDK\" in it")
    return v


def gcloud_version_fact() -> Fact:
    """The version of the gcloud that runs the commands (where they run);
    a dry run assumes one that sends the configuration."""
    return fact("gcloud's version", gcloud("version", "--format=json"), _version, assumed=spot_grace.MIN_GCLOUD,
                describe=lambda v: f"gcloud {v}")


def pods_given_s(env: Environment, cluster: Any) -> tuple[int, str] | None:
    """What a preemption gives the job's pods on the environment's Spot TPU
    node pools as the cluster (``clusters list``'s entry) shows them: the
    lengthened ``spot_grace.PODS_S`` where every one carries the
    kubeletConfig, else GKE's default ``spot_grace.DEFAULT_PODS_S``, with
    the pool that lacks it (a gcloud older than ``spot_grace.MIN_GCLOUD``
    makes them without it); None where the cluster shows no Spot pool of
    the environment (none made yet, or not read: a dry run)."""
    pools = cluster.get("nodePools") if isinstance(cluster, dict) else None
    ours = {p.get("name"): p for p in (pools or []) if isinstance(p, dict)}
    names = [nodepool_name(env, i) for i in range(env.slices)]
    spot = [ours[n] for n in names if n in ours and capacity_option(pool_option(ours[n])).longer_grace]
    if not spot:
        return None
    option = next((o for o in env.options if o.kubelet_config), None)
    short = [p.get("name") for p in spot if option is None or lacks(option, p)]
    if short:
        return spot_grace.DEFAULT_PODS_S, (f"node pool {short[0]} was made without the lengthened graceful "
                                           f"termination (its kubeletConfig), so its Spot VMs give the job's pods "
                                           f"GKE's default {spot_grace.DEFAULT_PODS_S} s")
    return spot_grace.PODS_S, f"the Spot node pools give the job's pods {spot_grace.PODS_S} s (their kubeletConfig)"


def pools_grace(env: Environment, planned: int) -> Callable[[Any], tuple[int, str]] | None:
    """Where the environment's Spot pools are planned with a lengthened
    graceful termination (GKE Standard, ``choices.given``), a look that
    gives the grace they really give the job's pods, read from the cluster
    (a pool made by a gcloud too old to send it gives GKE's default): the
    rehearsal is never gentler than a real preemption. None elsewhere."""
    if env.platform.simulated or not any(o.kubelet_config for o in env.options):
        return None
    cluster = clusters_fact(env)

    def as_made(look: Any) -> tuple[int, str]:
        try:
            read = pods_given_s(env, look(cluster))
        except ProbeFailed as e:
            return planned, f"the Spot node pools could not be read ({e.why or e.line}): the planned {planned} s"
        if read is None or read[0] == planned:
            return planned, "" if read is None else read[1]
        return read[0], f"{read[1]}: the notice is {read[0]} s, not the {planned} s planned"
    return as_made


def sender(env: Environment) -> Callable[[Any], tuple[CapacityOption, ...]]:
    """A look that gives the environment's capacity options as this
    machine's gcloud can make their pools: where a Spot option's
    lengthened graceful termination takes a gcloud newer than the one that
    runs the commands (``spot_grace.gcloud_blocker``), that option as GKE's
    default gives it (15 s to the job's pods), its notice saying why. Its
    one read, `gcloud version`, only where an option has a kubeletConfig;
    a dry run assumes a gcloud that sends it."""
    version = gcloud_version_fact() if any(o.kubelet_config for o in env.options) else None

    def options(look: Any) -> tuple[CapacityOption, ...]:
        if version is None:
            return tuple(env.options)
        try:
            why = spot_grace.gcloud_blocker(look(version))
        except ProbeFailed as e:
            why = f"gcloud's version could not be read ({e.why or e.line})"
        if why is None:
            return tuple(env.options)
        return tuple(dataclasses.replace(o, notice=f"{spot_grace.DEFAULT_NOTICE} (not lengthened: {why})",
                                         notice_s=spot_grace.DEFAULT_PODS_S, kubelet_config={})
                     if o.kubelet_config else o for o in env.options)
    return options
