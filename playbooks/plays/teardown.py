"""§10 Cleanup: the RayCluster, the port-forward, the cluster, then the
subnets and networks the tutorial leaves behind, in dependency order. The
bucket, with the checkpoints of every run (what the user made), is kept
unless the user names it (`teardown --delete-bucket`): a kept bucket is
said in one line, with its size and what bills it. Each step deletes only
what it finds; a second run is a no-op. The user's IAM roles and the
enabled APIs are left as they are. (To stop the TPUs' bill and keep the
cluster too: `invoke stop-tpus`, ``plays/stop_tpus.py``.)"""
from __future__ import annotations

from typing import Any

from playbooks.access.cli_clients import gcloud
from playbooks.cloud import maintenance, manifests, still_billed
from playbooks.cloud.endpoints import forward_pidfile
from playbooks.cloud.gke import (
    bucket_fact,
    clusters_fact,
    container_change,
    kube,
    kube_context,
    location,
    needs_workload_policy,
    network_name,
    networks_fact,
    raycluster_fact,
    running_cluster,
    subnet_name,
    subnets_fact,
    workload_policy_fact,
    workload_policy_name,
)
from playbooks.cloud.kube_context import has_context, kubeconfig_fact
from playbooks.config import tutorial as T
from playbooks.config.schema import Environment
from playbooks.config.tpu import dcn_networks
from playbooks.core.command import Command, quote
from playbooks.core.errors import ProbeFailed
from playbooks.core.facts import ABSENT, Action, Fact, assume
from playbooks.core.pidfile import running_fact
from playbooks.core.step import Step, Verify, change, gone, ok

PLAY = "teardown"
DELETE_TIMEOUT = 30 * 60


# A dry run of teardown assumes everything exists, to show every delete.
def _cluster(env: Environment) -> Fact:
    return assume(clusters_fact(env), running_cluster(env))


def raycluster_step(env: Environment) -> Step:
    clusters = _cluster(env)
    kubeconfig = assume(kubeconfig_fact(env), {"contexts": [{"name": kube_context(env)}]})
    probe = assume(raycluster_fact(env), {"metadata": {"name": T.RAYCLUSTER_NAME}})

    def decide(look):
        if look(clusters) is ABSENT:
            return ok(f"cluster {env.cluster_name} is gone, and its RayCluster with it")
        if not has_context(look(kubeconfig), kube_context(env)):
            # Without credentials kubectl cannot look; the cluster delete that
            # follows removes the RayCluster anyway.
            return ok(f"no kubeconfig context {kube_context(env)}: the cluster delete removes the RayCluster")
        if look(probe) is ABSENT:
            return ok(f"RayCluster {T.RAYCLUSTER_NAME} is not there")
        return change(kube(env, "delete", "raycluster", T.RAYCLUSTER_NAME, "--namespace", env.namespace),
                      reason="deleted", found="present")

    return Step(PLAY, f"RayCluster {T.RAYCLUSTER_NAME}", decide, id="teardown:raycluster",
                verify=Verify(probe, gone("RayCluster"), timeout=300, interval=5))


def watch_rbac_step(env: Environment) -> Step:
    """The watch's rights (``stall_watch: cluster``), once the RayCluster
    (its head, the watch) is gone: the ClusterRole and ClusterRoleBinding
    (the cluster's, in no namespace), the Role and RoleBinding, and the
    head's service account they bind. The cluster's delete that follows
    would remove them too; deleting them first leaves no rights behind if
    that delete fails. The head account's binding on the bucket goes with
    the bucket where ``--delete-bucket`` deletes it (``bucket_step``), else
    stays with it, for the next `up`'s account of the same name. With ``stall_watch: follow`` none were
    made: no step (any an earlier ``cluster`` made go with the cluster)."""
    clusters = _cluster(env)
    kubeconfig = assume(kubeconfig_fact(env), {"contexts": [{"name": kube_context(env)}]})
    probe = assume(manifests.watch_rbac_fact(env), {d["kind"]: d for d in manifests.watch_rbac_docs(env)})
    name = manifests.watch_rbac_name(env)

    def decide(look):
        if look(clusters) is ABSENT:
            return ok(f"cluster {env.cluster_name} is gone, and the watch's RBAC {name} with it")
        if not has_context(look(kubeconfig), kube_context(env)):
            return ok(f"no kubeconfig context {kube_context(env)}: the cluster delete removes the watch's RBAC {name}")
        found = look(probe)
        if found is ABSENT:
            return ok(f"no ServiceAccount, ClusterRole, Role or binding {name}")
        return change(manifests.watch_rbac_delete(env), reason="deleted", found=", ".join(found))

    return Step(PLAY, f"RBAC of the watch {name}", decide, id="teardown:watch-rbac", after=("teardown:raycluster",),
                verify=Verify(probe, gone(f"RBAC {name}"), timeout=120, interval=5))


def forward_step(env: Environment) -> Step:
    pf = forward_pidfile(env)
    running = assume(running_fact(pf, str(pf.path)), True)

    def decide(look):
        if not look(running):
            return ok("no port-forward running")
        return change(Action(f"kill -TERM $(cat {quote(str(pf.path))})", pf.stop), reason="stopped",
                      found="running")

    return Step(PLAY, "port-forward", decide, id="teardown:forward")


def maintenance_step(env: Environment) -> Step:
    """The runs' maintenance exclusions (``playbooks/cloud/maintenance.py``), once
    their jobs went with the RayCluster: ours only, others' left as they are.
    A dry run assumes the tutorial's run left one."""
    run = dict(next(iter(T.TRAIN_ARGS.values())))["run_name"]
    probe = assume(clusters_fact(env), maintenance.held(env, run))

    def decide(look):
        c = look(probe)
        if c is ABSENT:
            return ok(f"cluster {env.cluster_name} is gone, and its maintenance exclusions with it")
        names = maintenance.ours(c)
        if not names:
            return ok("no maintenance exclusion of ours")
        return change(*[maintenance.remove_command(env, n) for n in names], reason=f"removed {', '.join(names)}",
                      found=", ".join(names))

    return Step(PLAY, "maintenance exclusions of our runs", decide, id="teardown:maintenance",
                after=("teardown:raycluster",),
                verify=Verify(probe, lambda c: None if c is ABSENT or not maintenance.ours(c)
                              else f"{', '.join(maintenance.ours(c))} still there", timeout=300, interval=5))


def cluster_step(env: Environment) -> Step:
    probe = _cluster(env)

    def decide(look):
        c = look(probe)
        if c is ABSENT:
            return ok(f"cluster {env.cluster_name} is not there")
        if c.get("status") == "STOPPING":
            from playbooks.core.step import wait
            return wait(f"cluster {env.cluster_name} is already being deleted")
        # The tutorial writes --zone=$ZONE (its Standard cluster); an
        # Autopilot cluster is regional, so it is named by --location.
        where = f"--location={env.region}" if env.cluster_mode.regional else f"--zone={env.zone}"
        return change(container_change(env, "clusters", "delete", env.cluster_name, where, quiet=True),
                      reason="deleted", found="present")

    return Step(PLAY, f"GKE cluster {env.cluster_name}", decide, id="teardown:cluster",
                after=("teardown:raycluster", "teardown:maintenance", "teardown:watch-rbac"),
                verify=Verify(probe, gone("cluster"), timeout=DELETE_TIMEOUT, interval=15))


def bucket_step(env: Environment) -> Step:
    probe = assume(bucket_fact(env), {"name": env.gs_bucket})

    def decide(look):
        if look(probe) is ABSENT:
            return ok(f"bucket gs://{env.gs_bucket} is not there")
        return change(Command(("gsutil", "rm", "-r", f"gs://{env.gs_bucket}")), reason="deleted with its objects",
                      found="present")

    return Step(PLAY, f"bucket gs://{env.gs_bucket}", decide, id="teardown:bucket",
                verify=Verify(probe, gone("bucket"), timeout=120, interval=5))


def kept_bucket_step(env: Environment) -> Step:
    """Without ``--delete-bucket``: the bucket and every run's checkpoints
    in it kept, said in one line with its size and what bills it."""
    probe = assume(bucket_fact(env), {"name": env.gs_bucket})
    held = still_billed.bytes_fact(env)

    def decide(look):
        b = look(probe)
        if b is ABSENT:
            return ok(f"bucket gs://{env.gs_bucket} is not there")
        try:
            n, why = look(held), ""
        except ProbeFailed as e:
            n, why = None, e.why
        if n is ABSENT:  # gone between the two looks
            return ok(f"bucket gs://{env.gs_bucket} is not there")
        return ok(f"kept {still_billed.bucket_line(env, b, n, why)}; {still_billed.DELETE_BUCKET}")

    return Step(PLAY, f"bucket gs://{env.gs_bucket}", decide, id="teardown:bucket", probes=(probe, held))


def _last(v: Any) -> str:
    return str(v or "").rsplit("/", 1)[-1]


def subnet_step(env: Environment, i: int) -> Step:
    name, net = subnet_name(env, i), network_name(env, i)
    probe = assume(subnets_fact(env, name), {"name": name, "network": f"networks/{net}"})

    def decide(look):
        s = look(probe)
        if s is ABSENT:
            return ok(f"subnet {name} is not there")
        if _last(s.get("network")) != net:
            return ok(f"subnet {name} belongs to network {_last(s.get('network'))}, not {net}: left alone")
        return change(gcloud("compute", "networks", "subnets", "delete", name, f"--region={env.region}",
                             project=env.project_id, quiet=True), reason="deleted", found="present")

    return Step(PLAY, f"subnet {name}", decide, id=f"teardown:subnet-{i + 1}", after=("teardown:cluster",),
                verify=Verify(probe, gone("subnet"), timeout=300, interval=5))


def network_step(env: Environment, i: int) -> Step:
    name = network_name(env, i)
    probe = assume(networks_fact(env, name), {"name": name})

    def decide(look):
        if look(probe) is ABSENT:
            return ok(f"network {name} is not there")
        return change(gcloud("compute", "networks", "delete", name, project=env.project_id, quiet=True),
                      reason="deleted", found="present")

    return Step(PLAY, f"VPC {name}", decide, id=f"teardown:net-{i + 1}",
                after=(f"teardown:subnet-{i + 1}", "teardown:cluster"),
                verify=Verify(probe, gone("network"), timeout=300, interval=5))


def policy_step(env: Environment) -> Step:
    """TPU7x's workload policy, once the cluster (its pools) is gone."""
    name = workload_policy_name(env)
    probe = assume(workload_policy_fact(env), {"name": name})

    def decide(look):
        if look(probe) is ABSENT:
            return ok(f"workload policy {name} is not there")
        return change(gcloud("compute", "resource-policies", "delete", name, f"--region={env.region}",
                             project=env.project_id, quiet=True), reason="deleted", found="present")

    return Step(PLAY, f"workload policy {name}", decide, id="teardown:workload-policy", after=("teardown:cluster",),
                verify=Verify(probe, gone("workload policy"), timeout=300, interval=5))


def steps(env: Environment, delete_bucket: bool = False) -> list[Step]:
    """(The local twin's teardown is ``plays/local_cluster.py``'s stop steps.)
    The bucket is deleted only with ``delete_bucket`` (`--delete-bucket`)."""
    out = [raycluster_step(env)]
    if manifests.watch_rbac_wanted(env):
        out.append(watch_rbac_step(env))
    bucket = bucket_step(env) if delete_bucket else kept_bucket_step(env)
    out += [forward_step(env), maintenance_step(env), cluster_step(env), bucket]
    if needs_workload_policy(env):
        out.append(policy_step(env))
    if not dcn_networks(env):
        # Autopilot: GKE made the nodes' networks and removes them with the
        # cluster; a machine type without the two NICs: none were made.
        return out
    return out + [subnet_step(env, 0), subnet_step(env, 1), network_step(env, 0), network_step(env, 1)]


def summary(env: Environment, delete_bucket: bool = False) -> str:
    """What teardown deletes, for the confirmation prompt (and what it keeps)."""
    if env.platform.simulated:
        return f"the local Ray cluster of environment {env.name!r} (only the processes this project started)"
    rbac = (f", the watch's service account, ClusterRole, Role and bindings {manifests.watch_rbac_name(env)}"
            if manifests.watch_rbac_wanted(env) else "")
    what = (f"in project {env.project_id}: RayCluster {T.RAYCLUSTER_NAME}{rbac}, GKE cluster {env.cluster_name} "
            f"({location(env)})")
    if delete_bucket:
        what += f", bucket gs://{env.gs_bucket} and everything in it (every run's checkpoints)"
    if needs_workload_policy(env):
        what += f", workload policy {workload_policy_name(env)}"
    if dcn_networks(env):
        what += (f", subnets {subnet_name(env, 0)}/{subnet_name(env, 1)} and networks "
                 f"{network_name(env, 0)}/{network_name(env, 1)}")
    return what if delete_bucket else f"{what} (bucket gs://{env.gs_bucket} and its checkpoints kept)"
