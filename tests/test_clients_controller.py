"""The playbooks run from a controller host over SSH (a real sshd on
127.0.0.1, tests/sshd.py) against the loopback fakes, with the real gcloud,
kubectl and curl running on the controller. This machine's PATH holds no
gcloud, kubectl, envsubst or curl and its KUBECONFIG and CLOUDSDK_CONFIG
point nowhere, so a command or a kubernetes-client read that ran here
instead of on the controller would fail the run.

The fakes and their environment are this file's own (tests/fakes/cloud.py):
its tests run one after the other in one worker (pytest-xdist's --dist
loadfile keeps a file together), beside the other files of clients."""
from __future__ import annotations

import json
import re
import subprocess

import pytest

from tests import sshd
from tests.fakes.cloud import COUNT_LOG, INVOKE, ROOT, STANDARD, VENV_BIN, Cloud

pytestmark = pytest.mark.clients


NOWHERE = {"PATH": str(VENV_BIN), "KUBECONFIG": "/nonexistent/kubeconfig", "CLOUDSDK_CONFIG": "/nonexistent/gcloud",
           "BOTO_CONFIG": "/nonexistent/boto"}


@pytest.fixture
def controller(cloud: Cloud, tmp_path):
    """An sshd whose sessions have the fakes' client environment (the
    controller's own gcloud and kubectl configuration), its gcloud given an
    access-token file: a token with no expiry."""
    cloud.use_access_token_file()
    yield from _controller(cloud, tmp_path)


@pytest.fixture
def controller_with_expiring_credentials(cloud: Cloud, tmp_path):
    """The same, its gcloud signed in with a service account key (the
    fakes' default): its tokens expire, as a real account's do. New client
    folders: no token kept by an earlier test of this file."""
    cloud.fresh_clients()
    yield from _controller(cloud, tmp_path)


def _controller(cloud: Cloud, tmp_path):
    login = {k: v for k, v in cloud.env().items() if not k.startswith("INVOKE_")}
    # The client processes its sessions start, counted by the fakes' wrappers on its PATH.
    login[COUNT_LOG] = str(tmp_path / "controller-started.log")
    server = sshd.start(tmp_path / "sshd", login)
    cloud.change_inventory(STANDARD, **server.inventory_keys(str(tmp_path / "remote")))
    try:
        yield server
    finally:
        server.stop()


def _steps(out: str) -> list[str]:
    """A transcript's step lines, without the banner, timings and the
    controller's own step."""
    keep, skip = [], False
    for line in out.splitlines():
        if line.startswith("TASK ["):
            skip = line.startswith("TASK [controller :")
        if skip or line.startswith(("PLAY [", "logs: ", "up ")) or "controller : project files" in line:
            continue
        keep.append(re.sub(r"\s+\d+\.\ds\b", "", line.split(IN_PROCESS)[0]))
    return keep


# A dry run's mark of a line the connector would answer in-process (core/runner.py).
IN_PROCESS = "  # in-process: "


def test_up_through_the_controller_converges_and_a_second_run_sends_no_change(cloud: Cloud, controller, tmp_path):
    first = cloud.invoke("up", **NOWHERE)
    assert first.rc == 0, first.out
    assert f"on controller {controller.target}" in first.out
    assert re.search(r"controller : project files on \S+ +changed", first.out)
    assert (tmp_path / "remote" / "manifests" / "ray-cluster.tpu-multi-slice.yaml").is_file()
    assert (tmp_path / "remote" / ".state" / STANDARD / "port-forward.pid").exists() or "port-forward" in first.out
    st = cloud.gcp.st
    assert ("us-east5-b", "maxtext-multislice") in st.clusters
    assert cloud.kube.list("rayclusters")

    log = tmp_path / "controller-started.log"
    before = log.read_text().splitlines()
    second = cloud.invoke("up", **NOWHERE)
    assert second.rc == 0, second.out
    # On the controller every command is its own process (the in-process
    # reads are this machine's): 12 for a converged up (measured 2026-12-07,
    # docs/controller.md), at most the 18 a local one started before them; each kubectl starts
    # the auth plugin, which caches no token without an expiry (gcloud's
    # access-token file, the fakes' credentials, has none), so each plugin
    # starts a gcloud.
    there = [line.split(" ", 1)[0] for line in log.read_text().splitlines()[len(before):]]
    assert second.started() == [] and 0 < len(there) <= 18, there
    assert there.count("kubectl") == there.count("gke-gcloud-auth-plugin"), there
    assert second.changes == [], [r.path for r in second.changes]
    recap = [r for r in second.recaps() if r["play"] == "up"][-1]
    assert recap["changed"] == 0 and recap["failed"] == 0, second.out
    assert re.search(r"controller : project files on \S+ +ok", second.out)


def test_with_credentials_that_expire_the_auth_plugin_there_asks_gcloud_once(
        cloud: Cloud, controller_with_expiring_credentials, tmp_path):
    """A real account's token has an expiry, and gke-gcloud-auth-plugin keeps
    it (in ~/.kube) until then: through a controller signed in with a
    service account key, each kubectl there starts the plugin, but only the
    first plugin starts a gcloud, in the first run; the converged run
    starts none. The cloud's side is there already (the test above makes it
    from nothing through the controller): the first run makes the cluster's
    objects, with kubectl."""
    cloud.seed_to_cluster()
    cloud.seed_pools()
    cloud.seed_bucket()
    log = tmp_path / "controller-started.log"
    first = cloud.invoke("up", **NOWHERE)
    assert first.rc == 0, first.out
    started = log.read_text().splitlines()
    helpers = [p for p in started if p.startswith("gcloud config config-helper")]
    assert sum(p.startswith("kubectl ") for p in started) >= 2, started
    assert len(helpers) == 1, started
    assert cloud.kube.list("rayclusters") and first.calls("POST", r"/rayclusters$"), first.out

    second = cloud.invoke("up", **NOWHERE)
    assert second.rc == 0 and second.changes == [], second.out
    there = log.read_text().splitlines()[len(started):]
    names = [p.split(" ", 1)[0] for p in there]
    assert names.count("kubectl") >= 1 and names.count("kubectl") == names.count("gke-gcloud-auth-plugin"), there
    assert not [p for p in there if p.startswith("gcloud config config-helper")], there
    assert 0 < len(there) <= 18 - names.count("kubectl"), there


def test_status_through_the_controller_starts_no_more_processes_than_before_the_in_process_reads(
        cloud: Cloud, controller, tmp_path):
    """`invoke status` through a controller, where every command is its
    process (the in-process reads are this machine's): at most the 13
    client processes a status started before those reads
    (docs/benchmarks.md), here with gcloud's access-token file, whose
    plugin starts a gcloud per kubectl. The Kubernetes objects are one
    kubectl (gke.objects_command), the node pools come with `clusters list`,
    the project's number with the enabled services; every row as asked."""
    cloud.seed_full()
    cloud.get_credentials()
    up = cloud.invoke("up", **NOWHERE)               # converged; the port-forward there
    assert up.rc == 0 and up.changes == [], up.out
    log = tmp_path / "controller-started.log"
    before = log.read_text().splitlines()
    run = cloud.invoke("status", "--json", **NOWHERE)
    assert run.rc == 0, run.out
    there = log.read_text().splitlines()[len(before):]
    names = [p.split(" ", 1)[0] for p in there]
    assert run.started() == [] and 0 < len(there) <= 13, there
    assert names.count("kubectl") == 1 and not [p for p in there if p.startswith(("gcloud container node-pools",
                                                                               "gcloud projects describe"))], there
    doc = json.loads(run.out[run.out.index("{\n"):run.out.rindex("\n}") + 2])
    rows = {i["what"]: i["verdict"] for i in doc["items"]}
    for row in ("storage : Kubernetes service account maxtext-ksa", "storage : workload identity binding "
                "roles/storage.objectUser", "nodepools : TPU node pool v6e-16-0", "nodepools : TPU node pool v6e-16-1",
                "raycluster : RayCluster maxtext-tpu-cluster", "raycluster : TPU slices of maxtext-tpu-cluster",
                "status : TPU nodes ready", "status : TPU host maintenance, flex-start ends",
                "status : RayCluster workers"):
        assert rows.get(row) == "as asked", (row, rows)
    assert set(rows.values()) == {"as asked"}, rows


def test_the_dry_run_through_a_controller_is_the_local_one_naming_the_controller(cloud: Cloud, controller):
    with_controller = cloud.invoke("--dry", "up", **NOWHERE)
    assert with_controller.rc == 0, with_controller.out
    assert with_controller.requests == []            # a dry run connects to nothing
    assert "sftp put" in with_controller.out and f"on controller {controller.target}" in with_controller.out
    cloud.reset()
    local = cloud.invoke("--dry", "up")
    assert _steps(with_controller.out) == _steps(local.out)
    # On a controller every command is its process: no line says it is answered in-process; here some are.
    assert IN_PROCESS not in with_controller.out and IN_PROCESS in local.out
    counts = [[r for r in run.recaps() if r["play"] == "up"][-1] for run in (with_controller, local)]
    assert counts[0]["changed"] == counts[1]["changed"] + 1     # the sync, and nothing else


@pytest.mark.parametrize("fault", ["refused port", "unknown host key"])
def test_an_unreachable_controller_is_one_line_and_unreachable_in_the_recap(cloud: Cloud, controller, tmp_path, fault):
    keys = controller.inventory_keys(str(tmp_path / "remote"))   # change_inventory starts from the shipped one
    if fault == "refused port":
        cloud.change_inventory(STANDARD, **{**keys, "controller": f"root@127.0.0.1:{sshd.free_port()}"})
    else:
        empty = tmp_path / "empty_known_hosts"
        empty.write_text("")
        cloud.change_inventory(STANDARD, **{**keys, "known_hosts": str(empty)})
    run = cloud.invoke("up", **NOWHERE)
    assert run.rc == 4                                # Ansible's exit code for an unreachable host
    assert "Traceback" not in run.out
    said = [ln for ln in run.out.splitlines() if ln.startswith("  controller root@") and "is unreachable" in ln]
    assert len(said) == 1, run.out
    assert re.search(r"controller : project files on \S+ +unreachable", run.out), run.out
    assert re.search(r"^up \S+: ok=0 changed=0 unreachable=1 failed=0", run.out, re.M), run.out
    assert run.requests == []                         # nothing reached the fakes


def test_internal_control_plane_without_a_controller_is_refused_in_one_line(cloud: Cloud):
    cloud.change_inventory(STANDARD, control_plane="internal")
    p = subprocess.run([str(INVOKE), "--dry", "cluster"], env=cloud.env(), cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "control_plane" in lines[0] and "needs a controller" in lines[0], p.stderr


def test_dns_control_plane_asks_for_the_dns_endpoint(cloud: Cloud):
    cloud.change_inventory(STANDARD, control_plane="dns")
    run = cloud.invoke("--dry", "cluster")
    assert "get-credentials maxtext-multislice --location=us-east5-b --dns-endpoint" in run.out, run.out


def test_project_files_reach_a_controller_without_sftp_through_cat(cloud: Cloud, tmp_path):
    """A hardened bastion's sshd offers no SFTP subsystem: the sync (and
    every read, write and stdin after it) goes through cat over ssh. The
    cheapest play that syncs: capacity (read-only, four probes)."""
    login = {k: v for k, v in cloud.env().items() if not k.startswith("INVOKE_")}
    server = sshd.start(tmp_path / "sshd", login, sftp=False)
    try:
        cloud.change_inventory(STANDARD, **server.inventory_keys(str(tmp_path / "remote")))
        run = cloud.invoke("capacity", **NOWHERE)
        assert run.rc == 0, run.out
        assert re.search(r"controller : project files on \S+ +changed", run.out), run.out
        assert (tmp_path / "remote" / "manifests" / "ray-cluster.tpu-multi-slice.yaml").is_file()
        assert (tmp_path / "remote" / "trainer" / "maxtext_ray.py").is_file()
        assert not list((tmp_path / "remote").rglob("*.tmp"))          # each file renamed into place
        assert "subsystem request for sftp by user root failed" in (tmp_path / "sshd" / "sshd.log").read_text()
    finally:
        server.stop()


def test_doctor_through_the_controller_checks_the_controllers_tools(cloud: Cloud, controller, tmp_path):
    """`invoke doctor` with a controller: every tool, gcloud's account, the
    project, the kubectl context and the parse of the plan's gcloud lines
    are checked where the commands run (this machine's PATH has no gcloud or
    kubectl); the parser runs from the synced remote_dir, fed on its stdin."""
    cloud.seed_project()
    cloud.seed_cluster()
    run = cloud.invoke("doctor", **NOWHERE)
    assert re.search(r"doctor : kubectl context \S+ +failed", run.out), run.out   # no context there yet
    cloud.invoke("cluster", **NOWHERE)                                            # get-credentials there
    run = cloud.invoke("doctor", **NOWHERE)
    assert run.rc == 0, run.out
    for tool in ("gcloud", "gsutil", "kubectl", "gke-gcloud-auth-plugin", "envsubst", "ray"):
        assert re.search(rf"ok: \[doctor : {re.escape(tool)}\] {re.escape(tool)} \d", run.out), (tool, run.out)
    assert re.search(r"ok: \[doctor : gcloud commands parse\] all \d+ gcloud command lines of the plan parse", run.out)
    assert "reaches Kubernetes" in run.out
    assert (tmp_path / "remote" / "playbooks" / "access" / "gcloud_parse.py").is_file()
    logs = sorted((ROOT / ".state" / STANDARD / "runs").glob("*-doctor"))[-1]
    parse = [p.read_text() for p in logs.glob("*.log") if "gcloud_parse.py" in p.read_text().splitlines()[0]]
    assert parse and all(f"# on controller {controller.target}" in t for t in parse), parse
    assert not (ROOT / ".state" / STANDARD / "gcloud-lines.jsonl").exists()    # nothing written here
