"""MaxText overrides are checked before anything runs (a typo must not cost a
compile or a TPU job), by MaxText's own rules: the schema shipped in
playbooks/data is the pinned maxtext's, and the verdicts agree with its
pydantic validation."""
import importlib.util
import json
import subprocess
from typing import Annotated

import pytest

from playbooks.config import maxtext_settings as M
from playbooks.config import tutorial as T
from playbooks.config.schema import load_inventory
from playbooks.core.errors import InputError
from playbooks.job.fit import CANDIDATES
from playbooks.job.spec import PRESETS, build_job
from tests.conftest import INVOKE, ROOT
from tests.test_inventory import resolve


def _script():
    spec = importlib.util.spec_from_file_location("maxtext_schema", ROOT / "scripts" / "maxtext_schema.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_shipped_schema_is_the_installed_maxtexts():
    assert M.SCHEMA.read_text() == _script().render(), \
        "playbooks/data/maxtext_schema.json is stale: run .venv/bin/python scripts/maxtext_schema.py"


CASES = [
    ("per_device_batch_size", "abc"), ("per_device_batch_size", "1"), ("per_device_batch_size", "0.5"),
    ("steps", "-5"), ("steps", "3.0"), ("steps", "3.5"), ("steps", "20"),
    ("learning_rate", "1e-5"), ("learning_rate", "-1"), ("learning_rate", "3.e-5"),
    ("optimizer_memory_host_offload", "true"), ("optimizer_memory_host_offload", "yes"),
    ("optimizer_memory_host_offload", "1"), ("optimizer_memory_host_offload", "maybe"),
    ("run_name", "abc"), ("run_name", "123"), ("run_name", "rayjob-8b"),
    ("remat_policy", "full"), ("remat_policy", "none"), ("remat_policy", "minimal_offloaded"),
    ("ici_fsdp_parallelism", "x"), ("ici_fsdp_parallelism", "-1"), ("ici_tensor_parallelism", "4"),
    ("dataset_type", "synthetic"), ("dataset_type", "synth"),
    ("dtype", "bfloat16"), ("dtype", "bf16"), ("quantization", "int8"), ("quantization", "int3"),
    ("train_data_columns", "text"), ("train_data_columns", "[a,b]"),
    ("tokenizer_path", "none"), ("max_target_length", "2048"), ("base_emb_dim", "1.5"),
    ("enable_checkpointing", "False"), ("attention", "flash"), ("opt_type", "sgd"),
    ("compile_topology_num_slices", "two"), ("base_output_directory", "gs://b/x"),
]


@pytest.fixture(scope="module")
def maxtext_verdict():
    """MaxText's own answer for one key=value: its command-line parse, its
    pre-pydantic conversions, then the field's pydantic validation."""
    from maxtext.configs import pyconfig, types
    from pydantic import TypeAdapter, ValidationError

    fields = types.MaxTextConfig.model_fields

    def verdict(key, text):
        raw = M.parse(text)
        value = pyconfig._prepare_for_pydantic({key: raw}, config_class=types.MaxTextConfig)[key]
        f = fields[key]
        adapter = TypeAdapter(Annotated[(f.annotation, *f.metadata)] if f.metadata else f.annotation)
        try:
            adapter.validate_python(value)
            return True
        except ValidationError:
            return False
    return verdict


def test_verdicts_agree_with_maxtexts_own_validation(maxtext_verdict):
    wrong = [(k, v, M.schema_problem(k, v)) for k, v in CASES
             if (M.schema_problem(k, v) is None) != maxtext_verdict(k, v)]
    assert not wrong
    assert sum(M.schema_problem(k, v) is not None for k, v in CASES) >= 12  # the table has teeth
    # bad_value adds the enums and the sign rules below; none of these values breaks them
    assert [(k, v) for k, v in CASES if (M.bad_value(k, v) is None) != (M.schema_problem(k, v) is None)] == []


# -- string fields MaxText declares with its own enum (pydantic takes any string) -------------
def _maxtexts_get_remat_policy():
    """MaxText's own NNXDecoder.get_remat_policy, compiled from the installed
    source alone (importing its module costs seconds of flax)."""
    import ast
    import warnings
    from pathlib import Path
    from types import SimpleNamespace

    import jax

    origin = importlib.util.find_spec("maxtext.layers.nnx_decoders").origin
    tree = ast.parse(Path(origin).read_text())
    fn = next(f for c in tree.body if isinstance(c, ast.ClassDef) and c.name == "NNXDecoder"
              for f in c.body if isinstance(f, ast.FunctionDef) and f.name == "get_remat_policy")
    scope = {"jax": jax, "warnings": warnings, "max_logging": SimpleNamespace(log=lambda *a: None)}
    exec(compile(ast.Module([fn], []), origin, "exec"), scope)

    def run(name):
        config = SimpleNamespace(remat_policy=name, scan_layers=False, tensors_on_device=[], tensors_to_offload=[])
        return scope["get_remat_policy"](SimpleNamespace(config=config, minimal_policy=lambda **kw: "minimal"))
    return run


def test_a_remat_policy_is_one_maxtext_runs():
    """Every value taken runs through MaxText's decoder; the refused one is
    its assert ("Remat policy needs to be on list of remat policies")."""
    from maxtext.configs.types import RematPolicy

    run = _maxtexts_get_remat_policy()
    taken = M.runs("remat_policy")
    assert {p.value for p in RematPolicy} <= set(taken)  # the enum, read from maxtext now
    assert {"minimal_with_context", "none"} <= set(taken)  # base.yml's first choice; no remat at all
    for name in taken:
        assert M.bad_value("remat_policy", name) is None, name
        run(name)
    for wrong in ("fulll", "Full", "minimal-offloaded"):
        with pytest.raises(AssertionError, match="list of remat policies"):
            run(wrong)
        assert M.bad_value("remat_policy", wrong) is not None
    why = M.bad_value("remat_policy", "fulll")
    assert why.startswith("is not a remat_policy MaxText 0.2.5 runs (its RematPolicy: full, minimal, ")
    assert "its NNXDecoder.get_remat_policy also runs: none, minimal_with_context," in why
    assert why.endswith("; did you mean full?")
    assert M.bad_value("remat_policy", "none") is None  # None after MaxText's own conversion


def test_every_enum_backed_string_field_is_recorded():
    """remat_policy and te_comm_gemm_overlap are typed `str` but declared with
    MaxText's RematPolicy and TeCommGemmOverlapPolicy; a field typed as its
    enum (dtype) is checked by pydantic's schema already."""
    from maxtext.configs.types import TeCommGemmOverlapPolicy

    assert set(M.schema()["x-maxtext-enums"]) == {"remat_policy", "te_comm_gemm_overlap"}
    assert M.runs("te_comm_gemm_overlap") == [p.value for p in TeCommGemmOverlapPolicy]
    assert M.bad_value("te_comm_gemm_overlap", "disable") == (
        "is not a te_comm_gemm_overlap MaxText 0.2.5 runs (its TeCommGemmOverlapPolicy: disabled, mlp, full); "
        "did you mean disabled?")
    assert M.runs("dtype") is None and "one of: bfloat16" in M.bad_value("dtype", "bf16")
    assert M.bad_value("remat_policy", "1").startswith("reads as int 1, not a string")  # the type comes first


@pytest.mark.parametrize("key, refused, taken", [
    ("per_device_batch_size", ["-4", "0", "-0.5"], ["1", "0.5", "12"]),
    ("eval_per_device_batch_size", ["-1", "-0.25"], ["0", "2", "0.5"]),
    ("max_target_length", ["0", "-128"], ["1", "2048"]),
    ("steps", ["0", "-1"], ["1", "100"]),
    ("checkpoint_period", ["0", "-10"], ["1", "10"]),
    ("log_period", ["0", "-1"], ["1", "100"]),
])
def test_sign_rules(maxtext_verdict, key, refused, taken):
    for v in refused:
        assert M.schema_problem(key, v) is None and maxtext_verdict(key, v), (key, v)  # MaxText would take it
        why = M.bad_value(key, v)
        assert why and why.startswith("must be >"), (key, v, why)
    for v in taken:
        assert M.bad_value(key, v) is None, (key, v)


def test_shipped_inventory_and_arguments_keep_the_sign_rules():
    assert set(M.SIGNS) <= set(M.schema()["properties"])
    for name in load_inventory().names:
        for k, v in load_inventory().env(name).train_overrides.items():
            assert M.problem(k, M.as_text(v)) is None, (name, k, v)


def test_messages_name_what_maxtext_wants():
    assert M.bad_value("per_device_batch_size", "abc") == (
        "is not an integer or a number, as MaxText 0.2.5 wants for per_device_batch_size (The batch size per device.)")
    assert M.bad_value("run_name", "123").startswith("reads as int 123, not a string")
    assert "one of: synthetic, hf, grain" in M.bad_value("dataset_type", "synth")
    assert M.bad_value("steps", "-5").startswith("is not an integer >= -1")
    assert M.unknown_key("remat_plicy") == "is not a MaxText 0.2.5 config key; did you mean remat_policy?"
    assert M.unknown_key("foo_bar") == "is not a MaxText 0.2.5 config key"
    assert M.unknown_key("lora_rank") is None  # a nested model's key, taken at the top level


def test_every_shipped_argument_is_valid():
    """The tutorial's arguments, the presets and the preflight's candidates."""
    shipped = [kv for args in T.TRAIN_ARGS.values() for kv in args]
    shipped += [kv for presets in PRESETS.values() for p in presets.values() for kv in p]
    shipped += [kv for c in CANDIDATES for kv in c]
    assert len(shipped) > 20
    assert [(k, v, M.problem(k, v)) for k, v in shipped if M.problem(k, v)] == []


@pytest.mark.parametrize("sets, words", [
    (["foo_bar=1"], "--set 'foo_bar=1': 'foo_bar' is not a MaxText 0.2.5 config key"),
    (["per_device_batch_size=abc"], "'abc' is not an integer or a number"),
    (["remat_plicy=full"], "did you mean remat_policy?"),
    (["remat_policy=fulll"], "--set 'remat_policy=fulll': 'fulll' is not a remat_policy MaxText 0.2.5 runs"),
    (["per_device_batch_size=-4"], "--set 'per_device_batch_size=-4': '-4' must be > 0: a batch size is positive"),
    (["steps=0"], "--set 'steps=0': '0' must be >= 1"),
    (["base_num_decoder_layers=4"], "the job sets base_num_decoder_layers=4 (the model sets 32); MaxText refuses"),
])
def test_train_refuses_a_bad_set_before_anything_runs(sets, words):
    env = load_inventory().env("dev")
    with pytest.raises(InputError) as e:
        build_job(env, "llama3-8b", sets=sets)
    assert words in str(e.value)


def test_model_keys_may_change_with_override_model_config():
    env = load_inventory().env("dev")
    job = build_job(env, "llama3-8b", sets=["override_model_config=true", "base_num_decoder_layers=4"])
    assert ("base_num_decoder_layers", "4") in job.args
    # the same value as the model's own is no change
    build_job(env, "llama3-8b", sets=["vocab_size=128256"])


def test_inventory_train_overrides_are_checked(tmp_path):
    with pytest.raises(InputError) as e:
        resolve(tmp_path, train_overrides={"per_device_batch_size": 1, "checkpoint_period": "ten"})
    assert str(e.value).endswith("key 'train_overrides.checkpoint_period' = 'ten' is not an integer, as MaxText "
                                 "0.2.5 wants for checkpoint_period (The frequency (in steps) at which to save "
                                 "checkpoints.)")
    with pytest.raises(InputError, match=r"'train_overrides.remat_plicy' = 'full' is not a MaxText"):
        resolve(tmp_path, train_overrides={"remat_plicy": "full"})
    with pytest.raises(InputError, match=r"'train_overrides.remat_policy' = 'fulll' is not a remat_policy .*"
                                         r"did you mean full\?$"):
        resolve(tmp_path, train_overrides={"remat_policy": "fulll"})
    with pytest.raises(InputError, match=r"'train_overrides.per_device_batch_size' = -4 must be > 0"):
        resolve(tmp_path, train_overrides={"per_device_batch_size": -4})
    assert resolve(tmp_path, train_overrides={"optimizer_memory_host_offload": True}).train_overrides


def test_invoke_dry_train_with_a_typo_is_one_line_and_exit_2(hermetic):
    r = subprocess.run([INVOKE, "--dry", "train", "--model=llama3-70b", "--set", "per_device_batch_size=one"],
                       cwd=ROOT, capture_output=True, text=True, env={**hermetic, "INVOKE_PLAYBOOK_ENV": "dev"})
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout == ""
    assert r.stderr.strip().splitlines() == [
        "error: --set 'per_device_batch_size=one': 'one' is not an integer or a number, as MaxText 0.2.5 wants "
        "for per_device_batch_size (The batch size per device.)"]


def test_resize_interval_reaches_the_elastic_trainer_of_either_kind():
    from tests.conftest import env
    assert build_job(env("local"), "llama3-8b", elastic=True).env_vars["TRAINER_RESIZE_INTERVAL_S"] == "10"
    assert build_job(env("local", resize_interval=3), "llama3-8b", True).env_vars["TRAINER_RESIZE_INTERVAL_S"] == "3"
    assert "TRAINER_RESIZE_INTERVAL_S" not in build_job(env("dev"), "llama3-8b", elastic=True).env_vars  # Ray's 60 s
    assert build_job(env("dev", resize_interval=30), "llama3-8b", True).env_vars["TRAINER_RESIZE_INTERVAL_S"] == "30"


def test_an_elastic_job_carries_its_start_retries_and_resize_save_timeout_and_keeps_rays_start_timeout():
    """The retry after a loss is sized from the hosts alive (the trainer's
    FreshClusterView), so no job shortens Ray Train's placement group wait."""
    from tests.conftest import env
    timeout = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"
    for e in (env("local"), env("dev")):
        job = build_job(e, "llama3-8b", elastic=True)
        assert timeout not in job.env_vars
        assert (job.env_vars["TRAINER_START_RETRIES"], job.env_vars["TRAINER_RESIZE_SAVE_TIMEOUT_S"]) == ("3", "600")
        assert "TRAINER_START_RETRIES" not in build_job(e, "llama3-8b").env_vars  # a fixed-size job has no resize
    job = build_job(env("local", start_retries=0, resize_save_timeout=30), "llama3-8b", elastic=True)
    assert (job.env_vars["TRAINER_START_RETRIES"], job.env_vars["TRAINER_RESIZE_SAVE_TIMEOUT_S"]) == ("0", "30")


def test_an_elastic_jobs_failure_bound_is_the_inventorys_max_failures_3_by_default_and_reaches_ray_train(monkeypatch):
    """The bound on the failures an elastic job recovers from is a key of
    the inventory, carried in the job's environment to the trainer, which
    gives it to Ray Train's FailureConfig (-1: Ray's no limit)."""
    import sys

    from tests.conftest import ROOT, env
    sys.path.insert(0, str(ROOT / "trainer"))
    import maxtext_ray as mr
    for e in (env("local"), env("dev")):
        assert build_job(e, "llama3-8b", elastic=True).env_vars["TRAINER_MAX_FAILURES"] == "3"
        assert "TRAINER_MAX_FAILURES" not in build_job(e, "llama3-8b").env_vars  # a fixed-size job: Ray's own
    for given in (-1, 0, 7):
        job = build_job(env("dev", max_failures=given), "llama3-8b", elastic=True)
        assert job.env_vars["TRAINER_MAX_FAILURES"] == str(given)
        assert mr.max_failures(job.env_vars) == given
    assert mr.max_failures({}) == 3
    from ray.train.v2.api.config import FailureConfig
    made: list[FailureConfig] = []

    class Trainer:
        def __init__(self, **kw):
            made.append(kw["run_config"].failure_config)

        def fit(self):
            pass
    import ray
    import ray.train.v2.jax as rj
    monkeypatch.setattr(rj, "JaxTrainer", Trainer)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    monkeypatch.setattr(mr, "absolute_config", lambda argv: argv)
    monkeypatch.setattr(mr, "check_model_config", lambda argv: None)
    monkeypatch.setattr(mr, "worker_runtime_env", lambda: {})
    monkeypatch.setenv(mr.ENV_MAX_FAILURES, "-1")
    mr.fit(["trainer", "base.yml"], elastic=True)
    assert made[-1].max_failures == -1


def test_every_job_saves_on_a_preemption_notice_and_its_workers_run_the_setup_hook():
    from playbooks.job.spec import runtime_env
    from tests.conftest import env
    for e in (env("local"), env("dev")):
        for elastic in (False, True):
            job = build_job(e, "llama3-8b", elastic=elastic)
            assert job.arg("enable_autocheckpoint") == "true"
            assert json.loads(runtime_env(job))["worker_process_setup_hook"] == "maxtext_ray.preimport"
    # A user may still turn it off.
    assert build_job(env("local"), "llama3-8b", sets=["enable_autocheckpoint=false"]).arg("enable_autocheckpoint") \
        == "false"
