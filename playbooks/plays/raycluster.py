"""§7 The RayCluster: DRANET NIC claims and one TPU worker group of
``slices`` replicas x ``hosts_per_slice`` hosts; applied, then waited for.
On Autopilot, first the rendered manifests are checked against Autopilot's
rules and the ComputeClass that opts the TPU nodes into managed DRANET is
applied (``playbooks/cloud/manifests.py`` renders both). With ``stall_watch:
cluster`` the Ray head's own service account and the rights the watch acts
with there (its ClusterRole and Role) are applied before the RayCluster;
the TPU workers' account (``ksa_name``) gets none of them."""
from __future__ import annotations

import json
import re
from typing import Any

from playbooks.cloud import capacity_options, kube_objects, manifests
from playbooks.cloud.gke import kube, kube_get, raycluster_fact
from playbooks.cloud.slices import pods_fact
from playbooks.config import tutorial as T
from playbooks.config.schema import Environment, capacity_text
from playbooks.config.versions import installed
from playbooks.core.errors import PlaybookError
from playbooks.core.facts import ABSENT
from playbooks.core.step import Step, Verify, change, drift, fail, ok, wait

PLAY = "raycluster"
READY_TIMEOUT = 30 * 60


def image_version(image: str) -> str | None:
    m = re.search(r":(\d+\.\d+\.\d+)", image)
    return m.group(1) if m else None


def skew_warning(image: str) -> str | None:
    """The Ray in the image should be the Ray this machine submits jobs with."""
    local = installed("ray")
    if local == "not installed":
        return None
    have = image_version(image)
    if have is None:
        return f"warning: cannot tell the Ray version of image {image}; this machine runs Ray {local}"
    if have != local:
        return f"warning: image {image} runs Ray {have}, this machine Ray {local}: jobs may fail to submit or run"
    return None


def shape_diffs(env: Environment, rc: Any) -> list[str]:
    g = manifests.worker_group(rc)
    if not g:
        return [f"no worker group {T.TPU_WORKER_GROUP!r}"]
    diffs = []
    if g.get("replicas") != env.slices:
        diffs.append(f"{g.get('replicas')} slice replicas, want {env.slices}")
    if g.get("numOfHosts") != env.hosts_per_slice:
        diffs.append(f"numOfHosts {g.get('numOfHosts')}, want {env.hosts_per_slice}")
    spec = manifests.group_pod_spec(g)
    sel = spec.get("nodeSelector") or {}
    if sel.get("cloud.google.com/gke-tpu-topology") != env.topology:
        diffs.append(f"topology {sel.get('cloud.google.com/gke-tpu-topology')}, want {env.topology}")
    want = manifests.worker_node_selector(env)
    if sel != want and sel.get("cloud.google.com/gke-tpu-topology") == env.topology:
        diffs.append(f"worker nodeSelector {json.dumps(sel, sort_keys=True)}, want {json.dumps(want, sort_keys=True)}")
    affinity, want_affinity = spec.get("affinity") or {}, manifests.worker_affinity(env)
    if affinity != want_affinity:
        diffs.append(f"worker affinity {json.dumps(affinity, sort_keys=True)}, want "
                     f"{json.dumps(want_affinity, sort_keys=True)}")
    for c in spec.get("containers") or []:
        if c.get("image") != env.ray_image:
            diffs.append(f"image {c.get('image')}, want {env.ray_image}")
        envs = {e.get("name"): e.get("value") for e in c.get("env") or []}
        if envs.get("MEGASCALE_NUM_SLICES") != str(env.slices):
            diffs.append(f"MEGASCALE_NUM_SLICES {envs.get('MEGASCALE_NUM_SLICES')}, want {env.slices}")
    return diffs + manifests.added_settings_diffs(env, rc)


def apply_step(env: Environment) -> Step:
    """The RayCluster and its NIC claims, applied as rendered (its slices'
    readiness is the next step's)."""
    probe = raycluster_fact(env)
    claims = kube_get(env, "resourceclaimtemplate", manifests.claim_name(env), env.namespace)

    def decide(look):
        rc, claim = look(probe), look(claims)
        if rc is ABSENT or claim is ABSENT:
            return change(manifests.raycluster_apply(env),
                          reason=f"applied ({env.slices} x {env.hosts_per_slice} TPU workers)")
        diffs = shape_diffs(env, rc)
        if diffs:
            again = kube(env, "delete", "raycluster", T.RAYCLUSTER_NAME, "--namespace", env.namespace).line()
            return drift(f"RayCluster {T.RAYCLUSTER_NAME}: " + "; ".join(diffs),
                         notes=[f"to make it as rendered (a running job ends): {again}, then `invoke raycluster`"])
        return ok(f"RayCluster {T.RAYCLUSTER_NAME} is the one rendered ({env.slices} x {env.hosts_per_slice} TPU "
                  f"workers)")

    after: tuple[str, ...] = ("kube:credentials", "storage:ksa", "storage:binding", "storage:bucket")
    if manifests.watch_rbac_wanted(env):
        after += ("raycluster:watch-rbac", "storage:head-binding")
    if env.cluster_mode.restricted_pods:
        after += ("raycluster:autopilot-rules",)
    if env.cluster_mode.compute_class:
        after += ("raycluster:compute-class",)
    return Step(PLAY, f"RayCluster {T.RAYCLUSTER_NAME}", decide, id="raycluster:apply", after=after,
                verify=Verify(probe, lambda rc: "RayCluster not found" if rc is ABSENT else None, timeout=60,
                              interval=5), probes=(claims, probe))


def slices_step(env: Environment) -> Step:
    """Done when min_slices slices are whole: every worker pod of their
    replica ready (and the head). The others are named as waiting (a
    flex-start pool with no nodes yet, a pool being replaced), here, in the
    recap, in `status` and in the heartbeats."""
    probe = pods_fact(env)
    need = env.min_slices
    # flex-start nodes come when capacity does: the workers wait for them up
    # to capacity_wait (the pools themselves start empty).
    timeout = max(READY_TIMEOUT, capacity_options.wait_seconds(env) or 0)
    flex = " (waiting for flex-start capacity: the nodes come when GKE finds the chips)" \
        if any(o.waits_for_capacity for o in env.options) else ""

    def decide(look):
        s = look(probe)
        if s.enough(need):
            return ok(f"RayCluster {T.RAYCLUSTER_NAME}: {s.text(need)}", notes=[s.waiting_text()])
        return wait(f"RayCluster {T.RAYCLUSTER_NAME}: {s.text(need)}")

    def check(s):
        why = s.why(need)
        return f"{why}{flex}" if why else None

    def explain(look, reason: str) -> str | None:
        """The wait ended without readiness: why, one line per cause."""
        try:
            found = look(kube_objects.causes_fact(env))
        except PlaybookError as e:
            return f"and why could not be read: {str(e).splitlines()[0]}"
        return ("why: " + "; ".join(found)) if found else None

    return Step(PLAY, f"TPU slices of {T.RAYCLUSTER_NAME}", decide, id="raycluster:slices",
                after=("raycluster:apply",), verify=Verify(probe, check, timeout=timeout, interval=5),
                explain=explain)


def image_step(env: Environment) -> Step:
    """Not a change: says whether the image's Ray matches this machine's."""
    def decide(look):
        warning = skew_warning(env.ray_image)
        return ok(warning or f"image {env.ray_image} matches this machine's Ray")
    return Step(PLAY, "Ray version skew", decide, id="raycluster:skew")


# -- the watch in the cluster ------------------------------------------------------------
def watch_rbac_step(env: Environment) -> Step:
    """The head's own service account and the rights of the watch on it
    (``stall_watch: cluster``), before the head starts: it may read, cordon
    and taint nodes (a ClusterRole) and read and delete the pods of the
    namespace, read their logs, the events and the RayCluster (a Role);
    ``manifests/ray-watch-rbac.yaml`` says why each. The workers' account
    is not bound. Objects of that name with other rules are drift, never
    overwritten."""
    probe = manifests.watch_rbac_fact(env)
    name = manifests.watch_rbac_name(env)
    who = f"service account {env.namespace}/{manifests.head_ksa_name(env)}"

    def decide(look):
        missing, differ = manifests.watch_rbac_diffs(env, look(probe))
        if differ:
            return drift("; ".join(differ))
        if missing:
            return change(manifests.watch_rbac_apply(env),
                          reason=f"applied ({', '.join(missing)} {name}, for {who})")
        return ok(f"ServiceAccount, ClusterRole, Role and their bindings {name} are the ones rendered (for {who})")

    def check(found) -> str | None:
        missing, differ = manifests.watch_rbac_diffs(env, found)
        return "; ".join([f"{k} {name} not found" for k in missing] + differ) or None

    return Step(PLAY, f"RBAC of the watch {name}", decide, id="raycluster:watch-rbac",
                after=("kube:credentials", "storage:namespace"),
                verify=Verify(probe, check, timeout=60, interval=5))


# -- Autopilot ---------------------------------------------------------------------------
def rules_step(env: Environment) -> Step:
    def decide(look):
        found = manifests.autopilot_violations(manifests.all_docs(env))
        if found:
            return fail(f"{len(found)} field(s) Autopilot would refuse: " + "; ".join(found))
        return ok("the rendered manifests keep Autopilot's rules (no privileged container, no capability it "
                  "denies, no host namespace, no hostPath)")

    return Step(PLAY, "Autopilot's rules", decide, id="raycluster:autopilot-rules")


def compute_class_step(env: Environment) -> Step:
    probe = kube_get(env, "computeclass", manifests.COMPUTE_CLASS)
    want = manifests.compute_class_doc(env)["spec"]

    def decide(look):
        cc = look(probe)
        if cc is ABSENT:
            return change(manifests.compute_class_apply(env),
                          reason=f"applied (DRA networking, {env.machine_type}, {capacity_text(env)})")
        have = cc.get("spec") or {}
        diffs = [f"{k}: {json.dumps(have.get(k), sort_keys=True)}, want {json.dumps(v, sort_keys=True)}"
                 for k, v in want.items() if have.get(k) != v]
        if diffs:
            return drift(f"ComputeClass {manifests.COMPUTE_CLASS}: " + "; ".join(diffs))
        return ok(f"ComputeClass {manifests.COMPUTE_CLASS} is the one rendered (DRA networking, {capacity_text(env)})")

    return Step(PLAY, f"ComputeClass {manifests.COMPUTE_CLASS}", decide, id="raycluster:compute-class",
                after=("kube:credentials",),
                verify=Verify(probe, lambda cc: "ComputeClass not found" if cc is ABSENT else
                              None if (cc.get("spec") or {}) == want else "not the one rendered", timeout=60,
                              interval=5))


def steps(env: Environment) -> list[Step]:
    """On Autopilot the RayCluster's TPU requests are what makes the chips:
    its rules are checked and its ComputeClass applied first. The watch's
    rights only where it runs in the cluster (not a step at all otherwise,
    as the Autopilot steps on Standard)."""
    mode = env.cluster_mode
    first = [rules_step(env)] if mode.restricted_pods else []
    first += [compute_class_step(env)] if mode.compute_class else []
    rbac = [watch_rbac_step(env)] if manifests.watch_rbac_wanted(env) else []
    return [*first, image_step(env), *rbac, apply_step(env), slices_step(env)]
