"""The twin shaped as another TPU generation: two TPU v5p slices of 2x2x1
(one host of 4 chips each, TPU_ACCELERATOR_TYPE v5p-8: TensorCores), the
inventory's `local-v5p` on ports of its own. Ray's real TPU path accepts the
v5p host, Ray Train asks for TPU-V5P, and a brief elastic job trains on both
slices to SUCCEEDED; its summary says MFU "simulated" (no percent of a TPU
peak the CPU never had). Minutes."""
import os
import re
import shutil
import subprocess

import pytest
import yaml

from tests.conftest import INVOKE, ROOT

pytestmark = pytest.mark.e2e
ENV = "e2e-local-v5p"
STEPS = 8
# Another checkout may run the e2e tests on this machine at the same time
# (tests/test_local_e2e.py's offset): ports and an address of its own.
OFFSET = int(os.environ.get("PLAYBOOK_E2E_OFFSET", "0"))
GCS_PORT = 6700 + 100 * OFFSET


@pytest.fixture(scope="module")
def invoke(tmp_path_factory):
    d = tmp_path_factory.mktemp("e2e-v5p")
    base = yaml.safe_load((ROOT / "inventory.yaml").read_text())["environments"]["local-v5p"]
    env = {**base, "gcs_port": GCS_PORT, "dashboard_port": 8295 + OFFSET, "ray_ip": f"127.0.0.{20 + OFFSET}",
           "resize_interval": 3}
    inv = d / "inventory.yaml"
    inv.write_text(yaml.safe_dump({"default": ENV, "environments": {ENV: env}}))
    shutil.rmtree(ROOT / ".state" / ENV, ignore_errors=True)
    e = {k: v for k, v in os.environ.items() if not k.startswith("INVOKE_")}
    e.update({"INVOKE_PLAYBOOK_INVENTORY": str(inv), "HOME": str(d), "RAY_USAGE_STATS_ENABLED": "0"})

    def run(*args, timeout=900):
        r = subprocess.run([INVOKE, "-r", str(ROOT), *args], cwd=d, env=e, capture_output=True, text=True,
                           timeout=timeout)
        return r.returncode, r.stdout + r.stderr

    yield run
    run("teardown", "--yes", timeout=120)


def test_a_v5p_shaped_twin_trains_an_elastic_job_on_both_slices(invoke):
    rc, out = invoke("up")
    assert rc == 0, out[-4000:]
    assert "TPU_ACCELERATOR_TYPE=v5p-8 TPU_TOPOLOGY=2x2x1" in out
    assert "TPU host tpu-group-1-0 joined (v5p-8, 4 chips)" in out
    rc, out = invoke("train", "--elastic", "--steps", str(STEPS), timeout=1500)
    assert rc == 0, out[-6000:]
    assert '"TRAINER_ACCELERATOR_TYPE": "TPU-V5P"' in out and '"TRAINER_TOPOLOGY": "2x2x1"' in out
    assert "'accelerator_type:TPU-V5P'" in out          # Ray Train asked for v5p hosts
    assert re.search(rf"job rayjob-elastic-8b-\d+ SUCCEEDED: {STEPS} steps", out), out[-4000:]
    assert re.search(rf"^  steps: {STEPS} \(last step {STEPS - 1}\)$", out, re.M), out[-4000:]
    assert re.search(r"^  MFU: simulated \([\d.e-]+ TFLOP/s/device on this machine's CPU, standing in for v5p "
                     r"chips: no percent of a TPU peak it never had\)$", out, re.M), out[-4000:]
