"""The kubectl credentials step against the cluster GKE has now
(``playbooks/plays/cluster.py``, ``playbooks/cloud/kube_context.py``): a
context of the cluster's name that points at another server or CA (the
cluster deleted elsewhere and made again under the same name) is written
again by get-credentials, and the verify proves the new one matches; the
kubeconfig's clusters as read from its files; and the kubernetes client of
the run made again once get-credentials rewrote the kubeconfig
(``playbooks/access/kube_api.py``). The real get-credentials and kubectl
against the fakes: ``tests/test_clients_journeys.py``."""
from __future__ import annotations

import base64
import json

import pytest

from playbooks.access import kube_api
from playbooks.access.kube_api import KubectlShortcut
from playbooks.cloud import kube_context as K
from playbooks.cloud.kube_context import kubeconfig_fact, read_kubeconfig
from playbooks.core.connector import LocalConnector
from playbooks.core.fixtures import Answers
from playbooks.core.play import Playbook
from playbooks.core.recap import Reporter
from playbooks.core.runner import Mode, Runner
from playbooks.plays import cluster
from tests.conftest import Transcript, env, run_with_facts
from tests.fakes.kube import FakeKube
from tests.fakes.tls import make_pki

DEV = env("dev")
NAME = "gke_my-tpu-project_us-east5-b_maxtext-multislice"
CLUSTERS = "gcloud container clusters list --format=json --project=my-tpu-project"
KUBECONFIG = kubeconfig_fact(DEV).key
GET_CREDENTIALS = ("gcloud container clusters get-credentials maxtext-multislice --location=us-east5-b "
                   "--project=my-tpu-project")
OLD_CA, NEW_CA = base64.b64encode(b"old CA").decode(), base64.b64encode(b"new CA").decode()


def gke_cluster(endpoint="34.1.2.3", ca=NEW_CA, **extra):
    """The cluster as `clusters list` shows it (the fields the steps read)."""
    return {"name": "maxtext-multislice", "status": "RUNNING", "location": "us-east5-b",
            "autopilot": {}, "addonsConfig": {"rayOperatorConfig": {"enabled": True}},
            "workloadIdentityConfig": {"workloadPool": "my-tpu-project.svc.id.goog"},
            "endpoint": endpoint, "masterAuth": {"clusterCaCertificate": ca}, **extra}


def kubeconfig(server="https://34.1.2.3", ca: str | None = NEW_CA, name=NAME):
    """What read_kubeconfig gives of a kubeconfig get-credentials wrote."""
    entry: dict = {"server": server}
    if ca is not None:
        entry["certificate-authority-data"] = ca
    return {"contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
            "clusters": [{"name": name, "cluster": entry}], "current-context": name}


def applied(lines):
    return [ln.split("apply  ", 1)[1] for ln in lines if ln.startswith("  apply")]


def credentials(facts, mode=Mode.APPLY, e=DEV):
    return run_with_facts([cluster.credentials_step(e)], facts, mode=mode)


def test_a_context_on_the_old_endpoint_is_written_again_and_verified():
    facts = {KUBECONFIG: Answers(kubeconfig("https://34.9.9.9", OLD_CA), kubeconfig()), CLUSTERS: [gke_cluster()]}
    recap, out = credentials(facts)
    assert recap.counters() == "ok=0 changed=1 failed=0 skipped=0", out.text()
    assert applied(out) == [GET_CREDENTIALS]
    [result] = recap.results
    assert result.found == f"context {NAME} points at https://34.9.9.9, the cluster is at https://34.1.2.3"
    assert result.notes == [result.found]   # said under the step's line
    assert f"wrote context {NAME} again, at the cluster's endpoint and CA" in out.text()
    assert any(ln.startswith("  verify") and ln.endswith("=> ok") for ln in out), out.text()


def test_a_context_with_another_ca_is_written_again():
    facts = {KUBECONFIG: Answers(kubeconfig(ca=OLD_CA), kubeconfig()), CLUSTERS: [gke_cluster()]}
    recap, out = credentials(facts)
    assert applied(out) == [GET_CREDENTIALS] and recap.counters() == "ok=0 changed=1 failed=0 skipped=0"
    assert recap.results[0].found == f"context {NAME}'s CA differs from the cluster's (masterAuth.clusterCaCertificate)"


def test_the_verify_fails_when_the_context_still_points_at_the_old_cluster():
    old = kubeconfig("https://34.9.9.9", OLD_CA)
    recap, out = credentials({KUBECONFIG: Answers(old, old), CLUSTERS: [gke_cluster()]})
    assert recap.counters() == "ok=0 changed=0 failed=1 skipped=0", out.text()
    assert f"context {NAME} points at https://34.9.9.9, the cluster is at https://34.1.2.3" in out.text()


def test_a_new_context_is_verified_against_the_cluster_too():
    empty = {"contexts": [], "clusters": [], "current-context": None}
    recap, out = credentials({KUBECONFIG: Answers(empty, kubeconfig("https://34.9.9.9")), CLUSTERS: [gke_cluster()]})
    assert applied(out) == [GET_CREDENTIALS] and recap.counters() == "ok=0 changed=0 failed=1 skipped=0"
    assert "the cluster is at https://34.1.2.3" in out.text()  # its verify: not the cluster's server
    recap, out = credentials({KUBECONFIG: Answers(empty, kubeconfig()), CLUSTERS: [gke_cluster()]})
    assert recap.counters() == "ok=0 changed=1 failed=0 skipped=0", out.text()


def test_a_matching_context_is_ok_and_runs_nothing():
    recap, out = credentials({KUBECONFIG: kubeconfig(), CLUSTERS: [gke_cluster()]})
    assert recap.counters() == "ok=1 changed=0 failed=0 skipped=0" and applied(out) == []
    assert f"context {NAME} exists and points at the cluster" in out.text()


def test_with_no_cluster_to_compare_with_a_context_is_taken_as_it_is():
    """No cluster yet (check mode before `cluster` makes it), or one that
    shows no endpoint yet (PROVISIONING): nothing to compare with."""
    recap, out = credentials({KUBECONFIG: kubeconfig("https://34.9.9.9"), CLUSTERS: []}, mode=Mode.CHECK)
    assert recap.counters() == "ok=1 changed=0 failed=0 skipped=0", out.text()
    provisioning = {k: v for k, v in gke_cluster(status="PROVISIONING").items() if k != "endpoint"}
    recap, out = credentials({KUBECONFIG: kubeconfig("https://34.9.9.9"), CLUSTERS: [provisioning]})
    assert recap.counters() == "ok=1 changed=0 failed=0 skipped=0", out.text()


def test_a_dry_run_writes_the_context_without_looking_at_the_cluster():
    out = Transcript()
    recap = Playbook(Runner(Mode.DRY), Reporter(out.append), workers=1).run("test", [cluster.credentials_step(DEV)])
    assert recap.counters() == "ok=0 changed=1 failed=0 skipped=0", out.text()
    assert applied(out) == [GET_CREDENTIALS] and "clusters list" not in out.text()


def test_the_server_each_control_plane_writes():
    """As gcloud 528 writes it (api_lib/container/util.py, ClusterConfig.Persist):
    the IP endpoint, the DNS endpoint with no CA data, the private endpoint."""
    c = gke_cluster(controlPlaneEndpointsConfig={"dnsEndpointConfig": {"endpoint": "gke-abc.us-east5.gke.goog",
                                                                       "allowExternalTraffic": True},
                                                 "ipEndpointsConfig": {"enabled": True}},
                    privateClusterConfig={"privateEndpoint": "10.0.0.2"})
    assert K.cluster_endpoint(DEV, c) == ("https://34.1.2.3", NEW_CA)
    dns = env("dev", control_plane="dns")
    assert K.cluster_endpoint(dns, c) == ("https://gke-abc.us-east5.gke.goog", None)
    internal = type(DEV)(DEV.name, {**DEV, "control_plane": "internal"})  # the inventory wants a controller
    assert K.cluster_endpoint(internal, c) == ("https://10.0.0.2", NEW_CA)
    no_ip = {**c, "controlPlaneEndpointsConfig": {**c["controlPlaneEndpointsConfig"],
                                                  "ipEndpointsConfig": {"enabled": False}}}
    assert K.cluster_endpoint(DEV, no_ip) == ("https://gke-abc.us-east5.gke.goog", None)
    # a DNS context has no CA data to compare; its server is the DNS endpoint
    assert K.stale_context(dns, kubeconfig("https://gke-abc.us-east5.gke.goog", None), c) is None
    assert K.stale_context(dns, kubeconfig("https://gke-old.us-east5.gke.goog", None), c) == (
        f"context {NAME} points at https://gke-old.us-east5.gke.goog, the cluster is at "
        f"https://gke-abc.us-east5.gke.goog")
    assert K.stale_context(DEV, {"contexts": [{"name": NAME}]}, c) == (
        f"context {NAME} points at no server, the cluster is at https://34.1.2.3")


def test_read_kubeconfig_keeps_each_clusters_server_and_ca_first_file_first(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    first.write_text(json.dumps({"contexts": [{"name": NAME, "context": {"cluster": NAME}}],
                                 "clusters": [{"name": NAME, "cluster": {"server": "https://1.1.1.1",
                                                                         "certificate-authority-data": OLD_CA}}]}))
    second.write_text(json.dumps({"current-context": NAME,
                                  "clusters": [{"name": NAME, "cluster": {"server": "https://2.2.2.2"}},
                                               {"name": "other", "cluster": {"server": "https://3.3.3.3"}}]}))
    via = LocalConnector(tmp_path, {"KUBECONFIG": f"{first}:{second}", "HOME": str(tmp_path)})
    cfg = read_kubeconfig(via)
    assert cfg["clusters"] == [{"name": NAME, "cluster": {"server": "https://1.1.1.1",
                                                          "certificate-authority-data": OLD_CA}},
                               {"name": "other", "cluster": {"server": "https://3.3.3.3"}}]
    assert cfg["current-context"] == NAME
    assert K.stale_context(DEV, cfg, gke_cluster("1.1.1.1", OLD_CA)) is None


# -- the run's kubernetes client sees a kubeconfig rewritten in the run -----------------------
@pytest.fixture(scope="module")
def fake_kube(tmp_path_factory):
    base = tmp_path_factory.mktemp("kubecreds")
    pki = make_pki(base / "pki", "kube")
    kube = FakeKube(pki, "a-token").start()
    yield kube, pki
    kube.stop()


def write_kubeconfig(path, server: str, ca_pem: bytes) -> None:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": NAME,
        "clusters": [{"name": NAME, "cluster": {"server": server,
                                                "certificate-authority-data": base64.b64encode(ca_pem).decode()}}],
        "users": [{"name": "u", "user": {"token": "a-token"}}],
        "contexts": [{"name": NAME, "context": {"cluster": NAME, "user": "u"}}]}))


def test_the_client_is_made_again_when_the_kubeconfig_is_rewritten(fake_kube, tmp_path):
    """The kubeconfig points at a cluster that is gone (a closed port, an old
    CA); a get-credentials in the same run writes the new server and CA: the
    next kubectl read answered in-process reaches the new cluster."""
    kube, pki = fake_kube
    config = tmp_path / "kubeconfig"
    env_ = {"KUBECONFIG": str(config), "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    argv = ["kubectl", "get", "namespace", "default", "--output=json", f"--context={NAME}"]
    write_kubeconfig(config, "https://127.0.0.1:9", make_pki(tmp_path / "old", "kube").ca_pem)
    shortcut = KubectlShortcut()
    before = shortcut.run(argv, env_, 10)
    assert before is not None and before.rc == 1 and before.stderr.startswith("Unable to connect to the server")
    write_kubeconfig(config, kube.url, pki.ca_pem)
    after = shortcut.run(argv, env_, 10)
    assert after is not None and after.rc == 0, after and after.stderr
    assert json.loads(after.stdout)["metadata"]["name"] == "default"
    made = list(shortcut._clients.values())
    again = shortcut.run(argv, env_, 10)  # the file unchanged: the same client, the old one dropped
    assert again is not None and again.rc == 0 and list(shortcut._clients.values()) == made and len(made) == 1
    stamp = kube_api.kubeconfig_stamp(str(config))
    config.write_text(config.read_text() + "\n")
    assert kube_api.kubeconfig_stamp(str(config)) != stamp
