"""The inventory's choices as records, one each: the environment's kind
(where its cluster is: ``Platform``), a GKE cluster's mode (``ClusterMode``)
and a capacity option (``CapacityOption``). Each is chosen once from the
inventory's string (``platform``, ``cluster_mode``, ``capacity_option``);
the code reads the record's fields, never compares the strings
(``tests/test_structure.py`` holds every package but this one to that).
The TPU generation is the same kind of record, in ``tpu.py``."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from playbooks.config import host_notice, spot_grace
from playbooks.config import tutorial as T

# -- where the cluster is ---------------------------------------------------------


@dataclass(frozen=True)
class Platform:
    """An environment's kind: the inventory's ``kind:``."""

    name: str
    # The TPU hosts are Ray node processes on this machine (the twin:
    # playbooks/twin, plays/local_cluster start, break and stop them); their
    # chips are JAX CPU devices: no TPU chip, no price, no MFU.
    simulated: bool
    # A GKE cluster in a Google Cloud project: gcloud, kubectl, capacity and
    # quotas, prices, maintenance.
    cloud: bool


GKE = Platform("gke", simulated=False, cloud=True)
LOCAL = Platform("local", simulated=True, cloud=False)
PLATFORMS: Mapping[str, Platform] = MappingProxyType({p.name: p for p in (GKE, LOCAL)})
DEFAULT_PLATFORM = GKE.name


def platform(env: Mapping[str, Any]) -> Platform:
    """The environment's kind (``kind:``, gke when unset), as its record."""
    return PLATFORMS[env.get("kind") or DEFAULT_PLATFORM]


# -- a GKE cluster's mode --------------------------------------------------------------


@dataclass(frozen=True)
class ClusterMode:
    """GKE Standard or Autopilot: the inventory's ``mode:``."""

    name: str
    title: str                  # how a line names it: Standard, Autopilot
    # We make the TPU node pools (one a slice, workload policies); else GKE
    # makes the nodes from the pods' requests (`clusters create-auto`, the
    # cluster's autopilot.enabled).
    our_node_pools: bool
    # The cluster, and where its TPU nodes are looked for, is in a region
    # (GKE picks the zone); else in the inventory's zone.
    regional: bool
    # `clusters create` passes --workload-pool: the cluster's pool is checked.
    our_workload_pool: bool
    # The tutorial's two DCN networks and subnets are ours to make (where the
    # machine type has the NICs: tpu.dcn_networks); else GKE makes them.
    our_networks: bool
    # The TPU workers' capacity is a ComputeClass's priorities (their node
    # selector names it); else our capacity label, in the workers' affinity.
    compute_class: bool
    # Pods are held to Autopilot's rules (no privileged container, requests
    # it accepts): checked on the rendered manifests before any apply.
    restricted_pods: bool
    # The NICs each TPU host's pod claims from DRANET (DeviceClass
    # netdev.google.com), where it claims any (gke.netdev_claim): the
    # ResourceClaimTemplate's name and its request. Standard: the tutorial's
    # two, on the two DCN networks of the node pools; Autopilot: all that the
    # accelerator network profile gives the node (the claim GKE's sample
    # pairs with it: kubernetes-engine-samples
    # ai-ml/gke-ray/rayserve/llm/tpu/networking/all-netdev-template.yaml).
    netdev_claim: str
    netdev_request: Mapping[str, Any]
    # The CPU nodes `clusters create` makes beside the TPU ones (its
    # default-pool, billed as Compute Engine VMs): gcloud's --num-nodes
    # default, 3 in each of the cluster's zones ("default=3",
    # https://cloud.google.com/sdk/gcloud/reference/container/clusters/create),
    # a zonal cluster: 3. Autopilot makes none of ours: it bills the pods'
    # requests (https://cloud.google.com/kubernetes-engine/pricing).
    cpu_pool_nodes: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "netdev_request", MappingProxyType(dict(self.netdev_request)))


STANDARD = ClusterMode("standard", "Standard", our_node_pools=True, regional=False, our_workload_pool=True,
                       our_networks=True, compute_class=False, restricted_pods=False,
                       netdev_claim=T.NETDEV_CLAIMS["standard"],
                       netdev_request={"deviceClassName": "netdev.google.com", "allocationMode": "ExactCount",
                                       "count": 2}, cpu_pool_nodes=3)
AUTOPILOT = ClusterMode("autopilot", "Autopilot", our_node_pools=False, regional=True, our_workload_pool=False,
                        our_networks=False, compute_class=True, restricted_pods=True,
                        netdev_claim=T.NETDEV_CLAIMS["autopilot"],
                        netdev_request={"deviceClassName": "netdev.google.com", "allocationMode": "All"},
                        cpu_pool_nodes=0)
MODES: Mapping[str, ClusterMode] = MappingProxyType({m.name: m for m in (STANDARD, AUTOPILOT)})


def cluster_mode(env: Mapping[str, Any]) -> ClusterMode | None:
    """A GKE environment's mode as its record (None: no mode, a local one)."""
    return MODES.get(env.get("mode") or "")


# -- a capacity option ------------------------------------------------------------------


@dataclass(frozen=True)
class CapacityOption:
    """How a slice's TPUs are got: the inventory's ``capacity:`` (each of
    its list). Sources: playbooks/cloud/capacity_options.py."""

    name: str
    # What `gcloud container node-pools create` adds; {reservation} and
    # {hosts} are the environment's reservation and hosts per slice.
    pool_flags: tuple[str, ...]
    starts_empty: bool          # the pool starts with 0 nodes (they come as capacity does)
    waits_for_capacity: bool    # the slices' nodes may take capacity_wait to come
    preemptible: bool           # its slices can be taken back (a node shut down is a preemption)
    reserved: bool              # it consumes a reservation (the inventory's reservation:)
    # The quotas a pool of it consumes, in the order it tries them: the
    # generation's fields (tpu.Generation.on_demand_quota, preemptible_quota).
    quotas: tuple[str, ...]
    # Its ComputeClass priority's fields (a reservation adds its own).
    compute_class: Mapping[str, Any] = field(default_factory=dict)
    # Its price can come from the Cloud Billing Catalog (the generation's
    # SKU); else only from the inventory's prices:.
    catalog_priced: bool = True
    # The notice a slice of it gets before it goes, in words, and the
    # seconds the job's pods have after it to save (None: no notice of
    # that kind). Sources: ``job/save_period.py``.
    notice: str = ""
    notice_s: int | None = None
    # The mean time between interruptions a run on it expects, by default
    # (the inventory's interruption_mtbi_hours wins), and its basis in
    # words: the checkpoint period is chosen from it (``job/save_period.py``).
    mtbi_hours: float = 168.0
    mtbi_basis: str = ""
    # mtbi_hours is each VM's (a Spot VM is preempted on its own, and a
    # slice is lost when any of its VMs is: a run's is it / its VMs,
    # ``job/save_plan.mtbi``); else the run's as it stands (an assumed
    # run-level figure, or a pool's one fixed end).
    mtbi_per_vm: bool = False
    # Its pools' graceful termination can be lengthened past notice_s (a
    # Spot VM's: config/spot_grace.py), and what an environment's pools of
    # it get: the node system configuration's kubeletConfig (empty: none;
    # given by ``options``, where the environment's cluster takes it).
    longer_grace: bool = False
    kubelet_config: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "compute_class", MappingProxyType(dict(self.compute_class)))
        object.__setattr__(self, "kubelet_config", MappingProxyType(dict(self.kubelet_config)))


# What a slice of each option is told before it goes, and how often a run
# on it is interrupted (an assumption where Google publishes no rate):
# ``job/save_period.py`` quotes the sources.
MAINTENANCE_NOTICE = ("no notice but host maintenance, announced days ahead by a node label (`invoke status` says "
                      "when)")
ASSUMED_MTBI = ("an assumption (30 days): Google publishes no rate of TPU host failures; host maintenance is "
                "announced days ahead; set interruption_mtbi_hours from what your runs see")
ON_DEMAND = CapacityOption("on-demand", (), starts_empty=False, waits_for_capacity=False, preemptible=False,
                           reserved=False, quotas=("on_demand_quota",), notice=MAINTENANCE_NOTICE,
                           mtbi_hours=720.0, mtbi_basis=ASSUMED_MTBI)
SPOT = CapacityOption("spot", ("--spot",), starts_empty=False, waits_for_capacity=False, preemptible=True,
                      reserved=False, quotas=("preemptible_quota",), compute_class={"spot": True},
                      notice=spot_grace.DEFAULT_NOTICE, notice_s=spot_grace.DEFAULT_PODS_S, mtbi_hours=24.0,
                      mtbi_basis=("an assumption (a day per Spot VM): Google publishes no Spot preemption rate; "
                                  "set interruption_mtbi_hours from what your runs see"), mtbi_per_vm=True,
                      longer_grace=True)
RESERVATION = CapacityOption("reservation", ("--reservation-affinity=specific", "--reservation={reservation}"),
                             starts_empty=False, waits_for_capacity=False, preemptible=False, reserved=True,
                             quotas=(), catalog_priced=False, notice=MAINTENANCE_NOTICE, mtbi_hours=720.0,
                             mtbi_basis=ASSUMED_MTBI)
FLEX_START = CapacityOption(
    "flex-start", ("--flex-start", "--enable-autoscaling", "--min-nodes=0", "--max-nodes={hosts}",
                   "--location-policy=ANY", "--reservation-affinity=none", "--no-enable-autorepair"),
    starts_empty=True, waits_for_capacity=True, preemptible=True, reserved=False,
    quotas=("preemptible_quota", "on_demand_quota"), compute_class={"flexStart": {"enabled": True}},
    notice=("no notice before its end: a flex-start slice ends at its max run duration, 7 days by default "
            "(`invoke status` says when)"),
    mtbi_hours=168.0, mtbi_basis="its max run duration, 7 days by default: the one end it is sure to have")
OPTIONS: Mapping[str, CapacityOption] = MappingProxyType(
    {o.name: o for o in (ON_DEMAND, SPOT, RESERVATION, FLEX_START)})


def capacity_option(name: str) -> CapacityOption:
    """An option's record from its name (the inventory's, or a pool's)."""
    return OPTIONS[name]


def options(env: Mapping[str, Any]) -> tuple[CapacityOption, ...]:
    """The environment's capacity options, best first, as records (none
    where it has no capacity: a local one), each as this environment's
    cluster gives it (``given``)."""
    v = env.get("capacity")
    if v is None:
        return ()
    return tuple(given(env, OPTIONS[o]) for o in (v if isinstance(v, list) else [v]))


def longer_grace_blocker(env: Mapping[str, Any]) -> str | None:
    """Why the environment's Spot pools cannot give the job's pods
    ``spot_grace.PODS_S`` of a preemption's notice (None: they can, and
    this project sets it)."""
    m = cluster_mode(env)
    return spot_grace.blocker(m is not None and m.our_node_pools, str(env.get("cluster_version") or ""))


def given(env: Mapping[str, Any], option: CapacityOption) -> CapacityOption:
    """``option`` as the environment's cluster gives it: a Spot pool's
    graceful termination lengthened where the cluster takes it (its
    kubelet_config, notice and notice_s); else its notice says why not."""
    if not option.longer_grace:
        return option
    why = longer_grace_blocker(env)
    if why is not None:
        return replace(option, notice=f"{option.notice} (not lengthened: {why})")
    return replace(option, notice=spot_grace.LONG_NOTICE, notice_s=spot_grace.PODS_S,
                   kubelet_config=spot_grace.KUBELET_CONFIG)


def worker_grace_s(env: Mapping[str, Any]) -> int:
    """The TPU worker pods' terminationGracePeriodSeconds: the longest
    notice a pool of the environment gives them (a lengthened Spot pool's),
    else Kubernetes' default (host_notice.POD_GRACE_S). A pod's grace caps
    what a node's shutdown gives it: it must not be the shorter."""
    return max([host_notice.POD_GRACE_S] + [o.notice_s for o in options(env) if o.kubelet_config and o.notice_s])


def preemption_grace_s(env: Mapping[str, Any]) -> int:
    """The seconds a preemption's notice gives the job's pods on the
    environment's capacity: the shortest of its options that give one (a
    Spot pool's); where none does (on-demand, a reservation, flex-start,
    the twin), a pod's own grace (``worker_grace_s``), which a pod deleted
    or drained for maintenance gets."""
    given_s = [o.notice_s for o in options(env) if o.preemptible and o.notice_s is not None]
    return min(given_s) if given_s else worker_grace_s(env)
