"""§7 The RayCluster: DRANET NIC claims and one TPU worker group of
``slices`` replicas x ``hosts_per_slice`` hosts; applied, then waited for."""
from __future__ import annotations

import json
import re
from typing import Any

from .. import k8s
from .. import tutorial as T
from ..core.command import Command
from ..core.errors import PlaybookError
from ..core.facts import ABSENT
from ..core.render import envsubst, leftover
from ..core.step import Step, Verify, change, drift, ok, wait
from ..gke import kube, kube_get, raycluster_fact, workers
from ..project import ROOT
from ..schema import Environment
from ..versions import installed
from . import autopilot, capacity
from .cluster import credentials_step

PLAY = "raycluster"
READY_TIMEOUT = 30 * 60
# The NICs each TPU host's pod claims from DRANET (DeviceClass netdev.google.com):
# Standard, the tutorial's two, on the two DCN networks of the node pools;
# Autopilot, all that the accelerator network profile gives the node (the
# claim GKE's sample pairs with it: kubernetes-engine-samples
# ai-ml/gke-ray/rayserve/llm/tpu/networking/all-netdev-template.yaml).
CLAIMS = {
    "standard": (T.NETDEV_CLAIMS["standard"],
                 {"deviceClassName": "netdev.google.com", "allocationMode": "ExactCount", "count": 2}),
    "autopilot": (T.NETDEV_CLAIMS["autopilot"], {"deviceClassName": "netdev.google.com", "allocationMode": "All"}),
}


def claim_name(env: Environment) -> str:
    return CLAIMS[env.mode][0]


def worker_node_selector(env: Environment) -> dict[str, str]:
    """The tutorial's three labels, then the capacity's (Standard) or the
    ComputeClass (Autopilot, whose priorities carry the capacity)."""
    sel = {"iam.gke.io/gke-metadata-server-enabled": "true",
           "cloud.google.com/gke-tpu-accelerator": T.TPU_ACCELERATOR_LABEL,
           "cloud.google.com/gke-tpu-topology": env.topology}
    if env.mode == "autopilot":
        sel[autopilot.SELECTOR] = autopilot.COMPUTE_CLASS
    else:
        sel.update(capacity.node_selector(env))
    return sel


def manifest_values(env: Environment) -> dict[str, str]:
    name, request = CLAIMS[env.mode]
    return {
        "NAMESPACE": env.namespace,
        "KSA_NAME": env.ksa_name,
        "GS_BUCKET": env.gs_bucket,
        "RAY_IMAGE": env.ray_image,
        "SLICES": str(env.slices),
        "HOSTS_PER_SLICE": str(env.hosts_per_slice),
        "CHIPS_PER_HOST": str(env.chips_per_host),
        "WORKER_NODE_SELECTOR": json.dumps(worker_node_selector(env)),
        "NETDEV_CLAIM": name,
        "NETDEV_REQUEST": json.dumps(request),
        # The tutorial's workers are privileged; Autopilot denies that.
        "WORKER_SECURITY_CONTEXT": json.dumps({} if env.mode == "autopilot" else {"privileged": True}),
    }


def apply_command(env: Environment) -> Command:
    """``envsubst < manifest | kubectl apply -f -``, as the tutorial writes it,
    with envsubst limited to the manifest's variables and its output checked."""
    render = envsubst(T.RAYCLUSTER_MANIFEST, manifest_values(env), root=ROOT)
    apply = kube(env, "apply", "-f", "-")
    return Command(apply.argv, pipe_from=render, pipe_check=leftover)


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


def _worker_group(rc: Any) -> dict:
    for g in ((rc or {}).get("spec") or {}).get("workerGroupSpecs") or []:
        if g.get("groupName") == T.TPU_WORKER_GROUP:
            return g
    return {}


def shape_diffs(env: Environment, rc: Any) -> list[str]:
    g = _worker_group(rc)
    if not g:
        return [f"no worker group {T.TPU_WORKER_GROUP!r}"]
    diffs = []
    if g.get("replicas") != env.slices:
        diffs.append(f"{g.get('replicas')} slice replicas, want {env.slices}")
    if g.get("numOfHosts") != env.hosts_per_slice:
        diffs.append(f"numOfHosts {g.get('numOfHosts')}, want {env.hosts_per_slice}")
    spec = (g.get("template") or {}).get("spec") or {}
    sel = spec.get("nodeSelector") or {}
    if sel.get("cloud.google.com/gke-tpu-topology") != env.topology:
        diffs.append(f"topology {sel.get('cloud.google.com/gke-tpu-topology')}, want {env.topology}")
    want = worker_node_selector(env)
    if sel != want and sel.get("cloud.google.com/gke-tpu-topology") == env.topology:
        diffs.append(f"worker nodeSelector {json.dumps(sel, sort_keys=True)}, want {json.dumps(want, sort_keys=True)}")
    for c in spec.get("containers") or []:
        if c.get("image") != env.ray_image:
            diffs.append(f"image {c.get('image')}, want {env.ray_image}")
        envs = {e.get("name"): e.get("value") for e in c.get("env") or []}
        if envs.get("MEGASCALE_NUM_SLICES") != str(env.slices):
            diffs.append(f"MEGASCALE_NUM_SLICES {envs.get('MEGASCALE_NUM_SLICES')}, want {env.slices}")
    return diffs


ready = k8s.ready


def apply_step(env: Environment) -> Step:
    probe = raycluster_fact(env)
    claims = kube_get(env, "resourceclaimtemplate", claim_name(env), env.namespace)

    def decide(look):
        rc, claim = look(probe), look(claims)
        if rc is ABSENT or claim is ABSENT:
            return change(apply_command(env), reason=f"applied ({env.slices} x {env.hosts_per_slice} TPU workers)")
        diffs = shape_diffs(env, rc)
        if diffs:
            return drift(f"RayCluster {T.RAYCLUSTER_NAME}: " + "; ".join(diffs))
        why = ready(env, rc)
        if why:
            return wait(f"RayCluster {T.RAYCLUSTER_NAME} exists, not ready yet ({why})")
        return ok(f"RayCluster {T.RAYCLUSTER_NAME} ready with {workers(env)} TPU workers")

    # flex-start nodes come when capacity does: the workers wait for them up
    # to capacity_wait (the pools themselves start empty).
    timeout = max(READY_TIMEOUT, capacity.wait_seconds(env) or 0)

    def check(rc):
        why = ready(env, rc)
        if why and env.capacity == "flex-start":
            return f"{why} (waiting for flex-start capacity: the nodes come when GKE finds the chips)"
        return why

    after: tuple[str, ...] = ("kube:credentials", "storage:ksa", "storage:binding", "storage:bucket")
    if env.mode == "autopilot":
        after += ("raycluster:autopilot-rules", "raycluster:compute-class")
    def explain(look, reason: str) -> str | None:
        """The wait ended without readiness: why, one line per cause."""
        try:
            found = look(k8s.causes_fact(env))
        except PlaybookError as e:
            return f"and why could not be read: {str(e).splitlines()[0]}"
        return ("why: " + "; ".join(found)) if found else None

    # Readiness is watched (the kubernetes client), not polled with kubectl.
    return Step(PLAY, f"RayCluster {T.RAYCLUSTER_NAME}", decide, id="raycluster:apply", after=after,
                verify=Verify(k8s.raycluster_watch_fact(env), check, timeout=timeout, interval=1),
                probes=(claims, probe), explain=explain)


def image_step(env: Environment) -> Step:
    """Not a change: says whether the image's Ray matches this machine's."""
    def decide(look):
        warning = skew_warning(env.ray_image)
        return ok(warning or f"image {env.ray_image} matches this machine's Ray")
    return Step(PLAY, "Ray version skew", decide, id="raycluster:skew")


def steps(env: Environment) -> list[Step]:
    from .nodepools import chips_step
    if env.mode == "autopilot":
        # The RayCluster's TPU requests are what makes the chips; its rules
        # are checked and its ComputeClass applied first.
        return [*autopilot.steps(env), image_step(env), *chips_step(env, PLAY), apply_step(env)]
    return [credentials_step(env, PLAY), image_step(env), apply_step(env)]
