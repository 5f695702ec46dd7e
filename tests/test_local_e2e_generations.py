"""The twin shaped as the other TPU generations, each on ports of its own:
two TPU v5e slices of 2x2 (one host of 4 chips each, TPU_ACCELERATOR_TYPE
v5litepod-4: chips) and two TPU v5p slices of 2x2x1 (one host of 4 chips,
v5p-8: TensorCores), the inventory's `local-v5e` and `local-v5p`. Ray's real
TPU path accepts each host, Ray Train asks for that generation's accelerator
type, and a brief elastic job trains on both slices to SUCCEEDED; its summary
says MFU "simulated" (no percent of a TPU peak the CPU never had). Minutes."""
import os
import re
import shutil
import subprocess

import pytest
import yaml

from tests.conftest import INVOKE, ROOT
from tests.test_local_e2e import STEPS as E2E_STEPS

pytestmark = pytest.mark.e2e
STEPS = 6
# Another checkout may run the e2e tests on this machine at the same time
# (tests/test_local_e2e.py's offset): ports and an address of its own.
OFFSET = int(os.environ.get("PLAYBOOK_E2E_OFFSET", "0"))
# Each generation: (its shipped environment, its hosts' TPU_ACCELERATOR_TYPE,
# its TPU_TOPOLOGY, Ray's accelerator type, the chip the summary names), and
# its own ports and address.
SHAPES = {
    "v5e": ("local-v5e", "v5litepod-4", "2x2", "TPU-V5LITEPOD", 0),
    "v5p": ("local-v5p", "v5p-8", "2x2x1", "TPU-V5P", 1),
}


@pytest.fixture(scope="module", params=sorted(SHAPES))
def shape(request):
    return request.param


@pytest.fixture(scope="module")
def invoke(tmp_path_factory, shape, twin_compile_cache):
    name, _, _, _, k = SHAPES[shape]
    env_name = f"e2e-{name}"
    d = tmp_path_factory.mktemp(f"e2e-{shape}")
    base = yaml.safe_load((ROOT / "inventory.yaml").read_text())["environments"][name]
    env = {**base, "gcs_port": 6700 + 100 * OFFSET + 50 * k, "dashboard_port": 8295 + 2 * OFFSET + k,
           "ray_ip": f"127.0.0.{20 + 2 * OFFSET + k}", "resize_interval": 3,
           # The learning-rate schedule of tests/test_local_e2e.py's job (its steps):
           # the step's program holds the schedule, so with it this job's is the e2e
           # run's two-slice program, read from the line's compilation cache
           # (twin_compile_cache) instead of compiled again; its 6 steps are the
           # schedule's first 6.
           "train_overrides": {**base["train_overrides"], "jax_cache_dir": twin_compile_cache,
                               "learning_rate_schedule_steps": E2E_STEPS}}
    inv = d / "inventory.yaml"
    inv.write_text(yaml.safe_dump({"default": env_name, "environments": {env_name: env}}))
    shutil.rmtree(ROOT / ".state" / env_name, ignore_errors=True)
    e = {k: v for k, v in os.environ.items() if not k.startswith("INVOKE_")}
    e.update({"INVOKE_PLAYBOOK_INVENTORY": str(inv), "HOME": str(d), "RAY_USAGE_STATS_ENABLED": "0"})

    def run(*args, timeout=900):
        r = subprocess.run([INVOKE, "-r", str(ROOT), *args], cwd=d, env=e, capture_output=True, text=True,
                           timeout=timeout)
        return r.returncode, r.stdout + r.stderr

    yield run
    run("teardown", "--yes", timeout=120)


def test_a_twin_of_each_generation_trains_an_elastic_job_on_both_slices(invoke, shape):
    _, pod_type, topology, ray_type, _ = SHAPES[shape]
    rc, out = invoke("up")
    assert rc == 0, out[-4000:]
    assert f"TPU_ACCELERATOR_TYPE={pod_type} TPU_TOPOLOGY={topology}" in out
    assert f"TPU host tpu-group-1-0 joined ({pod_type}, 4 chips)" in out
    rc, out = invoke("train", "--elastic", "--steps", str(STEPS), timeout=1500)
    assert rc == 0, out[-6000:]
    assert f'"TRAINER_ACCELERATOR_TYPE": "{ray_type}"' in out and f'"TRAINER_TOPOLOGY": "{topology}"' in out
    assert f"'accelerator_type:{ray_type}'" in out          # Ray Train asked for that generation's hosts
    assert re.search(rf"job rayjob-elastic-8b-\d+ SUCCEEDED: {STEPS} steps", out), out[-4000:]
    assert re.search(rf"^  steps: {STEPS} \(last step {STEPS - 1}\)$", out, re.M), out[-4000:]
    assert re.search(rf"^  MFU: simulated \([\d.e-]+ TFLOP/s/device on this machine's CPU, standing in for {shape} "
                     r"chips: no percent of a TPU peak it never had\)$", out, re.M), out[-4000:]
