"""The trainer's own checks, its configs and its pins (no Ray cluster)."""
import filecmp
import json
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "trainer"))
import maxtext_ray as mr
from playbooks.trainlog import Summary

TRAINER = ROOT / "trainer"


def installed_configs() -> Path:
    return Path(metadata.distribution("maxtext").locate_file("maxtext/configs"))


def test_shipped_configs_are_the_pinned_maxtexts():
    src = installed_configs()
    assert metadata.version("maxtext") == "0.2.5"
    assert filecmp.cmp(src / "base.yml", TRAINER / "base.yml", shallow=False)
    shipped = sorted(p.name for p in (TRAINER / "models").glob("*.yml"))
    assert shipped == sorted(p.name for p in (src / "models").glob("*.yml"))
    for name in shipped:
        assert filecmp.cmp(src / "models" / name, TRAINER / "models" / name, shallow=False), name


def test_worker_requirements_are_pinned_from_the_lock():
    lock = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            k, v = line.split("==")
            lock[re.sub(r"[-_.]+", "-", k.lower())] = v
    pins = [ln for ln in (TRAINER / "requirements.txt").read_text().splitlines() if ln and not ln.startswith("#")]
    assert len(pins) > 200
    for p in pins:
        k, v = p.split("==")
        assert lock.get(re.sub(r"[-_.]+", "-", k.lower())) == v, p
    for must in ("maxtext==0.2.5", "jax==0.12.0.1", "jaxlib==0.12.0.1", "libtpu==0.0.50.1"):
        assert must in pins


def test_model_config_must_sit_beside_base_yml(tmp_path):
    (tmp_path / "base.yml").write_text((TRAINER / "base.yml").read_text())
    with pytest.raises(mr.ConfigError, match=r"models/llama3-70b.yml not found beside .*MaxText would train its "
                                             r"default model instead of llama3-70b"):
        mr.check_model_config(["t.py", str(tmp_path / "base.yml"), "model_name=llama3-70b"])
    assert mr.check_model_config(["t.py", str(TRAINER / "base.yml"), "model_name=llama3-70b"])["base_emb_dim"] == 8192


def test_trainer_script_refuses_a_lone_base_yml(tmp_path):
    (tmp_path / "base.yml").write_text((TRAINER / "base.yml").read_text())
    r = subprocess.run([sys.executable, str(TRAINER / "maxtext_multi_slice_trainer.py"), "base.yml",
                        "model_name=llama3-8b", "steps=1"], cwd=tmp_path, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(TRAINER)}, timeout=120)
    assert r.returncode != 0
    assert "models/llama3-8b.yml not found beside" in r.stderr + r.stdout


def test_expected_dimensions_and_parameter_counts():
    base = str(TRAINER / "base.yml")
    d8 = mr.expected_model(["t", base, "model_name=llama3-8b"])
    assert round(mr.llama_params(d8) / 1e9, 3) == 8.030
    d70 = mr.expected_model(["t", base, "model_name=llama3-70b"])
    assert round(mr.llama_params(d70) / 1e9, 2) == 70.55
    tiny = mr.expected_model(["t", base, "model_name=llama3-8b", "override_model_config=true", "base_emb_dim=256"])
    assert tiny["base_emb_dim"] == 256 and tiny["base_num_decoder_layers"] == 32


def test_a_config_without_the_models_dimensions_is_refused():
    class Cfg:
        model_name = "llama3-8b"
        base_emb_dim = 2048
    with pytest.raises(mr.ConfigError, match=r"did not apply the config of model llama3-8b: base_emb_dim=2048 "
                                             r"\(want 4096\)"):
        mr.assert_model_applied(Cfg(), {"base_emb_dim": 4096})


def test_layout_defaults_are_the_tutorials_and_env_overrides_them():
    assert mr.Layout.from_env({}) == mr.Layout(2, 4, "4x4", 4, "TPU-V6E")
    assert mr.Layout.from_env({}).workers == 8
    ln = mr.Layout.from_env({"TRAINER_SLICES": "2", "TRAINER_HOSTS_PER_SLICE": "1", "TRAINER_TOPOLOGY": "2x2"})
    assert (ln.workers, ln.topology) == (2, "2x2")
    # Elastic: Ray Train's 60 s between looks for slices that came, unless the job says otherwise.
    assert mr.scaling_config(ln, elastic=True).elastic_resize_monitor_interval_s == 60.0
    quick = mr.Layout.from_env({"TRAINER_SLICES": "2", "TRAINER_HOSTS_PER_SLICE": "1", "TRAINER_TOPOLOGY": "2x2",
                                "TRAINER_RESIZE_INTERVAL_S": "10"})
    assert mr.scaling_config(quick, elastic=True).elastic_resize_monitor_interval_s == 10.0
    assert mr.scaling_config(quick, elastic=True).num_workers == (1, 2)


def test_worker_runtime_env_installs_the_pinned_requirements(tmp_path, monkeypatch):
    monkeypatch.delenv(mr.ENV_WORKER_REQUIREMENTS, raising=False)
    assert mr.worker_runtime_env() is None
    monkeypatch.setenv(mr.ENV_WORKER_REQUIREMENTS, str(TRAINER / "requirements.txt"))
    pkgs = mr.worker_runtime_env()["pip"]["packages"]
    assert "maxtext==0.2.5" in pkgs and not any(p.startswith("#") for p in pkgs)


LOG = """\
(TrainController pid=9) Started training worker group of size 4:
(RayTrainWorker pid=1, ip=10.0.0.1) completed step: 0, seconds: 9.0, TFLOP/s/device: 1.0, Tokens/s/device: 10.0, total_weights: 8, loss: 7.5
(RayTrainWorker pid=1, ip=10.0.0.1) completed step: 0, seconds: 9.0, TFLOP/s/device: 1.0, Tokens/s/device: 10.0, total_weights: 8, loss: 7.5
(RayTrainWorker pid=2, ip=10.0.0.2) completed step: 0, seconds: 9.0, TFLOP/s/device: 1.0, Tokens/s/device: 10.0, total_weights: 8, loss: 7.5
(RayTrainWorker pid=1, ip=10.0.0.1) completed step: 1, seconds: 5.0, TFLOP/s/device: 1.0, Tokens/s/device: 20.0, total_weights: 8, loss: 7.4
(RayTrainWorker pid=1, ip=10.0.0.1) completed step: 2, seconds: 0.5, TFLOP/s/device: 1.0, Tokens/s/device: 100.0, total_weights: 8, loss: 7.0
(RayTrainWorker pid=1, ip=10.0.0.1) completed step: 3, seconds: 0.7, TFLOP/s/device: 1.0, Tokens/s/device: 80.0, total_weights: 8, loss: 6.9
(TrainController pid=9) Started training worker group of size 2:
(RayTrainWorker pid=3) restoring from this run's directory step 2
(RayTrainWorker pid=4) restoring from this run's directory step 2
(RayTrainWorker pid=3) completed step: 3, seconds: 4.0, TFLOP/s/device: 1.0, Tokens/s/device: 5.0, total_weights: 8, loss: 6.9
(TrainController pid=9) Detected changes in the cluster resources. Deciding to resize the worker group from 2 -> 4 workers.
(TrainController pid=9) Started training worker group of size 4:
(RayTrainWorker pid=3) number parameters: 8.030 billion
(RayTrainWorker pid=3) model check: llama3-8b applied, 8.030 billion parameters expected
"""


def test_summary_of_a_job_log():
    s = Summary()
    for line in LOG.splitlines():
        s.feed(line)
    assert s.last_step == 3 and len(s.steps) == 4
    assert s.final_loss == 6.9
    assert s.median_step_seconds == 0.6  # steps 2 and 3: past each group's first two
    assert s.world_sizes == [4, 2, 4] and s.resizes == [(4, 2), (2, 4)]
    assert s.resize_steps == [3, 3]  # the shrink after step 3; the regrowth after step 3 (run again)
    assert s.restores == [2]
    assert s.params_mismatch() is None
    s.feed("(RayTrainWorker pid=3) number parameters: 1.300 billion")
    assert "the model config was not applied" in s.params_mismatch()


def test_maxtext_metrics_file_read_one_record_per_step(tmp_path):
    """MaxText writes `step` as a float and appends across restarts: a step
    run again after a restore counts as its last run; other lines are not records."""
    from playbooks import metrics
    rows = [{"step": 0.0, "learning/loss": 7.5, "perf/step_time_seconds": 9.0},
            {"step": 1.0, "learning/loss": 7.4, "perf/step_time_seconds": 0.5},
            {"step": 1.0, "learning/loss": 7.3, "perf/step_time_seconds": 4.0},  # again, after a restore
            {"step": 2.5}, {"step": True}, {"step": "3"}, [1, 2]]
    f = tmp_path / "m.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows) + "not json\n")
    got = metrics.from_maxtext(f)
    assert [(r["step"], r["loss"], r["step_seconds"]) for r in got] == [(0, 7.5, 9.0), (1, 7.3, 4.0)]
