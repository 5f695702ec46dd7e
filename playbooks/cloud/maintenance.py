"""GKE maintenance held off while a run trains: a maintenance exclusion of
the cluster, one per run, added before its job is submitted and removed
when the job ends (and at teardown). What it is, its commands, and how the
cluster's maintenance policy is read (`clusters list`, the probe the
cluster play already makes). The steps: ``plays/train.py`` (hold, release),
``plays/teardown.py``; ``status.py`` shows an exclusion in force.

The scope is "No minor or node upgrades" (the API's
MaintenanceExclusionOptions.Scope NO_MINOR_OR_NODE_UPGRADES: "excludes all
minor upgrades for the cluster, and also exclude all node pool upgrades.
Only control plane patches are allowed"): a node upgrade recreates the
node, so a TPU slice of the job is lost; control-plane patches (security
fixes) still come and leave the nodes alone. GKE's limits per scope
(kubernetes-engine/docs/concepts/maintenance-windows-and-exclusions, "Scope
of maintenance to exclude" and "Limitations on maintenance exclusions"):
"No upgrades" at most 30 days; "No minor upgrades" and "No minor or node
upgrades" up to the end of support of the cluster's minor version (Google's
own sample, terraform-google-modules/terraform-docs-samples
gke/standard/zonal/no-channel-to-release-channel/no_minor_or_node_upgrade/
main.tf, ends one "at the end of standard support for 1.31"); at most 20
exclusions per cluster (terraform-provider-google #15279 quotes that page).
A hold lasts HOLD from its `train` (inside every scope's limit, but near a
version's end of support, where GKE refuses the end date with its own
message); a run still training when it ends is held again by the next
`invoke train`, which follows the running job.
"""
from __future__ import annotations

import datetime as dt
from typing import Any

from playbooks.cloud.gke import clusters_fact, container_change, location, running_cluster, when
from playbooks.config.schema import Environment
from playbooks.core.command import Command
from playbooks.core.errors import PlaybookError
from playbooks.core.facts import ABSENT, assume
from playbooks.core.play import StepContext

# gcloud's value (surface container/clusters/update: flags.AddMaintenanceExclusionFlags
# takes no_upgrades | no_minor_upgrades | no_minor_or_node_upgrades) and the API's.
SCOPE = "no_minor_or_node_upgrades"
API_SCOPE = "NO_MINOR_OR_NODE_UPGRADES"
HOLD = dt.timedelta(days=7)
# Start and end as ISO 8601 durations after now, which gcloud's
# arg_parsers.Datetime (core/util/times.ParseDateTime) takes: the command
# line is the same on every run (and in the dry run's goldens).
HOLD_START, HOLD_END = "P0D", f"P{HOLD.days}D"
# An exclusion of ours ending sooner than this is renewed (removed and added).
RENEW_WITHIN = dt.timedelta(days=1)
PREFIX = "playbooks-train-"


def name(run: str) -> str:
    """The exclusion of a run (run names are 1-63 of a-z 0-9 . _ -)."""
    return f"{PREFIX}{run}"


def _update(env: Environment, *flags: str) -> Command:
    """A cluster update: patient for another operation of the cluster, as
    every cluster and node pool change is (gke.container_change)."""
    return container_change(env, "clusters", "update", env.cluster_name, f"--location={location(env)}", *flags,
                            quiet=True)


def add_command(env: Environment, run: str) -> Command:
    return _update(env, f"--add-maintenance-exclusion-name={name(run)}",
                   f"--add-maintenance-exclusion-start={HOLD_START}", f"--add-maintenance-exclusion-end={HOLD_END}",
                   f"--add-maintenance-exclusion-scope={SCOPE}")


def remove_command(env: Environment, exclusion: str) -> Command:
    return _update(env, f"--remove-maintenance-exclusion={exclusion}")


def exclusions(cluster: Any) -> dict[str, dict]:
    """The cluster's maintenance exclusions: name -> its TimeWindow
    (startTime, endTime, maintenanceExclusionOptions.scope)."""
    window = ((cluster or {}).get("maintenancePolicy") or {}).get("window") or {}
    return {str(k): v or {} for k, v in (window.get("maintenanceExclusions") or {}).items()}


def ours(cluster: Any) -> list[str]:
    return sorted(n for n in exclusions(cluster) if n.startswith(PREFIX))


def scope(window: dict) -> str:
    # An exclusion without options excludes all upgrades (the API's default scope).
    return str((window.get("maintenanceExclusionOptions") or {}).get("scope") or "NO_UPGRADES")


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


# gcloud reads its clock where it runs (a controller host, perhaps): a start
# this much ahead of ours is taken as now.
SKEW = dt.timedelta(minutes=5)


def in_force(window: dict, at: dt.datetime | None = None) -> bool:
    at = at or now()
    start, end = when(window.get("startTime")), when(window.get("endTime"))
    return start is not None and end is not None and start <= at + SKEW and at < end


def short_of(window: dict | None, at: dt.datetime | None = None) -> str | None:
    """Why an exclusion of ours does not hold the run off as asked (None
    when it does): absent, another scope, not in force, ending soon."""
    at = at or now()
    if window is None:
        return "no exclusion"
    if scope(window) != API_SCOPE:
        return f"its scope is {scope(window)}, want {API_SCOPE}"
    end = when(window.get("endTime"))
    if not in_force(window, at) or end is None:
        return f"not in force ({window.get('startTime')} to {window.get('endTime')})"
    if end - at < RENEW_WITHIN:
        return f"it ends at {shown(end)}, in less than {RENEW_WITHIN.days} day"
    return None


def shown(t: dt.datetime | None) -> str:
    return t.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M UTC") if t else "?"


def describe(exclusion: str, window: dict) -> str:
    return (f"{exclusion} ({scope(window).lower()}) until {shown(when(window.get('endTime')))}")


def held(env: Environment, run: str, at: dt.datetime | None = None) -> dict:
    """A cluster as `clusters list` shows it, with this run's exclusion in
    force (what a dry run assumes after the hold)."""
    at = at or now()
    return {**running_cluster(env), "maintenancePolicy": {"window": {"maintenanceExclusions": {name(run): {
                "startTime": at.isoformat(), "endTime": (at + HOLD).isoformat(),
                "maintenanceExclusionOptions": {"scope": API_SCOPE}}}}}}


def release(ctx: StepContext, env: Environment, run: str) -> str | None:
    """The run's job ended: its exclusion goes (in the step that saw the
    end: `train`, `logs --follow`). A line saying so, or why it could not;
    None when there was none. A dry run assumes the hold was made."""
    if env.platform.simulated or not env.hold_maintenance:
        return None
    exclusion = name(run)
    cluster = ctx.look(assume(clusters_fact(env), held(env, run)), fresh=True)
    if cluster is ABSENT or exclusion not in exclusions(cluster):
        return None
    remove = remove_command(env, exclusion)
    try:
        ctx.act(remove)
    except PlaybookError as e:
        return (f"maintenance exclusion {exclusion} is still there ({str(e).splitlines()[0]}): `invoke teardown` "
                f"removes it, or `{remove.line()}`")
    return f"maintenance exclusion {exclusion} removed: GKE may upgrade the nodes again"
