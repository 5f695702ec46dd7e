"""The kubernetes client answering the plays' node and pod writes as kubectl
does (``playbooks/access/kube_api.py``), and answering kubectl in a pod of
the cluster, where there is none.

Each write, as the quarantine play builds it, once through the real kubectl
and once through the shortcut, each on the same fresh state of the fake
Kubernetes API (tests/fakes/kube.py): the same stdout, stderr and exit code,
and the same nodes and pods after. Then the in-cluster mode: the fake over
TLS as the service's address, a service-account token and CA in a temp
folder, no kubeconfig and no kubectl run."""
from __future__ import annotations

import base64
import datetime
import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from playbooks.access import kube_api
from playbooks.access.cli_clients import kubectl
from playbooks.access.kube_api import IN_CLUSTER_ENV, KubectlShortcut, parse_write
from playbooks.core.connector import NOT_FOUND, TIMED_OUT, LocalConnector
from playbooks.plays.quarantine import TAINT, TAINT_KEY
from tests.fakes.kube import FakeKube, status
from tests.fakes.tls import make_pki

clients = pytest.mark.clients
CONTEXT = "gke_fake-tpu-project_us-east5-b_maxtext-multislice"   # as `kube` names it (gke.kube_context)
TOKEN = "kubeconfig-token"
SA_TOKEN = "service-account-token-1"
NODE, OTHER, POD = "gke-v6e-16-0-abcd1234-0000", "gke-v6e-16-0-abcd1234-0001", "maxtext-tpu-cluster-tpu-worker-x1"
OTHER_TAINT = {"effect": "NoExecute", "key": "google.com/tpu", "value": "present"}


class Kube:
    """The fake API server, a kubeconfig for it, a client environment."""

    def __init__(self, base: Path):
        self.base = base
        self.pki = make_pki(base / "pki", "kube")
        self.fake = FakeKube(self.pki, TOKEN).start()
        config = base / "kubeconfig"
        config.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": CONTEXT,
            "clusters": [{"name": "c", "cluster": {"server": self.fake.url, "certificate-authority-data":
                                                   base64.b64encode(self.pki.ca_pem).decode()}}],
            "users": [{"name": "u", "user": {"token": TOKEN}}],
            "contexts": [{"name": CONTEXT, "context": {"cluster": "c", "user": "u"}}]}))
        (base / "home").mkdir()
        self.cli_sent: list[tuple[str, str]] = []
        self.env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(base / "home"), "KUBECONFIG": str(config),
                    "LANG": "C.UTF-8"}

    def seed(self, prepare: Callable[[FakeKube], None] = lambda k: None) -> None:
        """Two nodes of a TPU pool and a pod, then ``prepare``'s changes."""
        k = self.fake
        k.reset()
        for name in (NODE, OTHER):
            k.create("nodes", {"metadata": {"name": name, "labels": {"cloud.google.com/gke-nodepool": "v6e-16-0"}},
                               "spec": {}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
        k.create("pods", {"metadata": {"name": POD, "namespace": "default"},
                          "spec": {"containers": [{"name": "ray-worker"}], "nodeName": NODE}})
        prepare(k)

    def state(self) -> dict:
        """What a write may change: each node's spec, the pods there are."""
        return {"nodes": {n["metadata"]["name"]: n.get("spec") for n in self.fake.list("nodes")},
                "labels": {n["metadata"]["name"]: n["metadata"].get("labels") for n in self.fake.list("nodes")},
                "pods": sorted((p["metadata"]["namespace"], p["metadata"]["name"]) for p in self.fake.list("pods"))}


@pytest.fixture(scope="module")
def kube_session(tmp_path_factory):
    k = Kube(tmp_path_factory.mktemp("kubewrites"))
    yield k
    k.fake.stop()


@pytest.fixture
def kube(kube_session: Kube) -> Kube:
    kube_session.seed()
    return kube_session


def spec(k: FakeKube, name: str = NODE) -> dict:
    return k.get("nodes", name)["spec"]


def cordoned(k: FakeKube) -> None:
    spec(k)["unschedulable"] = True


def tainted(k: FakeKube) -> None:
    spec(k)["taints"] = [{"effect": "NoSchedule", "key": TAINT_KEY, "value": "true"}, dict(OTHER_TAINT)]


def other_tainted(k: FakeKube) -> None:
    spec(k)["taints"] = [dict(OTHER_TAINT)]


def refuse(method: str, reason: str, code: int) -> Callable[[FakeKube], None]:
    def prepare(k: FakeKube) -> None:
        k.server.fail(method, r"/(nodes|pods)/", code, status(code, reason, f"{reason.lower()}: refused by a test"))
    return prepare


PERFORM = "cloud.google.com/perform-maintenance"


def performing(k: FakeKube) -> None:
    k.get("nodes", NODE)["metadata"]["labels"][PERFORM] = "true"


def dead_kubelet(k: FakeKube) -> None:
    k.stop_kubelet(NODE)   # the pod's node: a graceful delete leaves it Terminating


def cmd(*args: str) -> list[str]:
    """A kubectl command line as the plays build it (``gke.kube``)."""
    return list(kubectl(*args, context=CONTEXT).argv)


# (id, argv, the state before it) -- each write of the quarantine play, and what can go wrong with it.
CASES = [
    ("cordon", cmd("cordon", NODE), None),
    ("cordon-already", cmd("cordon", NODE), cordoned),
    ("cordon-missing", cmd("cordon", "gke-gone-0000"), None),
    ("cordon-patch-refused", cmd("cordon", NODE), refuse("PATCH", "Forbidden", 403)),
    ("cordon-get-refused", cmd("cordon", NODE), refuse("GET", "Forbidden", 403)),
    ("uncordon", cmd("uncordon", NODE), cordoned),
    ("uncordon-already", cmd("uncordon", NODE), None),
    ("taint-overwrite", cmd("taint", "nodes", NODE, TAINT, "--overwrite"), other_tainted),
    ("taint-overwrite-again", cmd("taint", "nodes", NODE, TAINT, "--overwrite"), tainted),
    ("taint-new", cmd("taint", "nodes", NODE, TAINT), other_tainted),
    ("taint-exists", cmd("taint", "nodes", NODE, TAINT), tainted),
    ("taint-several", cmd("taint", "nodes", NODE, "a=1:NoSchedule", "b:PreferNoSchedule"), tainted),
    ("taint-several-exist", cmd("taint", "nodes", NODE, f"{TAINT_KEY}=x:NoSchedule", "google.com/tpu=y:NoExecute"),
     tainted),
    ("taint-missing-node", cmd("taint", "nodes", "gke-gone-0000", TAINT, "--overwrite"), None),
    ("taint-patch-refused", cmd("taint", "nodes", NODE, TAINT, "--overwrite"), refuse("PATCH", "Forbidden", 403)),
    ("untaint", cmd("taint", "nodes", NODE, f"{TAINT_KEY}-"), tainted),
    ("untaint-last", cmd("taint", "node", NODE, "google.com/tpu-"), other_tainted),
    ("untaint-effect", cmd("taint", "nodes", NODE, f"{TAINT_KEY}:NoSchedule-"), tainted),
    ("untaint-absent", cmd("taint", "nodes", NODE, f"{TAINT_KEY}-"), other_tainted),
    ("untaint-other-effect", cmd("taint", "nodes", NODE, f"{TAINT_KEY}:NoExecute-"), tainted),
    ("untaint-two-absent", cmd("taint", "nodes", NODE, "x-", "y:NoSchedule-"), None),
    ("untaint-overwrite", cmd("taint", "nodes", NODE, f"{TAINT_KEY}-", "--overwrite"), tainted),
    ("taint-and-untaint", cmd("taint", "nodes", NODE, "google.com/tpu-", "d=1:NoSchedule"), tainted),
    # A slice's maintenance started (plays/slice_notice.py): its pool's nodes labelled.
    ("label-pool", cmd("label", "nodes", "-l", "cloud.google.com/gke-nodepool=v6e-16-0", f"{PERFORM}=true",
                       "--overwrite"), None),
    ("label-pool-already", cmd("label", "nodes", "-l", "cloud.google.com/gke-nodepool=v6e-16-0", f"{PERFORM}=true",
                               "--overwrite"), performing),
    ("label-pool-none", cmd("label", "nodes", "-l", "cloud.google.com/gke-nodepool=v6e-16-9", f"{PERFORM}=true",
                            "--overwrite"), None),
    ("label-patch-refused", cmd("label", "nodes", "-l", "cloud.google.com/gke-nodepool=v6e-16-0", f"{PERFORM}=true",
                                "--overwrite"), refuse("PATCH", "Forbidden", 403)),
    ("delete-pod", cmd("delete", "pod", POD, "--namespace", "default"), None),
    ("delete-pod-missing", cmd("delete", "pod", "gone", "--namespace", "default"), None),
    ("delete-pod-no-namespace", cmd("delete", "pod", POD, "--namespace", "nowhere"), None),
    ("delete-pod-refused", cmd("delete", "pod", POD, "-n", "default"), refuse("DELETE", "Forbidden", 403)),
    # Bounded (plays' cloud/pod_delete.py): a grace period, a force delete of a pod kept Terminating.
    ("delete-pod-grace-bounded", cmd("delete", "pod", POD, "--namespace", "default", "--grace-period=5",
                                     "--timeout=30s"), None),
    ("delete-pod-force", cmd("delete", "pod", POD, "--namespace", "default", "--grace-period=0", "--force",
                             "--timeout=30s"), dead_kubelet),
    ("delete-pod-force-alone", cmd("delete", "pod", POD, "--namespace", "default", "--force"), dead_kubelet),
    ("delete-pod-force-missing", cmd("delete", "pod", "gone", "--namespace", "default", "--grace-period=0",
                                     "--force", "--timeout=30s"), None),
]


@clients
@pytest.mark.parametrize(("argv", "prepare"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_write_is_answered_as_kubectl_answers_it(kube: Kube, argv, prepare):
    """The same stdout, stderr and exit code as the real kubectl, and the
    same nodes and pods after, from the same state."""
    kube.seed(prepare or (lambda k: None))
    mark = kube.fake.server.mark()
    cli = subprocess.run(argv, env=kube.env, capture_output=True, text=True, timeout=60)
    after_cli = kube.state()
    kube.cli_sent = [(r.method, r.path) for r in kube.fake.server.since(mark) if r.mutating]

    kube.seed(prepare or (lambda k: None))
    mark = kube.fake.server.mark()
    fast = KubectlShortcut().run(list(argv), dict(kube.env), 30)
    assert fast is not None, f"the shortcut does not answer {argv}"
    assert (fast.rc, fast.stdout, fast.stderr) == (cli.returncode, cli.stdout, cli.stderr), argv
    assert kube.state() == after_cli
    sent = [(r.method, r.path) for r in kube.fake.server.since(mark) if r.mutating]
    assert sent == kube.cli_sent, "the shortcut's changing requests are not kubectl's"


def test_the_taint_the_play_sets_and_removes_reads_as_kubectl_prints_it():
    """The words each verb prints, for the plays' commands (also the
    play's own check: nodes_fact reads the taint back by TAINT_KEY)."""
    w = parse_write(cmd("taint", "nodes", NODE, TAINT, "--overwrite"))
    assert w is not None and (w.name, w.overwrite, w.context) == (NODE, True, CONTEXT)
    assert w.add == [{"effect": "NoSchedule", "key": TAINT_KEY, "value": "true"}] and w.remove == []
    word, taints = kube_api.new_taints(NODE, [dict(OTHER_TAINT)], w)
    assert (word, taints) == ("modified", [w.add[0], OTHER_TAINT])
    release = parse_write(cmd("taint", "nodes", NODE, f"{TAINT_KEY}-"))
    assert release is not None and release.remove == [{"key": TAINT_KEY}]
    assert kube_api.new_taints(NODE, taints, release) == ("untainted", [OTHER_TAINT])
    with pytest.raises(kube_api.KubectlError) as e:
        kube_api.new_taints(NODE, [OTHER_TAINT], release)
    assert e.value.stderr() == f'error: taint "{TAINT_KEY}" not found\n'
    d = parse_write(cmd("delete", "pod", POD, "--namespace", "ns1"))
    assert d is not None and (d.verb, d.name, d.namespace) == ("delete", POD, "ns1")


@pytest.mark.parametrize("argv", [
    ["kubectl", "cordon", NODE, "--dry-run=server"],
    ["kubectl", "cordon", "-l", "pool=a"],
    ["kubectl", "cordon", NODE, OTHER],
    ["kubectl", "cordon", f"node/{NODE}"],
    ["kubectl", "drain", NODE],
    ["kubectl", "taint", "nodes", NODE],
    ["kubectl", "taint", "nodes", "--all", "a=b:NoSchedule"],
    ["kubectl", "taint", "pods", NODE, "a=b:NoSchedule"],
    ["kubectl", "taint", "nodes", NODE, "a=b:Bad"],
    ["kubectl", "taint", "nodes", NODE, "a=b"],
    ["kubectl", "taint", "nodes", NODE, "-bad=b:NoSchedule"],
    ["kubectl", "taint", "nodes", NODE, "a=b=c:NoSchedule"],
    ["kubectl", "taint", "nodes", NODE, "a/b/c=d:NoSchedule"],
    ["kubectl", "taint", "nodes", NODE, "e=1:NoSchedule", "e=2:NoSchedule"],
    ["kubectl", "taint", "nodes", NODE, "c-", "c=1:NoSchedule"],
    ["kubectl", "taint", "nodes", NODE, "a:Bad-"],
    ["kubectl", "delete", "pod", POD, "--grace-period=0"],
    ["kubectl", "delete", "pod", POD, "--force", "--grace-period=3"],
    ["kubectl", "delete", "pod", POD, "--timeout=1m"],
    ["kubectl", "delete", "pod", POD, "--timeout", "30s"],
    ["kubectl", "delete", "pod", POD, "--wait=false"],
    ["kubectl", "delete", "pods", "--all"],
    ["kubectl", "delete", "pod", POD, "other"],
    ["kubectl", "delete", "node", NODE],
    ["kubectl", "delete", "pod", POD, "--namespace"],
    ["kubectl", "delete", "-f", "x.yaml"],
])
def test_a_write_with_what_the_shortcut_does_not_know_runs_as_kubectl(argv):
    """Not parsed (a flag, several objects, a spec kubectl itself refuses):
    the command runs as a process, and kubectl says what it says."""
    assert parse_write(argv) is None
    assert KubectlShortcut().run(argv, {"HOME": "/nonexistent"}, 5) is None


@clients
def test_delete_waits_until_the_pod_is_gone_as_kubectl_does(kube: Kube):
    """The pod is still there (its grace period) for two reads after the
    DELETE: the answer comes once it is gone, as kubectl's --wait; one that
    stays past the timeout is the connector's timed-out answer."""
    shortcut, argv = KubectlShortcut(), cmd("delete", "pod", POD, "--namespace", "default")
    lingering = dict(kube.fake.get("pods", POD, "default"))
    kube.fake.server.fail("GET", rf"/pods/{POD}$", 200, lingering, times=2)
    mark = kube.fake.server.mark()
    fast = shortcut.run(argv, dict(kube.env), 30)
    assert fast is not None and (fast.rc, fast.stdout) == (0, f'pod "{POD}" deleted\n')
    reads = [r.status for r in kube.fake.server.since(mark) if r.method == "GET"]
    assert reads == [200, 200, 404], reads
    assert fast.seconds >= 0.9

    kube.seed()
    lingering = dict(kube.fake.get("pods", POD, "default"))
    kube.fake.server.fail("GET", rf"/pods/{POD}$", 200, lingering, times=100)
    slow = shortcut.run(argv, dict(kube.env), 1)
    assert slow is not None and (slow.rc, slow.stdout) == (TIMED_OUT, f'pod "{POD}" deleted\n'), slow.stderr
    assert "timed out after 1s" in slow.stderr


@clients
@pytest.mark.parametrize("flags", [(), ("--grace-period=5",)], ids=["own-grace", "grace"])
def test_a_delete_of_a_pod_kept_terminating_ends_at_its_timeout_as_kubectl_does(kube: Kube, flags):
    """The pod's node's kubelet is dead: the API server keeps it
    Terminating. kubectl delete --timeout=2s gives up after 2 s with its
    "timed out waiting" error, exit 1, the pod still there; the shortcut
    the same (kubectl's stderr before that line is client-go's log of its
    watch's end, not repeated)."""
    argv = cmd("delete", "pod", POD, "--namespace", "default", *flags, "--timeout=2s")
    answers = []
    for run in (lambda: subprocess.run(argv, env=kube.env, capture_output=True, text=True, timeout=60),
                lambda: KubectlShortcut().run(list(argv), dict(kube.env), 30)):
        kube.seed(dead_kubelet)
        mark = kube.fake.server.mark()
        r = run()
        assert r is not None
        pod = kube.fake.get("pods", POD, "default")
        answers.append((r.returncode if hasattr(r, "returncode") else r.rc, r.stdout, r.stderr.splitlines()[-1],
                        bool(pod["metadata"].get("deletionTimestamp")),
                        [(q.method, q.body) for q in kube.fake.server.since(mark) if q.mutating]))
    cli, fast = answers
    assert cli[:4] == (1, f'pod "{POD}" deleted\n', f"error: timed out waiting for the condition on pods/{POD}", True)
    assert fast == cli


# -- in the cluster -----------------------------------------------------------------------------
@pytest.fixture
def pod(kube: Kube, tmp_path: Path, monkeypatch) -> dict[str, str]:
    """This process as in a pod: the service account's token and CA in a
    temp folder, the API server's address in the environment, a kubectl on
    PATH that only leaves a mark (no kubectl runs), no kubeconfig. The fake
    takes only the service account's token."""
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text(SA_TOKEN)   # a projected token has no newline
    shutil.copy(kube.pki.ca_file, sa / "ca.crt")
    monkeypatch.setattr(kube_api, "SERVICE_ACCOUNT_DIR", str(sa))
    monkeypatch.setattr(kube.fake, "token", SA_TOKEN)
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "kubectl").write_text(f"#!/bin/sh\ntouch {tmp_path / 'kubectl-ran'}\n")
    (bin_ / "kubectl").chmod(0o755)
    return {"PATH": f"{bin_}:/usr/bin:/bin", "HOME": str(tmp_path), IN_CLUSTER_ENV: "1",
            "KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(kube.fake.server.port)}


@clients
def test_in_the_cluster_the_service_account_answers_kubectl(kube: Kube, pod: dict[str, str], tmp_path: Path):
    """get nodes, cordon, taint and delete pod through the connector as the
    watch in the Ray head runs them: the service account's token on every
    request, over TLS with its CA, the plays' --context= ignored."""
    here = LocalConnector(tmp_path, base_env=pod, shortcuts=(KubectlShortcut(),))
    mark = kube.fake.server.mark()
    got = here.run(cmd("get", "nodes", "-l", "cloud.google.com/gke-nodepool=v6e-16-0", "--output=json"), timeout=30)
    assert got.rc == 0, got.stderr
    assert sorted(i["metadata"]["name"] for i in json.loads(got.stdout)["items"]) == [NODE, OTHER]
    for argv, said in ((cmd("cordon", NODE), f"node/{NODE} cordoned\n"),
                       (cmd("taint", "nodes", NODE, TAINT, "--overwrite"), f"node/{NODE} modified\n"),
                       (cmd("delete", "pod", POD, "--namespace", "default"), f'pod "{POD}" deleted\n')):
        ran = here.run(argv, timeout=30)
        assert (ran.rc, ran.stdout, ran.stderr) == (0, said, ""), argv
    node = kube.fake.get("nodes", NODE)["spec"]
    assert node == {"unschedulable": True, "taints": [{"effect": "NoSchedule", "key": TAINT_KEY, "value": "true"}]}
    assert kube.fake.get("pods", POD, "default") is None
    seen = kube.fake.server.since(mark)
    assert seen and {r.headers.get("authorization", "").lower() for r in seen} == {f"bearer {SA_TOKEN}"}
    assert [r.method for r in seen if r.mutating] == ["PATCH", "PATCH", "DELETE"]
    assert not (tmp_path / "kubectl-ran").exists()


@clients
def test_in_the_cluster_a_rotated_token_is_read_again(kube: Kube, pod: dict[str, str], monkeypatch):
    """The kubelet rotates the projected token: a minute after its last
    read the loader reads the file again, and the new token is sent."""
    from kubernetes.config import incluster_config
    shortcut = KubectlShortcut()
    assert shortcut.run(cmd("cordon", NODE), pod, 30).rc == 0
    rotated = "service-account-token-2"
    (Path(kube_api.SERVICE_ACCOUNT_DIR) / "token").write_text(rotated)
    monkeypatch.setattr(kube.fake, "token", rotated)

    class Later(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime.datetime.now(tz) + datetime.timedelta(minutes=2)

    monkeypatch.setattr(incluster_config, "datetime", type("Clock", (), {"datetime": Later,
                                                                         "timedelta": datetime.timedelta}))
    mark = kube.fake.server.mark()
    ran = shortcut.run(cmd("uncordon", NODE), pod, 30)
    assert (ran.rc, ran.stdout, ran.stderr) == (0, f"node/{NODE} uncordoned\n", "")
    assert {r.headers.get("authorization") for r in kube.fake.server.since(mark)} == {f"bearer {rotated}"}


@pytest.mark.parametrize("argv", [
    ["kubectl", "apply", "-f", "raycluster.yaml", f"--context={CONTEXT}"],
    ["kubectl", "get", "pods", "--watch"],
    ["kubectl", "cordon", NODE, "--dry-run=server"],
])
def test_in_the_cluster_kubectl_it_does_not_answer_fails_in_one_line_and_runs_nothing(tmp_path: Path, argv):
    """No process (a kubectl on PATH would leave its mark): exit 127 and one
    line that names the command; a stream too. Not kubectl: not its business."""
    mark = tmp_path / "kubectl-ran"
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "kubectl").write_text(f"#!/bin/sh\ntouch {mark}\n")
    (bin_ / "kubectl").chmod(0o755)
    env = {"PATH": f"{bin_}:/usr/bin:/bin", IN_CLUSTER_ENV: "1"}
    here = LocalConnector(tmp_path, base_env=env, shortcuts=(KubectlShortcut(),))
    ran = here.run(argv, timeout=10)
    assert ran.rc == NOT_FOUND and ran.stdout == ""
    assert ran.stderr.count("\n") == 1 and ran.stderr.startswith(" ".join(argv) + ": not answered in the cluster")
    streamed = here.stream(["kubectl", "logs", "-f", POD], on_line=lambda line: None)
    assert streamed.rc == NOT_FOUND and "kubectl logs -f" in streamed.stderr
    assert not mark.exists()
    assert here.run(["true"], timeout=10).rc == 0   # other commands run as before
    outside = LocalConnector(tmp_path, base_env={"PATH": env["PATH"]}, shortcuts=(KubectlShortcut(),))
    assert outside.run(argv, timeout=10).rc == 0 and mark.exists()   # without the variable, kubectl runs


def test_in_the_cluster_without_the_service_account_says_so(tmp_path: Path, monkeypatch):
    """No token mounted: kubectl's "Unable to connect" with the loader's reason, exit 1."""
    monkeypatch.setattr(kube_api, "SERVICE_ACCOUNT_DIR", str(tmp_path / "none"))
    env = {IN_CLUSTER_ENV: "1", "KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "1"}
    ran = KubectlShortcut().run(cmd("cordon", NODE), env, 5)
    assert ran is not None and ran.rc == 1
    assert ran.stderr == "Unable to connect to the server: ConfigException: Service token file does not exist.\n"
