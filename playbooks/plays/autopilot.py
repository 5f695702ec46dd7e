"""GKE Autopilot: the ComputeClass that opts the TPU nodes into managed
DRANET, and the rules of Autopilot a manifest must keep before it is applied.

On Autopilot the tutorial's RayCluster would be refused: its TPU workers are
privileged, and Autopilot's policy denies that ("GKE Warden rejected the
request ... [denied by autogke-disallow-privilege] container ... is
privileged; not allowed in Autopilot";
https://cloud.google.com/kubernetes-engine/docs/concepts/autopilot-security).
And DRANET on Autopilot needs a custom ComputeClass with DRA networking and
the accelerator network profile `auto`, with which GKE makes and manages the
extra networks itself: the tutorial's two VPCs are never attached to an
Autopilot node (GKE's DRANET guide,
https://docs.cloud.google.com/kubernetes-engine/docs/how-to/allocate-network-resources-dra).
"""
from __future__ import annotations

import json
from typing import Any, Iterable

import yaml

from .. import tutorial as T
from ..core.command import Command
from ..core.facts import ABSENT
from ..core.render import envsubst, leftover, render
from ..core.step import Step, Verify, change, drift, fail, ok
from ..gke import kube, kube_get
from ..project import ROOT
from ..schema import Environment, reservation_parts
from .cluster import credentials_step

PLAY = "raycluster"
COMPUTE_CLASS = "maxtext-tpu-dranet"
COMPUTE_CLASS_MANIFEST = "manifests/compute-class.tpu-dranet.yaml"
SELECTOR = "cloud.google.com/compute-class"
NETWORKS_SKIP = ("Autopilot: GKE makes and manages the TPU nodes' extra networks itself (the ComputeClass's "
                 "accelerator network profile auto); the tutorial's two VPCs would never be attached")


def priorities(env: Environment) -> list[dict[str, Any]]:
    """The ComputeClass's one priority: the machine type with the accelerator
    network profile, and the inventory's capacity (the same key means the
    same on both modes: ComputeClass fields spot, flexStart, reservations)."""
    p: dict[str, Any] = {"machineType": env.machine_type, "acceleratorNetworkProfile": "auto"}
    if env.capacity == "spot":
        p["spot"] = True
    elif env.capacity == "flex-start":
        p["flexStart"] = {"enabled": True}
    elif env.capacity == "reservation":
        owner, name = reservation_parts(env)
        p["reservations"] = {"affinity": "Specific", "specific": [{"name": name, "project": owner}]}
    return [p]


def compute_class_values(env: Environment) -> dict[str, str]:
    return {"COMPUTE_CLASS": COMPUTE_CLASS, "PRIORITIES": json.dumps(priorities(env))}


def rendered_compute_class(env: Environment) -> dict:
    text = (ROOT / COMPUTE_CLASS_MANIFEST).read_text()
    return yaml.safe_load(render(text, compute_class_values(env)))


def compute_class_fact(env: Environment):
    return kube_get(env, "computeclass", COMPUTE_CLASS)


def compute_class_step(env: Environment) -> Step:
    probe = compute_class_fact(env)
    want = rendered_compute_class(env)["spec"]

    def apply() -> Command:
        r = envsubst(COMPUTE_CLASS_MANIFEST, compute_class_values(env), root=ROOT)
        return Command(kube(env, "apply", "-f", "-").argv, pipe_from=r, pipe_check=leftover)

    def decide(look):
        cc = look(probe)
        if cc is ABSENT:
            return change(apply(), reason=f"applied (DRA networking, {env.machine_type}, {env.capacity})")
        have = cc.get("spec") or {}
        diffs = [f"{k}: {json.dumps(have.get(k), sort_keys=True)}, want {json.dumps(v, sort_keys=True)}"
                 for k, v in want.items() if have.get(k) != v]
        if diffs:
            return drift(f"ComputeClass {COMPUTE_CLASS}: " + "; ".join(diffs))
        return ok(f"ComputeClass {COMPUTE_CLASS} is the one rendered (DRA networking, {env.capacity})")

    return Step(PLAY, f"ComputeClass {COMPUTE_CLASS}", decide, id="raycluster:compute-class",
                after=("kube:credentials",),
                verify=Verify(probe, lambda cc: "ComputeClass not found" if cc is ABSENT else
                              None if (cc.get("spec") or {}) == want else "not the one rendered", timeout=60,
                              interval=5))


# -- Autopilot's rules, checked on the rendered manifests before any apply ------------
# Autopilot's security policy (GKE "Autopilot security measures"): no
# privileged containers, no host namespaces, no hostPath volumes that write.
# Its per-machine resource limits for TPU v6e are not published: not checked.
def pod_specs(docs: Iterable[dict]) -> list[tuple[str, dict]]:
    """(where, pod spec) of every pod template in these manifests."""
    out = []
    for d in docs:
        if not isinstance(d, dict):
            continue
        name = f"{d.get('kind')} {(d.get('metadata') or {}).get('name')}"
        spec = d.get("spec") or {}
        if d.get("kind") == "RayCluster":
            out.append((f"{name}: headGroupSpec", (spec.get("headGroupSpec") or {}).get("template", {}).get("spec")
                        or {}))
            for i, g in enumerate(spec.get("workerGroupSpecs") or []):
                out.append((f"{name}: workerGroupSpecs[{i}]", (g.get("template") or {}).get("spec") or {}))
        elif d.get("kind") == "Pod":
            out.append((name, spec))
    return out


def violations(docs: Iterable[dict]) -> list[str]:
    """Each field Autopilot would refuse, one line each."""
    out = []
    for where, spec in pod_specs(docs):
        for field in ("hostNetwork", "hostPID", "hostIPC"):
            if spec.get(field):
                out.append(f"{where}: spec.{field}: true is a host namespace, denied on Autopilot")
        for v in spec.get("volumes") or []:
            if "hostPath" in v:
                out.append(f"{where}: volumes[{v.get('name')}].hostPath is denied on Autopilot")
        for kind in ("initContainers", "containers"):
            for c in spec.get(kind) or []:
                sc = c.get("securityContext") or {}
                if sc.get("privileged"):
                    out.append(f"{where}: {kind}[{c.get('name')}].securityContext.privileged: true is denied on "
                               f"Autopilot (autogke-disallow-privilege)")
                if sc.get("allowPrivilegeEscalation"):
                    out.append(f"{where}: {kind}[{c.get('name')}].securityContext.allowPrivilegeEscalation: true is "
                               f"denied on Autopilot")
    return out


def rendered_docs(env: Environment) -> list[dict]:
    from .raycluster import manifest_values
    text = render((ROOT / T.RAYCLUSTER_MANIFEST).read_text(), manifest_values(env))
    return [d for d in yaml.safe_load_all(text) if d] + [rendered_compute_class(env)]


def rules_step(env: Environment) -> Step:
    def decide(look):
        found = violations(rendered_docs(env))
        if found:
            return fail(f"{len(found)} field(s) Autopilot would refuse: " + "; ".join(found))
        return ok("the rendered manifests keep Autopilot's rules (no privileged container, no host namespace, no "
                  "hostPath)")

    return Step(PLAY, "Autopilot's rules", decide, id="raycluster:autopilot-rules")


def steps(env: Environment) -> list[Step]:
    """What Autopilot needs before the RayCluster: its rules kept, the
    ComputeClass applied."""
    return [credentials_step(env, PLAY), rules_step(env), compute_class_step(env)]
