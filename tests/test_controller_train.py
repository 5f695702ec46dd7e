"""`invoke train` for a GKE environment run from a controller host (a real
sshd on 127.0.0.1) reaches SUCCEEDED on a real Ray cluster: the local twin,
one simulated v6e-4 host, standing in for the RayCluster. The fakes answer
gcloud and kubectl on the controller; a TCP relay on localhost stands in for
`kubectl port-forward svc/...-head-svc` (the fake cluster has no pods to
forward to). `ray job submit` and `ray job logs --follow` run on the
controller, the job runs on the twin, MaxText trains a tiny model on CPU.

Its own fakes, environment names, ports and `.state/` folders: it may run
beside the other tests of clients in another worker."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests import sshd
from tests.fakes.cloud import INVOKE, ROOT, STANDARD, fake_cloud

pytestmark = [pytest.mark.e2e, pytest.mark.clients]

GKE_ENV = "ctl-train-gke"
TWIN = "ctl-train-twin"
TWIN_IP, TWIN_GCS, TWIN_DASHBOARD = "127.0.0.4", 6600, 8285


class Relay:
    """127.0.0.1:<port> -> target: what a port-forward to the head service
    does, for a head that is a local process."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.sock.close()


def test_train_through_the_controller_reaches_succeeded_on_a_local_ray_cluster(tmp_path, twin_compile_cache):
    for name in (GKE_ENV, TWIN):
        shutil.rmtree(ROOT / ".state" / name, ignore_errors=True)
    shipped = yaml.safe_load((ROOT / "inventory.yaml").read_text())["environments"]["local"]
    # The job's outputs and its compilation cache on this machine, where the
    # twin's workers are (a GKE job's are in its bucket: gs:// is not here,
    # and each cache read would wait for a DNS lookup that cannot answer);
    # the cache is the one the twin's other jobs of this worker use.
    overrides = dict(shipped["train_overrides"], base_output_directory=f"{tmp_path}/data/",
                     jax_cache_dir=twin_compile_cache)
    twin_inv = tmp_path / "twin.yaml"
    twin_inv.write_text(yaml.safe_dump({"default": TWIN, "environments": {TWIN: dict(
        shipped, slices=1, topology="2x2", ray_ip=TWIN_IP, gcs_port=TWIN_GCS, dashboard_port=TWIN_DASHBOARD)}}))
    relay = Relay((TWIN_IP, TWIN_DASHBOARD))
    short_tmp = tempfile.mkdtemp(prefix="ctl-", dir="/tmp")
    with fake_cloud(tmp_path / "cloud") as cloud:
        data = yaml.safe_load(cloud.inventory_path.read_text())
        gke = dict(data["environments"][STANDARD], slices=1, topology="2x2", dashboard_port=relay.port,
                   worker_packages="image", train_overrides=overrides)
        server = sshd.start(tmp_path / "sshd", {k: v for k, v in cloud.env(GKE_ENV).items()
                                                 if not k.startswith("INVOKE_")})
        gke.update(server.inventory_keys(str(tmp_path / "remote")))
        cloud.inventory_path.write_text(yaml.safe_dump({"default": GKE_ENV, "environments": {GKE_ENV: gke}}))
        cloud._inventory_text = cloud.inventory_path.read_text()
        cloud.seed_project()
        cloud.seed_cluster(GKE_ENV)
        # The twin: started here, with no proxy (the fakes' client
        # environment sends stray traffic to a sink) and a short TMPDIR (Ray's
        # socket paths must fit in 107 bytes).
        twin_env = {k: v for k, v in cloud.env(GKE_ENV).items() if "proxy" not in k.lower()}
        twin_env.update(INVOKE_PLAYBOOK_INVENTORY=str(twin_inv), INVOKE_PLAYBOOK_ENV=TWIN,
                        PATH=os.environ["PATH"], TMPDIR=short_tmp)

        def twin(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run([str(INVOKE), *args], env=twin_env, cwd=ROOT, capture_output=True, text=True,
                                  timeout=300)
        try:
            up = twin("up")
            assert up.returncode == 0, up.stdout + up.stderr

            run = cloud.invoke("train", "--skip-preflight", "--steps=3", env_name=GKE_ENV, timeout=900)
            the_job_ran_on_the_twin_submitted_from_the_controller(run, server.target, tmp_path / "remote")
        finally:
            twin("teardown", "--yes")
            server.stop()
            relay.close()
            shutil.rmtree(short_tmp, ignore_errors=True)
    for name in (GKE_ENV, TWIN):
        shutil.rmtree(ROOT / ".state" / name, ignore_errors=True)


def the_job_ran_on_the_twin_submitted_from_the_controller(run, target: str, remote: Path) -> None:
    assert run.rc == 0, run.out[-6000:]
    assert f"on controller {target}" in run.out
    assert "Ray 2.60.0 dashboard at http://localhost:" in run.out       # the relay, as a port-forward
    assert "SUCCEEDED" in run.out and "completed step: 2" in run.out, run.out[-4000:]
    assert "storage.googleapis.com" not in run.out       # the compilation cache read here
    # The job ran on the twin, submitted from the controller.
    with urllib.request.urlopen(f"http://{TWIN_IP}:{TWIN_DASHBOARD}/api/jobs/", timeout=10) as r:
        jobs = json.load(r)
    ours = [j for j in jobs if str(j.get("submission_id", "")).startswith("rayjob-multi-slice-")]
    assert [j["status"] for j in ours] == ["SUCCEEDED"], jobs
    logs = sorted(Path(ROOT / ".state" / GKE_ENV / "runs").glob("*-train/*.log"))
    submit = [p.read_text() for p in logs if p.read_text().startswith("$ ray job submit")]
    assert submit and all(f"# on controller {target}" in t for t in submit), [p.name for p in logs]
    # The controller had the trainer synced into its remote_dir.
    assert (remote / "trainer" / "maxtext_ray.py").is_file()
