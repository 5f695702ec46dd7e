"""The shapes a job fits (issue 64, item 5): when no change of settings fits
the environment's slices, the refusal names the smallest shape of its TPU
generation that fits by estimate (slices, topology, the change), and that
shape, taken as said, passes; the ICI axes follow the slice's devices when
the user set none, and a user's that do not are refused naming the value
that does; the preset's help names the shape it was made for."""
import re
import time

import yaml

from playbooks.config.schema import load_inventory
from playbooks.job import fit as pf
from playbooks.job import spec as tr
from tests.conftest import env
from tests.goldens import dry_run

STD = {"kind": "gke", "mode": "standard", "project_id": "sh-project", "region": "us-west4", "zone": "us-west4-a",
       "cluster_name": "sh", "cluster_version": "1.35.2-gke.1842000", "gs_bucket": "sh-bucket", "ksa_name": "sh",
       "namespace": "default", "user_identifier": "me@example.com", "slices": 2}
V5E = {**STD, "machine_type": "ct5lp-hightpu-4t", "topology": "4x4"}
V5P = {**STD, "machine_type": "ct5p-hightpu-4t", "topology": "2x2x4"}


def inventory(tmp_path, **envs):
    tmp_path.mkdir(parents=True, exist_ok=True)
    inv = tmp_path / "inventory.yaml"
    inv.write_text(yaml.safe_dump({"default": next(iter(envs)), "environments": envs}))
    return inv


def environment(tmp_path, name="v5e", **raw):
    return load_inventory(inventory(tmp_path, **{name: raw})).env(name)


def sets_of(line: str) -> list[str]:
    """The --set flags of the line's `invoke train` command."""
    command = line[line.index("invoke train"):].split(";")[0]
    return re.findall(r"--set (\S+)", command)


# -- the smallest shape that fits, named in the refusal ------------------------------------------
def test_the_70b_preset_on_two_v5e_16_names_the_smallest_v5e_shape_and_that_shape_passes(tmp_path):
    e = environment(tmp_path, **V5E)
    j = tr.build_job(e, "llama3-70b", True, sets=["dcn_fsdp_parallelism=-1"], preset="fits")
    why = pf.memory_problem(e, j)
    assert why.startswith("llama3-70b --preset=fits (made for 2 x v6e-16) does not fit 2 x v5e-16 and 1 x v5e-16 "
                          "by estimate: 2 x v5e-16 needs 30.00 of 15.75 GiB per chip"), why
    said = why[why.index("; the smallest v5e shape"):]
    assert said.startswith("; the smallest v5e shape that fits llama3-70b by estimate: 2 x v5e-128 (256 chips: "
                           "2 x 8x16) with --set per_device_batch_size=1 --set optimizer_memory_host_offload=true "
                           "--set parameter_memory_host_offload=true --set param_scan_axis=0, 15.63 of 15.75 GiB per "
                           "chip (too close to call: the compile decides): set `topology: 8x16`, `slices: 2` for v5e "
                           "in the inventory and run `invoke up`, then INVOKE_PLAYBOOK_ENV=v5e invoke train "
                           "--model=llama3-70b --elastic --preset=fits --set dcn_fsdp_parallelism=-1 --set "
                           "parameter_memory_host_offload=true --set param_scan_axis=0;"), said
    # Taken as said: the inventory's two keys and the command's flags.
    bigger = environment(tmp_path / "b", **{**V5E, "topology": "8x16", "slices": 2})
    k = tr.build_job(bigger, "llama3-70b", True, sets=sets_of(said), preset="fits")
    assert k.derived == (("ici_fsdp_parallelism", "32"), ("ici_tensor_parallelism", "4"))
    assert pf.static_checks(bigger, k) == [] and pf.memory_problem(bigger, k) is None
    assert all(est.total <= est.capacity for _, est in pf.estimates(bigger, k))


def test_the_tutorials_70b_flags_on_v5e_name_the_fewest_chips_and_fewest_slices(tmp_path):
    e = environment(tmp_path, **V5E)
    why = pf.memory_problem(e, tr.build_job(e, "llama3-70b"))
    assert "None of the 4 changes the preflight tries fits by estimate, nor 8 slices; the smallest v5e shape that " \
           "fits llama3-70b by estimate: 1 x v5e-128 (128 chips: 1 x 8x16) with --set per_device_batch_size=1" in why
    assert "set `topology: 8x16`, `slices: 1` for v5e in the inventory" in why, why
    assert why.endswith("--set param_scan_axis=0 --set dcn_fsdp_parallelism=-1; `invoke preflight` with the same "
                        "flags compiles it (the proof)"), why
    # No shape of fewer chips fits, with any change the search knows.
    got = pf.smallest_shape(e, tr.build_job(e, "llama3-70b"))
    smaller = [t for t in pf.layouts(e, False) if t[0] < 128]
    assert got is not None and smaller
    for _, n, top, mt in smaller:
        other = environment(tmp_path / f"{top}-{n}", **{**V5E, "topology": top, "slices": n, "machine_type": mt})
        for change in [(), *pf.CANDIDATES]:
            k = tr.build_job(other, "llama3-70b", sets=[f"{a}={b}" for a, b in change + got.follow])
            assert pf.static_checks(other, k) == []
            assert any(est.total > est.capacity for _, est in pf.estimates(other, k)), (top, n, change)


def test_the_dry_run_of_the_preset_on_v5e_says_the_shape_and_starts_nothing(tmp_path):
    inv = inventory(tmp_path, v5e=V5E)
    rc, out, err = dry_run("v5e", ["train", "--model=llama3-70b", "--preset=fits"], inventory=inv)
    assert rc == 1, out + err
    assert "the smallest v5e shape that fits llama3-70b by estimate: 1 x v5e-128 (128 chips: 1 x 8x16)" in out, out
    assert "ray job submit" not in out and "train_compile" not in out


def test_when_no_shape_of_the_generation_fits_it_says_so_quickly(tmp_path):
    """The bound of the search: every shape of v5p (32 chip counts) to 16
    slices, each change; none fits a million-token sequence."""
    e = environment(tmp_path, name="v5p", **V5P)
    j = tr.build_job(e, "llama3-70b", sets=["max_target_length=1048576"])
    start = time.monotonic()
    why = pf.memory_problem(e, j)
    assert time.monotonic() - start < 2.0  # ~0.1 s here
    assert why.endswith("nor 8 slices; no v5p shape of up to 16 slices fits llama3-70b by estimate, with its own "
                        "settings or any change the preflight tries"), why


def test_the_compiles_search_that_finds_nothing_names_the_smallest_shape_by_estimate(tmp_path):
    e = environment(tmp_path, **V5E)
    j = tr.build_job(e, "llama3-70b", preset="fits")
    line = pf.none_found(e, j, "does not fit 2 x v5e-16", pf.search_plan(e, j))
    assert line.startswith("does not fit 2 x v5e-16; none of the 1 changes tried fits, nor 8 slices: a larger "
                           "topology is needed; the smallest v5e shape that fits llama3-70b by estimate: 1 x v5e-128 "
                           "(128 chips: 1 x 8x16)"), line


# -- the ICI axes follow the slice ------------------------------------------------------------------
def test_the_ici_axes_follow_a_bigger_slice_when_the_user_set_none(tmp_path):
    e = environment(tmp_path, **{**V5E, "topology": "8x8"})
    for model in ("llama3-8b", "llama3-70b"):
        j = tr.build_job(e, model, sets=["dcn_fsdp_parallelism=-1"] if model == "llama3-70b" else [])
        assert (j.arg("ici_fsdp_parallelism"), j.arg("ici_tensor_parallelism")) == ("16", "4")
        assert pf.static_checks(e, j) == [], model
    # The tutorial's own slice (16 devices, also TPU7x's 2x2x2: two a chip) keeps the tutorial's values.
    assert tr.build_job(env("dev"), "llama3-70b").derived == ()
    assert tr.build_job(env("dev"), "llama3-70b").arg("ici_fsdp_parallelism") == "4"
    # A slice of one chip: the tensor axis no wider than the slice.
    small = environment(tmp_path / "s", **{**V5E, "topology": "1x1", "slices": 1,
                                          "machine_type": "ct5lp-hightpu-1t"})
    assert tr.build_job(small, "llama3-8b").derived == (("ici_fsdp_parallelism", "1"), ("ici_tensor_parallelism", "1"))


def test_a_users_ici_that_does_not_make_the_slice_is_refused_naming_the_value_that_does(tmp_path):
    e = environment(tmp_path, **{**V5E, "topology": "8x8"})
    j = tr.build_job(e, "llama3-8b", sets=["ici_tensor_parallelism=8"])
    assert pf.static_checks(e, j) == [
        "ICI parallelism (per slice, 64 chips in a 8x8 slice): ici_fsdp_parallelism=4 x ici_tensor_parallelism=8 = "
        "32, but there are 64: --set ici_fsdp_parallelism=8 matches"]
    assert j.derived == ()
    # The inventory's train_overrides are the user's too.
    o = environment(tmp_path / "o", **{**V5E, "topology": "8x8", "train_overrides": {"ici_fsdp_parallelism": 4}})
    k = tr.build_job(o, "llama3-8b")
    assert pf.static_checks(o, k) == [
        "ICI parallelism (per slice, 64 chips in a 8x8 slice): ici_fsdp_parallelism=4 x ici_tensor_parallelism=4 = "
        "16, but there are 64: --set ici_fsdp_parallelism=16 matches"]
    assert k.derived == ()


# -- the preset says the shape it was made for --------------------------------------------------
def test_the_presets_help_and_docs_name_the_shape_it_was_made_for():
    import tasks
    from tests.conftest import ROOT
    shape = tr.preset_shape("llama3-70b", "fits")
    assert shape == "2 x v6e-16"
    assert f"--preset=fits is made for {shape}" in tasks.JOB_HELP["preset"]
    for page in ("README.md", "docs/gke.md"):
        text = (ROOT / page).read_text()
        assert f"made for {shape}" in text, page
