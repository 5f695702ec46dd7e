"""A follow that outlives its port-forward: `invoke train` following a
running job on GKE through `kubectl port-forward`, the port-forward process
killed mid-follow. The follower starts it again and goes on from where it
was: every log line once (none twice, none lost: the lines the job wrote
while the link was down come after it is back), the timeline whole, said
in one line; with the port-forward failing to come back, it gives up after
``reconnect_timeout`` with the job not seen to end and how to follow it
again. Also `invoke logs --follow`.

Through `invoke` against the fakes (what runs as a process and what
in-process: tests/clients.py), the real Ray Jobs SDK streaming the log over
the fake dashboard's WebSocket; the
port-forward itself is a TCP relay (tests/fakes/kubectl_shim/kubectl: the
fake Kubernetes API has no portforward subresource), started through the
same `kubectl port-forward ...` command line the playbooks run.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time

import pytest

from playbooks.runs import events as E
from tests.clients import ROOT, Cloud
from tests.fakes.cloud import INVOKE, STANDARD

pytestmark = pytest.mark.clients

SHIM = ROOT / "tests" / "fakes" / "kubectl_shim"
RUN = "rayjob-multi-slice"
SID = f"{RUN}-1"
STEPS = 12
KILL_AFTER = 5  # the port-forward killed once the follower has shown this step
STATE = ROOT / ".state" / STANDARD


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def step_lines(n: int) -> list[str]:
    """What the trainer prints of step n: its event, MaxText's step line."""
    e = {"t": round(time.time(), 3), "kind": E.STEP, "step": n, "seconds": 0.5, "loss": 7.0 - n / 10,
         "tokens_per_s_per_device": 1000.0, "tflops_per_device": 1.0}
    return [f"(RayTrainWorker pid=42, ip=10.0.0.3) trainer event: {json.dumps(e)}",
            f"(RayTrainWorker pid=42, ip=10.0.0.3) completed step: {n}, seconds: 0.500, TFLOP/s/device: 1.000, "
            f"Tokens/s/device: 1000.000, total_weights: 4096, loss: {7.0 - n / 10:.3f}"]


class Job:
    """The fake dashboard's job, written to as a trainer would, a step
    every ``every`` seconds, ended SUCCEEDED after its last."""

    def __init__(self, cloud: Cloud, every: float = 0.4):
        self.cloud, self.every = cloud, every
        cloud.dashboard.add_job(SID, f"python maxtext_multi_slice_trainer.py base.yml run_name={RUN} steps={STEPS}")
        cloud.dashboard.log(SID, "(TrainController pid=7) Started training worker group of size 8.")
        self.go = threading.Event()
        self.thread = threading.Thread(target=self.write, daemon=True)

    def write(self) -> None:
        for n in range(STEPS):
            self.go.wait()
            self.cloud.dashboard.log(SID, *step_lines(n))
            time.sleep(self.every)
        self.cloud.dashboard.log(SID, "(TrainController pid=7) Training complete.")
        self.cloud.dashboard.end(SID)


@pytest.fixture
def gke(cloud: Cloud, tmp_path):
    """The cluster up, the dashboard reached through the shim's port-forward."""
    cloud.seed_full()
    cloud.get_credentials()
    port = free_port()
    cloud.change_inventory(dashboard_port=port, reconnect_timeout=10)
    env = {"PATH": f"{SHIM}:{cloud.env()['PATH']}", "KUBE_TEST_REAL_KUBECTL": shutil.which("kubectl") or "",
           "KUBE_TEST_FORWARD_TO": str(cloud.dashboard.port),
           "KUBE_TEST_FORWARD_REFUSE": str(tmp_path / "refuse")}
    shutil.rmtree(STATE / "training" / RUN, ignore_errors=True)
    yield cloud, env, tmp_path / "refuse"
    pid = forward_pid()
    if pid:
        with __import__("contextlib").suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    (STATE / "port-forward.pid").unlink(missing_ok=True)


def forward_pid() -> int | None:
    p = STATE / "port-forward.pid"
    if not p.is_file():
        return None
    text = p.read_text().strip()
    try:
        return int(json.loads(text)["pid"]) if text.startswith("{") else int(text.split()[0])
    except (ValueError, KeyError, IndexError):
        return None


def start(cloud: Cloud, env: dict, *args: str) -> tuple[subprocess.Popen, list[str]]:
    p = subprocess.Popen([str(INVOKE), *args], env=cloud.env(**env), cwd=ROOT, stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []

    def read() -> None:
        assert p.stdout is not None
        for line in p.stdout:
            lines.append(line.rstrip("\n"))

    threading.Thread(target=read, daemon=True).start()
    return p, lines


def wait_for(lines: list[str], text: str, p: subprocess.Popen, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not any(text in ln for ln in lines):
        assert p.poll() is None or any(text in ln for ln in lines), "\n".join(lines[-60:])
        assert time.monotonic() < deadline, f"no {text!r} within {seconds} s:\n" + "\n".join(lines[-60:])
        time.sleep(0.1)


def kill_forward() -> int:
    pid = forward_pid()
    assert pid, "no port-forward pid file"
    os.kill(pid, signal.SIGKILL)
    return pid


def test_train_follows_on_after_its_port_forward_is_killed_every_line_once(gke):
    cloud, env, _ = gke
    job = Job(cloud)
    job.thread.start()
    p, lines = start(cloud, env, "train", "--skip-preflight")
    wait_for(lines, f"job {SID} of run {RUN} is already RUNNING: following it", p)
    job.go.set()
    wait_for(lines, f"completed step: {KILL_AFTER},", p)
    killed = kill_forward()
    rc = p.wait(timeout=240)
    out = "\n".join(lines)
    assert rc == 0, out[-5000:]
    # Said in one line, with where it stopped.
    [said] = [ln for ln in lines if "port-forward to the Ray dashboard dropped" in ln]
    assert f"job {SID}'s log stopped after line" in said and "following the job on from there" in said, said
    assert forward_pid() not in (None, killed)  # a new port-forward, through the same command line
    # Every step once: none twice, none lost.
    for n in range(STEPS):
        assert sum(f"completed step: {n}," in ln for ln in lines) == 1, (n, out[-5000:])
    assert f"ok: [train : job {RUN} (llama3-8b)]" in out or f"job {SID} SUCCEEDED" in out, out[-3000:]
    # The run's log file and its timeline hold each line and step once.
    [log] = sorted((STATE / "runs").glob("*-train/job.log"))[-1:]
    text = log.read_text()
    for n in range(STEPS):
        assert text.count(f"completed step: {n},") == 1, n
    events = [json.loads(x) for x in (STATE / "training" / RUN / "events.jsonl").read_text().splitlines()]
    steps = [e["step"] for e in events if e["kind"] == E.STEP and e.get("job") == SID]
    assert steps == list(range(STEPS)), steps
    assert any(e["kind"] == E.JOB_END and e.get("status") == "SUCCEEDED" for e in events)


def test_a_port_forward_that_does_not_come_back_ends_the_follow_in_bounded_time_saying_how_to_follow_again(gke):
    cloud, env, refuse = gke
    job = Job(cloud)
    job.thread.start()
    p, lines = start(cloud, env, "logs", "--follow", f"--run={RUN}")
    wait_for(lines, "watch: no new step", p)
    job.go.set()
    wait_for(lines, f"completed step: {KILL_AFTER},", p)
    refuse.write_text("")
    kill_forward()
    at = time.monotonic()
    rc = p.wait(timeout=180)
    took = time.monotonic() - at
    out = "\n".join(lines)
    assert rc != 0, out[-3000:]
    assert took < 10 + 30, took  # reconnect_timeout, and a look or two
    assert (f"job {SID} was not seen to end: its log's stream from the Ray dashboard" in out
            and "could not be reached again within 10 s (reconnect_timeout)" in out
            and f"`invoke logs --run {RUN} --follow` follows it again" in out), out[-3000:]
    assert "Traceback" not in out
    # Followed again (the port-forward back): from the start, the whole log, the job's end.
    refuse.unlink()
    again = subprocess.run([str(INVOKE), "logs", "--follow", f"--run={RUN}"], env=cloud.env(**env), cwd=ROOT,
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=240)
    assert again.returncode == 0, again.stdout[-3000:]
    assert f"completed step: {STEPS - 1}," in again.stdout
