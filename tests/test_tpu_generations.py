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

from playbooks.cloud import prices as P
from playbooks.config.tpu import GENERATIONS, chips
from playbooks.job.fit import hbm_of
from playbooks.runs.train_summary import Summary
from tests.conftest import ROOT

GENS = list(GENERATIONS.values())
IDS = [g.name for g in GENS]


@pytest.mark.parametrize("gen", GENS, ids=IDS)
def test_every_topology_is_one_maxtext_compiles_for_with_the_records_device_count(gen):
    """compile_topology=<key>: MaxText's own table has the key, for that
    topology, with chips x devices_per_chip devices (megacore v5p: one a
    chip; TPU7x: two)."""
    for top in gen.topologies:
        key = gen.compile_topology(top)
        assert key in MAXTEXT, key
        spec = MAXTEXT[key]
        assert spec.topology_name.split(":")[1] == top, (key, spec.topology_name)
        assert spec.devices_per_slice == chips(top) * gen.devices_per_chip, key


@pytest.mark.parametrize("gen", GENS, ids=IDS)
def test_ray_knows_the_generation_its_topologies_and_its_cores_per_chip(gen):
    """TPU_ACCELERATOR_TYPE and the Ray accelerator type as Ray 2.60 reads
    them (its prefix normalized: tpu7x-8 -> v7x-8)."""
    for top in gen.topologies:
        pod = gen.pod_type(top)
        assert ray_tpu.TPUAcceleratorManager.is_valid_tpu_accelerator_type(pod), pod
        version = ray_tpu.normalize_tpu_accelerator_type(pod).split("-")[0]
        assert top in ray_tpu.VALID_TPU_TOPOLOGY[version], (pod, top)
        assert ray_tpu.get_tpu_cores_per_chip(ray_tpu.normalize_tpu_accelerator_type(pod)) == gen.cores_per_chip
    assert ray_tpu.normalize_tpu_accelerator_type(gen.ray_accelerator_type) == version


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


@pytest.mark.parametrize("name,description,usage,option", [
    ("v6e", "TpuV6e running in Columbus", "OnDemand", "on-demand"),
    ("v5e", "TpuV5e running in Columbus", "OnDemand", "on-demand"),
    ("v5e", "TpuV5e attached to Spot Preemptible VMs running in Columbus", "Preemptible", "spot"),
    ("v5p", "TpuV5p running in Columbus", "OnDemand", "on-demand"),
    ("v5p", "TpuV6e running in Columbus", "OnDemand", None),   # another generation's SKU: never its price
    ("v6e", "TpuV5p running in Columbus", "OnDemand", None),
    ("tpu7x", "Tpu7x running in Columbus", "OnDemand", None),  # no SKU known: no price, never a guess
])
def test_each_generation_prices_only_its_own_skus(name, description, usage, option):
    sku = {"description": description, "category": {"usageType": usage}}
    assert P.option_of(sku, GENERATIONS[name]) == option


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
