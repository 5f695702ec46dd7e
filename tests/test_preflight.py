"""Preflight: each static rule violated once; the compile output read right;
an ahead-of-time compile of a small model that fits, one that does not (and
the smallest change that fits), and a cache hit."""
import json
import os
import re
import subprocess
import time

import pytest
import yaml

from playbooks.config.schema import Environment, load_inventory
from playbooks.job import fit as pf
from playbooks.job import spec as tr
from tests.conftest import INVOKE, ROOT, env

OOM_LINE = ("jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: Ran out of memory on HBM, "
            "the total memory required for HLO temporaries (49.82G) exceeds available HBM (31.24G). "
            "HLO module: jit_train_step.")
MEMORY_LINE = ("Memory analysis: CompiledMemoryStats(generated_code_size_in_bytes=183514624, "
               "argument_size_in_bytes=8820705792, output_size_in_bytes=8820382464, alias_size_in_bytes=8820378112, "
               "temp_size_in_bytes=26805193056, host_generated_code_size_in_bytes=0, "
               "host_argument_size_in_bytes=17640736256, host_output_size_in_bytes=17640736256, "
               "host_alias_size_in_bytes=17640736256, host_temp_size_in_bytes=0)")
TPU_LOG = """\
I1130 06:31:18.344219   17068 deepsea_compiler_backend.cc:2249] XLA::TPU program HBM usage: 21.54G / 31.24G
I1130 06:31:18.344243   17068 deepsea_compiler_backend.cc:2301] Total hbm usage >= 30.01G:
    reserved        264.01M
Total host usage >= 16.43G:
"""


def job(e, model="llama3-8b", sets=(), elastic=False):
    return tr.build_job(e, model, elastic, sets=list(sets))


def problems(e, j):
    return pf.static_checks(e, j)


# -- static rules ---------------------------------------------------------------------
def test_the_tutorials_jobs_pass_the_static_checks():
    for model in ("llama3-8b", "llama3-70b"):
        assert problems(env("dev"), job(env("dev"), model)) == []
    assert problems(env("local"), job(env("local"))) == []


def test_ici_product_must_be_the_chips_of_a_slice():
    p = problems(env("dev"), job(env("dev"), sets=["ici_tensor_parallelism=8"]))
    assert p == ["ICI parallelism (per slice, 16 chips in a 4x4 slice): ici_fsdp_parallelism=4 x "
                 "ici_tensor_parallelism=8 = 32, but there are 16: --set ici_fsdp_parallelism=2 matches"]


def test_dcn_product_must_be_the_slices():
    p = problems(env("dev"), job(env("dev"), "llama3-70b", sets=["dcn_fsdp_parallelism=4"]))
    assert p == ["DCN parallelism (across slices, 2 slices): dcn_fsdp_parallelism=4 = 4, but there are 2: "
                 "--set dcn_fsdp_parallelism=2 matches"]


def test_only_one_axis_may_be_filled():
    p = problems(env("dev"), job(env("dev"), sets=["ici_fsdp_parallelism=-1", "ici_data_parallelism=-1"]))
    assert p and "more than one axis is -1 (ici_data_parallelism, ici_fsdp_parallelism)" in p[0]


def test_a_filled_axis_must_divide():
    p = problems(env("dev"), job(env("dev"), sets=["ici_fsdp_parallelism=-1", "ici_tensor_parallelism=3"]))
    assert p[0] == ("ICI parallelism (per slice, 16 chips in a 4x4 slice): ici_tensor_parallelism=3 = 3 does not "
                    "divide the 16 to fill (ici_fsdp_parallelism=-1 gets the rest)")


def test_model_config_must_exist_in_the_pinned_maxtext():
    j = job(env("dev"))
    j.args = [(k, "llama9-1t" if k == "model_name" else v) for k, v in j.args]
    assert problems(env("dev"), j)[0].startswith("model config models/llama9-1t.yml is not in the pinned MaxText")


def test_hosts_times_chips_must_form_the_topology():
    e = Environment("dev", {**env("dev"), "hosts_per_slice": 2})   # what the inventory rules would refuse
    assert "hosts: 2 hosts x 4 chips = 8, but topology 4x4 has 16 chips" in problems(e, job(e))


def test_manifest_megascale_must_equal_the_replicas(tmp_path, monkeypatch):
    text = (ROOT / "manifests" / "ray-cluster.tpu-multi-slice.yaml").read_text()
    bad = tmp_path / "m.yaml"
    bad.write_text(text.replace('value: "${SLICES}"', 'value: "1"'))
    monkeypatch.setattr(pf.T, "RAYCLUSTER_MANIFEST", str(bad))
    assert "manifest: MEGASCALE_NUM_SLICES=1 but the worker group has 2 slice replicas" in\
        problems(env("dev"), job(env("dev")))


def test_heads_must_split_over_the_tensor_axis():
    e = env("local")
    p = problems(e, job(e, sets=["ici_tensor_parallelism=4", "ici_fsdp_parallelism=1", "base_num_kv_heads=3",
                                 "base_num_query_heads=6"]))
    assert "attention: 6 query heads do not split over ici_tensor_parallelism=4" in p
    assert "attention: 3 KV heads and ici_tensor_parallelism=4: neither divides the other" in p


def test_elastic_needs_a_dcn_that_follows_the_slices():
    with pytest.raises(Exception, match="dcn_fsdp_parallelism=2 fixes the slice count"):
        job(env("dev"), "llama3-70b", elastic=True)


# -- reading the compiler ---------------------------------------------------------------
def test_out_of_memory_is_read_with_its_numbers():
    f = pf.parse_compile("...\n" + OOM_LINE + "\n")
    assert (f.fits, f.needed, f.capacity) == (False, 49.82, 31.24)
    assert f.lines() == ["does NOT fit: its temporaries alone need 49.82 GiB per chip, the chip has 31.24 GiB of "
                         "HBM (short by 18.58 GiB)"]


def test_a_fit_is_read_from_the_stats_and_the_compilers_own_total():
    f = pf.parse_compile("Jitting and compilation complete!\n" + MEMORY_LINE, TPU_LOG)
    assert f.fits and round(f.arguments, 2) == 8.21 and round(f.temporaries, 2) == 24.96
    assert (f.total, f.capacity, f.host) == (30.01, 31.24, 16.43)
    assert round(f.margin, 2) == 1.23
    assert "total 30.01 GiB of 31.24 GiB HBM: margin 1.23 GiB (3.9%)" in " ".join(f.lines())


def test_another_failure_is_not_read_as_a_fit_or_an_oom():
    f = pf.parse_compile("E0000 unexpected worker hostname\nValueError: num_kv_heads (2) must be divisible by 4\n")
    assert not f.fits and f.needed is None and f.error == "ValueError: num_kv_heads (2) must be divisible by 4"


def test_the_70b_preset_is_the_proven_change():
    assert pf.PRESETS["llama3-70b"]["fits"] == (("per_device_batch_size", "1"),
                                                 ("optimizer_memory_host_offload", "true"))
    j = tr.build_job(env("dev"), "llama3-70b", preset="fits")
    assert dict(j.args)["per_device_batch_size"] == "1" and dict(j.args)["optimizer_memory_host_offload"] == "true"
    with pytest.raises(Exception, match="--preset 'fits' is not defined for llama3-8b"):
        tr.build_job(env("dev"), "llama3-8b", preset="fits")


# -- real AOT compiles (a tiny model; ~40 s each) --------------------------------------------
TINY = {"override_model_config": True, "base_emb_dim": 256, "base_num_query_heads": 4, "base_num_kv_heads": 4,
        "base_mlp_dim": 512, "base_num_decoder_layers": 2, "head_dim": 64, "vocab_size": 1024,
        "max_target_length": 128, "per_device_batch_size": 1}
GKE = {"kind": "gke", "mode": "standard", "project_id": "pf-project", "region": "us-east5", "zone": "us-east5-b",
       "cluster_name": "pf", "cluster_version": "1.35.2-gke.1842000", "gs_bucket": "pf-bucket", "ksa_name": "pf",
       "namespace": "default", "user_identifier": "me@example.com"}


@pytest.fixture(scope="module")
def preflight_env(tmp_path_factory):
    d = tmp_path_factory.mktemp("pf")
    inv = d / "inventory.yaml"
    inv.write_text(yaml.safe_dump({"default": "pf-fits", "environments": {
        "pf-fits": {**GKE, "train_overrides": TINY},
        # One v6e-4 slice and logits far over its HBM: 524288 vocabulary x 64 tokens x 1024 sequences
        # (~65 GiB of temporaries per chip; one sequence needs ~1.4 GiB). Short sequences, many of
        # them: the two compiles of `invoke preflight` took 33 CPU-seconds here (2026-12-07), where
        # 1024 tokens x 64 took 46 and 8192 tokens more.
        # (its own cluster, bucket, subnets and port: no two environments own one thing)
        "pf-oom": {**GKE, "cluster_name": "pf-oom", "gs_bucket": "pf-oom-bucket", "subnet_1_name": "pf-oom-1",
                   "subnet_2_name": "pf-oom-2", "dashboard_port": 8266, "slices": 1, "topology": "2x2",
                   "train_overrides": {
            **TINY, "vocab_size": 524288, "max_target_length": 64, "per_device_batch_size": 1024,
            "ici_fsdp_parallelism": 4, "ici_tensor_parallelism": 1,
            # The search's first candidate, already set: it is skipped (one compile fewer).
            "remat_policy": "full"}},
    }}))
    e = {k: v for k, v in os.environ.items() if not k.startswith("INVOKE_")}
    e.update({"INVOKE_PLAYBOOK_INVENTORY": str(inv), "HOME": str(d),
              "PLAYBOOK_PREFLIGHT_CACHE": str(d / "cache")})  # a cold cache: every first run compiles

    def invoke(name, *args):
        start = time.monotonic()
        r = subprocess.run([INVOKE, *args], cwd=ROOT, env={**e, "INVOKE_PLAYBOOK_ENV": name}, capture_output=True,
                           text=True, timeout=1800)
        return r.returncode, r.stdout + r.stderr, time.monotonic() - start

    return invoke


@pytest.mark.compile
def test_a_small_model_that_fits_and_then_a_cache_hit(preflight_env):
    rc, out, _seconds = preflight_env("pf-fits", "preflight", "--set", "steps=7")
    assert rc == 0, out
    assert "(cached" not in out and "=> fits" in out
    assert re.search(r"total [\d.]+ (M|G)?i?B? ?.*of 31.24 GiB HBM: margin", out) or "of 31.24 GiB HBM: margin" in out
    assert "fits 2 x v6e-16 with" in out and "libtpu 0.0.50.1" in out
    rc, out2, seconds2 = preflight_env("pf-fits", "preflight", "--set", "steps=7")
    assert rc == 0 and "(cached" in out2, out2
    assert seconds2 < 15 and "train_compile" in out2
    assert "compiling for" not in out2


@pytest.mark.compile
def test_a_small_model_that_does_not_fit_and_the_smallest_change_that_does(preflight_env):
    rc, out, _ = preflight_env("pf-oom", "preflight")
    assert rc == 1, out
    m = re.search(r"does NOT fit: its temporaries alone need ([\d.]+) GiB per chip, the chip has 31.24 GiB", out)
    assert m and float(m.group(1)) > 31.24
    assert "trying --set per_device_batch_size=1" in out
    assert ("Smallest change that fits" in out and
            "INVOKE_PLAYBOOK_ENV=pf-oom invoke train --model=llama3-8b --set per_device_batch_size=1" in out), out
    # `invoke train` refuses it before anything starts (the result is cached).
    rc, out, seconds = preflight_env("pf-oom", "train")
    assert rc == 1 and "does not fit 1 x v6e-4" in out and seconds < 20
    assert "ray job submit" not in out and "get-credentials" not in out


# -- the search, through `invoke preflight`, on results put in its cache ----------------------
def _seed(cache, e, j, fits, extra=(), slices=None, total=None):
    args = pf.compile_args(e, j, extra, slices)
    f = pf.Fit(fits=fits, seconds=1.0, temporaries=(20.0 if fits else None), total=total,
               needed=(None if fits else 40.0))
    path = cache / f"{pf.cache_key(args)}.json"
    path.write_text(json.dumps(f.to_json()))


def test_when_no_setting_fits_more_slices_are_tried_and_the_inventory_change_named(tmp_path):
    """No compile: every result the search asks for is in the cache, so this
    checks its order, what it skips and what it says."""
    inv = tmp_path / "inventory.yaml"
    inv.write_text(yaml.safe_dump({"default": "big", "environments": {"big": GKE}}))
    e = load_inventory(inv).env("big")
    j = tr.build_job(e, "llama3-70b")
    cache = tmp_path / "cache"
    cache.mkdir()
    _seed(cache, e, j, fits=False)
    tried = [c for c in pf.CANDIDATES if not pf.job_uses(j, c)]
    assert pf.CANDIDATES[0] == (("remat_policy", "full"),) and pf.CANDIDATES[0] not in tried  # the job has it
    for c in tried:
        _seed(cache, e, j, fits=False, extra=c)
    dcn = pf.dcn_following_slices(j)
    assert dcn == (("dcn_fsdp_parallelism", "-1"),)
    _seed(cache, e, j, fits=False, extra=dcn, slices=4)
    _seed(cache, e, j, fits=True, extra=dcn, slices=8, total=28.5)
    r = subprocess.run([INVOKE, "preflight", "--model=llama3-70b"], cwd=ROOT, capture_output=True, text=True,
                       env={**{k: v for k, v in os.environ.items() if not k.startswith("INVOKE_")},
                            "INVOKE_PLAYBOOK_INVENTORY": str(inv), "HOME": str(tmp_path),
                            "PLAYBOOK_PREFLIGHT_CACHE": str(cache)}, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "compiling for" not in out  # all from the cache
    assert [ln.strip() for ln in out.splitlines() if ln.strip().startswith("trying")] == [
        *(f"trying {pf.set_line(c)}" for c in tried),
        "trying 4 x v6e-16 with --set dcn_fsdp_parallelism=-1",
        "trying 8 x v6e-16 with --set dcn_fsdp_parallelism=-1"]
    assert ("No change of settings fits; 8 slices do (28.50 of 31.24 GiB): set `slices: 8` for big in the "
            "inventory and run `invoke up` (8 node pools of v6e-16), then INVOKE_PLAYBOOK_ENV=big invoke train "
            "--model=llama3-70b --set dcn_fsdp_parallelism=-1") in out, out


# -- the HBM estimate in the static checks (no compile) -----------------------------------------
def test_the_tutorials_70b_job_is_refused_by_estimate_with_the_change_that_fits():
    e = env("dev")
    why = pf.memory_problem(e, job(e, "llama3-70b"))
    assert why.startswith("llama3-70b, the tutorial's flags, does not fit 2 x v6e-16 by estimate: 53.98 of 31.24 GiB "
                          "per chip (parameters 8.21, optimizer state 16.43, gradients 8.21"), why
    assert "The first change not a misfit by estimate (30.00 GiB, too close to call: the compile decides): " \
           "INVOKE_PLAYBOOK_ENV=dev invoke train --model=llama3-70b --preset=fits;" in why
    assert pf.memory_problem(e, job(e, "llama3-70b", ["per_device_batch_size=1", "optimizer_memory_host_offload=true"])) \
        is None
    assert pf.memory_problem(e, job(e)) is None


def test_the_dry_run_says_the_misfit_before_any_compile_within_a_second():
    from tests.goldens import dry_run
    start = time.monotonic()
    rc, out, _ = dry_run("dev", ["train", "--model=llama3-70b"])
    assert rc == 1 and time.monotonic() - start < 3  # ~0.3 s here; slack for a loaded CI machine
    assert "does not fit 2 x v6e-16 by estimate" in out and "invoke train --model=llama3-70b --preset=fits" in out
    assert "train_compile" not in out and "ray job submit" not in out and "get-credentials" not in out


def test_an_elastic_job_is_estimated_on_every_shape_it_may_shrink_to():
    e = env("dev")
    j = job(e, "llama3-70b", ["dcn_fsdp_parallelism=-1", "per_device_batch_size=1",
                              "optimizer_memory_host_offload=true"], elastic=True)
    assert pf.shapes(e, j) == [2, 1] and pf.shapes(e, job(e)) == [2]
    why = pf.memory_problem(e, j)
    assert why.startswith("llama3-70b does not fit 1 x v6e-16 (where the elastic job runs after a lost slice) by "
                          "estimate: 46.43 of 31.24 GiB per chip"), why
    assert "; it fits 2 x v6e-16. " in why and why.endswith("or train without --elastic (every slice, no shrinking)")
    # The fix keeps the job's own flags (--elastic, its --set) and adds the change.
    assert ("INVOKE_PLAYBOOK_ENV=dev invoke train --model=llama3-70b --elastic --set dcn_fsdp_parallelism=-1 --set "
            "per_device_batch_size=1 --set optimizer_memory_host_offload=true --set parameter_memory_host_offload=true "
            "--set param_scan_axis=0") in why


def test_the_ready_command_keeps_the_jobs_own_flags():
    e = env("dev")
    j = tr.build_job(e, "llama3-70b", True, sets=["dcn_fsdp_parallelism=-1"], preset="fits")
    extra = (("parameter_memory_host_offload", "true"),)
    assert pf.ready_command(e, j, extra) == ("INVOKE_PLAYBOOK_ENV=dev invoke train --model=llama3-70b --elastic "
                                             "--preset=fits --set dcn_fsdp_parallelism=-1 --set "
                                             "parameter_memory_host_offload=true")
    assert pf.ready_command(e, job(e, "llama3-70b"), pf.PRESETS["llama3-70b"]["fits"]).endswith(
        "invoke train --model=llama3-70b --preset=fits")


def _invoke(tmp_path, inv, cache, *args):
    return subprocess.run([INVOKE, *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**{k: v for k, v in os.environ.items() if not k.startswith("INVOKE_")},
                               "INVOKE_PLAYBOOK_INVENTORY": str(inv), "HOME": str(tmp_path),
                               "PLAYBOOK_PREFLIGHT_CACHE": str(cache)})


def test_an_elastic_job_that_fits_every_slice_but_not_one_is_refused_naming_the_shape(tmp_path):
    """The compile of each shape from the cache: 2 slices fit, 1 does not."""
    inv = tmp_path / "inventory.yaml"
    inv.write_text(yaml.safe_dump({"default": "big", "environments": {"big": GKE}}))
    e = load_inventory(inv).env("big")
    j = tr.build_job(e, "llama3-8b", elastic=True)
    cache = tmp_path / "cache"
    cache.mkdir()
    _seed(cache, e, j, fits=True, total=22.35)
    _seed(cache, e, j, fits=False, slices=1)
    for task in ("preflight", "train"):
        r = _invoke(tmp_path, inv, cache, task, "--elastic")
        out = r.stdout + r.stderr
        assert r.returncode == 1, out
        assert "compiling for" not in out and "HBM per chip, estimated: 22.36 of 31.24 GiB on 2 and 1 x v6e-16" in out
        assert ("fits 2 x v6e-16 with 8.89 GiB to spare per chip (cached), but the elastic job will not run on "
                "1 x v6e-16 (needs 40.00 GiB of temporaries per chip), where it shrinks after a lost slice") in out, out
        assert "ray job submit" not in out and "get-credentials" not in out
    _seed(cache, e, j, fits=True, slices=1, total=22.35)
    r = _invoke(tmp_path, inv, cache, "preflight", "--elastic")
    assert r.returncode == 0 and "fits 2 x v6e-16 with 8.89 GiB to spare per chip (cached), and 1 x v6e-16" in r.stdout
