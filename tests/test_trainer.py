"""The trainer's own checks, its configs and its pins (no Ray cluster)."""
import filecmp
import json
import os
import re
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.sshd import free_port
from tests.test_health_check import jax_env

sys.path.insert(0, str(ROOT / "trainer"))
import maxtext_ray as mr
from playbooks.runs.train_summary import Summary

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


def test_worker_runtime_env_installs_the_pinned_requirements_and_marks_the_training_workers(tmp_path, monkeypatch):
    monkeypatch.delenv(mr.ENV_WORKER_REQUIREMENTS, raising=False)
    assert mr.worker_runtime_env() == {"env_vars": {mr.ENV_PREIMPORT: "1"}}
    monkeypatch.setenv(mr.ENV_WORKER_REQUIREMENTS, str(TRAINER / "requirements.txt"))
    pkgs = mr.worker_runtime_env()["pip"]["packages"]
    assert "maxtext==0.2.5" in pkgs and not any(p.startswith("#") for p in pkgs)
    assert mr.worker_runtime_env()["env_vars"] == {mr.ENV_PREIMPORT: "1"}


def test_the_setup_hook_imports_maxtext_in_the_background_only_on_a_training_worker(monkeypatch, tmp_path):
    """The job's worker_process_setup_hook runs in every worker process of the
    job (the controller too): only a training worker (the mark) imports, in
    a thread of its own, and an import that fails stays in that thread."""
    import sys
    import threading

    (tmp_path / "preimport_probe.py").write_text("LOADED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(mr, "PREIMPORT", ("preimport_probe", "no_such_module_for_the_hook"))
    threads: list[threading.Thread] = []
    real = threading.Thread.start

    def start(self):
        threads.append(self)
        real(self)
    monkeypatch.setattr(threading.Thread, "start", start)
    monkeypatch.delenv(mr.ENV_PREIMPORT, raising=False)
    mr.preimport()
    assert threads == [] and "preimport_probe" not in sys.modules
    monkeypatch.setenv(mr.ENV_PREIMPORT, "1")
    mr.preimport()
    assert [t.name for t in threads] == ["preimport-maxtext"] and threads[0].daemon
    threads[0].join(10)
    assert sys.modules["preimport_probe"].LOADED
    monkeypatch.delitem(sys.modules, "preimport_probe")


def test_a_deferred_module_runs_nothing_until_its_first_use(tmp_path, monkeypatch):
    """An import, a from-import (as MaxText's chain does: `from google.cloud
    import aiplatform`) and find_spec of a deferred module run none of it;
    its first attribute read runs it once and answers from it; a submodule's
    import runs its package first; an imported or missing module is not
    deferred."""
    import importlib.util

    import deferred_import

    (tmp_path / "defer_probe").mkdir()
    (tmp_path / "defer_probe" / "__init__.py").write_text("")
    for pkg in ("a", "b"):
        d = tmp_path / "defer_probe" / pkg
        d.mkdir()
        (d / "__init__.py").write_text(f"import pathlib\npathlib.Path({str(d)!r}, 'ran').open('a').write('x')\n"
                                       "VALUE = 42\n")
        (d / "sub.py").write_text("from . import VALUE\nTWICE = 2 * VALUE\n")
    for name in ("defer_probe", "defer_probe.a", "defer_probe.b", "defer_probe.b.sub"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))

    def ran(pkg: str) -> str:
        f = tmp_path / "defer_probe" / pkg / "ran"
        return f.read_text() if f.exists() else ""

    assert deferred_import.defer("defer_probe.a") and deferred_import.defer("defer_probe.b")
    import defer_probe.a
    from defer_probe import a
    assert importlib.util.find_spec("defer_probe.a").name == "defer_probe.a"
    assert a is defer_probe.a and ran("a") == "" and not deferred_import.loaded("defer_probe.a")
    assert a.VALUE == 42 and ran("a") == "x" and deferred_import.loaded("defer_probe.a")
    assert a.VALUE == 42 and ran("a") == "x"                                  # once
    assert sys.modules["defer_probe.a"] is not a                                # the real one from now on

    import defer_probe.b.sub
    assert ran("b") == "x" and defer_probe.b.sub.TWICE == 84

    assert not deferred_import.defer("defer_probe.a")                           # imported already
    assert not deferred_import.defer("no_such_module_to_defer")
    assert "no_such_module_to_defer" not in sys.modules


def test_a_package_deferred_as_one_imports_its_submodules_without_its_init(tmp_path, monkeypatch):
    """tokamax's case (MaxText's `from tokamax._src.ops.attention import
    base`): the package's submodules import without its __init__, whose
    first own name read runs it once; the real package then holds them."""
    import deferred_import

    c = tmp_path / "defer_pkg_probe"
    (c / "sub").mkdir(parents=True)
    (c / "__init__.py").write_text(f"import pathlib\npathlib.Path({str(c)!r}, 'ran').open('a').write('x')\n"
                                   "from defer_pkg_probe.sub.leaf import X as X\n")
    (c / "sub" / "__init__.py").write_text("")
    (c / "sub" / "leaf.py").write_text("X = 7\n")
    (c / "plain.py").write_text("")
    for name in ("defer_pkg_probe", "defer_pkg_probe.sub", "defer_pkg_probe.sub.leaf", "defer_pkg_probe.plain"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))

    def ran() -> str:
        return (c / "ran").read_text() if (c / "ran").exists() else ""

    assert deferred_import.defer("defer_pkg_probe", package=True)
    assert not deferred_import.defer("defer_pkg_probe.plain", package=True)   # a module, not a package
    stand_in = sys.modules["defer_pkg_probe"]
    from defer_pkg_probe.sub import leaf
    assert leaf.X == 7 and ran() == "" and not deferred_import.loaded("defer_pkg_probe")
    assert stand_in.X == 7 and ran() == "x" and deferred_import.loaded("defer_pkg_probe")
    assert sys.modules["defer_pkg_probe"] is not stand_in and sys.modules["defer_pkg_probe"].sub.leaf is leaf


@pytest.mark.compile
def test_maxtexts_import_leaves_what_it_does_not_use_for_its_first_use():
    """The trainer's worker imports MaxText without google.cloud.aiplatform
    (its Vertex AI TensorBoard uploader's), sympy, scipy.stats, fastapi,
    uvicorn and tokamax's own __init__ (one of its submodules is imported),
    and a job that uses one gets the real module, through the names MaxText
    and its libraries hold: a process importing MaxText as a worker does."""
    names = [*mr.DEFERRED, *mr.DEFERRED_PACKAGES]
    code = ("import sys, maxtext_ray, deferred_import\n"
            f"assert maxtext_ray.defer_unused() == {names!r}\n"
            "import maxtext.configs.pyconfig, maxtext.trainers.pre_train.train\n"
            "print('loaded at import:', [n for n in maxtext_ray.DEFERRED + maxtext_ray.DEFERRED_PACKAGES "
            "if deferred_import.loaded(n)])\n"
            "assert 'tokamax._src.ops.attention.base' in sys.modules\n"
            "from cloud_accelerator_diagnostics.src.tensorboard_uploader import tensorboard\n"
            "print('init from:', tensorboard.aiplatform.init.__module__)\n"
            "from maxtext.layers import engram, moe\n"
            "print('prime:', engram.sympy.isprime(7919))\n"
            "print('ragged_dot from:', moe.tokamax.ragged_dot.__module__)\n"
            "import tokamax._src.ops.attention.base as base\n"
            "print('same submodule:', sys.modules['tokamax']._src.ops.attention.base is base)\n"
            "from ml_goodput_measurement.src import goodput_utils\n"
            "print('mad:', goodput_utils.stats.median_abs_deviation([1.0, 2.0, 4.0]))\n"
            "from pathwaysutils import profiling\n"
            "print('server:', profiling.fastapi.FastAPI.__name__, profiling.uvicorn.run.__module__)\n"
            "print('loaded at use:', [n for n in maxtext_ray.DEFERRED + maxtext_ray.DEFERRED_PACKAGES "
            "if not deferred_import.loaded(n)])\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=TRAINER, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "loaded at import: []" in r.stdout, r.stdout
    assert "init from: google.cloud.aiplatform.initializer" in r.stdout, r.stdout
    assert "prime: True" in r.stdout and "mad: 1.0" in r.stdout, r.stdout
    assert "ragged_dot from: tokamax._src.ops.ragged_dot.api" in r.stdout, r.stdout
    assert "same submodule: True" in r.stdout and "server: FastAPI uvicorn.main" in r.stdout, r.stdout
    assert "loaded at use: []" in r.stdout, r.stdout


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


WORKER_LINE = re.compile(r"^\((RayTrainWorker|TrainController) pid=(\d+)[^)]*\) (.*)$")
MODEL_CHECK = re.compile(r"^model check: (\S+) applied, ([\d.]+) billion parameters expected")


def summary_of(lines) -> Summary:
    """The follower's summary of a job log: each worker's MaxText lines
    through the trainer's own event handler (the first worker heard in each
    group its rank 0, the others its peers), Ray Train's lines as they are,
    all read by the timeline's reader."""
    import contextlib
    import io

    from playbooks.runs.timeline import Reader
    s, reader = Summary(), Reader("job-1")
    handlers: dict[str, mr.MaxTextEvents] = {}

    def feed(line: str) -> None:
        for e in reader.feed(line):
            s.add(e)

    for raw in lines:
        m = WORKER_LINE.match(raw)
        if not m or m.group(1) != "RayTrainWorker":
            feed(raw)
            if "Started training worker group" in raw:
                handlers = {}  # a new group: new processes, new ranks
            continue
        pid, msg = m.group(2), m.group(3)
        h = handlers.setdefault(pid, mr.MaxTextEvents(peer_rank=None if not handlers else len(handlers)))
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            if (c := MODEL_CHECK.match(msg)) and h.peer_rank is None:  # what run_maxtext says on rank 0
                mr.event("model_check", model=c.group(1), expected_billion=float(c.group(2)))
            else:
                h.line(msg, 100.0)
        for line in out.getvalue().splitlines():
            feed(f"(RayTrainWorker pid={pid}) {line}")
    for e in reader.end():  # the log's end: a line still held for its time (the follower's job end)
        s.add(e)
    return s


def test_a_resize_is_after_the_last_step_of_the_group_it_ends_not_the_furthest_step_ever():
    """A group ran to step 5; the next restored step 2 and was lost at step 4:
    the shrink is after step 4 (what goodput's incident says), not 5."""
    line = ("(RayTrainWorker pid={p}) completed step: {n}, seconds: 1.0, TFLOP/s/device: 1.0, Tokens/s/device: 5.0, "
            "total_weights: 8, loss: 6.0")
    s = summary_of(["(TrainController pid=9) Started training worker group of size 1:",
                    *(line.format(p=1, n=n) for n in range(6)),
                    "(TrainController pid=9) Started training worker group of size 2:",
                    *(line.format(p=p, n=n) for n, p in ((3, 2), (3, 3), (4, 3), (4, 2))),
                    "(TrainController pid=9) Started training worker group of size 1:"])
    assert s.resize_steps == [5, 4] and s.last_step == 5


def test_a_step_saved_on_a_preemption_notice_counts_though_its_line_never_came():
    """The save before a grow: MaxText saves step 20 and stops before it logs
    it; the next group resumes at 21. The run's steps are 0-39, all of them."""
    from playbooks.job.spec import build_job
    from playbooks.plays.train import _verdict, entrypoint_steps
    from tests.conftest import env
    line = ("(RayTrainWorker pid={p}) completed step: {n}, seconds: 1.0, TFLOP/s/device: 1.0, Tokens/s/device: 5.0, "
            "total_weights: 8, loss: 6.0")
    s = summary_of(["(TrainController pid=9) Started training worker group of size 1:",
                    *(line.format(p=1, n=n) for n in range(20)),
                    "(RayTrainWorker pid=1) Waited 0.5 seconds for step 20 to finish before starting checkpointing.",
                    "(RayTrainWorker pid=1) Started an asynchronous checkpoint save for step 20",
                    "(TrainController pid=9) Started training worker group of size 2:",
                    "(RayTrainWorker pid=2) restoring from this run's directory step 20",
                    *(line.format(p=2, n=n) for n in range(21, 40))])
    assert len(s.steps) == 39 and s.done_steps == set(range(40)) and s.resize_steps == [20]
    assert s.lines()[0] == "steps: 40 (last step 39)"
    job = build_job(env("local"), "llama3-8b", elastic=True, steps=40)
    entry = "python maxtext_elastic_trainer.py base.yml steps=40 run_name=rayjob-elastic-8b"
    assert entrypoint_steps(entry) == 40 and entrypoint_steps("python x.py 'unclosed") is None
    done = _verdict(job, "rayjob-elastic-8b-1", {"status": "SUCCEEDED", "entrypoint": entry}, s, None)
    assert done.reason == "job rayjob-elastic-8b-1 SUCCEEDED: 40 steps, final loss 6.000"


def test_a_job_that_succeeded_short_of_its_last_step_is_not_a_success():
    """MaxText returns as if done when it stops early (a SIGTERM the trainer
    did not see): SUCCEEDED at step 19 of a job of 40 is not a trained run."""
    from playbooks.core.recap import FAILED
    from playbooks.job.spec import build_job
    from playbooks.plays.train import _verdict
    from tests.conftest import env
    s = summary_of(f"(RayTrainWorker pid=1) completed step: {n}, seconds: 1.0, TFLOP/s/device: 1.0, Tokens/s/device: "
                   f"5.0, total_weights: 8, loss: 6.0" for n in range(20))
    job = build_job(env("local"), "llama3-8b", steps=20)  # the flags say 20; the job followed says 40
    done = _verdict(job, "run-2", {"status": "SUCCEEDED", "entrypoint": "python t.py base.yml steps=40"}, s, None)
    assert done.outcome == FAILED
    assert done.reason == ("job run-2 SUCCEEDED, but its last step is 19, not 39: MaxText stopped early (see the "
                           "log); `invoke train` resumes run rayjob-multi-slice from its last checkpoint")


def test_summary_of_a_job_log():
    lines = LOG.splitlines()
    s = summary_of(lines)
    assert s.last_step == 3 and len(s.steps) == 4
    assert s.final_loss == 6.9
    assert s.median_step_seconds == 0.6  # steps 2 and 3: past each group's first two
    assert s.world_sizes == [4, 2, 4] and s.resizes == [(4, 2), (2, 4)]
    assert s.resize_steps == [3, 3]  # the shrink after step 3; the regrowth after step 3 (run again)
    assert s.restores == [2]
    assert s.params_mismatch() is None
    s = summary_of([*lines, "(RayTrainWorker pid=3) number parameters: 1.300 billion"])
    assert "the model config was not applied" in s.params_mismatch()
    # What made each change of size, said with it.
    assert s.lines()[-3:-1] == ["resize 4 -> 2 workers after step 3 (a restart)",
                                "resize 2 -> 4 workers after step 3 (Ray Train's resize)"]


def test_maxtext_metrics_file_read_one_record_per_step(tmp_path):
    """MaxText writes `step` as a float and appends across restarts: a step
    run again after a restore counts as its last run; other lines are not records."""
    from playbooks.runs import metrics
    rows = [{"step": 0.0, "learning/loss": 7.5, "perf/step_time_seconds": 9.0},
            {"step": 1.0, "learning/loss": 7.4, "perf/step_time_seconds": 0.5},
            {"step": 1.0, "learning/loss": 7.3, "perf/step_time_seconds": 4.0},  # again, after a restore
            {"step": 2.5}, {"step": True}, {"step": "3"}, [1, 2]]
    f = tmp_path / "m.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows) + "not json\n")
    got = metrics.from_maxtext(f)
    assert [(r["step"], r["loss"], r["step_seconds"]) for r in got] == [(0, 7.5, 9.0), (1, 7.3, 4.0)]


# -- the trainer's events (the run's timeline) -----------------------------------------
# MaxText 0.2.5's and Orbax's own lines, as a local elastic job logged them.
MAXTEXT_LINES = [
    "Waiting for step 10 to finish before checkpoint...",
    "Waited 28.489091873168945 seconds for step 10 to finish before starting checkpointing.",
    "Started an asynchronous checkpoint save for step 10",
    "completed step: 11, seconds: 3.029, TFLOP/s/device: 0.000, Tokens/s/device: 42.253, total_weights: 1024, "
    "loss: 7.216, lm_loss: 7.216, perplexity: 1361.549",
    "checkpoint manager exists so trying to load this run's existing checkpoint",
    "restoring from this run's directory step 10",
    "[process=0] [sync] Started load checkpoint @ /data/rayjob-elastic-8b/checkpoints/10.",
    "[process=0] [sync] Finished load in 0.34 seconds @ /data/rayjob-elastic-8b/checkpoints/10",
    "completed step: 11, seconds: 9.514, TFLOP/s/device: 0.000, Tokens/s/device: 13.010, total_weights: 1024, "
    "loss: 7.216, lm_loss: 7.216, perplexity: 1361.549",
    "completed step: 12, seconds: 0.270, TFLOP/s/device: 0.004, Tokens/s/device: 474.788, total_weights: 1024, "
    "loss: 7.182, lm_loss: 7.182, perplexity: 1316.023",
]


def test_maxtexts_own_log_lines_become_events_with_their_time(capsys):
    """Through the logger MaxText and Orbax log to (absl's), as in a worker;
    each event one JSON line the follower reads back, with its time."""
    import logging

    from absl import logging as absl_logging

    from playbooks.runs import timeline
    level = logging.getLogger("absl").level
    handler = mr.listen_to_maxtext()
    try:
        for line in MAXTEXT_LINES:
            absl_logging.info(line)
    finally:
        logging.getLogger("absl").removeHandler(handler)
        logging.getLogger("absl").setLevel(level)
    printed = capsys.readouterr().out.splitlines()
    assert all(line.startswith(mr.EVENT) for line in printed)
    reader = timeline.Reader("job-1")
    events = [e for line in printed for e in reader.feed(f"(RayTrainWorker pid=7) {line}")]
    assert [(e["kind"], e["step"]) for e in events] == [
        ("checkpoint_saved", 10), ("step", 11), ("first_step", 11), ("restore_started", 10), ("restored", 10),
        ("step", 11), ("step", 12)]
    saved, restored = events[0], events[4]
    assert 0 <= saved["seconds"] < 5 and 0 <= restored["seconds"] < 5
    assert all(e["source"] == "trainer" and e["job"] == "job-1" and abs(e["t"] - time.time()) < 60 for e in events)


def test_a_worker_group_after_a_restore_says_its_first_step_is_after_it(capsys):
    h = mr.MaxTextEvents()
    for line in MAXTEXT_LINES[5:]:
        h.line(line, 100.0)
    kinds = [json.loads(line[len(mr.EVENT):])["kind"] for line in capsys.readouterr().out.splitlines()]
    assert kinds == ["restore_started", "restored", "step", "first_step_after_restore", "step"]


def test_a_peer_host_says_only_the_steps_it_finishes_with_its_rank(capsys):
    """Another slice's first host: its steps as peer_step (goodput's "lost at"
    when rank 0's host dies first), nothing of saves, restores or first steps."""
    h = mr.MaxTextEvents(peer_rank=4)
    for line in MAXTEXT_LINES:
        h.line(line, 100.0)
    printed = [json.loads(line[len(mr.EVENT):]) for line in capsys.readouterr().out.splitlines()]
    assert [(e["kind"], e["step"], e["rank"]) for e in printed] == [("peer_step", 11, 4), ("peer_step", 11, 4),
                                                                    ("peer_step", 12, 4)]
    assert all(isinstance(e["seconds"], float) for e in printed)


def test_a_save_holds_the_training_from_the_end_of_the_step_it_saves():
    """MaxText first waits for the step to finish (the step's own time,
    28.5 s here: its compile), then saves; only the save is the save's."""
    h = mr.MaxTextEvents()
    times = (100.0, 128.5, 129.25)
    for line, t in zip(MAXTEXT_LINES[:3], times):
        out = h.line(line, t)
    assert out["kind"] == "checkpoint_saved" and out["step"] == 10 and out["seconds"] == 0.75


def test_compile_spans_are_the_pinned_jaxs_and_short_ones_are_left_out(capsys):
    import jax
    import jax.monitoring
    import jax.numpy as jnp
    seen: list[str] = []

    def listen(name, start, end, **kw):
        seen.append(name)
    jax.monitoring.register_event_time_span_listener(listen)
    try:
        jax.jit(lambda x: jnp.sin(x) * 3 + 1)(jnp.arange(7.0)).block_until_ready()
    finally:
        jax.monitoring.unregister_event_time_span_listener(listen)
    assert set(mr.COMPILE_SPANS) <= set(seen), seen
    assert mr.compile_span("/jax/core/compile/backend_compile_duration", 10.0, 10.2, fun_name="f") == []
    started, ended = mr.compile_span("/jax/core/compile/backend_compile_duration", 10.0, 22.5, fun_name="train_step")
    assert (started["kind"], started["t"], ended["kind"], ended["t"], ended["seconds"]) == \
        ("compile_started", 10.0, "compile_ended", 22.5, 12.5)
    assert ended["function"] == "train_step" and ended["phase"] == "compile"
    assert mr.compile_span("/jax/other", 0.0, 100.0) == []


SYNC_PROBE = """
import os, signal, sys, threading, time
import jax
jax.distributed.initialize(f"127.0.0.1:{sys.argv[2]}", num_processes=1, process_id=0)
from jax.experimental import multihost_utils as mu
from orbax.checkpoint import checkpoint_manager as cm
import preemption_sync
if sys.argv[1] == "guarded":
    preemption_sync.guard()  # what run_maxtext does before MaxText's loop
for step in range(48, 52):  # the loop has asked at each step up to 51
    mu.reached_preemption_sync_point(step)
# Orbax's finalize thread of the save of step 50 asks about step 50.
t = threading.Thread(target=cm.CheckpointManager.reached_preemption, args=(None, 50), name="save_finalize")
t.start()
t.join()
os.kill(os.getpid(), signal.SIGTERM)  # the notice: JAX's notifier takes it
time.sleep(1.0)  # its sync protocol (milliseconds)
print("saved at", [s for s in range(52, 60) if mu.reached_preemption_sync_point(s)], flush=True)
"""


@pytest.mark.parametrize("mode", ["bare", "guarded"])
def test_a_notice_after_an_orbax_finalize_still_reaches_its_sync_point(mode):
    """The real JAX and Orbax: an asynchronous save's finalize thread asks
    JAX's sync point about its own (older) step; a notice just then sets a
    sync point the loop has passed, and the loop never saves (bare). With
    the guard the loop saves at the next step (52)."""
    port = free_port()
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(TRAINER)}
    p = subprocess.run([sys.executable, "-c", SYNC_PROBE, mode, str(port)], env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == ("saved at []" if mode == "bare" else "saved at [52]"), p.stderr[-2000:]


def test_a_step_without_a_measure_is_no_part_of_the_medians():
    """A step saved on a preemption notice before MaxText logged it (the
    save before a grow, the hang's restart) has no time or rate: the medians
    are the measured steps' (a NaN in statistics.median's sort made the
    e2e's tokens/s/device median NaN)."""
    from playbooks.runs.train_summary import Summary
    s = Summary(chip="v6e", simulated=True)
    for step in range(8):
        s.add({"t": float(step), "kind": "step", "step": step, "seconds": 1.0 + step / 10,
               "tokens_per_s_per_device": 100.0 + step, "loss": 5.0, "tflops_per_device": 0.5})
        if step == 4:
            s.add({"t": 4.5, "kind": "step", "step": 40, "seconds": None, "unlogged": "saved on a notice"})
    assert s.median_tokens_per_device == 104.5 and abs(s.median_step_seconds - 1.45) < 1e-9  # steps 2-7
    assert s.median_tflops_per_device == 0.5 and s.step_seconds_quantile(0.9) == 1.7


CACHE_PROBE = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import jax
jax.config.update("jax_compilation_cache_dir", sys.argv[2])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.distributed.initialize(f"127.0.0.1:{sys.argv[3]}", num_processes=2, process_id=int(sys.argv[4]),
                           initialization_timeout=120)
import maxtext_ray
patched = sys.argv[5] == "patched" and maxtext_ray.patch_compile_cache_key()
import numpy as np
from jax._src import compiler
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
reads = []
read = compiler._cache_read
def counted(module_name, key, *a, **kw):
    got = read(module_name, key, *a, **kw)
    reads.append({"module": module_name, "key": key, "hit": got[0] is not None})
    return got
compiler._cache_read = counted
mesh = Mesh(jax.devices(), ("d",))
x = jax.make_array_from_callback((8, 16), NamedSharding(mesh, P("d")), lambda i: np.full((1, 16), i[0].start + 1.0))
total = float(jax.jit(lambda a: (a * a).sum())(x))
print("RESULT " + json.dumps({"patched": patched, "total": total, "reads": reads}), flush=True)
"""


def two_processes(cache: Path, mode: str) -> list[dict]:
    """Both processes of one JAX group (2 x 4 CPU devices, Gloo) run the
    same jit over all 8 devices with the persistent cache in ``cache``."""
    port, env = free_port(), jax_env(4)
    procs = [subprocess.Popen([sys.executable, "-c", CACHE_PROBE, str(TRAINER), str(cache),
                               str(port), str(i), mode], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for i in (0, 1)]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=240)
        line = [x for x in stdout.splitlines() if x.startswith("RESULT ")]
        assert p.returncode == 0 and line, stderr[-3000:]
        out.append(json.loads(line[-1][len("RESULT "):]))
    return out


@pytest.mark.multiprocess
def test_on_cpu_every_simulated_host_reads_the_compilation_cache_that_process_0_wrote(tmp_path):
    """The pinned jax keys a CPU process's cache entries by its own
    topology: unpatched, process 1's key is not process 0's, and process 1
    never finds an entry (only process 0 writes them). Patched (the twin's
    workers), the keys agree: run again, both processes load the program
    process 0 compiled, and it computes the same sum over all 8 devices."""
    expected = 16 * sum(k * k for k in range(1, 9))
    unpatched = two_processes(tmp_path / "unpatched", "plain")
    assert not any(r["patched"] for r in unpatched)
    main = [[x["key"] for x in r["reads"] if x["module"] == "jit__lambda"] for r in unpatched]
    assert main[0] and main[1] and main[0] != main[1]
    again = two_processes(tmp_path / "unpatched", "plain")
    assert [any(x["hit"] for x in r["reads"] if x["module"] == "jit__lambda") for r in again] == [True, False]

    first = two_processes(tmp_path / "patched", "patched")
    assert all(r["patched"] for r in first) and first[0]["reads"] == [
        {**x, "hit": False} for x in first[1]["reads"]]          # the same keys, nothing cached yet
    second = two_processes(tmp_path / "patched", "patched")
    assert all(x["hit"] for r in second for x in r["reads"] if x["module"] == "jit__lambda")
    assert [r["total"] for r in first + second] == [expected] * 4
