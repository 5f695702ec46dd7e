"""Each TPU generation's record (playbooks/config/tpu.py) against what the
installed tools and a real chip say: Ray's TPU types and topologies, MaxText's
compile_topology keys, the v5e chip measured by bench/tpu_chip.py; and what
the plays read of it (pool names, prices, the MFU line)."""
from __future__ import annotations

import json
import re

import pytest
from maxtext.utils.accelerator_to_spec_map import UserFacingNameToSystemCharacteristics as MAXTEXT
from ray._private.accelerators import tpu as ray_tpu

from playbooks.cloud import manifests
from playbooks.cloud import prices as P
from playbooks.config.tpu import (
    GENERATIONS,
    SOURCED,
    chips,
    dcn_networks,
    inventory_shapes,
    of_machine_type,
    ray_hosts_problem,
    ray_topology_problem,
    sources_table,
)
from playbooks.job.fit import hbm_of
from playbooks.runs.train_summary import Summary
from tests.conftest import ROOT, env

GENS = list(GENERATIONS.values())
IDS = [g.name for g in GENS]


@pytest.mark.parametrize("gen", GENS, ids=IDS)
def test_every_shape_the_inventory_takes_is_one_maxtext_compiles_for_with_the_records_device_count(gen):
    """compile_topology=<key>: MaxText's own table has the key, with chips x
    devices_per_chip devices (megacore v5p: one a chip; TPU7x: two), and
    names that very shape where it is the one MaxText keeps for that many
    chips (v5p 4x4x16 compiles as v5p-512, MaxText's 4x8x8: the same chips)."""
    exact = 0
    for top in inventory_shapes(gen):
        key = gen.compile_topology(top)
        assert key in MAXTEXT, key
        spec = MAXTEXT[key]
        assert spec.devices_per_slice == chips(top) * gen.devices_per_chip, key
        assert chips(spec.topology_name.split(":")[1]) == chips(top), (key, spec.topology_name)
        exact += spec.topology_name.split(":")[1] == top
    assert exact >= 8, exact  # every shape the records listed before the 3D rule is MaxText's own


@pytest.mark.parametrize("gen", GENS, ids=IDS)
def test_ray_knows_the_generation_its_topologies_and_its_cores_per_chip(gen):
    """TPU_ACCELERATOR_TYPE and the Ray accelerator type as Ray 2.60 reads
    them (its prefix normalized: tpu7x-8 -> v7x-8), for every shape the
    inventory takes."""
    for top in inventory_shapes(gen):
        pod = gen.pod_type(top)
        assert ray_tpu.TPUAcceleratorManager.is_valid_tpu_accelerator_type(pod), pod
        version = ray_tpu.normalize_tpu_accelerator_type(pod).split("-")[0]
        assert top in ray_tpu.VALID_TPU_TOPOLOGY[version], (pod, top)
        assert ray_tpu.get_tpu_cores_per_chip(ray_tpu.normalize_tpu_accelerator_type(pod)) == gen.cores_per_chip
    assert ray_tpu.normalize_tpu_accelerator_type(gen.ray_accelerator_type) == version == gen.ray_version


@pytest.mark.parametrize("gen", GENS, ids=IDS)
def test_the_records_ray_tables_are_the_installed_rays(gen):
    """What the records refuse in Ray's name is Ray's: its table of shapes,
    and the shapes it takes for one host of all their chips."""
    assert gen.ray_topologies == ray_tpu.VALID_TPU_TOPOLOGY[gen.ray_version]
    single = ray_tpu.TPU_SINGLE_HOST_TOPOLOGIES if gen.ray_version in ray_tpu.TPU_8_CHIPS_PER_HOST_TYPES else ()
    assert gen.ray_single_host == tuple(single)
    for top in gen.topologies:
        hosts_per_ray = chips(top) // ray_tpu.get_chips_per_host(top, gen.ray_version)
        for mt in gen.machine_types.values():
            if mt.forms(top) and ray_hosts_problem(top, gen, mt.chips, "") is None and chips(top) >= mt.chips:
                assert max(1, hosts_per_ray) == chips(top) // mt.chips, (top, mt)


# Slice shapes GKE allows, per machine type, as the records' sources give
# them ([S8] [S10] [S11] [S1]); the 3D rule: AxBxC of whole 4x4x4 cubes,
# A <= B <= C, each a multiple of 4.
SHAPES = [
    ("ct6e-standard-4t", "2x4", True), ("ct5lp-hightpu-4t", "2x4", True),   # two 4-chip VMs
    ("ct6e-standard-8t", "2x4", True), ("ct5lp-hightpu-8t", "2x4", True),   # one 8-chip VM
    ("ct6e-standard-1t", "2x4", False), ("ct6e-standard-4t", "2x8", False),  # 2x8: Ray's, not GKE's
    ("ct5p-hightpu-4t", "4x4x12", True), ("ct5p-hightpu-4t", "4x12x20", True), ("ct5p-hightpu-4t", "16x16x24", True),
    ("ct5p-hightpu-4t", "16x16x28", False),  # 112 cubes: over v5p's 96 (16x16x24)
    ("ct5p-hightpu-4t", "4x8x4", False), ("ct5p-hightpu-4t", "4x6x8", False), ("ct5p-hightpu-4t", "2x4x8", False),
    ("tpu7x-standard-4t", "4x4x12", True), ("tpu7x-standard-4t", "16x24x24", True),  # 144 cubes
    ("tpu7x-standard-4t", "16x24x28", False), ("tpu7x-standard-4t", "2x2x1", True),
]


@pytest.mark.parametrize("machine_type,top,allowed", SHAPES)
def test_the_slice_shapes_gke_allows_on_each_machine_type(machine_type, top, allowed):
    gen = of_machine_type(machine_type)
    assert gen is not None and gen.machine_types[machine_type].forms(top) is allowed
    assert (top in gen.topologies) is (allowed or any(m.forms(top) for m in gen.machine_types.values()))


@pytest.mark.parametrize("gen,top,chips_per_host,words", [
    (GENERATIONS["v6e"], "2x4", 4, "Ray takes every v6e 2x4 for one host of 8 chips"),
    (GENERATIONS["v5e"], "2x4", 4, "Ray takes every v5e 2x4 for one host of 8 chips"),
    (GENERATIONS["v5p"], "4x4x28", 4, "VALID_TPU_TOPOLOGY['v5p']"),
    (GENERATIONS["tpu7x"], "4x4x12", 4, "VALID_TPU_TOPOLOGY['v7x']"),
])
def test_a_shape_gke_allows_and_ray_cannot_take_is_refused_naming_rays_limit(gen, top, chips_per_host, words):
    """GKE allows it (the record's shapes); Ray cannot take it: on 4-chip
    VMs Ray's own arithmetic gives one 8-chip host for a v5e/v6e 2x4 (so
    SlicePlacementGroup reserves no slice), and a 3D shape outside Ray's
    table raises in SlicePlacementGroup._validate_tpu_config."""
    assert top in gen.topologies and (top not in inventory_shapes(gen) or top in gen.ray_single_host)
    why = ray_topology_problem(top, gen) or ray_hosts_problem(top, gen, chips_per_host, "is")
    assert why is not None and words in why and "ray/_private/accelerators/tpu.py" in why
    if top in gen.ray_topologies:
        assert ray_tpu.get_chips_per_host(top, gen.ray_version) == chips(top) != chips_per_host
    else:
        assert not ray_tpu.TPUAcceleratorManager.is_valid_tpu_accelerator_topology(gen.ray_version, top)


def test_every_value_of_every_record_names_its_source_or_says_unverified_and_the_docs_show_it():
    """Each record's sources: one entry per value; a citation (a source key
    of docs/tpu-generations.md, a URL, a file) or "unverified"; the page's
    table is the records' own, and lists every source key cited."""
    page = (ROOT / "docs" / "tpu-generations.md").read_text()
    assert sources_table() in page
    cited = set()
    for gen in GENS:
        assert tuple(gen.sources) == SOURCED, gen.name
        for k, text in gen.sources.items():
            keys = re.findall(r"\[(S\d+\w?)\]", text)
            cited.update(keys)
            assert keys or "unverified" in text or re.search(r"https?://|\.(py|json|md|txt)\b", text), (gen.name, k)
    assert all(f"- [{k}]" in page for k in cited), sorted(k for k in cited if f"- [{k}]" not in page)
    assert {g.name: g.unverified() for g in GENS}["v5e"] == ["skus", "quotas"]


# GKE's DRANET page: "Supported TPU machine types: ct6e-standard-1t,
# ct6e-standard-4t, ct6e-standard-8t and tpu7x-standard-4t" (its stored copy
# of 2026-04-10, as ../shared/reference/capacity_autopilot.md §2 quotes it) [S16].
DRANET_TPU_MACHINE_TYPES = {"ct6e-standard-1t", "ct6e-standard-4t", "ct6e-standard-8t", "tpu7x-standard-4t"}


def test_the_tutorials_networks_go_to_the_machine_types_gkes_dranet_page_lists():
    with_nics = {name for g in GENS for name, mt in g.machine_types.items() if mt.dcn_nics}
    assert with_nics == DRANET_TPU_MACHINE_TYPES
    e = env("dev", machine_type="tpu7x-standard-4t", topology="2x2x2")
    assert dcn_networks(e)
    assert manifests.raycluster_manifest(e) == "manifests/ray-cluster.tpu-multi-slice.yaml"


def test_tpu7x_pods_run_one_container_with_all_the_vms_chips_as_kuberays_webhook_counts():
    """A TPU7x VM has two NUMA nodes [S18]; xpk runs one container per node
    [S1][S30]. Here one container takes the VM's 4 chips: KubeRay's TPU
    webhook [S22] counts a worker group's hosts as the topology's chips over
    one TPU container's google.com/tpu (getNumTPUHostsFromTopology) and
    refuses a group whose numOfHosts differs, so two 2-chip containers a pod
    would count twice the hosts there are."""
    tpu7x = GENERATIONS["tpu7x"]
    assert (tpu7x.numa_nodes, tpu7x.pod_containers) == (2, 1)
    assert "[S22]" in tpu7x.sources["pod_layout"] and "[S18]" in tpu7x.sources["pod_layout"]
    e = env("dev", machine_type="tpu7x-standard-4t", topology="2x2x2")
    group = manifests.worker_group(next(d for d in manifests.raycluster_docs(e) if d.get("kind") == "RayCluster"))
    tpu = [c for c in manifests.group_pod_spec(group)["containers"]
           if "google.com/tpu" in (c.get("resources") or {}).get("limits", {})]
    assert len(tpu) == tpu7x.pod_containers
    per_container = int(tpu[-1]["resources"]["limits"]["google.com/tpu"])  # the webhook reads the last
    assert max(1, chips(e.topology) // per_container) == group["numOfHosts"] == e.hosts_per_slice == 2


@pytest.mark.parametrize("gen", GENS, ids=IDS)
def test_each_generation_offers_spot_and_flex_start_as_gke_gives_them(gen):
    """Spot: "GKE also supports Spot VMs" for TPUs, no generation excepted
    [S25]; flex-start: GKE's flex-start page [S24] (TPU7x: xpk's own TPU7x
    flex-start recipe [S23]). Each offer is cited in the record."""
    assert gen.capacity_options == ("on-demand", "spot", "reservation", "flex-start")
    assert all(k in gen.sources["capacity_options"] for k in ("[S25]", "[S24]" if gen.name != "tpu7x" else "[S23]"))


def test_threads_per_core_is_the_tutorials_own_flag_on_its_machine_type():
    """--threads-per-core=1 is in the tutorial's node-pools create (its
    source, ../shared/seeds/000_be27905aeb5332c0.txt: [S29]); the record
    says so, and says the other v6e machine types take it unverified."""
    v6e = GENERATIONS["v6e"]
    assert v6e.threads_per_core == 1 and "[S29]" in v6e.sources["threads_per_core"]
    assert "unverified" in v6e.sources["threads_per_core"]
    assert all(g.threads_per_core is None for g in GENS if g is not v6e)
    page = (ROOT / "docs" / "tpu-generations.md").read_text()
    assert "- [S29] The tutorial: `../shared/seeds/000_be27905aeb5332c0.txt` line 111" in page
    assert "[S29]" in (ROOT / "playbooks" / "config" / "tutorial.py").read_text()
    seed = ROOT.parent / "shared" / "seeds" / "000_be27905aeb5332c0.txt"
    if not seed.exists():
        pytest.skip(f"the tutorial's source is not at {seed} (the workspace's shared/seeds)")
    line = seed.read_text().splitlines()[110]
    assert "--machine-type=ct6e-standard-4t" in line and "--threads-per-core=1" in line


def test_the_v5e_record_agrees_with_the_chip_measured():
    """bench/tpu_chip.py on a lent v5e: the HBM its runtime reports within 1%
    of the record's, and the bf16 rate reached below the record's peak."""
    chip = json.loads((ROOT / "bench" / "data" / "tpu_chip_v5e.json").read_text())
    v5e = GENERATIONS["v5e"]
    assert chip["device_kind"] == "TPU v5 lite" and chip["cores_per_chip"] == v5e.cores_per_chip
    assert abs(chip["hbm_bytes"] / 1024 ** 3 - v5e.hbm_gib) / v5e.hbm_gib < 0.01
    assert chip["tflops_reached"] < v5e.peak_bf16_tflops
    assert chip["tflops_reached"] > 0.8 * v5e.peak_bf16_tflops  # the peak is the chip's, not another's


def test_the_fit_reads_the_hbm_of_the_generation_compiled_for():
    assert hbm_of(["compile_topology=v6e-16"]) == 31.24
    assert hbm_of(["compile_topology=v5e-16"]) == GENERATIONS["v5e"].hbm_gib
    assert hbm_of(["compile_topology=v5p-32"]) == GENERATIONS["v5p"].hbm_gib
    assert hbm_of(["compile_topology=tpu7x-16"]) == GENERATIONS["tpu7x"].hbm_gib


# SKUs as Billing Catalog answers show them (docs/tpu-generations.md):
# [S26] a third-party fixture "captured live from the Cloud Billing Catalog
# API (service 6F81-5844-456A ...) on 2026-06-14"; [S28] a third-party test's
# SKUs. (generation, description, usageType, the option it prices, source)
CATALOG_ANSWERS = [
    ("v6e", "TpuV6e running in Dallas", "OnDemand", "on-demand", "S26"),
    ("v6e", "TpuV6e attached to Spot Preemptible VMs running in Americas", "Preemptible", "spot", "S28"),
    ("v5e", "TpuV5e running in Delhi", "OnDemand", "on-demand", "S26"),
    ("v5e", "TpuV5e running in Americas", "OnDemand", "on-demand", "S28"),
    ("v5e", "TpuV5e attached to Spot Preemptible VMs running in Singapore", "Preemptible", "spot", "S26"),
    ("v5p", "TpuV5p running in Sao Paulo", "OnDemand", "on-demand", "S26"),
    ("v5p", "Reserved TpuV5p in Delhi in Calendar Mode", "OnDemand", None, "S26"),
    ("v5p", "Commitment v1: TpuV5p running in Netherlands for 3 Years", "Commit3Yr", None, "S26"),
    ("tpu7x", "TPU7x running in Americas", "OnDemand", None, "S26"),  # known, not priced: its unit is unclear
    ("v5p", "TpuV6e running in Dallas", "OnDemand", None, "S26"),   # another generation's SKU: never its price
    ("v6e", "TpuV5p running in Sao Paulo", "OnDemand", None, "S26"),
]


@pytest.mark.parametrize("name,description,usage,option,source", CATALOG_ANSWERS)
def test_each_matcher_takes_the_sku_a_cited_catalog_answer_shows_and_no_other(name, description, usage, option,
                                                                             source):
    sku = {"skuId": "X", "description": description, "category": {"resourceGroup": "TPU", "usageType": usage}}
    gen = GENERATIONS[name]
    assert P.option_of(sku, gen) == option
    assert P.unmatched_spot(sku, gen) is None  # a SKU the record knows is never a Spot price gone missing
    if option is not None:
        assert f"[{source}]" in gen.sources["skus"]


def test_tpu7x_has_no_price_from_its_on_demand_sku_and_the_line_says_why():
    e = env("dev", machine_type="tpu7x-standard-4t", topology="2x2x2")
    p = P.price(e, "on-demand", None)
    assert p.per_chip_hour is None and not P.needs_catalog(e, ["on-demand"])
    assert p.why.startswith("TPU7x (Ironwood)'s on-demand SKU is not priced here: its SKU 'TPU7x running in "
                            "Americas'") and p.why.endswith("of a 4-chip VM (docs/tpu-generations.md [S26] [S28]): set "
                                                   "prices.on-demand")


@pytest.mark.parametrize("name,description,usage", [
    ("v6e", "TpuV6e Spot Preemptible running in Columbus", "Preemptible"),           # renamed
    ("v5p", "TpuV5p attached to Spot VMs running in Sao Paulo", "OnDemand"),          # its words say Spot
    ("v5e", "Preemptible TpuV5e running in Las Vegas", "Preemptible"),
])
def test_a_spot_sku_no_pattern_takes_is_named_and_the_spot_line_gives_it_never_a_silent_gap(name, description,
                                                                                          usage):
    """The spot description of a generation changes (or was never the one
    the record holds): the catalog names the SKU as a problem, and the spot
    price line says that is why there is none; on-demand keeps its price."""
    on_demand = {"skuId": "OD", "description": f"Tpu{name.capitalize()} running in Columbus",
                 "category": {"usageType": "OnDemand"}, "serviceRegions": ["us-east5"],
                 "pricingInfo": [{"pricingExpression": {"usageUnit": "h", "tieredRates": [
                     {"unitPrice": {"currencyCode": "USD", "units": "2", "nanos": 0}}]}}]}
    spot = {**on_demand, "skuId": "SP", "description": description, "category": {"usageType": usage}}
    catalog = P.Catalog(0.0, "https://cloudbilling.googleapis.com/", tpu=name)
    P.add_rates(catalog, [on_demand, spot])
    machine = {"v6e": "ct6e-standard-4t", "v5e": "ct5lp-hightpu-4t", "v5p": "ct5p-hightpu-4t"}[name]
    e = env("dev", machine_type=machine, topology=GENERATIONS[name].example(), region="us-east5", zone="us-east5-b")
    assert catalog.rates == {"on-demand": {"us-east5": 2.0}}
    assert len(catalog.problems) == 1 and f"SKU SP ({description}" in catalog.problems[0]
    assert f"is a {name} spot SKU by its" in catalog.problems[0]
    why = P.price(e, "spot", catalog).why
    assert f"has no {name} spot SKU in us-east5; SKU SP ({description}" in why, why
    assert P.price(e, "on-demand", catalog).per_chip_hour == 2.0


def test_a_tpu_run_says_its_mfu_and_a_local_one_says_simulated():
    event = {"kind": "step", "step": 5, "seconds": 1.0, "tflops_per_device": 91.8, "tokens_per_s_per_device": 1.0,
             "loss": 1.0}
    for chip, peak in (("v6e", 918), ("v5p", 459)):
        s = Summary(chip=chip)
        for i in range(6):
            s.add({**event, "step": i})
        assert s.mfu_line() == f"MFU: {100 * 91.8 / peak:.2f}% (91.8 TFLOP/s/device of a {chip} chip's {peak} bf16 peak)"
    s = Summary(chip="v5p", simulated=True)
    for i in range(6):
        s.add({**event, "step": i})
    assert s.mfu() is None
    assert re.fullmatch(r"MFU: simulated \(91\.8 TFLOP/s/device on this machine's CPU, standing in for v5p chips: "
                        r"no percent of a TPU peak it never had\)", s.mfu_line())
