"""TPU generations, one record each (v5e, v5p, v6e, TPU7x), and the
topology arithmetic every play reads from them: chips, hosts per slice, the
names GKE, Ray and MaxText give a slice.

Every value carries its source: each record's ``sources`` names, value by
value, where it comes from, or says "unverified" and why (the table in
docs/tpu-generations.md is rendered from them: ``sources_table``). The keys
[S1]..[S33] are that page's list of sources; the ones cited most:
[S1] xpk src/xpk/core/system_characteristics.py @367c838; [S4b] the
installed ray/_private/accelerators/tpu.py (Ray 2.60); [S5] MaxText's
utils/accelerator_to_spec_map.py (the installed one); [S7] the GKE TPU
device plugin's TestInitEnvs; [S8]-[S12] the Cloud TPU pages of v6e, TPU7x,
v5e, v5p; [S16] GKE's DRANET page; [S18] GKE's concepts/tpu-ironwood;
[S22] the KubeRay TPU webhook; [S26]-[S28] Billing Catalog answers as
others captured them; [S29] the tutorial itself.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from playbooks.config.choices import cluster_mode, platform

# -- the records ------------------------------------------------------------------

# What each record's ``sources`` covers, one entry per value (or group of values).
SOURCED = ("machine_types", "shapes", "ray", "accelerator_label", "ray_accelerator_type", "pod_type", "maxtext",
           "hbm_gib", "peak_bf16_tflops", "threads_per_core", "workload_policy", "dcn_nics", "pod_layout", "skus",
           "quotas", "capacity_options", "autopilot")


@dataclass(frozen=True)
class MachineType:
    """A GKE TPU machine type: its chips per VM, the slice shapes GKE lists
    for it, and whether its VM takes the tutorial's two DCN networks
    (GKE's DRANET page lists it: DRANET ``two-netdev``). ``cubes``: 3D
    generations also take any AxBxC of whole 4x4x4 cubes (A <= B <= C, each
    a multiple of 4) up to that many cubes."""

    chips: int
    topologies: tuple[str, ...]
    dcn_nics: bool = False
    memory_gb: int | None = None   # the VM's memory, where a pod's 200G would not fit
    cubes: int = 0

    def forms(self, topology: str) -> bool:
        return topology in self.topologies or (self.cubes > 0 and cube_shape(topology, self.cubes))


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
    ray_version: str               # Ray's key of its TPU tables (normalize_tpu_accelerator_type)
    ray_topologies: frozenset[str]  # Ray's VALID_TPU_TOPOLOGY[ray_version]: the shapes Ray Train reserves
    ray_single_host: tuple[str, ...]  # shapes Ray takes for one host of all their chips (get_chips_per_host)
    pod_type_prefix: str           # TPU_ACCELERATOR_TYPE = <prefix>-<chips x cores_per_chip>
    cores_per_chip: int            # TensorCores per chip (what TPU_ACCELERATOR_TYPE counts)
    maxtext_prefix: str            # MaxText's compile_topology = <prefix>-<chips x maxtext_per_chip>
    maxtext_per_chip: int
    devices_per_chip: int          # JAX devices per chip (MaxText's devices_per_slice / chips)
    hbm_gib: float                 # HBM per chip the runtime reports (the fit's default)
    peak_bf16_tflops: float        # per chip, for MFU
    threads_per_core: int | None   # node-pools create --threads-per-core (None: not passed)
    workload_policy: bool          # multi-host pools need a HIGH_THROUGHPUT workload policy
    numa_nodes: int                # NUMA nodes per VM
    pod_containers: int            # containers a TPU worker pod runs (each with all the VM's chips / this)
    skus: Mapping[str, tuple[str, str]]  # capacity option -> (description regex, usageType)
    sku_family: str                # a regex the generation's every SKU description holds
    unpriced: Mapping[str, str]    # capacity option -> why its known SKU is not priced
    on_demand_quota: tuple[str, Mapping[str, str]]
    preemptible_quota: tuple[str, Mapping[str, str]]
    autopilot: bool                # this project's Autopilot path (DRANET profile auto) takes it
    capacity_options: tuple[str, ...]
    sources: Mapping[str, str]     # each of SOURCED: where it comes from, or "unverified: why"
    topologies: tuple[str, ...] = field(default=(), init=False)

    def __post_init__(self) -> None:
        # Read-only all through: a record is shared by every environment.
        for name in ("machine_types", "skus", "unpriced", "sources"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))
        tops = tuple(dict.fromkeys(t for m in self.machine_types.values()
                                   for t in (*m.topologies, *cube_shapes(m.cubes))))
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

    def spot_sku(self) -> tuple[str, str] | None:
        """The Spot option's SKU (description regex, usageType), if known."""
        return self.skus.get("spot")

    def unverified(self) -> list[str]:
        """The values (or parts of them) no source gives: their entry in
        ``sources`` says "unverified"."""
        return [k for k in SOURCED if "unverified" in self.sources[k]]


def cube_shape(topology: str, max_cubes: int) -> bool:
    """AxBxC of whole 4x4x4 cubes: A <= B <= C, each a multiple of 4, at
    most ``max_cubes`` cubes ([S1] generate_tpu_topologies)."""
    try:
        dims = [int(d) for d in topology.split("x")]
    except ValueError:
        return False
    return (len(dims) == 3 and all(d % 4 == 0 and d > 0 for d in dims) and dims == sorted(dims)
            and dims[0] * dims[1] * dims[2] // 64 <= max_cubes)


def cube_shapes(max_cubes: int) -> tuple[str, ...]:
    """Every shape of ``cube_shape``, smallest first."""
    out = [(a * b * c, f"{a}x{b}x{c}") for a in range(4, 257, 4) for b in range(a, 257, 4)
           for c in range(b, 257, 4) if a * b * c // 64 <= max_cubes]
    return tuple(t for _, t in sorted(out))


def ray_3d(max_x: int, max_y: int, max_z: int) -> frozenset[str]:
    """Ray's own rule for its larger 3D topologies (_get_larger_3d_topologies
    in [S4b]): every x, y, z a multiple of 4 up to its maximum, in any order,
    with the four small shapes."""
    big = {f"{x}x{y}x{z}" for x in range(4, max_x + 1, 4) for y in range(4, max_y + 1, 4)
           for z in range(4, max_z + 1, 4)}
    return frozenset({"2x2x1", "2x2x2", "2x2x4", "2x4x4"} | big)


ALL_CAPACITY = ("on-demand", "spot", "reservation", "flex-start")
# Ray 2.60's v5e and v6e tables [S4b]: VALID_TPU_TOPOLOGY and the shapes it
# takes for one host of all their chips (TPU_SINGLE_HOST_TOPOLOGIES, for the
# types of TPU_8_CHIPS_PER_HOST_TYPES: get_chips_per_host).
RAY_2D = frozenset({"1x1", "2x2", "2x4", "2x8", "4x4", "4x8", "8x8", "8x16", "16x16"})
RAY_SINGLE_HOST_2D = ("1x1", "2x2", "2x4")
# The Billing Catalog's usage types (its API documentation; [S26]).
ON_DEMAND, PREEMPTIBLE = "OnDemand", "Preemptible"
# Capacity: Spot ("GKE also supports Spot VMs and using reserved Cloud TPU",
# [S25], no generation excepted) and flex-start (GKE's flex-start page lists
# TPU zones and "TPU v3 and v4 are not supported" [S24]).
SPOT_FLEX = "spot [S25] (and its SKU [S26][S27]); flex-start [S24]; on-demand, reservation [S25]"

V6E = Generation(
    name="v6e", title="TPU v6e (Trillium)", short="TPU v6e", dims=2,
    machine_types={
        "ct6e-standard-1t": MachineType(1, ("1x1",), dcn_nics=True),
        "ct6e-standard-4t": MachineType(4, ("2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"), dcn_nics=True),
        "ct6e-standard-8t": MachineType(8, ("2x4",), dcn_nics=True),
    },
    accelerator_label="tpu-v6e-slice", ray_accelerator_type="TPU-V6E", ray_version="v6e",
    ray_topologies=RAY_2D, ray_single_host=RAY_SINGLE_HOST_2D,
    pod_type_prefix="v6e", cores_per_chip=1, maxtext_prefix="v6e", maxtext_per_chip=1, devices_per_chip=1,
    hbm_gib=31.24, peak_bf16_tflops=918.0, threads_per_core=1, workload_policy=False,
    numa_nodes=1, pod_containers=1,
    skus={"on-demand": (r"^TpuV6e running in ", ON_DEMAND),
          "spot": (r"^TpuV6e attached to Spot (Preemptible )?VMs running in ", PREEMPTIBLE),
          "flex-start": (r"^DWS Defined Duration (Tpu)?V6e running in ", ON_DEMAND)},
    sku_family=r"V6e\b", unpriced={},
    on_demand_quota=("TPUS-PER-TPU-FAMILY-per-project-region", {"tpu_family": "CT6E"}),
    preemptible_quota=("PREEMPTIBLE-TPU-V6E-per-project-region", {}),
    autopilot=True, capacity_options=ALL_CAPACITY,
    sources={
        "machine_types": "[S8]; 1, 4 and 8 chips per VM [S1]",
        "shapes": "[S8]: 1x1 (-1t), 2x2 (-4t, one VM), 2x4 (-8t, one VM; two -4t VMs 'only supported when "
                  "using the GKE API'), 4x4..16x16 (-4t); [S1] (-4t: 2x2, 2x4..16x16)",
        "ray": "[S4b] VALID_TPU_TOPOLOGY['v6e'], TPU_SINGLE_HOST_TOPOLOGIES",
        "accelerator_label": "[S1][S7]", "ray_accelerator_type": "[S4]", "pod_type": "[S7]", "maxtext": "[S5]",
        "hbm_gib": "31.24: the AOT compile's HBM line (the log in tests/test_preflight.py); Google: 32 GB [S8]",
        "peak_bf16_tflops": "[S8]",
        "threads_per_core": "the tutorial's node-pools create on ct6e-standard-4t [S29]; on -1t and -8t "
                            "unverified (passed as on -4t)",
        "workload_policy": "none: --tpu-topology [S29][S2]",
        "dcn_nics": "GKE's DRANET page lists ct6e-standard-1t, -4t, -8t [S16]; -4t 'backed by two physical "
                    "NICs' [S17]",
        "pod_layout": "one container with the VM's chips: the tutorial's RayCluster [S29]",
        "skus": "descriptions and usageType as catalog answers show them [S26][S27][S28]; SkyPilot matches "
                "'TpuV6e', 'Preemptible' [S6]",
        "quotas": "TPUS_PER_TPU_FAMILY (Google's v6e guide [S8]); the ids: third-party notes "
                  "(../shared/reference/capacity_autopilot.md §4)",
        "capacity_options": SPOT_FLEX,
        "autopilot": "this project's Autopilot path: the ComputeClass of [S16] on v6e",
    },
)

V5E = Generation(
    name="v5e", title="TPU v5e", short="TPU v5e", dims=2,
    machine_types={
        "ct5lp-hightpu-1t": MachineType(1, ("1x1",), memory_gb=48),
        "ct5lp-hightpu-4t": MachineType(4, ("2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"), memory_gb=192),
        "ct5lp-hightpu-8t": MachineType(8, ("2x4",)),
    },
    accelerator_label="tpu-v5-lite-podslice", ray_accelerator_type="TPU-V5LITEPOD", ray_version="v5litepod",
    ray_topologies=RAY_2D, ray_single_host=RAY_SINGLE_HOST_2D,
    pod_type_prefix="v5litepod", cores_per_chip=1, maxtext_prefix="v5e", maxtext_per_chip=1, devices_per_chip=1,
    hbm_gib=15.75, peak_bf16_tflops=197.0, threads_per_core=None, workload_policy=False,
    numa_nodes=1, pod_containers=1,
    skus={"on-demand": (r"^TpuV5e running in ", ON_DEMAND),
          "spot": (r"^TpuV5e attached to Spot (Preemptible )?VMs running in ", PREEMPTIBLE),
          "flex-start": (r"^DWS Defined Duration (Tpu)?V5e running in ", ON_DEMAND)},
    sku_family=r"V5e\b", unpriced={},
    on_demand_quota=("TPUS-PER-TPU-FAMILY-per-project-region", {"tpu_family": "CT5LP"}),
    preemptible_quota=("PREEMPTIBLE-TPU-LITE-PODSLICE-V5-per-project-region", {}),
    autopilot=False, capacity_options=ALL_CAPACITY,
    sources={
        "machine_types": "[S10]: 1, 4, 8 chips per VM, 48, 192, 384 GB of memory",
        "shapes": "[S10] (1x1..16x16; 2x4 on one -8t VM); [S1] (-4t: 2x4 on two VMs, 4x4..16x16); 2x2 on a "
                  "-4t is single-host [S13]",
        "ray": "[S4b] VALID_TPU_TOPOLOGY['v5litepod'], TPU_SINGLE_HOST_TOPOLOGIES",
        "accelerator_label": "[S1][S7]", "ray_accelerator_type": "[S4]", "pod_type": "[S7][S4]",
        "maxtext": "[S5] (v5e-<chips>, not v5litepod)",
        "hbm_gib": "measured: bench/data/tpu_chip_v5e.json (16,909,336,064 bytes); Google: 16 GB [S10]",
        "peak_bf16_tflops": "[S10] (measured 184.6 of it: bench/data/tpu_chip_v5e.json)",
        "threads_per_core": "not passed: the tutorial's flag is for ct6e-standard-4t [S29]",
        "workload_policy": "none: --tpu-topology [S2]",
        "dcn_nics": "not on GKE's DRANET page's list [S16]: no DCN networks of the tutorial's",
        "pod_layout": "one container with the VM's chips, as KubeRay's webhook counts hosts [S22]",
        "skus": "on-demand 'TpuV5e running in Delhi' (OnDemand), spot 'TpuV5e attached to Spot Preemptible VMs "
                "running in Singapore' (Preemptible) [S26]; 'TpuV5e running in Americas' [S28]; flex-start "
                "'DWS Defined Duration V5e' [S27] (its usageType and 'running in': unverified)",
        "quotas": "unverified: ids following v6e's naming (an id Cloud Quotas does not know is 'not checked')",
        "capacity_options": SPOT_FLEX,
        "autopilot": "not this project's Autopilot path: v5e is not on GKE's DRANET page [S16]",
    },
)

V5P = Generation(
    name="v5p", title="TPU v5p", short="TPU v5p", dims=3,
    machine_types={
        "ct5p-hightpu-4t": MachineType(4, ("2x2x1", "2x2x2", "2x2x4", "2x4x4"), cubes=96),
    },
    accelerator_label="tpu-v5p-slice", ray_accelerator_type="TPU-V5P", ray_version="v5p",
    ray_topologies=ray_3d(16, 16, 24), ray_single_host=(),
    pod_type_prefix="v5p", cores_per_chip=2, maxtext_prefix="v5p", maxtext_per_chip=2, devices_per_chip=1,
    hbm_gib=95.0, peak_bf16_tflops=459.0, threads_per_core=None, workload_policy=False,
    numa_nodes=1, pod_containers=1,
    skus={"on-demand": (r"^TpuV5p running in ", ON_DEMAND),
          "spot": (r"^TpuV5p attached to Spot (Preemptible )?VMs running in ", PREEMPTIBLE),
          "flex-start": (r"^DWS Defined Duration (Tpu)?V5p running in ", ON_DEMAND)},
    sku_family=r"V5p\b", unpriced={},
    on_demand_quota=("TPUS-PER-TPU-FAMILY-per-project-region", {"tpu_family": "CT5P"}),
    preemptible_quota=("PREEMPTIBLE-TPU-V5P-per-project-region", {}),
    autopilot=False, capacity_options=ALL_CAPACITY,
    sources={
        "machine_types": "[S11][S12]: 4 chips per VM",
        "shapes": "2x2x1 (one VM), 2x2x2, 2x2x4, 2x4x4, then AxBxC of whole 4x4x4 cubes, A <= B <= C [S1]; "
                  "at most 96 cubes: 'The maximum v5p shape is 16x16x24 (6144 chips, 96 cubes)' [S11] (xpk "
                  "allows 140 [S1]); GKE's own table [S32]: not read",
        "ray": "[S4b] VALID_TPU_TOPOLOGY['v5p'] (_get_larger_3d_topologies(16, 16, 24))",
        "accelerator_label": "[S1][S7]", "ray_accelerator_type": "[S4]", "pod_type": "[S7][S11]",
        "maxtext": "[S5] ('megacore': one JAX device a chip)",
        "hbm_gib": "Google's 95 GiB [S12]; what the runtime reports: unverified", "peak_bf16_tflops": "[S12]",
        "threads_per_core": "not passed: the tutorial's flag is for ct6e-standard-4t [S29]",
        "workload_policy": "none: --tpu-topology [S2]",
        "dcn_nics": "not on GKE's DRANET page's list [S16]: no DCN networks of the tutorial's",
        "pod_layout": "one container with the VM's chips, as KubeRay's webhook counts hosts [S22]",
        "skus": "on-demand 'TpuV5p running in Sao Paulo' (OnDemand) [S26]; spot 'TpuV5p attached to Spot "
                "Preemptible VMs', flex-start 'DWS Defined Duration V5p' [S27] (their usageType and "
                "'running in': unverified)",
        "quotas": "unverified: ids following v6e's naming (an id Cloud Quotas does not know is 'not checked')",
        "capacity_options": SPOT_FLEX,
        "autopilot": "not this project's Autopilot path: v5p is not on GKE's DRANET page [S16]",
    },
)

TPU7X = Generation(
    name="tpu7x", title="TPU7x (Ironwood)", short="TPU7x", dims=3,
    machine_types={
        "tpu7x-standard-4t": MachineType(4, ("2x2x1", "2x2x2", "2x2x4", "2x4x4"), dcn_nics=True, cubes=144),
    },
    accelerator_label="tpu7x", ray_accelerator_type="TPU-V7X", ray_version="v7x",
    ray_topologies=frozenset({"2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8", "8x8x16",
                              "8x16x16"}), ray_single_host=(),
    pod_type_prefix="tpu7x", cores_per_chip=2, maxtext_prefix="tpu7x", maxtext_per_chip=2, devices_per_chip=2,
    hbm_gib=192.0, peak_bf16_tflops=2307.0, threads_per_core=None, workload_policy=True,
    numa_nodes=2, pod_containers=1,
    skus={}, sku_family=r"TPU7x\b",
    unpriced={"on-demand": "its SKU 'TPU7x running in Americas' (OnDemand, one SKU for us-west1, us-central1 and "
                           "us-east1) is priced per hour without saying whether of a chip or of a 4-chip VM "
                           "(docs/tpu-generations.md [S26] [S28])"},
    on_demand_quota=("TPUS-PER-TPU-FAMILY-per-project-region", {"tpu_family": "TPU7X"}),
    preemptible_quota=("PREEMPTIBLE-TPU7X-per-project-region", {}),
    autopilot=False, capacity_options=ALL_CAPACITY,
    sources={
        "machine_types": "tpu7x-standard-4t: 4 chips, 2 NICs, 2 NUMA nodes per VM [S18][S9][S1]",
        "shapes": "2x2x1 (one VM), 2x2x2, 2x2x4, 2x4x4, then AxBxC of whole 4x4x4 cubes, A <= B <= C, at most "
                  "144 [S1]; GKE's own table [S32]: not read",
        "ray": "[S4b] VALID_TPU_TOPOLOGY['v7x']; Ray normalizes tpu7x-8 to v7x-8",
        "accelerator_label": "[S1][S7]", "ray_accelerator_type": "[S4c]", "pod_type": "[S7][S9]",
        "maxtext": "[S5] (chip_config 'default': two JAX devices a chip)",
        "hbm_gib": "Google's 192 GiB [S9]; what the runtime reports: unverified", "peak_bf16_tflops": "[S9]",
        "threads_per_core": "not passed: the tutorial's flag is for ct6e-standard-4t [S29]",
        "workload_policy": "HIGH_THROUGHPUT, --placement-policy in place of --tpu-topology [S18][S2]",
        "dcn_nics": "GKE's DRANET page lists tpu7x-standard-4t [S16]; 2 NICs a VM [S18]; that the tutorial's "
                    "two-netdev claim takes both: unverified (not run)",
        "pod_layout": "one container with the VM's 4 chips across its 2 NUMA nodes: GKE 'lets you' run one "
                      "container per NUMA node [S18] and xpk does (parallel_containers=2, optional) [S1][S30], "
                      "but KubeRay's webhook takes one TPU container's google.com/tpu as a host's chips [S22]",
        "skus": "on-demand 'TPU7x running in Americas' (OnDemand) [S26], not priced (unit unclear [S28]); "
                "spot, flex-start: no SKU found",
        "quotas": "unverified: ids following v6e's naming (an id Cloud Quotas does not know is 'not checked')",
        "capacity_options": "reservation, on-demand [S9][S25]; flex-start: xpk's TPU7x flex-start recipe [S23] "
                            "(GKE's flex-start page [S24] names no TPU7x zone); spot [S25], a TPU7x Spot pool "
                            "reported [S31]",
        "autopilot": "not this project's Autopilot path: its ComputeClass (manifests/compute-class.tpu-dranet.yaml) "
                     "is v6e's; GKE's Autopilot takes TPU7x from 1.34.1-gke.3084001 [S18]",
    },
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


def sources_table() -> str:
    """Where each value of each record comes from, as docs/tpu-generations.md shows it."""
    gens = list(GENERATIONS.values())
    rows = ["| value | " + " | ".join(g.short for g in gens) + " |", "| --- |" + " --- |" * len(gens)]
    rows += [f"| {k} | " + " | ".join(g.sources[k].replace("|", "/") for g in gens) + " |" for k in SOURCED]
    return "\n".join(rows)


# -- topology arithmetic ---------------------------------------------------------------
_TOPOLOGY = re.compile(r"^[1-9][0-9]{0,2}x[1-9][0-9]{0,2}$")
_TOPOLOGY_3D = re.compile(r"^[1-9][0-9]{0,2}x[1-9][0-9]{0,2}x[1-9][0-9]{0,2}$")


def chips(topology: str) -> int:
    """Chips of a topology such as 4x4 or 2x2x2 (the topology rule ran first)."""
    n = 1
    for d in topology.split("x"):
        n *= int(d)
    return n


def shapes_text(gen: Generation) -> str:
    """The shapes a generation's slices may have, in words (the 3D rule
    in one clause, not its hundreds of shapes)."""
    listed = list(dict.fromkeys(t for m in gen.machine_types.values() for t in m.topologies))
    cubes = max((m.cubes for m in gen.machine_types.values()), default=0)
    rule = (f", then AxBxC of whole 4x4x4 cubes (A <= B <= C, each a multiple of 4) up to {cubes} cubes"
            if cubes else "")
    return f"{gen.name} slices are: {', '.join(listed)}{rule}"


def topology_problem(v: str, gen: Generation = V6E) -> str | None:
    """Why ``v`` is not a slice shape of ``gen`` that GKE allows (before any
    machine type)."""
    valid = shapes_text(gen)
    shaped = _TOPOLOGY_3D.match(v) if gen.dims == 3 else _TOPOLOGY.match(v)
    if not shaped:
        if gen.dims == 2 and _TOPOLOGY_3D.match(v):
            return f"is a 3D topology; {gen.title} slices are 2D, like 4x4 ({valid})"
        if gen.dims == 3 and _TOPOLOGY.match(v):
            return f"is a 2D topology; {gen.title} slices are 3D, like 2x2x2 ({valid})"
        return f"is not a topology like {gen.example()} ({valid})"
    if not any(m.forms(v) for m in gen.machine_types.values()):
        return f"is not a {gen.title} topology ({valid})"
    return None


def machine_topology_problem(v: str, gen: Generation, machine_type: str) -> str | None:
    """Why machine type ``machine_type`` (of ``gen``) cannot form topology ``v``."""
    mt = gen.machine_types.get(machine_type)
    if mt is not None and not mt.forms(v):
        return f"cannot be formed by machine type {machine_type!r} (it forms: {', '.join(mt.topologies)})"
    return None


RAY_TPU = "ray/_private/accelerators/tpu.py"


def ray_topology_problem(v: str, gen: Generation) -> str | None:
    """Why Ray Train cannot reserve a slice of shape ``v`` that GKE allows:
    Ray's table of the generation's shapes does not have it [S4b]."""
    if v in gen.ray_topologies:
        return None
    return (f"is a {gen.title} slice GKE allows, but Ray cannot take it: Ray's VALID_TPU_TOPOLOGY"
            f"[{gen.ray_version!r}] ({RAY_TPU}) does not list it, so Ray Train reserves no slice of it")


def ray_hosts_problem(v: str, gen: Generation, chips_per_host: int, lead: str) -> str | None:
    """Why Ray cannot take ``v`` on hosts of ``chips_per_host`` chips: Ray
    takes every slice of that shape for one host of all its chips
    (get_chips_per_host, TPU_SINGLE_HOST_TOPOLOGIES [S4b]), so it would
    reserve no slice of ``chips(v) // chips_per_host`` hosts."""
    if v not in gen.ray_single_host or chips(v) <= chips_per_host:
        return None
    whole = next((m for m, t in gen.machine_types.items() if t.chips == chips(v) and v in t.topologies), None)
    use = f": use machine type {whole}, one VM of {chips(v)} chips" if whole else ""
    return (f"{lead} {chips(v) // chips_per_host} hosts of {chips_per_host} chips, which GKE allows, but "
            f"Ray takes every {gen.name} {v} for one host of {chips(v)} chips (get_chips_per_host, "
            f"TPU_SINGLE_HOST_TOPOLOGIES in {RAY_TPU}) and reserves no slice of it{use}")


def inventory_shapes(gen: Generation) -> tuple[str, ...]:
    """The shapes an environment of ``gen`` may have: GKE allows them on
    one of its machine types and Ray can take them there."""
    return tuple(t for t in gen.topologies if ray_topology_problem(t, gen) is None and any(
        m.forms(t) and ray_hosts_problem(t, gen, m.chips, "") is None for m in gen.machine_types.values()))


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
