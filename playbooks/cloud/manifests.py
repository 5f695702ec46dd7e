"""The rendered manifests, owned in one place: the values each template of
``manifests/`` is rendered with, the documents it renders to, the command
that applies it (``envsubst < template | kubectl apply -f -``), and the rules
a rendered document must keep (Autopilot's; the worker group's slices).

- ``manifests/ray-cluster.tpu-multi-slice.yaml``: DRANET NIC claims and the
  RayCluster, one TPU worker group of ``slices`` replicas x
  ``hosts_per_slice`` hosts.
- ``manifests/ray-cluster.tpu-multi-slice.no-dranet.yaml``: the same
  RayCluster without the NIC claims, for a machine type without the
  tutorial's two DCN NICs (TPU v5e, v5p, TPU7x: ``config/tpu.py``).
- ``manifests/compute-class.tpu-dranet.yaml`` (Autopilot): the ComputeClass
  that opts the TPU nodes into managed DRANET.
- ``manifests/ray-watch-rbac.yaml`` (``stall_watch: cluster``): the head's
  own service account, which the watch in the cluster acts as, and its
  rights (nodes cordoned and tainted, pods deleted): a ClusterRole for the
  nodes, a Role in the namespace for the rest, and their bindings. The TPU
  workers keep the tutorial's account, ``ksa_name``, with no rights.

On Autopilot the tutorial's RayCluster would be refused: its TPU workers are
privileged (ours add SYS_PTRACE there instead), and Autopilot's policy
denies that ("GKE Warden rejected the request ... [denied by
autogke-disallow-privilege] container ... is privileged; not allowed in
Autopilot";
https://cloud.google.com/kubernetes-engine/docs/concepts/autopilot-security).
And DRANET on Autopilot needs a custom ComputeClass with DRA networking and
the accelerator network profile `auto`, with which GKE makes and manages the
extra networks itself: the tutorial's two VPCs are never attached to an
Autopilot node (GKE's DRANET guide,
https://docs.cloud.google.com/kubernetes-engine/docs/how-to/allocate-network-resources-dra).
"""
from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from typing import Any

import yaml

from playbooks.access.cli_clients import fact, kube_list
from playbooks.cloud import capacity_options
from playbooks.cloud.gke import kube, netdev_claim
from playbooks.config import host_notice
from playbooks.config import tutorial as T
from playbooks.config.choices import worker_grace_s
from playbooks.config.project import ROOT
from playbooks.config.schema import Environment, reservation_parts
from playbooks.config.tpu import generation
from playbooks.core.command import Command
from playbooks.core.facts import ABSENT, Fact
from playbooks.core.render import envsubst, leftover, render


# -- the RayCluster ------------------------------------------------------------------------
# The NICs each TPU host's pod claims from DRANET: the cluster mode's
# (config/choices.py, ClusterMode.netdev_claim and netdev_request).
def claim_name(env: Environment) -> str:
    return env.cluster_mode.netdev_claim


def worker_node_selector(env: Environment) -> dict[str, str]:
    """The tutorial's three labels, and on Autopilot the ComputeClass (whose
    priorities carry the capacity). On Standard the capacity is the
    workers' affinity (worker_affinity)."""
    sel = {"iam.gke.io/gke-metadata-server-enabled": "true",
           "cloud.google.com/gke-tpu-accelerator": generation(env).accelerator_label,
           "cloud.google.com/gke-tpu-topology": env.topology}
    if env.cluster_mode.compute_class:
        sel[SELECTOR] = COMPUTE_CLASS
    return sel


def worker_affinity(env: Environment) -> dict[str, Any]:
    """Standard: the nodes of any capacity option of the list (our label on
    each pool; why one worker group: capacity_options.worker_affinity).
    Autopilot: none (the ComputeClass's priorities)."""
    return {} if env.cluster_mode.compute_class else capacity_options.worker_affinity(env)


NO_DRANET_MANIFEST = "manifests/ray-cluster.tpu-multi-slice.no-dranet.yaml"
POD_MEMORY_GB = 200  # the tutorial's worker pod


def raycluster_manifest(env: Environment) -> str:
    """The tutorial's template, or its twin without DRANET's NIC claims."""
    return T.RAYCLUSTER_MANIFEST if netdev_claim(env) else NO_DRANET_MANIFEST


def worker_memory(env: Environment) -> str:
    """The tutorial's 200G, or three quarters of a VM that has less."""
    vm = generation(env).machine_types[env.machine_type].memory_gb
    return f"{POD_MEMORY_GB}G" if vm is None or vm * 3 // 4 >= POD_MEMORY_GB else f"{vm * 3 // 4}G"


def raycluster_values(env: Environment) -> dict[str, str]:
    if not netdev_claim(env):
        return {**_common_values(env), "WORKER_MEMORY": worker_memory(env)}
    mode = env.cluster_mode
    return {**_common_values(env), "NETDEV_CLAIM": mode.netdev_claim,
            "NETDEV_REQUEST": json.dumps(dict(mode.netdev_request))}


def _common_values(env: Environment) -> dict[str, str]:
    return {
        "NAMESPACE": env.namespace,
        "HEAD_KSA_NAME": head_ksa_name(env),
        "KSA_NAME": env.ksa_name,
        "GS_BUCKET": env.gs_bucket,
        "RAY_IMAGE": env.ray_image,
        "SLICES": str(env.slices),
        "HOSTS_PER_SLICE": str(env.hosts_per_slice),
        "CHIPS_PER_HOST": str(env.chips_per_host),
        "WORKER_NODE_SELECTOR": json.dumps(worker_node_selector(env)),
        "WORKER_AFFINITY": json.dumps(worker_affinity(env)),
        "WORKER_SECURITY_CONTEXT": json.dumps(worker_security_context(env)),
        # Not the tutorial's: a notice to go (a Spot preemption, a pod
        # deleted with a grace) reaches the trainer as a drain of the pod's
        # Ray node, so it saves before the node goes (config/host_notice.py),
        # within the pods' grace: the longest notice a pool of the
        # environment gives them (a lengthened Spot pool's 105 s, else
        # Kubernetes' default 30 s: choices.worker_grace_s).
        "WORKER_LIFECYCLE": json.dumps(host_notice.prestop_hook(worker_grace_s(env))),
        "WORKER_GRACE_S": str(worker_grace_s(env)),
    }


def worker_security_context(env: Environment) -> dict:
    """The tutorial's privileged worker; on Autopilot, which denies that,
    SYS_PTRACE alone: py-spy (the worker stacks the hang diagnosis reads,
    through the dashboard) needs it in a container (Ray's KubeRay py-spy
    guide), and Autopilot allows it (AUTOPILOT_CAPABILITIES)."""
    return {"capabilities": {"add": ["SYS_PTRACE"]}} if env.cluster_mode.restricted_pods else {"privileged": True}


def _apply(template: str, values: dict[str, str], env: Environment) -> Command:
    """``envsubst < template | kubectl apply -f -``, as the tutorial writes it,
    with envsubst limited to the template's variables and its output checked."""
    rendered = envsubst(template, values, root=ROOT)
    return Command(kube(env, "apply", "-f", "-").argv, pipe_from=rendered, pipe_check=leftover)


def raycluster_apply(env: Environment) -> Command:
    return _apply(raycluster_manifest(env), raycluster_values(env), env)


def raycluster_docs(env: Environment) -> list[dict]:
    """The rendered RayCluster manifest: its claim template and RayCluster."""
    text = render((ROOT / raycluster_manifest(env)).read_text(), raycluster_values(env))
    return [d for d in yaml.safe_load_all(text) if d]


def worker_group(rc: Any) -> dict:
    """The TPU worker group of a RayCluster (rendered or read back)."""
    for g in ((rc or {}).get("spec") or {}).get("workerGroupSpecs") or []:
        if g.get("groupName") == T.TPU_WORKER_GROUP:
            return g
    return {}


def group_pod_spec(group: Any) -> dict:
    """The pod spec of a RayCluster's head or worker group."""
    return ((group or {}).get("template") or {}).get("spec") or {}


def head_pod_spec(rc: Any) -> dict:
    """The pod spec of a RayCluster's head (rendered or read back)."""
    return group_pod_spec(((rc or {}).get("spec") or {}).get("headGroupSpec"))


def _first_container(spec: dict) -> dict:
    return next(iter(spec.get("containers") or []), {})


def added_settings_diffs(env: Environment, rc: Any) -> list[str]:
    """What a RayCluster read back lacks of the settings our manifests add
    to the tutorial's (the rendered one is their home): the head's service
    account (the watch's own with ``stall_watch: cluster``: a head on the
    workers' account has no right to set a slice aside, and one on the
    watch's account after a change back to ``follow`` keeps rights it no
    longer needs), the head's environment (RAY_DASHBOARD_ENABLE_PROFILING,
    without which every worker stack answers 403), the workers' security
    context (py-spy's right to trace), their preStop hook (a notice's
    save) and their grace (a pod without one has Kubernetes' default, 30 s).
    A RayCluster applied before one of them was added lacks it, and works
    otherwise: drift."""
    want = next(d for d in raycluster_docs(env) if d.get("kind") == "RayCluster")
    diffs = []
    have_sa, want_sa = (head_pod_spec(r).get("serviceAccountName") for r in (rc, want))
    if have_sa != want_sa:
        diffs.append(f"head serviceAccountName {have_sa!r}, want {want_sa!r}")
    have_env = {e.get("name"): e.get("value") for e in _first_container(head_pod_spec(rc)).get("env") or []}
    for e in _first_container(head_pod_spec(want)).get("env") or []:
        if have_env.get(e["name"]) != e.get("value"):
            diffs.append(f"head env {e['name']}={have_env.get(e['name'])!r}, want {e.get('value')!r}")
    have, wanted = (_first_container(group_pod_spec(worker_group(r))) for r in (rc, want))
    for key in ("securityContext", "lifecycle"):
        if have.get(key) != wanted.get(key):
            diffs.append(f"worker {key} {json.dumps(have.get(key), sort_keys=True)}, want "
                         f"{json.dumps(wanted.get(key), sort_keys=True)}")
    grace, want_grace = (group_pod_spec(worker_group(r)).get("terminationGracePeriodSeconds", host_notice.POD_GRACE_S)
                         for r in (rc, want))
    if grace != want_grace:
        diffs.append(f"worker terminationGracePeriodSeconds {grace}, want {want_grace}")
    return diffs


def megascale_problem(env: Environment) -> str | None:
    """The TPU webhook needs MEGASCALE_NUM_SLICES equal to the replicas."""
    for doc in raycluster_docs(env):
        if doc.get("kind") != "RayCluster":
            continue
        for g in doc["spec"].get("workerGroupSpecs") or []:
            for c in g["template"]["spec"].get("containers") or []:
                env_vars = {e["name"]: e.get("value") for e in c.get("env") or []}
                if str(env_vars.get("MEGASCALE_NUM_SLICES")) != str(g.get("replicas")):
                    return (f"manifest: MEGASCALE_NUM_SLICES={env_vars.get('MEGASCALE_NUM_SLICES')} but the worker "
                            f"group has {g.get('replicas')} slice replicas")
    return None


# -- the ComputeClass (Autopilot) -------------------------------------------------------------
COMPUTE_CLASS = "maxtext-tpu-dranet"
COMPUTE_CLASS_MANIFEST = "manifests/compute-class.tpu-dranet.yaml"
SELECTOR = "cloud.google.com/compute-class"


def priorities(env: Environment) -> list[dict[str, Any]]:
    """The ComputeClass's priorities: one per capacity option of the list,
    in its order (GKE tries them best first), each the machine type with
    the accelerator network profile and the option (the same key means the
    same on both modes: ComputeClass fields spot, flexStart, reservations;
    on-demand is a priority with none of them)."""
    out = []
    for option in env.options:
        p: dict[str, Any] = {"machineType": env.machine_type, "acceleratorNetworkProfile": "auto",
                             **copy.deepcopy(dict(option.compute_class))}
        if option.reserved:
            owner, name = reservation_parts(env)
            p["reservations"] = {"affinity": "Specific", "specific": [{"name": name, "project": owner}]}
        out.append(p)
    return out


def compute_class_values(env: Environment) -> dict[str, str]:
    return {"COMPUTE_CLASS": COMPUTE_CLASS, "PRIORITIES": json.dumps(priorities(env))}


def compute_class_doc(env: Environment) -> dict:
    text = (ROOT / COMPUTE_CLASS_MANIFEST).read_text()
    return yaml.safe_load(render(text, compute_class_values(env)))


def compute_class_apply(env: Environment) -> Command:
    return _apply(COMPUTE_CLASS_MANIFEST, compute_class_values(env), env)


def all_docs(env: Environment) -> list[dict]:
    """Every document this environment applies."""
    return raycluster_docs(env) + ([compute_class_doc(env)] if env.cluster_mode.compute_class else [])


# -- the rights of the watch in the cluster (stall_watch: cluster) ----------------------
WATCH_RBAC_MANIFEST = "manifests/ray-watch-rbac.yaml"
WATCH_RBAC_PREFIX = "maxtext-watch"
# kubectl's name of each kind of the manifest, in the order they are deleted
# (the bindings first: no moment where a binding names a role that is gone).
RBAC_KINDS = {"ClusterRoleBinding": "clusterrolebinding", "ClusterRole": "clusterrole",
              "RoleBinding": "rolebinding", "Role": "role", "ServiceAccount": "serviceaccount"}
# What of each object is ours to compare: a role's rules, a binding's role and subjects.
RBAC_FIELDS = ("rules", "roleRef", "subjects")


def watch_rbac_wanted(env: Environment) -> bool:
    """Whether the head's service account needs the watch's rights: on GKE
    with ``stall_watch: cluster`` (the watch then runs on the Ray head and
    acts as that account). The local twin's watch runs as this machine's
    user; with ``follow`` the watch runs here, with the user's rights."""
    return env.platform.cloud and env.stall_watch == "cluster"


def watch_rbac_name(env: Environment) -> str:
    """The name of all five objects (the head's service account among them):
    the namespace tells two environments of one cluster apart (the manifest
    says why)."""
    return f"{WATCH_RBAC_PREFIX}-{env.namespace}"


def head_ksa_name(env: Environment) -> str:
    """The service account the Ray head runs as: the watch's own
    (``watch_rbac_name``, made by its manifest) where the watch runs there
    and acts, else the tutorial's one account, ``ksa_name``, as the TPU
    workers always do. One home for it: the RayCluster's HEAD_KSA_NAME, the
    bucket's binding (``plays/storage.py``), the drift of a head on another."""
    return watch_rbac_name(env) if watch_rbac_wanted(env) else env.ksa_name


def watch_rbac_values(env: Environment) -> dict[str, str]:
    return {"NAMESPACE": env.namespace, "WATCH_KSA_NAME": watch_rbac_name(env)}


def watch_rbac_docs(env: Environment) -> list[dict]:
    """The rendered ServiceAccount, ClusterRole, ClusterRoleBinding, Role
    and RoleBinding."""
    text = render((ROOT / WATCH_RBAC_MANIFEST).read_text(), watch_rbac_values(env))
    return [d for d in yaml.safe_load_all(text) if d]


def watch_rbac_apply(env: Environment) -> Command:
    return _apply(WATCH_RBAC_MANIFEST, watch_rbac_values(env), env)


def _rbac_refs(env: Environment) -> list[str]:
    return [f"{kind}/{watch_rbac_name(env)}" for kind in RBAC_KINDS.values()]


def watch_rbac_delete(env: Environment) -> Command:
    return kube(env, "delete", *_rbac_refs(env), "--namespace", env.namespace, "--ignore-not-found")


def watch_rbac_fact(env: Environment) -> Fact:
    """The five objects as they are, in one `kubectl get`: Kind -> object,
    those found (ABSENT: none)."""
    name = watch_rbac_name(env)

    def select(items: Any) -> Any:
        found = {it.get("kind"): it for it in (items or {}).get("items") or []
                 if it.get("kind") in RBAC_KINDS and (it.get("metadata") or {}).get("name") == name}
        return {k: found[k] for k in RBAC_KINDS if k in found} or ABSENT

    c = kube(env, "get", *_rbac_refs(env), "--namespace", env.namespace, "--ignore-not-found", "--output=json")
    return fact(f"RBAC {name}", c, kube_list(select),
                describe=lambda found: f"{len(found)} of {len(RBAC_KINDS)} present ({', '.join(found)})")


def watch_rbac_diffs(env: Environment, found: Any) -> tuple[list[str], list[str]]:
    """(the kinds missing, one line per object found that is not the one
    rendered) against what ``watch_rbac_fact`` read."""
    have = {} if found is ABSENT else found
    missing, differ = [], []
    for doc in watch_rbac_docs(env):
        kind, cur = doc["kind"], have.get(doc["kind"])
        if cur is None:
            missing.append(kind)
            continue
        for field in RBAC_FIELDS:
            if field in doc and cur.get(field) != doc[field]:
                differ.append(f"{kind} {watch_rbac_name(env)} {field}: {json.dumps(cur.get(field), sort_keys=True)}, "
                              f"want {json.dumps(doc[field], sort_keys=True)}")
    return missing, differ


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
            out.append((f"{name}: headGroupSpec", head_pod_spec(d)))
            for i, g in enumerate(spec.get("workerGroupSpecs") or []):
                out.append((f"{name}: workerGroupSpecs[{i}]", group_pod_spec(g)))
        elif d.get("kind") == "Pod":
            out.append((name, spec))
    return out


# The capabilities a container may add on Autopilot, as GKE Warden lists them
# when it refuses another ("[denied by autogke-default-linux-capabilities]
# ... Autopilot only allows the capabilities: ...", quoted in
# CrowdStrike/falcon-helm issue #310, 2024). NET_RAW among them has needed
# an allowlist on some versions (GKE's page on privileged open-source
# workloads): this project adds SYS_PTRACE only.
AUTOPILOT_CAPABILITIES = frozenset((
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE", "NET_RAW",
    "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT", "SYS_PTRACE"))


def autopilot_violations(docs: Iterable[dict]) -> list[str]:
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
                for cap in ((sc.get("capabilities") or {}).get("add") or []):
                    if cap not in AUTOPILOT_CAPABILITIES:
                        out.append(f"{where}: {kind}[{c.get('name')}].securityContext.capabilities.add: {cap} is "
                                   f"denied on Autopilot (autogke-default-linux-capabilities)")
    return out
