"""TPU generations, one record each (v5e, v5p, v6e, TPU7x), and the
topology arithmetic every play reads from them: chips, hosts per slice, the
names GKE, Ray and MaxText give a slice.

Every value carries its source. The research behind them, with each value
marked verified or not, is in docs/tpu-generations.md; the source keys
[S1]..[S21] below are its list:
[S1] xpk src/xpk/core/system_characteristics.py @367c838;
[S2] xpk src/xpk/core/nodepool.py and scheduling.py @367c838;
[S3] xpk src/xpk/core/capacity.py; [S4] Ray's accelerators.py and the
installed ray/_private/accelerators/tpu.py (Ray 2.60: VALID_TPU_TOPOLOGY,
SINGLE_CORE_TPU_TYPES); [S5] MaxText's utils/accelerator_to_spec_map.py (the
installed one); [S6] SkyPilot sky/catalog/data_fetchers/fetch_gcp.py; [S7]
the GKE TPU device plugin's TestInitEnvs; [S8] cloud.google.com/tpu/docs/v6e;
[S9] .../tpu/docs/tpu7x; [S10] .../tpu/docs/v5e; [S11] .../tpu/docs/v5p;
[S12] .../tpu/docs/v5p-training; [S13] GKE's tpu-multislice guide; [S14]
GKE's tpus-autopilot; [S17] kubernetes-sigs/dranet docs/user/gke-tpu-performance.md;
[S18] GKE's concepts/tpu-ironwood; bench/data/tpu_chip_v5e.json: a v5e chip
measured by bench/tpu_chip.py.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from playbooks.config.choices import cluster_mode, platform

# -- the records ------------------------------------------------------------------


@dataclass(frozen=True)
class MachineType:
    """A GKE TPU machine type: its chips per VM, the topologies a slice of
    it can have, and whether its VM has the two physical NICs the
    tutorial's two DCN networks (DRANET ``two-netdev``) are attached to."""

    chips: int
    topologies: tuple[str, ...]
    dcn_nics: bool = False
    memory_gb: int | None = None   # the VM's memory, where a pod's 200G would not fit


@dataclass(frozen=True)
class Generation:
    """One TPU generation, as GKE, Ray, MaxText and the Billing Catalog name it."""

    name: str                      # the inventory's `tpu:` value; node pools are <name>-<chips>-<i>
    title: str                     # how a line names it: "TPU v6e (Trillium)"
    short: str                     # and in passing: "TPU v6e", "TPU7x"
    dims: int                      # 2: topologies AxB; 3: AxBxC
    machine_types: Mapping[str, MachineType]
    accelerator_label: str         # node label cloud.google.com/gke-tpu-accelerator
    ray_accelerator_type: str      # Ray's accelerator type (ScalingConfig.accelerator_type)
    pod_type_prefix: str           # TPU_ACCELERATOR_TYPE = <prefix>-<chips x cores_per_chip>
    cores_per_chip: int            # TensorCores per chip (what TPU_ACCELERATOR_TYPE counts)
    maxtext_prefix: str            # MaxText's compile_topology = <prefix>-<chips x maxtext_per_chip>
    maxtext_per_chip: int
    devices_per_chip: int          # JAX devices per chip (MaxText's devices_per_slice / chips)
    hbm_gib: float                 # HBM per chip the runtime reports (the fit's default)
    peak_bf16_tflops: float        # per chip, for MFU
    threads_per_core: int | None   # node-pools create --threads-per-core (None: not passed)
    workload_policy: bool          # multi-host pools need a HIGH_THROUGHPUT workload policy
    skus: Mapping[str, tuple[str, str]]  # capacity option -> (description regex, usageType)
    skus_verified: bool
    on_demand_quota: tuple[str, Mapping[str, str]]
    preemptible_quota: tuple[str, Mapping[str, str]]
    autopilot: bool                # this project's Autopilot path (DRANET profile auto) takes it
    capacity_options: tuple[str, ...]
    topologies: tuple[str, ...] = field(default=(), init=False)

    def __post_init__(self) -> None:
        # Read-only all through: a record is shared by every environment.
        for name in ("machine_types", "skus"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))
        tops = tuple(dict.fromkeys(t for m in self.machine_types.values() for t in m.topologies))
        object.__setattr__(self, "topologies", tops)

    def pod_type(self, topology: str) -> str:
        """TPU_ACCELERATOR_TYPE (GKE's device plugin [S7]): v6e-16, v5p-8, tpu7x-16."""
        return f"{self.pod_type_prefix}-{chips(topology) * self.cores_per_chip}"

    def compile_topology(self, topology: str) -> str:
        """MaxText's compile_topology key [S5]: v6e-16, v5e-16, v5p-16, tpu7x-16."""
        return f"{self.maxtext_prefix}-{chips(topology) * self.maxtext_per_chip}"

    def shape(self, topology: str) -> str:
        """A slice as the lines say it: its generation and chips, v6e-16."""
        return f"{self.name}-{chips(topology)}"

    def example(self) -> str:
        return "4x4" if self.dims == 2 else "2x2x2"


ALL_CAPACITY = ("on-demand", "spot", "reservation", "flex-start")

# TPU v6e (Trillium). Machine types and topologies [S8]: 1t forms 1x1, 4t
# 2x2 (single host) and 4x4..16x16 (multi-host), 8t 2x4 on one VM (2x4 on
# two 4t VMs is "only supported when using the GKE API": left out, as
# before). ct6e-standard-4t "is backed by two physical NICs" and the DRANET
# guide attaches the tutorial's two networks to it [S17]; an 8-chip host has
# "4 x 200 Gbps NIC" [S8]; the 1t: not stated, kept as before (the tutorial's
# networking for every v6e type). Label tpu-v6e-slice [S1][S7]; Ray TPU-V6E
# [S4]; v6e-<chips> [S7]; MaxText v6e-<chips> [S5]; 31.24 GiB is what libtpu
# reports (the compile log; Google: 32 GB) [S8]; 918 TFLOP/s bf16 [S8].
# threads_per_core 1: the tutorial's flag. SKUs: read live ("TpuV6e running
# in Columbus", playbooks/cloud/prices.py). Quotas: TPUS_PER_TPU_FAMILY with
# tpu_family CT6E (Google's v6e guide) and the preemptible v6e quota.
V6E = Generation(
    name="v6e", title="TPU v6e (Trillium)", short="TPU v6e", dims=2,
    machine_types={
        "ct6e-standard-1t": MachineType(1, ("1x1",), dcn_nics=True),
        "ct6e-standard-4t": MachineType(4, ("2x2", "4x4", "4x8", "8x8", "8x16", "16x16"), dcn_nics=True),
        "ct6e-standard-8t": MachineType(8, ("2x4",), dcn_nics=True),
    },
    accelerator_label="tpu-v6e-slice", ray_accelerator_type="TPU-V6E",
    pod_type_prefix="v6e", cores_per_chip=1, maxtext_prefix="v6e", maxtext_per_chip=1, devices_per_chip=1,
    hbm_gib=31.24, peak_bf16_tflops=918.0, threads_per_core=1, workload_policy=False,
    skus={"on-demand": (r"^TpuV6e running in ", "OnDemand"),
          "spot": (r"^TpuV6e attached to Spot (Preemptible )?VMs running in ", "Preemptible"),
          "flex-start": (r"^DWS Defined Duration (Tpu)?V6e running in ", "OnDemand")},
    skus_verified=True,
    on_demand_quota=("TPUS-PER-TPU-FAMILY-per-project-region", {"tpu_family": "CT6E"}),
    preemptible_quota=("PREEMPTIBLE-TPU-V6E-per-project-region", {}),
    autopilot=True, capacity_options=ALL_CAPACITY,
)

# TPU v5e (v5 lite). ct5lp-hightpu-1t/4t/8t: 1, 4, 8 chips per VM, 48, 192
# and 384 GB of memory [S10] (the 1t and 4t: less than the tutorial's 200G
# worker pod: the pod asks three quarters of the VM's); 2D
# topologies; 2x2 on a 4t is single-host [S13]; xpk builds 2x4..16x16 on the
# 4t (multi-host) [S1]; 2x4 on one 8t VM [S10]. Label tpu-v5-lite-podslice
# [S1][S7]; Ray TPU-V5LITEPOD [S4]; TPU_ACCELERATOR_TYPE v5litepod-<chips>
# (1 core per chip) [S7][S4]; MaxText keys v5e-<chips>, not v5litepod [S5].
# HBM 15.75 GiB: what the runtime reports (bytes_limit 16909336064, measured
# on a v5e chip: bench/data/tpu_chip_v5e.json; Google: 16 GB); bf16 peak 197
# TFLOP/s [S10] (measured 184.6 on a 16384^3 product). No second NIC for
# DRANET is documented for a v5e VM (an 8-chip host: "2 x 100 Gbps NIC"
# [S10], no DRANET claim anywhere): no DCN networks of the tutorial's.
# threads per core: no source; the flag is not passed (GKE's default).
# SKUs: SkyPilot matches 'TpuV5e' and 'Preemptible' [S6]; the full
# descriptions are UNVERIFIED (modelled on v6e's): a miss is "no price",
# never a wrong one. Quotas: UNVERIFIED ids following v6e's naming (the
# family is the machine type's prefix, as CT6E is ct6e's); an id Cloud
# Quotas does not know is "not checked", never a shortage.
V5E = Generation(
    name="v5e", title="TPU v5e", short="TPU v5e", dims=2,
    machine_types={
        "ct5lp-hightpu-1t": MachineType(1, ("1x1",), memory_gb=48),
        "ct5lp-hightpu-4t": MachineType(4, ("2x2", "4x4", "4x8", "8x8", "8x16", "16x16"), memory_gb=192),
        "ct5lp-hightpu-8t": MachineType(8, ("2x4",)),
    },
    accelerator_label="tpu-v5-lite-podslice", ray_accelerator_type="TPU-V5LITEPOD",
    pod_type_prefix="v5litepod", cores_per_chip=1, maxtext_prefix="v5e", maxtext_per_chip=1, devices_per_chip=1,
    hbm_gib=15.75, peak_bf16_tflops=197.0, threads_per_core=None, workload_policy=False,
    skus={"on-demand": (r"^TpuV5e running in ", "OnDemand"),
          "spot": (r"^TpuV5e attached to Spot (Preemptible )?VMs running in ", "Preemptible"),
          "flex-start": (r"^DWS Defined Duration (Tpu)?V5e running in ", "OnDemand")},
    skus_verified=False,
    on_demand_quota=("TPUS-PER-TPU-FAMILY-per-project-region", {"tpu_family": "CT5LP"}),
    preemptible_quota=("PREEMPTIBLE-TPU-LITE-PODSLICE-V5-per-project-region", {}),
    autopilot=False, capacity_options=ALL_CAPACITY,
)

# TPU v5p. ct5p-hightpu-4t, 4 chips per VM [S11][S12]; 3D topologies: 2x2x1
# single-host, 2x2x2 and up multi-host [S11]; Ray's own list (the installed
# tpu.py VALID_TPU_TOPOLOGY["v5p"]) up to 16x16x24 [S4]; kept here: those
# MaxText can compile for, up to 8x16x16 [S5]. Label tpu-v5p-slice [S1][S7];
# Ray TPU-V5P [S4]; TPU_ACCELERATOR_TYPE v5p-<TensorCores> (2 per chip: v5p-8
# is 4 chips) [S7][S11]; MaxText v5p-<TensorCores>, 'megacore': one JAX
# device per chip [S5]. HBM 95 GiB, 459 TFLOP/s bf16 [S12] (Google's figures;
# what the runtime reports is not measured here). NICs per VM: not found: no
# DCN networks of the tutorial's. SKUs 'TpuV5p' [S6], full strings
# UNVERIFIED; quotas UNVERIFIED (as v5e's).
V5P = Generation(
    name="v5p", title="TPU v5p", short="TPU v5p", dims=3,
    machine_types={
        "ct5p-hightpu-4t": MachineType(4, ("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8",
                                           "8x8x16", "8x16x16")),
    },
    accelerator_label="tpu-v5p-slice", ray_accelerator_type="TPU-V5P",
    pod_type_prefix="v5p", cores_per_chip=2, maxtext_prefix="v5p", maxtext_per_chip=2, devices_per_chip=1,
    hbm_gib=95.0, peak_bf16_tflops=459.0, threads_per_core=None, workload_policy=False,
    skus={"on-demand": (r"^TpuV5p running in ", "OnDemand"),
          "spot": (r"^TpuV5p attached to Spot (Preemptible )?VMs running in ", "Preemptible"),
          "flex-start": (r"^DWS Defined Duration (Tpu)?V5p running in ", "OnDemand")},
    skus_verified=False,
    on_demand_quota=("TPUS-PER-TPU-FAMILY-per-project-region", {"tpu_family": "CT5P"}),
    preemptible_quota=("PREEMPTIBLE-TPU-V5P-per-project-region", {}),
    autopilot=False, capacity_options=ALL_CAPACITY,
)

# TPU7x (Ironwood). tpu7x-standard-4t: 4 chips, 2 NICs, 2 NUMA nodes per VM
# [S18][S9][S1]; 3D topologies: 2x2x1 (one VM) .. 8x16x16 (Ray's list [S4];
# MaxText's keys [S5]). Multi-host pools need a workload policy (type
# HIGH_THROUGHPUT, --accelerator-topology), given to node-pools create as
# --placement-policy in place of --tpu-topology [S18][S2]; GKE Standard >=
# 1.34.0-gke.2201000 [S18]. Label tpu7x [S1][S7]; Ray TPU-V7X (Ray normalizes
# tpu7x-8 to v7x-8: the installed tpu.py) [S4]; TPU_ACCELERATOR_TYPE
# tpu7x-<TensorCores> (2 per chip) [S7][S9]; MaxText tpu7x-<TensorCores>,
# chip_config 'default': two JAX devices per chip [S5]. 192 GiB HBM and
# 2307 TFLOP/s bf16 per chip [S9] (Google's figures). NICs: 2 per VM [S18],
# but xpk gives tpu7x no accelerator network profile [S1] and no DRANET
# guide covers it: no DCN networks of the tutorial's (UNVERIFIED either way).
# No SKU found (SkyPilot's fetcher has none [S6]): no price from the catalog.
# Capacity: "To get access to TPU7x, contact your account team", reservations
# in All Capacity mode [S9][S20]; Spot and flex-start UNVERIFIED: refused.
TPU7X = Generation(
    name="tpu7x", title="TPU7x (Ironwood)", short="TPU7x", dims=3,
    machine_types={
        "tpu7x-standard-4t": MachineType(4, ("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8",
                                             "8x8x16", "8x16x16")),
    },
    accelerator_label="tpu7x", ray_accelerator_type="TPU-V7X",
    pod_type_prefix="tpu7x", cores_per_chip=2, maxtext_prefix="tpu7x", maxtext_per_chip=2, devices_per_chip=2,
    hbm_gib=192.0, peak_bf16_tflops=2307.0, threads_per_core=None, workload_policy=True,
    skus={}, skus_verified=False,
    on_demand_quota=("TPUS-PER-TPU-FAMILY-per-project-region", {"tpu_family": "TPU7X"}),
    preemptible_quota=("PREEMPTIBLE-TPU7X-per-project-region", {}),
    autopilot=False, capacity_options=("on-demand", "reservation"),
)

GENERATIONS: dict[str, Generation] = {g.name: g for g in (V6E, V5E, V5P, TPU7X)}
DEFAULT = V6E.name


def of_machine_type(machine_type: str) -> Generation | None:
    return next((g for g in GENERATIONS.values() if machine_type in g.machine_types), None)


def generation(env: Mapping) -> Generation:
    """The environment's generation (its `tpu` key; on GKE derived from
    machine_type)."""
    return GENERATIONS[env.get("tpu") or DEFAULT]


def machine_type_list() -> str:
    return "; ".join(f"{g.name}: {', '.join(g.machine_types)}" for g in GENERATIONS.values())


# -- topology arithmetic ---------------------------------------------------------------
_TOPOLOGY = re.compile(r"^[1-9][0-9]{0,2}x[1-9][0-9]{0,2}$")
_TOPOLOGY_3D = re.compile(r"^[1-9][0-9]{0,2}x[1-9][0-9]{0,2}x[1-9][0-9]{0,2}$")


def chips(topology: str) -> int:
    """Chips of a topology such as 4x4 or 2x2x2 (the topology rule ran first)."""
    n = 1
    for d in topology.split("x"):
        n *= int(d)
    return n


def topology_problem(v: str, gen: Generation = V6E) -> str | None:
    """Why ``v`` is not a topology of ``gen`` at all (before any machine type)."""
    valid = f"{gen.name} slices are: {', '.join(gen.topologies)}"
    shaped = _TOPOLOGY_3D.match(v) if gen.dims == 3 else _TOPOLOGY.match(v)
    if not shaped:
        if gen.dims == 2 and _TOPOLOGY_3D.match(v):
            return f"is a 3D topology; {gen.title} slices are 2D, like 4x4 ({valid})"
        if gen.dims == 3 and _TOPOLOGY.match(v):
            return f"is a 2D topology; {gen.title} slices are 3D, like 2x2x2 ({valid})"
        return f"is not a topology like {gen.example()} ({valid})"
    if v not in gen.topologies:
        return f"is not a {gen.title} topology ({valid})"
    return None


def machine_topology_problem(v: str, gen: Generation, machine_type: str) -> str | None:
    """Why machine type ``machine_type`` (of ``gen``) cannot form topology ``v``."""
    mt = gen.machine_types.get(machine_type)
    if mt is not None and v not in mt.topologies:
        return f"cannot be formed by machine type {machine_type!r} (it forms: {', '.join(mt.topologies)})"
    return None


def local_chips_per_host(gen: Generation) -> tuple[int, ...]:
    """The chips a VM of ``gen`` can have: what a simulated host may have."""
    return tuple(sorted({m.chips for m in gen.machine_types.values()}))


def default_chips_per_host(env: Mapping) -> int:
    gen = generation(env)
    if platform(env).simulated:
        # Ray's rule (get_chips_per_host): v5e/v6e single-host topologies
        # (<= 8 chips) are one VM; every other slice has 4 chips per VM.
        n = chips(env["topology"])
        return n if gen.dims == 2 and n <= 8 else 4
    return gen.machine_types[env["machine_type"]].chips


def hosts_per_slice(env: Mapping) -> int:
    return max(1, chips(env["topology"]) // env["chips_per_host"])


def dcn_networks(env: Mapping) -> bool:
    """Whether this environment's TPU VMs get the tutorial's two DCN
    networks and DRANET's two-netdev claim: GKE Standard on a machine type
    with the two NICs (Autopilot: GKE makes its own)."""
    gen = generation(env)
    mt = gen.machine_types.get(env.get("machine_type", ""))
    mode = cluster_mode(env)
    return mode is not None and mode.our_networks and mt is not None and mt.dcn_nics
