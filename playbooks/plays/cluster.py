"""§3 The GKE cluster, Standard or Autopilot, and kubectl credentials."""
from __future__ import annotations

from typing import Any

from playbooks.cloud.gke import clusters_fact, container_change, kube_context, location
from playbooks.cloud.kube_context import credentials_command, has_context, kubeconfig_fact, stale_context
from playbooks.config import tutorial as T
from playbooks.config.schema import Environment
from playbooks.core.facts import ABSENT
from playbooks.core.step import Step, Verify, change, drift, fail, ok, wait

PLAY = "cluster"
CREATE_TIMEOUT = 45 * 60


def create_command(env: Environment):
    if not env.cluster_mode.our_node_pools:
        # The tutorial also passes --machine-type=n1-standard-16 here, but
        # gcloud 528 rejects it for create-auto (exit 2, "unrecognized
        # arguments"): Autopilot picks its own machines, so it is left out.
        return container_change(env, "clusters", "create-auto", env.cluster_name, "--enable-ray-operator",
                                f"--location={env.region}", f"--cluster-version={env.cluster_version}")
    return container_change(env, "clusters", "create", env.cluster_name, f"--addons={T.STANDARD_ADDONS}",
                            f"--machine-type={T.CLUSTER_MACHINE_TYPE}", "--enable-dataplane-v2",
                            f"--workload-pool={env.project_id}.svc.id.goog", f"--location={env.zone}",
                            f"--cluster-version={env.cluster_version}")


def shape_diffs(env: Environment, c: Any) -> list[str]:
    diffs = []
    where = c.get("location") or c.get("zone")
    if where != location(env):
        diffs.append(f"it is in {where}, want {location(env)}")
    auto = bool((c.get("autopilot") or {}).get("enabled"))
    if auto == env.cluster_mode.our_node_pools:  # an Autopilot cluster makes its own nodes
        diffs.append(f"it is {'Autopilot' if auto else 'Standard'}, want {env.cluster_mode.title}")
    addons = c.get("addonsConfig") or {}
    if not (addons.get("rayOperatorConfig") or {}).get("enabled"):
        diffs.append("the Ray operator add-on is not enabled")
    if env.cluster_mode.our_workload_pool:
        pool = (c.get("workloadIdentityConfig") or {}).get("workloadPool")
        if pool != f"{env.project_id}.svc.id.goog":
            diffs.append(f"workload pool is {pool!r}, want '{env.project_id}.svc.id.goog'")
    return diffs


def cluster_step(env: Environment) -> Step:
    probe = clusters_fact(env)

    def decide(look):
        c = look(probe)
        if c is ABSENT:
            return change(create_command(env), reason=f"created ({env.mode})")
        diffs = shape_diffs(env, c)
        if diffs:
            return drift(f"cluster {env.cluster_name}: " + "; ".join(diffs))
        status = c.get("status")
        if status in ("RUNNING", "RECONCILING"):
            version = c.get("currentMasterVersion")
            return ok(f"cluster {env.cluster_name} is {status}" + (f" (GKE {version})" if version else ""))
        if status == "PROVISIONING":
            return wait(f"cluster {env.cluster_name} is being created by another operation")
        if status == "STOPPING":
            return fail(f"cluster {env.cluster_name} is being deleted; wait for it to go, then re-run")
        return fail(f"cluster {env.cluster_name} is {status}: {c.get('statusMessage', 'no message')}; "
                    f"delete it (`invoke teardown`) and re-run")

    def running(c):
        if c is ABSENT:
            return "cluster not found"
        return None if c.get("status") in ("RUNNING", "RECONCILING") else f"status {c.get('status')}"

    return Step(PLAY, f"GKE cluster {env.cluster_name}", decide, id="cluster:cluster", after=("prereqs:apis",),
                verify=Verify(probe, running, timeout=CREATE_TIMEOUT, interval=15))


def credentials_step(env: Environment, play: str = PLAY) -> Step:
    """get-credentials writes (and selects) the cluster's kubeconfig context.
    Every kubectl command names that context, so another current context can
    never send them to the wrong cluster. A context there already must point
    at the cluster GKE has now (``stale_context``: its server and CA): a
    cluster deleted elsewhere and made again under the same name has a new
    endpoint and CA, and get-credentials writes the context again. The
    cluster is the cluster step's fact (one `clusters list`); a dry run
    assumes no kubeconfig and does not look at it."""
    probe, clusters = kubeconfig_fact(env), clusters_fact(env)
    name = kube_context(env)
    want: list[Any] = [None]  # the cluster the context must match, read by the verify

    def decide(look):
        cfg = look(probe)
        if cfg is ABSENT:
            return change(credentials_command(env), reason=f"wrote context {name}", found=f"no context {name}")
        c = look(clusters)
        want[0] = None if c is ABSENT else c
        if not has_context(cfg, name):
            return change(credentials_command(env), reason=f"wrote context {name}", found=f"no context {name}")
        stale = None if c is ABSENT else stale_context(env, cfg, c)
        if stale:
            return change(credentials_command(env), found=stale, notes=[stale],
                          reason=f"wrote context {name} again, at the cluster's endpoint and CA")
        return ok(f"context {name} exists" + ("" if c is ABSENT else " and points at the cluster"))

    def check(cfg):
        if not has_context(cfg, name):
            return f"no context {name}"
        return None if want[0] is None else stale_context(env, cfg, want[0])

    return Step(play, "kubectl credentials", decide, id="kube:credentials", after=("cluster:cluster",),
                verify=Verify(probe, check))


def steps(env: Environment) -> list[Step]:
    return [cluster_step(env), credentials_step(env)]
