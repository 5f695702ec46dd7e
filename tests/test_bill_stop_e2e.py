"""Stopping the bill keeps the run (issue 64, item 1) on the twin: a run
trained to a checkpoint, `invoke stop-tpus` stops the simulated TPU hosts
(the twin's "TPU node pools": its Ray worker nodes) and keeps the Ray head
and the checkpoints; a second stop changes nothing; `invoke up` starts the
hosts again, and `invoke train` resumes the run from its last checkpoint,
not from step 0. One slice of one host, a tiny model: a few minutes."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest
import yaml

from tests.conftest import INVOKE, ROOT

pytestmark = pytest.mark.e2e
ENV = "e2e-bill-stop"
OFFSET = int(os.environ.get("PLAYBOOK_E2E_OFFSET", "0"))  # another checkout's e2e on this machine: its own ports
GCS_PORT = 7100 + 100 * OFFSET
FIRST, THEN, PERIOD = 10, 16, 5   # steps of the first job and of the resumed one; the checkpoint period
NODES = ROOT / ".state" / ENV / "nodes"


@pytest.fixture(scope="module")
def local(tmp_path_factory, twin_compile_cache):
    """A local environment of its own (ports, state folder): one slice of
    one simulated host; torn down after."""
    d = tmp_path_factory.mktemp("bill-stop")
    base = yaml.safe_load((ROOT / "inventory.yaml").read_text())["environments"]["local"]
    env = {**base, "slices": 1, "gcs_port": GCS_PORT, "dashboard_port": 8330 + OFFSET,
           "ray_ip": f"127.0.0.{31 + OFFSET}",
           "train_overrides": {**base["train_overrides"], "checkpoint_period": PERIOD,
                               "jax_cache_dir": twin_compile_cache}}
    inv = d / "inventory.yaml"
    inv.write_text(yaml.safe_dump({"default": ENV, "environments": {ENV: env}}))
    shutil.rmtree(ROOT / ".state" / ENV, ignore_errors=True)
    e = {k: v for k, v in os.environ.items() if not k.startswith("INVOKE_")}
    e.update({"INVOKE_PLAYBOOK_INVENTORY": str(inv), "HOME": str(d), "RAY_USAGE_STATS_ENABLED": "0"})

    def invoke(*args, timeout=900):
        r = subprocess.run([INVOKE, *args], cwd=ROOT, env=e, capture_output=True, text=True, timeout=timeout)
        return r.returncode, r.stdout + r.stderr

    yield invoke
    invoke("teardown", "--yes", timeout=120)
    shutil.rmtree(ROOT / ".state" / ENV, ignore_errors=True)


def running(name: str) -> bool:
    """Whether the twin's node ``name`` runs: its pid file names a live process."""
    pid = NODES / f"{name}.pid"
    try:
        os.kill(int(json.loads(pid.read_text())["pid"]), 0)
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return True


def restored(out: str) -> list[int]:
    m = re.search(r"^\s+restored from checkpoint step\(s\): (.+)$", out, re.M)
    return [int(x) for x in m.group(1).split(", ")] if m else []


def test_stop_tpus_keeps_the_head_and_the_checkpoints_and_train_resumes_after_up(local):
    rc, out = local("up")
    assert rc == 0, out
    rc, out = local("train", "--fresh", "--yes", f"--steps={FIRST}")
    assert rc == 0, out
    checkpoints = sorted((ROOT / ".state" / ENV).rglob("checkpoints"))
    assert checkpoints, out
    saved = sorted(p.name for p in checkpoints[0].iterdir() if p.name.isdigit())
    assert saved, f"no checkpoint step in {checkpoints[0]}"
    assert running("head") and running("tpu-group-0-0")

    rc, out = local("stop-tpus")
    assert rc == 0, out
    assert "changed: [stop-tpus : stop tpu-group-0-0] stopped tpu-group-0-0" in out, out
    assert not running("tpu-group-0-0") and running("head"), out
    assert sorted(p.name for p in checkpoints[0].iterdir() if p.name.isdigit()) == saved
    rc, again = local("stop-tpus")
    assert rc == 0 and re.search(rf"^stop-tpus {ENV}: ok=\d+ changed=0 failed=0", again, re.M), again
    assert "tpu-group-0-0 is not running" in again

    rc, out = local("up")
    assert rc == 0 and running("tpu-group-0-0"), out
    assert "ok: [twin : Ray head" in out, out  # the head was kept, not started again
    rc, out = local("train", f"--steps={THEN}")
    assert rc == 0, out
    back = restored(out)
    assert back and back[0] >= PERIOD and str(back[0]) in saved, out   # from its checkpoint, not step 0
