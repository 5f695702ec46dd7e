"""The harness: the fakes (GCP, the cluster's Kubernetes API, a Ray
dashboard) on 127.0.0.1, a hermetic environment for the real clients, and
``invoke`` run as a user would run it.

Every client process gets a HOME, CLOUDSDK_CONFIG and KUBECONFIG of the
test's fake cloud, endpoint overrides pointing at the fakes, the fakes' CA
certificates, and credentials that expire, as a real account's do: gcloud
signed in with a service account key (made once per process, its gcloud
configuration copied into a folder of the tests'), whose token comes from
the current fake's token endpoint with an expiry, so gke-gcloud-auth-plugin keeps
it in ~/.kube and starts a gcloud only when it has none; gsutil takes the
key from gcloud. Each test gets a new kubeconfig; HOME and the gcloud
configuration, with the tokens kept in them and in this tool's token cache,
go on from test to test while gcloud's configuration is unchanged, as on a
user's machine (``Cloud.next_test_clients``), and are made again after a
test changed it. ``Cloud.use_access_token_file`` gives a test gcloud's
access-token file instead (no expiry: the plugin asks gcloud on every
kubectl call), with a boto config whose OAuth refresh token the fake's token
endpoint exchanges for the same access token. HTTP(S)_PROXY points at a sink on
127.0.0.1 that records any request meant for somewhere else, so a stray call
to a real Google host fails fast and is seen (``Cloud.stray``).

``cloud_session`` is a module-scoped pytest fixture; ``cloud`` gives each
test empty fakes and a new kubeconfig. With pytest's ``--processes-only``
(tests/conftest.py) every process it starts has
TPU_PLAYBOOKS_PROCESSES_ONLY=1 (``Cloud.processes_only``): the plays' gcloud
and kubectl commands all run as the real processes, none is answered by the
connector in-process (``playbooks/access/gcp_api.py``, ``kube_api.py``).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from .gcp import FakeGcp, KubeLink, changes
from .kube import FakeKube
from .ray_dashboard import FakeDashboard
from .server import Request
from .tls import make_pki

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = ROOT / ".venv" / "bin"
INVOKE = VENV_BIN / "invoke"
TOKEN = "ya29.fake-access-token-for-tests"
PROJECT = "fake-tpu-project"
PROJECT_NUMBER = "123456789012"
SERVICE_ACCOUNT = f"playbooks@{PROJECT}.iam.gserviceaccount.com"  # the clients' gcloud account (Cloud.fresh_clients)
USER = "tester@example.com"

# Environment names unique to these tests and to this pytest-xdist worker:
# the tool keeps .state/<env>/, and the test files of clients run at once,
# one per worker, each with its own fakes.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
STANDARD = "clients-test-standard" + (f"-{_WORKER}" if _WORKER else "")
AUTOPILOT = "clients-test-autopilot" + (f"-{_WORKER}" if _WORKER else "")

# Each client process is started through a wrapper that writes its command
# line to the file named by this variable (when set), then execs the real
# client: how the tests and bench/provision.py count the processes a run
# starts, kubectl's auth plugin and the gcloud it starts included.
# The signed-in gcloud configuration (Cloud._service_account_config), made
# once per process (each pytest worker) and copied for every fake cloud after
# the first: its key's token URI names the first fake, but gcloud and gsutil
# renew at the token host of the environment they run in (the current fake's
# auth/token_host, BOTO's provider_token_uri; tried 2026-12-07 with the first
# fake stopped), and every fake accepts the same token. Two gcloud processes
# per test file fewer.
SIGNED_IN: list[Path] = []
COUNTED = ("gcloud", "gsutil", "kubectl", "gke-gcloud-auth-plugin")
COUNT_LOG = "TPU_PLAYBOOKS_TEST_STARTED"

RECAP = re.compile(r"^(?P<play>\S+) (?P<env>\S+): ok=(?P<ok>\d+) changed=(?P<changed>\d+) "
                   r"(?:unreachable=(?P<unreachable>\d+) )?failed=(?P<failed>\d+) skipped=(?P<skipped>\d+)", re.M)


def inventory(dashboard_port: int, autopilot_dashboard_port: int) -> dict:
    """Two GKE environments with the tutorial's shape: Standard (zonal, node
    pools) and Autopilot (regional, its own namespace). One project and
    region: each has its own dashboard port (no two environments may own one
    thing; Autopilot has no VPCs of ours)."""
    common = {"kind": "gke", "project_id": PROJECT, "region": "us-east5", "zone": "us-east5-b",
              "cluster_version": "1.35.2-gke.1842000", "ksa_name": "maxtext-ksa", "user_identifier": USER}
    return {"default": STANDARD, "environments": {
        STANDARD: dict(common, mode="standard", cluster_name="maxtext-multislice", gs_bucket=f"{PROJECT}-ckpt",
                       namespace="default", slices=2, topology="4x4", machine_type="ct6e-standard-4t",
                       dashboard_port=dashboard_port),
        AUTOPILOT: dict(common, mode="autopilot", cluster_name="maxtext-autopilot",
                        gs_bucket=f"{PROJECT}-autopilot", namespace="maxtext", dashboard_port=autopilot_dashboard_port),
    }}


class StraySink:
    """A proxy that proxies nothing: it records the first line of each
    request (``CONNECT host:443``, ``GET http://metadata...``) and refuses."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self._stop = False
        threading.Thread(target=self._loop, name="stray-sink", daemon=True).start()

    def _loop(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    line = conn.recv(4096).split(b"\r\n", 1)[0].decode(errors="replace")
                except OSError:
                    line = "(no request line)"
                self.lines.append(line)
                with suppress(OSError):
                    conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    def close(self) -> None:
        self._stop = True
        self.sock.close()


@dataclass
class Run:
    """One ``invoke`` run: its exit code, its output, and what the fakes
    received while it ran."""

    args: tuple[str, ...]
    rc: int
    out: str
    gcp: list[Request]
    kube: list[Request]
    seconds: float
    processes: list[str] = field(default_factory=list)

    def started(self, *programs: str) -> list[str]:
        """The client processes this run started (every one, the auth
        plugin's and the ones the auth plugin started too), as
        ``PROGRAM ARGS``; only those of ``programs`` when given."""
        return [p for p in self.processes if not programs or p.split(" ", 1)[0] in programs]

    @property
    def requests(self) -> list[Request]:
        return sorted(self.gcp + self.kube, key=lambda r: r.at)

    @property
    def changes(self) -> list[Request]:
        """Requests that can change state, at both fakes."""
        return [r for r in self.requests if changes(r)]

    def recaps(self) -> list[dict[str, Any]]:
        return [{k: (int(v) if v.isdigit() else v) for k, v in m.groupdict(default="0").items()}
                for m in RECAP.finditer(self.out)]

    def calls(self, method: str, pattern: str) -> list[Request]:
        return [r for r in self.requests if r.method == method and re.search(pattern, r.path)]

    def __str__(self) -> str:
        reqs = "\n".join(f"  {r.method} {r.path} -> {r.status}" for r in self.requests)
        return f"$ invoke {' '.join(self.args)}  (exit {self.rc}, {self.seconds:.1f}s)\n{self.out}\nrequests:\n{reqs}"


@dataclass
class Cloud:
    """The fakes, the client environment and the runner."""

    base: Path
    gcp: FakeGcp
    kube: FakeKube
    dashboard: FakeDashboard
    sink: StraySink
    inventory_path: Path
    clients: Path = field(init=False)
    runs: list[Run] = field(default_factory=list)
    # pytest --processes-only (tests/conftest.py): every client process, script and `invoke` run of the test
    # is given TPU_PLAYBOOKS_PROCESSES_ONLY=1, so no gcloud or kubectl command is answered in-process.
    processes_only: bool = False

    def __post_init__(self) -> None:
        self.clients = self.base / "clients-0"
        self.kube_dir = self.clients / "kube"
        self.service_account = False
        self._n = 0
        self._kept: tuple | None = None
        self._kubeconfigs: dict[str, str] = {}  # what get-credentials wrote into a new kubeconfig, by cluster
        self._inventory_text = self.inventory_path.read_text()
        self._signed_in: Path | None = None

    # -- client environment ------------------------------------------------------
    def fresh_clients(self, token_file: bool = False) -> None:
        """New HOME / CLOUDSDK_CONFIG / KUBECONFIG for the next runs: gcloud
        signed in with the service account (credentials that expire), or,
        with ``token_file``, given gcloud's access-token file."""
        self._n += 1
        self.clients = self.base / f"clients-{self._n}"
        self.kube_dir = self.clients / "kube"
        for d in ("home", "kube"):
            (self.clients / d).mkdir(parents=True, exist_ok=True)
        (self.clients / "token").write_text(TOKEN + "\n")
        self.service_account = not token_file
        if token_file:
            (self.clients / "gcloud").mkdir()
        else:
            shutil.copytree(self._service_account_config(), self.clients / "gcloud")
        # gsutil takes a signed-in service account's key from gcloud (its
        # legacy credentials' .boto): a refresh token here too would be a
        # second credential it refuses.
        refresh = "gs_oauth2_refresh_token = fake-refresh-token\n" if token_file else ""
        (self.clients / "boto.cfg").write_text(
            "[Credentials]\n"
            "gs_json_host = 127.0.0.1\n"
            f"gs_json_port = {self.gcp.server.port}\n"
            f"{refresh}"
            "[OAuth2]\n"
            f"provider_token_uri = {self.gcp.url}/oauth2/token\n"
            "client_id = fake-client-id\n"
            "client_secret = fake-client-secret\n"
            "[GSUtil]\n"
            "software_update_check_period = 0\n")
        self._kept = self._gcloud_stamp() if self.service_account else None

    def _gcloud_stamp(self) -> tuple:
        """What says gcloud's configuration changed (`gcloud config set`,
        `gcloud auth ...`): its sentinel file, its configurations and its
        credentials, as the auth plugin and this tool's token cache see it."""
        g = self.clients / "gcloud"
        files = [g / "config_sentinel", g / "active_config", g / "credentials.db", *sorted(g.glob("configurations/*"))]
        return tuple((f.name, f.stat().st_mtime_ns if f.exists() else None) for f in files)

    def next_test_clients(self) -> None:
        """The client folders of the next test: a new kubeconfig (no context
        but what the test makes), and the same HOME and gcloud configuration
        while it is signed in and unchanged, so the tokens gcloud, the auth
        plugin (~/.kube) and this tool (.state/gcloud-tokens) kept are still
        used, as on a user's machine; new ones after a test changed them."""
        if not (self.service_account and self._kept == self._gcloud_stamp()):
            self.fresh_clients()
            return
        self._n += 1
        self.kube_dir = self.clients / f"kube-{self._n}"
        self.kube_dir.mkdir()

    def use_access_token_file(self) -> None:
        """Fresh client folders whose gcloud has the access-token file, from
        now until the next test: a token without an expiry, so
        gke-gcloud-auth-plugin keeps nothing and asks gcloud on every call."""
        self.fresh_clients(token_file=True)

    def _service_account_config(self) -> Path:
        """A gcloud configuration signed in with a service account key (an
        RSA key made here) and holding its first token, made once per
        process (SIGNED_IN) by the real `gcloud auth activate-service-account`;
        gcloud renews the token at the fake's token endpoint
        (``auth/token_host``), with an expiry."""
        if self._signed_in is not None:
            return self._signed_in
        if SIGNED_IN and SIGNED_IN[0].is_dir():
            self._signed_in = SIGNED_IN[0]
            return self._signed_in
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        made = self.base / "signed-in"
        (made / "gcloud").mkdir(parents=True)
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        key_file = made / "service-account.json"
        key_file.write_text(json.dumps({
            "type": "service_account", "project_id": PROJECT, "private_key_id": "fake-key-1",
            "private_key": key.decode(), "client_email": SERVICE_ACCOUNT, "client_id": "1",
            "token_uri": f"{self.gcp.url}/oauth2/token"}))
        env = {**self.env(), "CLOUDSDK_CONFIG": str(made / "gcloud"),
               "CLOUDSDK_AUTH_TOKEN_HOST": f"{self.gcp.url}/oauth2/token"}
        env.pop("CLOUDSDK_AUTH_ACCESS_TOKEN_FILE", None)
        for argv in (["auth", "activate-service-account", f"--key-file={key_file}"], ["auth", "print-access-token"]):
            r = subprocess.run(["gcloud", *argv], env=env, cwd=ROOT, stdin=subprocess.DEVNULL,
                               capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, r.stderr
        self._signed_in = made / "gcloud"
        SIGNED_IN[:] = [self._signed_in]
        return self._signed_in

    def env(self, env_name: str = STANDARD, **extra: str) -> dict[str, str]:
        """The whole environment of a client process: nothing inherited but
        the system PATH's tools and a locale."""
        c = self.clients
        env = {
            "PATH": f"{self.base / 'counted'}:{VENV_BIN}:/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TMPDIR": str(self.base / "tmp"),
            "HOME": str(c / "home"),
            "CLOUDSDK_CONFIG": str(c / "gcloud"),
            "KUBECONFIG": str(self.kube_dir / "config"),
            "BOTO_CONFIG": str(c / "boto.cfg"),
            **({"CLOUDSDK_AUTH_TOKEN_HOST": f"{self.gcp.url}/oauth2/token"} if self.service_account else
               {"CLOUDSDK_AUTH_ACCESS_TOKEN_FILE": str(c / "token")}),
            "CLOUDSDK_CORE_CUSTOM_CA_CERTS_FILE": str(self.gcp.server.pki.ca_file),
            "CLOUDSDK_METRICS_ENVIRONMENT": "playbook-client-tests",
            "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
            "CLOUDSDK_CORE_DISABLE_USAGE_REPORTING": "true",
            "CLOUDSDK_CORE_CHECK_GCE_METADATA": "false",
            "CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK": "true",
            "CLOUDSDK_SURVEY_DISABLE_PROMPTS": "true",
            "NO_GCE_CHECK": "True",
            "GCE_METADATA_HOST": f"127.0.0.1:{self.sink.port}",
            "GCE_METADATA_IP": f"127.0.0.1:{self.sink.port}",
            "HTTPS_PROXY": f"http://127.0.0.1:{self.sink.port}",
            "HTTP_PROXY": f"http://127.0.0.1:{self.sink.port}",
            "https_proxy": f"http://127.0.0.1:{self.sink.port}",
            "http_proxy": f"http://127.0.0.1:{self.sink.port}",
            "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
            "RAY_USAGE_STATS_ENABLED": "0",
            "PYTHONDONTWRITEBYTECODE": "1",
            "INVOKE_PLAYBOOK_INVENTORY": str(self.inventory_path),
            "INVOKE_PLAYBOOK_ENV": env_name,
        }
        for api, url in self.gcp.endpoints().items():
            env[f"CLOUDSDK_API_ENDPOINT_OVERRIDES_{api}"] = url
        if self.processes_only:
            env["TPU_PLAYBOOKS_PROCESSES_ONLY"] = "1"
        (self.base / "tmp").mkdir(exist_ok=True)
        env.update(extra)
        return env

    # -- running -------------------------------------------------------------------
    def invoke(self, *args: str, env_name: str = STANDARD, timeout: float = 600, **extra: str) -> Run:
        g, k = self.gcp.server.mark(), self.kube.server.mark()
        self._n_runs = getattr(self, "_n_runs", 0) + 1
        started = self.base / "started" / f"{self._n_runs}.txt"
        started.parent.mkdir(exist_ok=True)
        start = time.monotonic()
        p = subprocess.run([str(INVOKE), *args], env=self.env(env_name, **{COUNT_LOG: str(started), **extra}),
                           cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=timeout)
        run = Run(tuple(args), p.returncode, p.stdout, self.gcp.server.since(g), self.kube.server.since(k),
                  time.monotonic() - start,
                  started.read_text().splitlines() if started.is_file() else [])
        self.runs.append(run)
        return run

    def client(self, *argv: str, env_name: str = STANDARD) -> subprocess.CompletedProcess:
        """One client command (gcloud, kubectl) in the same environment."""
        return subprocess.run(list(argv), env=self.env(env_name), cwd=ROOT, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=120)

    # -- state -----------------------------------------------------------------------
    def reset(self) -> None:
        for name in (STANDARD, AUTOPILOT):  # a catalog one test cached is not the next one's
            (ROOT / ".state" / name / "prices.json").unlink(missing_ok=True)
            (ROOT / ".state" / name / "quarantine.json").unlink(missing_ok=True)
        self.gcp.reset()
        self.kube.reset()
        self.dashboard.reset()
        self.sink.lines.clear()
        self.next_test_clients()
        self.inventory_path.write_text(self._inventory_text)

    def change_inventory(self, env_name: str = STANDARD, **changes: Any) -> None:
        """The inventory with these keys of one environment changed (until
        the next test: reset() writes it back)."""
        data = yaml.safe_load(self._inventory_text)
        data["environments"][env_name].update(changes)
        self.inventory_path.write_text(yaml.safe_dump(data, sort_keys=False))

    def envdata(self, name: str = STANDARD):
        """The environment as the playbooks see it (validated, with derived keys)."""
        from playbooks.config.schema import load_inventory
        return load_inventory(self.inventory_path).env(name)

    # Seeds: put the fakes in the state a finished `invoke up` leaves, piece by
    # piece, without running clients (fast); shapes as the real API shows them.
    def seed_project(self) -> None:
        g = self.gcp
        g.st.services |= {"container.googleapis.com", "cloudbuild.googleapis.com", "cloudbilling.googleapis.com"}
        policy = g._policy()
        for role in ("roles/container.admin", "roles/iam.serviceAccountAdmin", "roles/cloudbuild.builds.editor"):
            policy["bindings"].append({"role": role, "members": [f"user:{USER}"]})

    def seed_networks(self, mtu: int = 8896, env_name: str = STANDARD) -> None:
        e = self.envdata(env_name)
        for i, cidr in ((1, e.subnet_1_range), (2, e.subnet_2_range)):
            self.gcp.add_network(f"{e.cluster_name}-net-{i}", mtu=mtu)
            self.gcp.add_subnet(e.region, e[f"subnet_{i}_name"], f"{e.cluster_name}-net-{i}", cidr)

    def seed_cluster(self, env_name: str = STANDARD) -> dict:
        e = self.envdata(env_name)
        spec: dict[str, Any] = {"name": e.cluster_name, "initialClusterVersion": e.cluster_version,
                                "addonsConfig": {"rayOperatorConfig": {"enabled": True}}}
        if e.mode == "autopilot":
            spec["autopilot"] = {"enabled": True}
            return self.gcp.add_cluster(e.region, spec)
        spec["addonsConfig"]["gcsFuseCsiDriverConfig"] = {"enabled": True}
        spec["workloadIdentityConfig"] = {"workloadPool": f"{PROJECT}.svc.id.goog"}
        spec["networkConfig"] = {"datapathProvider": "ADVANCED_DATAPATH"}
        spec["nodePools"] = [{"name": "default-pool", "initialNodeCount": 3,
                              "config": {"machineType": "n1-standard-16"}}]
        return self.gcp.add_cluster(e.zone, spec)

    def pool_spec(self, name: str, topology: str = "4x4", nodes: int = 4, env_name: str = STANDARD,
                  capacity: str = "on-demand") -> dict:
        """A TPU node pool as `gcloud container node-pools create` asks for it
        (on-demand, or Spot)."""
        e = self.envdata(env_name)
        extra = {"spot": True} if capacity == "spot" else {}
        return {"name": name, "initialNodeCount": nodes,
                "config": {"machineType": e.machine_type, "gvnic": {"enabled": True}, **extra,
                           "advancedMachineFeatures": {"threadsPerCore": "1"},
                           "labels": {"cloud.google.com/gke-networking-dra-driver": "true",
                                      "tpu-playbooks/capacity": capacity},
                           "oauthScopes": ["https://www.googleapis.com/auth/cloud-platform"]},
                "placementPolicy": {"tpuTopology": topology, "type": "COMPACT"},
                "networkConfig": {"additionalNodeNetworkConfigs": [
                    {"network": f"{e.cluster_name}-net-1", "subnetwork": e.subnet_1_name},
                    {"network": f"{e.cluster_name}-net-2", "subnetwork": e.subnet_2_name}]}}

    def seed_pools(self, topology: str = "4x4", env_name: str = STANDARD) -> None:
        e = self.envdata(env_name)
        for i in range(e.slices):
            self.gcp.add_pool(e.zone, e.cluster_name, self.pool_spec(f"v6e-16-{i}", topology, env_name=env_name))

    def seed_bucket(self, objects: tuple[str, ...] = (), env_name: str = STANDARD) -> None:
        e = self.envdata(env_name)
        self.gcp.add_bucket(e.gs_bucket, e.region)
        for o in objects:
            self.gcp.add_object(e.gs_bucket, o)
        member = (f"principal://iam.googleapis.com/projects/{PROJECT_NUMBER}/locations/global/workloadIdentityPools/"
                  f"{PROJECT}.svc.id.goog/subject/ns/{e.namespace}/sa/{e.ksa_name}")
        self.gcp.st.bucket_iam[e.gs_bucket]["bindings"].append({"role": "roles/storage.objectUser",
                                                                "members": [member]})

    def seed_kube(self, env_name: str = STANDARD) -> None:
        """The KSA, the DRANET claim template and a ready RayCluster with its pods,
        from the repository's manifest rendered with the environment's values."""
        e = self.envdata(env_name)
        from playbooks.cloud import manifests
        if e.namespace != "default":
            self.kube.create("namespaces", {"metadata": {"name": e.namespace}})
        self.kube.create("serviceaccounts", {"metadata": {"name": e.ksa_name, "namespace": e.namespace}})
        if e.mode == "autopilot":
            self.kube.create("computeclasses", manifests.compute_class_doc(e))
        for doc in manifests.raycluster_docs(e):
            plural = {"RayCluster": "rayclusters", "ResourceClaimTemplate": "resourceclaimtemplates"}[doc["kind"]]
            self.kube.create(plural, doc)

    def seed_to_cluster(self, env_name: str = STANDARD) -> None:
        """What comes before the node pools: the project, its networks (not on
        Autopilot: no VPCs of ours) and the cluster."""
        self.seed_project()
        if self.envdata(env_name).mode == "standard":
            self.seed_networks(env_name=env_name)
        self.seed_cluster(env_name)

    def seed_full(self, env_name: str = STANDARD) -> None:
        self.seed_to_cluster(env_name)
        if self.envdata(env_name).mode == "standard":
            self.seed_pools(env_name=env_name)
        self.seed_bucket(("rayjob-elastic-8b/checkpoints/10/state", "rayjob-elastic-8b/checkpoints/10/meta",
                          "notes.txt"), env_name=env_name)
        self.seed_kube(env_name)

    def get_credentials(self, env_name: str = STANDARD) -> None:
        """The real `gcloud container clusters get-credentials`, so kubectl can
        reach the fake cluster (as after `invoke up`). Into a test's new
        kubeconfig, once it has run for the same cluster (its endpoint and
        CA) in this fake cloud, what it wrote then is written again instead
        of starting it each time, as the fakes are seeded."""
        e = self.envdata(env_name)
        loc = e.region if e.mode == "autopilot" else e.zone
        cluster = self.gcp.st.clusters.get((loc, e.cluster_name)) or {}
        key = json.dumps([env_name, cluster.get("endpoint"), cluster.get("masterAuth")], sort_keys=True)
        kubeconfig = self.kube_dir / "config"
        new = not kubeconfig.exists()
        if new and key in self._kubeconfigs:
            kubeconfig.write_text(self._kubeconfigs[key])
            return
        p = self.client("gcloud", "container", "clusters", "get-credentials", e.cluster_name,
                        f"--location={loc}", f"--project={PROJECT}", env_name=env_name)
        assert p.returncode == 0, p.stderr
        if new:
            self._kubeconfigs[key] = kubeconfig.read_text()


def counting_wrappers(folder: Path) -> None:
    """One wrapper per client in ``folder``: it appends its name and
    arguments to ``$TPU_PLAYBOOKS_TEST_STARTED`` (one line) and execs the
    client found on the system PATH."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in COUNTED:
        real = shutil.which(name, path="/usr/local/bin:/usr/bin:/bin")
        if real is None:
            continue
        w = folder / name
        w.write_text(f'#!/bin/sh\nif [ -n "${COUNT_LOG}" ]; then echo "{name} $*" >> "${COUNT_LOG}"; fi\n'
                     f'exec {real} "$@"\n')
        w.chmod(0o755)


@contextmanager
def fake_cloud(base: Path) -> Iterator[Cloud]:
    """The fakes started on 127.0.0.1, an inventory pointing at them, and a
    client environment; everything stopped at the end (tests and benchmarks)."""
    counting_wrappers(base / "counted")
    kube_pki = make_pki(base / "pki", "kube")
    gcp_pki = make_pki(base / "pki", "gcp")
    kube = FakeKube(kube_pki, TOKEN).start()
    gcp = FakeGcp(gcp_pki, PROJECT, PROJECT_NUMBER, TOKEN,
                  kube=KubeLink(kube.endpoint, kube_pki.ca_pem, on_delete=lambda c: kube.reset(),
                                on_create=lambda c: setattr(kube, "autopilot",
                                                            bool((c.get("autopilot") or {}).get("enabled"))),
                                on_pool=kube.set_pool_nodes))
    gcp.start()

    def ray_pods() -> list[dict]:
        """The Ray pods that run (a Pending pod has no Ray node)."""
        return [p for p in kube.list("pods") if (p["metadata"].get("labels") or {}).get("ray.io/is-ray-node")
                and (p.get("status") or {}).get("phase") == "Running"]

    dash = FakeDashboard(ray_pods).start()
    dash_auto = FakeDashboard(ray_pods).start()
    sink = StraySink()
    inv = base / "inventory.yaml"
    inv.write_text(yaml.safe_dump(inventory(dash.port, dash_auto.port), sort_keys=False))
    cloud = Cloud(base, gcp, kube, dash, sink, inv)
    cloud.fresh_clients()
    try:
        yield cloud
    finally:
        for s in (gcp, kube, dash, dash_auto):
            s.stop()
        sink.close()


@pytest.fixture(scope="module")
def cloud_session(tmp_path_factory, request) -> Iterator[Cloud]:
    for name in (STANDARD, AUTOPILOT):
        shutil.rmtree(ROOT / ".state" / name, ignore_errors=True)
    with fake_cloud(tmp_path_factory.mktemp("fakecloud")) as cloud:
        cloud.processes_only = bool(request.config.getoption("--processes-only", default=False))
        yield cloud
    if not request.session.testsfailed:
        for name in (STANDARD, AUTOPILOT):
            shutil.rmtree(ROOT / ".state" / name, ignore_errors=True)


@pytest.fixture
def cloud(cloud_session: Cloud, processes_mode: bool, request) -> Iterator[Cloud]:
    """Empty fakes and a new kubeconfig for each test; no stray traffic.
    Every command its process under ``--processes-only``, or in a test of a
    ``both_ways`` file run that way (``processes_mode``: tests/conftest.py)."""
    cloud_session.reset()
    cloud_session.processes_only = bool(request.config.getoption("--processes-only", default=False)
                                        or processes_mode)
    yield cloud_session
    assert not cloud_session.sink.lines, f"requests left 127.0.0.1: {cloud_session.sink.lines}"
