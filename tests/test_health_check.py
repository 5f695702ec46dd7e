"""The health gate (trainer/health_check.py) on this machine's CPU: JAX in a
subprocess with 4 (or 2) CPU devices as a host's chips, each case of a sick
host made in that process (a test's monkeypatch of the check's function, no
backdoor in the shipped code); its settings, from the inventory to the
job's env and back; its place in the training function (no Ray)."""
import json
import os
import re
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from playbooks.config.schema import load_inventory
from tests.conftest import ROOT
from tests.test_inventory import error, resolve, write

sys.path.insert(0, str(ROOT / "trainer"))
import health_check as hc

import maxtext_ray as mr

# Each case in one JAX process (its import costs seconds): what the gate
# said (its events, and HostUnhealthy's message or None).
CASES = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import health_check as hc
import numpy as np

def run(settings, rank=0):
    events = []
    start = time.monotonic()
    try:
        hc.gate(rank, settings, emit=lambda kind, **f: events.append({"kind": kind, **f}))
        raised = None
    except hc.HostUnhealthy as e:
        raised = str(e)
    return {"events": events, "raised": raised, "seconds": time.monotonic() - start}

out = {}
ok = hc.Settings(timeout_s=60, devices=4)
out["healthy"] = run(ok)

real = hc.device_matmul
def corrupt(device, a, b):
    got = np.array(real(device, a, b))
    if device.id == 2:
        got[7, 7] += 1.0
    return got
hc.device_matmul = corrupt
out["matmul"] = run(ok)
hc.device_matmul = real

real_memory = hc.memory_check
hc.memory_check = lambda fraction: (time.sleep(30), (True, "never"))[1]
out["hung"] = run(hc.Settings(timeout_s=2, devices=4))
hc.memory_check = real_memory

real_fv = hc._fill_and_verify
def bad_read():
    fill, verify = real_fv()
    return fill, lambda x, seed: verify(x, seed + 1)
hc._fill_and_verify = bad_read
out["memory"] = run(ok)
hc._fill_and_verify = real_fv

real_gather = hc.gather
peer = {"rank": 3, "hostname": "tpu-host-b", "slice": "slice-1", "host": "0", "failed": ["devices: devices 3 of 4"]}
hc.gather = lambda mine: [mine, peer]
import jax
processes = jax.process_count
jax.process_count = lambda: 2  # a group of two: this host and its sick peer
out["peer"] = run(ok, rank=1)
jax.process_count = processes
hc.gather = lambda mine: (time.sleep(30), [])[1]
out["no_peer"] = run(hc.Settings(timeout_s=2, devices=4))
hc.gather = real_gather
print("CASES " + json.dumps(out))
"""


def jax_env(devices: int, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINER_", "TPU_"))}
    return {**env, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", **extra}


@pytest.fixture(scope="module")
def cases() -> dict:
    p = subprocess.run(["nice", "-n", "19", sys.executable, "-c", CASES, str(ROOT / "trainer")],
                       env=jax_env(4, TPU_NAME="slice-0", TPU_WORKER_ID="1"), capture_output=True, text=True,
                       timeout=300)
    line = [x for x in p.stdout.splitlines() if x.startswith("CASES ")]
    assert p.returncode == 0 and line, p.stdout[-2000:] + p.stderr[-3000:]
    return json.loads(line[-1][len("CASES "):])


def checks_of(case: dict) -> dict:
    (e,) = [e for e in case["events"] if e["kind"] == "health_checked"]
    return e["checks"]


def test_a_healthy_host_passes_every_check_and_says_so(cases):
    c = cases["healthy"]
    assert c["raised"] is None
    checks = checks_of(c)
    assert list(checks) == ["devices", "matmul", "memory", "collective"]
    assert all(x["ok"] for x in checks.values()), checks
    assert checks["devices"]["detail"] == "devices 4 of 4 (cpu)"
    assert "not the device's memory" in checks["memory"]["detail"]  # CPU: a fixed size, said
    (gate,) = [e for e in c["events"] if e["kind"] == "health_gate"]  # rank 0's summary
    assert gate["ok"] and gate["hosts"] == 1 and gate["unhealthy"] == []
    (me,) = [e for e in c["events"] if e["kind"] == "health_checked"]
    assert (me["slice"], me["host"], me["rank"], me["ok"]) == ("slice-0", "1", 0, True)


def test_a_wrong_matmul_on_one_device_fails_the_host_naming_the_device(cases):
    c = cases["matmul"]
    checks = checks_of(c)
    assert not checks["matmul"]["ok"] and checks["matmul"]["detail"].startswith("device 2: relative error")
    assert checks["devices"]["ok"] and checks["memory"]["ok"]
    assert "slice slice-0, worker 1, rank 0): matmul: device 2: relative error" in c["raised"]


def test_a_check_that_does_not_answer_is_a_failure_and_the_worker_goes_on(cases):
    c = cases["hung"]
    assert checks_of(c)["memory"] == {"ok": False, "seconds": pytest.approx(2, abs=1.5),
                                      "detail": "did not answer in 2 s"}
    assert "memory: did not answer in 2 s" in c["raised"]
    assert c["seconds"] < 25  # the check sleeps 30 s: the gate did not wait for it


def test_memory_read_back_wrong_fails_the_host(cases):
    detail = checks_of(cases["memory"])["memory"]["detail"]
    assert detail.startswith("device 0: buffer 0 of 1 read back wrong"), detail
    assert "memory: device 0" in cases["memory"]["raised"]


def test_a_healthy_host_fails_with_the_group_naming_the_sick_peer(cases):
    """Every host learns every verdict: this one is well, its peer is not,
    and this one's error names the peer's host, slice and check."""
    c = cases["peer"]
    assert all(x["ok"] for x in checks_of(c).values())
    assert "tpu-host-b (slice slice-1, worker 0, rank 3): devices: devices 3 of 4" in c["raised"]
    assert not [e for e in c["events"] if e["kind"] == "health_gate"]  # rank 1: no summary


def test_verdicts_that_never_come_fail_every_host_in_time(cases):
    c = cases["no_peer"]
    coll = checks_of(c)["collective"]
    # every host's three checks (2 s each) could have ended, then 2 s more: 8 s less its own checks' time
    assert not coll["ok"] and re.match(r"did not answer in [2-8](\.\d)? s: a host did not join", coll["detail"])
    assert "the hosts' verdicts could not be gathered" in c["raised"] and c["seconds"] < 25


def test_alone_a_host_with_fewer_devices_than_chips_exits_1_naming_them():
    p = subprocess.run(["nice", "-n", "19", sys.executable, str(ROOT / "trainer" / "health_check.py"),
                        "--timeout", "60"], env=jax_env(2, TRAINER_DEVICES_PER_HOST="4"), capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 1, p.stderr[-2000:]
    out = json.loads(p.stdout)
    assert out["checks"]["devices"] == {**out["checks"]["devices"], "ok": False, "detail": "devices 2 of 4 (cpu)"}
    assert out["checks"]["matmul"]["ok"] and out["checks"]["memory"]["ok"] and not out["ok"]
    assert "collective" not in out["checks"] and out["not_run"].startswith("collective")


def test_alone_a_bad_flag_is_one_line_and_exit_2():
    p = subprocess.run([sys.executable, str(ROOT / "trainer" / "health_check.py"), "--hbm-fraction", "1.5"],
                       env=jax_env(1), capture_output=True, text=True, timeout=60)
    assert (p.returncode, p.stdout) == (2, "")
    assert p.stderr == "health_check.py: TRAINER_HEALTH_CHECK_HBM_FRACTION='1.5' must be above 0 and at most 0.95\n"


# Two JAX processes on this machine joined by jax.distributed (as Ray
# Train's JAX backend joins a worker group), each a "host" of its own slice.
GROUP = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
import jax
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{sys.argv[2]}", num_processes=2,
                           process_id=int(sys.argv[3]), initialization_timeout=120)
import health_check as hc
if sys.argv[4] == "hang":
    time.sleep(120)  # never reaches the gate: its JAX devices never start
if sys.argv[4] == "no-gather":
    hc.gather = lambda mine: time.sleep(120)  # its checks pass, it never joins the all-gather
events = []
try:
    hc.gate(int(sys.argv[3]), hc.Settings.from_env(), emit=lambda kind, **f: events.append({"kind": kind, **f}))
    raised = None
except hc.HostUnhealthy as e:
    raised = str(e)
print("RESULT " + json.dumps({"events": events, "raised": raised}), flush=True)
os._exit(0)
"""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Group:
    """Two processes of one group, started at ``started`` (time.monotonic)."""
    procs: list[subprocess.Popen]
    second_wait: float
    started: float


def start_group(second: str, devices_expected: tuple[str, str], timeout: str, second_wait: float = 1.0) -> Group:
    """Two processes joined by jax.distributed: the first runs the gate, the
    second ``second`` ("gate", "hang", "no-gather"). ``second_wait``: how
    long the second is waited for after the first's result (then killed:
    one meant to hang)."""
    port, procs, started = free_port(), [], time.monotonic()
    for i in (0, 1):
        env = jax_env(2, TPU_NAME=f"slice-{i}", TPU_WORKER_ID="0", TRAINER_DEVICES_PER_HOST=devices_expected[i],
                      TRAINER_HEALTH_CHECK_TIMEOUT_S=timeout)
        procs.append(subprocess.Popen(["nice", "-n", "19", sys.executable, "-c", GROUP, str(ROOT / "trainer"),
                                       str(port), str(i), second if i else "gate"],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return Group(procs, second_wait, started)


def results(group: Group) -> list[dict | None]:
    """Both processes' results (None: it printed none, killed at the end)."""
    out = []
    for p in group.procs:
        try:
            stdout, stderr = p.communicate(timeout=240 if p is group.procs[0] else group.second_wait)
        except subprocess.TimeoutExpired:
            p.kill()
            stdout, stderr = p.communicate()
        line = [x for x in stdout.splitlines() if x.startswith("RESULT ")]
        out.append(json.loads(line[-1][len("RESULT "):]) if line else None)
        if p is group.procs[0]:
            assert out[0] is not None, stderr[-3000:]
    return out


# The two groups whose healthy host waits out the gate's limits on purpose
# (~45 s of the line's time between them, the CPU idle) start with this
# file, beside its other JAX processes, where their tests are selected; the
# tests read them when their turn comes.
# Each group by what its second process does, with the test that reads it.
WAITING_GROUPS = {
    "no-gather": "test_across_processes_a_host_that_never_joins_the_all_gather_fails_the_other_in_time",
    "hang": "test_across_processes_a_host_hung_before_its_gate_stops_the_other_at_its_devices",
}


@pytest.fixture(scope="module", autouse=True)
def waiting_groups(request) -> Iterator[dict[str, Group]]:
    selected = {item.name for item in request.session.items if item.path == request.path}
    # at most 4 x 8 s in the gate each
    groups = {second: start_group(second, ("2", "2"), timeout="8")
              for second, test in WAITING_GROUPS.items() if test in selected}
    yield groups
    for g in groups.values():
        for p in g.procs:
            if p.poll() is None:
                p.kill()
                p.communicate()


@pytest.mark.multiprocess
def test_across_processes_every_host_names_the_sick_one():
    """A real all-gather between two processes: the healthy host fails
    too, naming the other's slice and check; rank 0 says the group's."""
    # The sick one ends too, later than the first under load: waited for.
    well, sick = results(start_group("gate", ("2", "4"), timeout="60", second_wait=120))
    assert sick is not None
    for r in (well, sick):
        assert r["raised"].endswith("(slice slice-1, worker 0, rank 1): devices: devices 2 of 4 (cpu)"), r["raised"]
        assert checks_of(r)["collective"] == {**checks_of(r)["collective"], "ok": True,
                                              "detail": "the verdicts of 2 host(s) gathered over 4 devices"}
    (gate,) = [e for e in well["events"] if e["kind"] == "health_gate"]
    assert (gate["ok"], gate["hosts"], [h["slice"] for h in gate["unhealthy"]]) == (False, 2, ["slice-1"])


@pytest.mark.multiprocess
def test_across_processes_a_host_that_never_joins_the_all_gather_fails_the_other_in_time(waiting_groups):
    group = waiting_groups["no-gather"]
    well, _ = results(group)
    assert time.monotonic() - group.started < 150
    # Our limit, or JAX's own deadline when it comes first (Gloo's 30 s on CPU, under load): both say who is missing.
    assert re.match(r"(did not answer in \d+(\.\d)? s|JAX's all-gather timed out \(DEADLINE_EXCEEDED\) within "
                    r"\d+(\.\d)? s): a host did not join", checks_of(well)["collective"]["detail"])
    assert "the hosts' verdicts could not be gathered" in well["raised"]


@pytest.mark.multiprocess
def test_across_processes_a_host_hung_before_its_gate_stops_the_other_at_its_devices(waiting_groups):
    """JAX's devices start only with every process's: the waiting host says
    so (it cannot tell a peer hung from its own chips), runs nothing else
    that would wait on them, and fails in one check's time."""
    group = waiting_groups["hang"]
    well, _ = results(group)
    assert time.monotonic() - group.started < 100
    checks = checks_of(well)
    assert checks["devices"]["detail"].startswith("did not answer in 8 s: JAX's devices start only when all 2 "
                                                  "processes of the group start theirs")
    assert [checks[k]["detail"] for k in ("matmul", "memory", "collective")] == [hc.NO_BACKEND] * 3
    assert well["raised"].endswith("(slice slice-0, worker 0, rank 0): devices: " + checks["devices"]["detail"])


# -- bounded, settings, the message: no JAX ---------------------------------------
def test_bounded_gives_up_on_a_check_at_its_limit_and_says_an_exception_in_one_line():
    start = time.monotonic()
    c = hc.bounded("slow", lambda: (time.sleep(10), (True, ""))[1], 0.2)
    assert (c.ok, c.detail) == (False, "did not answer in 0.2 s") and time.monotonic() - start < 2

    def boom():
        raise OSError("the chip\nis gone")
    assert hc.bounded("x", boom, 5).detail == "OSError: the chip is gone"
    assert hc.bounded("x", lambda: (True, "fine"), 5).ok


@pytest.mark.parametrize("env,error", [
    ({hc.ENV_ENABLED: "yes"}, "TRAINER_HEALTH_CHECK='yes' must be on or off"),
    ({hc.ENV_TIMEOUT: "soon"}, "TRAINER_HEALTH_CHECK_TIMEOUT_S='soon' is not a number"),
    ({hc.ENV_TIMEOUT: "0"}, "TRAINER_HEALTH_CHECK_TIMEOUT_S='0' must be at least 1 and at most 86400"),
    ({hc.ENV_HBM_FRACTION: "0"}, "TRAINER_HEALTH_CHECK_HBM_FRACTION='0' must be above 0 and at most 0.95"),
    ({hc.ENV_DEVICES: "2.5"}, "TRAINER_DEVICES_PER_HOST='2.5' is not a whole number"),
])
def test_bad_settings_in_the_jobs_env_are_one_line(env, error):
    with pytest.raises(ValueError) as e:
        hc.Settings.from_env(env)
    assert str(e.value) == error


def test_settings_default_on_and_read_the_jobs_env():
    assert hc.Settings.from_env({}) == hc.Settings(True, 120.0, 0.85, None)
    assert hc.Settings.from_env({hc.ENV_ENABLED: "off", hc.ENV_TIMEOUT: "30", hc.ENV_HBM_FRACTION: "0.5",
                                 hc.ENV_DEVICES: "8"}) == hc.Settings(False, 30.0, 0.5, 8)


def test_host_unhealthy_names_every_sick_host_and_check_in_one_line():
    sick = [{"hostname": "pod-a", "slice": "s-0", "host": "2", "rank": 2, "failed": ["matmul: device 1: bad"]},
            {"hostname": "pod-b", "slice": "s-1", "host": "0", "rank": 4, "failed": ["devices: devices 3 of 4",
                                                                                   "memory: did not answer in 9 s"]}]
    msg = str(hc.HostUnhealthy(hc.message(sick, None)))
    assert "\n" not in msg and isinstance(hc.HostUnhealthy(msg), RuntimeError)
    assert msg == ("health check failed, the worker group stops before MaxText: pod-a (slice s-0, worker 2, rank 2): "
                   "matmul: device 1: bad | pod-b (slice s-1, worker 0, rank 4): devices: devices 3 of 4; memory: did "
                   "not answer in 9 s")


def test_a_verdict_fits_its_row_and_a_damaged_row_is_unread():
    checks = [hc.Check("memory", False, 1.0, "x" * 5000), hc.Check("matmul", True, 1.0, "")]
    v = hc.verdict({"rank": 0, "hostname": "h" * 500, "slice": "s", "host": "0"}, checks)
    assert len(hc.encode(v)) <= hc.VERDICT_BYTES and v["failed"][0].startswith("memory: xxx")
    assert hc.decode(hc.encode(v) + b"\0" * 10) == v
    assert hc.decode(b"{\"rank\": 0, \"fail") is None and hc.decode(b"\xff\xfe") is None


# -- in the training function ----------------------------------------------------
@pytest.fixture
def one_worker(monkeypatch):
    """train_loop_per_worker's Ray Train context (rank 1 of 2), without Ray;
    MaxText replaced by a recorder."""
    ctx = types.SimpleNamespace(get_world_rank=lambda: 1, get_world_size=lambda: 2)
    train = types.ModuleType("ray.train")
    train.get_context = lambda: ctx
    runtime = types.SimpleNamespace(get_node_id=lambda: "node-1")  # the heartbeat's
    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(train=train, get_runtime_context=lambda: runtime))
    monkeypatch.setitem(sys.modules, "ray.train", train)
    monkeypatch.setenv("TPU_WORKER_ID", "1")
    ran, gated = [], []
    monkeypatch.setattr(mr, "run_maxtext", lambda *a: ran.append(a))
    monkeypatch.setattr(mr, "watch_progress", lambda: None)
    return ran, gated


def test_a_sick_host_stops_the_worker_before_maxtext(one_worker, monkeypatch):
    ran, gated = one_worker
    monkeypatch.delenv(hc.ENV_ENABLED, raising=False)

    def sick(rank, settings, emit):
        gated.append((rank, settings))
        raise hc.HostUnhealthy("health check failed, ...: pod-a (slice s-0, ...): devices: devices 3 of 4")
    monkeypatch.setattr(mr.health_check, "gate", sick)
    with pytest.raises(hc.HostUnhealthy, match="pod-a"):
        mr.train_loop_per_worker({"argv": ["t", "base.yml"], "layout": mr.Layout()})
    assert gated == [(1, hc.Settings())] and ran == []


def test_with_the_gate_off_maxtext_starts_unchecked(one_worker, monkeypatch):
    ran, gated = one_worker
    monkeypatch.setenv(hc.ENV_ENABLED, "off")
    monkeypatch.setattr(mr.health_check, "gate", lambda *a, **k: gated.append(a))
    mr.train_loop_per_worker({"argv": ["t", "base.yml"], "layout": mr.Layout()})
    assert gated == [] and len(ran) == 1


# -- from the inventory to the job's env ------------------------------------------
def test_the_job_env_carries_the_gates_settings_under_the_trainers_names(tmp_path):
    from playbooks.job.spec import trainer_env

    local = load_inventory(write(tmp_path, {"kind": "local", "devices_per_host": 2, "health_check_timeout": 30})).env()
    env = trainer_env(local, elastic=False)
    assert {k: env[k] for k in hc.ENV_NAMES} == {
        hc.ENV_ENABLED: "on", hc.ENV_TIMEOUT: "30", hc.ENV_HBM_FRACTION: "0.85", hc.ENV_DEVICES: "2"}
    assert hc.Settings.from_env(env) == hc.Settings(True, 30.0, 0.85, 2)
    off = load_inventory(write(tmp_path, {"kind": "local", "health_check": False})).env()
    assert not hc.Settings.from_env(trainer_env(off, elastic=True)).enabled
    # GKE: a host's chips x JAX devices per chip (two on TPU7x)
    v6e = resolve(tmp_path, health_check_hbm_fraction=0.9)
    assert trainer_env(v6e, elastic=False)[hc.ENV_DEVICES] == "4"
    assert hc.Settings.from_env(trainer_env(v6e, elastic=False)).hbm_fraction == 0.9
    tpu7x = resolve(tmp_path, machine_type="tpu7x-standard-4t", topology="2x2x2")
    assert trainer_env(tpu7x, elastic=False)[hc.ENV_DEVICES] == "8"


def test_the_inventorys_defaults_and_bounds_are_the_trainers():
    """The trainer cannot import playbooks/: the two say the same numbers."""
    from playbooks.config import schema

    keys = {k.name: k for k in schema.LOCAL}
    assert (keys["health_check_timeout"].default, keys["health_check_hbm_fraction"].default) == (
        hc.TIMEOUT_S, hc.HBM_FRACTION)
    assert schema.HBM_FRACTION_MAX == hc.HBM_FRACTION_MAX
    assert schema.HEALTH_CHECK_TIMEOUT_MAX <= 24 * 3600  # within what the trainer accepts


@pytest.mark.parametrize("changes,rule", [
    ({"health_check": "maybe"}, "key 'health_check' = 'maybe' must be true or false"),
    ({"health_check_timeout": 5}, "key 'health_check_timeout' = 5 must be at least 10"),
    ({"health_check_timeout": 7200}, "key 'health_check_timeout' = 7200 must be at most 3600"),
    ({"health_check_hbm_fraction": 0.99}, "key 'health_check_hbm_fraction' = 0.99 must be a number above 0 and at "
                                          "most 0.95"),
    ({"health_check_hbm_fraction": 0}, "key 'health_check_hbm_fraction' = 0 must be a number above 0"),
    ({"health_check_hbm_fraction": True}, "key 'health_check_hbm_fraction' = True must be a number above 0"),
])
def test_bad_gate_settings_in_the_inventory_are_one_line(tmp_path, changes, rule):
    assert rule in error(tmp_path, **changes)


def test_jaxs_own_deadline_in_the_all_gather_is_a_host_that_did_not_join(monkeypatch):
    """Gloo's key-value wait (30 s on CPU) can end the all-gather before our
    limit: the same cause, said the same way; any other error is not."""
    def late(mine):
        raise RuntimeError("Gloo context initialization failed: DEADLINE_EXCEEDED: GetKeyValue() timed out with key")
    monkeypatch.setattr(hc, "gather", late)
    c, rows = hc.collective({"rank": 0}, 60.0)  # room for JAX's import under load
    assert not c.ok and rows == []
    assert c.detail == ("JAX's all-gather timed out (DEADLINE_EXCEEDED) within 60 s: a host did not join the "
                        "all-gather (hung, gone, or its interconnect is down)")
    monkeypatch.setattr(hc, "gather", lambda mine: (_ for _ in ()).throw(ValueError("bad row")))
    c, _ = hc.collective({"rank": 0}, 60.0)
    assert not c.ok and "did not join" not in c.detail and "bad row" in c.detail
