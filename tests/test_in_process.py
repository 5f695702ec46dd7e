"""What the local connector answers in-process instead of starting a
process (``core.connector.base.Shortcut``: the `kubernetes` client for
kubectl, ``playbooks/access/kube_api.py``; Google's REST APIs for gcloud's
reads, ``playbooks/access/gcp_api.py``), compared with the real processes,
and marked where a user reads what ran.

- Every kubectl and gcloud command form of the goldens (tests/goldens/: the
  dry run of every task) that a shortcut takes (its parsers say so:
  ``claimed``), its values made the fakes' (a ``${NODE0}`` one
  node of the seeded slice, the project, context, bucket and namespace of
  tests/fakes/cloud.py's environments), run both ways against the seeded
  fakes: the real kubectl or gcloud process, and the shortcut as the
  connector makes it (the kubernetes client given gcloud's token). A
  write runs twice each way (its change, then the same again), each way
  from the same state (``FakeKube.snapshot``). Compared: the exit code,
  the output (JSON parsed), the error class (the first words of stderr's
  first error line), and after a write the nodes and pods. Then the same
  forms on a cluster with nothing in it (the NotFound side).
- A shortcut broken on purpose is caught by that comparison.
- A dry run marks each line whose command the connector would answer
  in-process (``  # in-process: ...``, from ``Shortcut.answers``), which
  are the lines the parsers take, and no other line; with
  TPU_PLAYBOOKS_PROCESSES_ONLY=1 it marks none. The run's log says of each
  command answered in-process that no process ran for it.
"""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from playbooks.access import gcp_api, kube_api
from playbooks.access.gcloud_credentials import GcloudCredentials
from playbooks.access.gcp_api import GcloudShortcut
from playbooks.access.kube_api import KubectlShortcut, parse_get, parse_write
from playbooks.core.command import Command
from playbooks.core.connector import LocalConnector, Ran
from playbooks.core.runlog import RunLog
from playbooks.core.runner import Mode, Runner, StepLog
from tests.clients import PROJECT, Cloud
from tests.fakes.cloud import AUTOPILOT, STANDARD
from tests.fakes.kube import FakeKube
from tests.goldens import GOLDENS, dry_run

LINE = re.compile(r"^  (?:probe|apply|verify) +(.*)$")
BIND = re.compile(r"^[A-Z][A-Z0-9_]*=\$\((.*)\)$")
MARK = "  # in-process: "
ERROR = re.compile(r"^(ERROR:|Error from server|error:|Unable to connect to the server)")
# A ${NAME} the dry run shows for a value a probe looks up, and what stands for it in a form.
LOOKED_UP = {"NODE": "{NODE}", "POD": "{POD}", "POOL": "{POOL}", "AT": "{AT}"}
QUOTA = "TPUS-PER-TPU-FAMILY-per-project-region"
# gcloud reads a project with nothing of ours in it answers as a seeded one does (its quotas, machine types,
# GKE's versions, gcloud's properties, the project and its policy): compared in the seeded world only.
SAME_WHEN_BARE = (("gcloud", "beta", "quotas"), ("gcloud", "compute", "machine-types"),
                  ("gcloud", "container", "get-server-config"), ("gcloud", "config", "list"),
                  ("gcloud", "projects", "describe"), ("gcloud", "projects", "get-iam-policy"))


# -- the forms --------------------------------------------------------------------------
def golden_commands() -> Iterator[tuple[str, str, str]]:
    """(golden file, the whole line, its command as shown) of every probe,
    apply and verify line of the goldens."""
    for path in sorted(GOLDENS.rglob("*.txt")):
        for line in path.read_text(errors="replace").splitlines():
            m = LINE.match(line)
            if m:
                shown = m.group(1).split("  => ")[0].split("  # ")[0].split("  (")[0]
                yield str(path.relative_to(GOLDENS)), line, shown


def split(shown: str) -> tuple[dict[str, str], list[str]] | None:
    """A shown command as (its VAR=value prefix, argv); None where it is not
    one command (a pipe, a shell's words)."""
    if m := BIND.match(shown):
        shown = m.group(1)
    try:
        words = shlex.split(shown)
    except ValueError:
        return None
    env = {}
    while words and re.fullmatch(r"[A-Z][A-Z0-9_]*=.*", words[0]):
        k, _, v = words.pop(0).partition("=")
        env[k] = v
    return (env, words) if words and "|" not in words else None


def form_of(argv: list[str]) -> tuple[tuple[str, ...], str]:
    """The command line with its values as the fakes name them left as
    ``{TOKEN}``s (``concrete`` fills them in), and the fake environment it
    belongs to (Autopilot where its context or location is a region)."""
    out, world, after = [], STANDARD, ""
    for a in argv:
        a = re.sub(r"\$\{([A-Z]+)\d*\}", lambda m: LOOKED_UP.get(m.group(1), m.group(0)), a)
        if m := re.fullmatch(r"--context=gke_[^_]+_([^_]+)_.*", a):
            world = STANDARD if re.search(r"-[a-z]$", m.group(1)) else AUTOPILOT
            a = "--context={CONTEXT}"
        for flag, token in (("--project=", "PROJECT"), ("--cluster=", "CLUSTER"), ("--location=", "LOCATION"),
                            ("--regions=", "REGION"), ("--filter=name=", "MACHINE_TYPE"), ("--namespace=", "NS")):
            if a.startswith(flag):
                a = flag + "{" + token + "}"
        if a.startswith("gs://"):
            a = "gs://{BUCKET}"
        if after in ("--namespace", "-n"):
            a = "{NS}"
        if after in ("get-iam-policy", "describe") and argv[1] == "projects":
            a = "{PROJECT}"
        if after == "describe" and argv[1:4] == ["beta", "quotas", "info"]:
            a = "{QUOTA}"
        out.append(a)
        after = a
    return tuple(out), world


def concrete(form: tuple[str, ...], values: dict[str, str]) -> list[str]:
    out = []
    for a in form:
        for token, value in values.items():
            a = a.replace("{" + token + "}", value)
        out.append(a)
    return out


def claimed(argv: list[str]) -> bool:
    """Whether a shortcut takes this command line, by its parsers: gcloud's
    reads (``gcp_api.parse``) and the lines answered from gcloud's
    config-helper (``FROM_HELPER``); kubectl's gets and writes
    (``parse_get``, ``parse_write``; no golden line is a `kubectl logs`)."""
    if argv[:1] == ["gcloud"]:
        return gcp_api.parse(argv) is not None or tuple(argv[1:]) in gcp_api.FROM_HELPER
    return argv[:1] == ["kubectl"] and (parse_get(argv) is not None or parse_write(argv) is not None)


PLAIN = {"NODE": "gke-node-0", "POD": "pod-0", "POOL": "v6e-16-0", "AT": "1700000000", "CONTEXT": "gke_p_z_c",
         "PROJECT": "p", "CLUSTER": "c", "LOCATION": "us-east5-b", "REGION": "us-east5", "MACHINE_TYPE": "m",
         "NS": "default", "BUCKET": "b", "QUOTA": QUOTA}


def golden_forms() -> dict[tuple[tuple[tuple[str, str], ...], tuple[str, ...]], tuple[str, str]]:
    """Every kubectl and gcloud command form of the goldens a shortcut
    takes -> (the fake environment it runs in, a golden line that has it)."""
    forms: dict = {}
    for where, _, shown in golden_commands():
        got = split(shown)
        if got is None or got[1][0] not in ("kubectl", "gcloud"):
            continue
        env, argv = got
        form, world = form_of(argv)
        if not claimed(concrete(form, PLAIN)):
            continue
        key = (tuple(sorted(env.items())), form)
        if key not in forms or (world == STANDARD and forms[key][0] != STANDARD):
            forms[key] = (world, f"{where}: {shown}")
    return forms


# -- both ways ------------------------------------------------------------------------------
def shape(text: str):
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def error_class(stderr: str) -> str:
    """The first words of stderr's first error line (gcloud's debug log and warnings aside)."""
    for line in stderr.splitlines():
        if ERROR.match(line):
            return " ".join(line.split()[:6])
    return ""


def outcome(rc: int, stdout: str, stderr: str) -> tuple:
    return rc, shape(stdout), error_class(stderr)


def kube_state(k: FakeKube) -> tuple:
    """What a write may change: each node's spec and labels; the pods by
    where they run (a pod KubeRay makes again has a new name)."""
    nodes = {n["metadata"]["name"]: (n.get("spec"), n["metadata"].get("labels")) for n in k.list("nodes")}
    pods = sorted(((p["metadata"]["namespace"], (p.get("spec") or {}).get("nodeName") or "",
                    (p["metadata"].get("labels") or {}).get("ray.io/group", ""),
                    "deletionTimestamp" in p["metadata"]) for p in k.list("pods")), key=str)
    return nodes, pods


class BothWays:
    """One fake world's values and shortcuts: each form run both ways."""

    def __init__(self, cloud: Cloud, world: str, values: dict[str, str]):
        self.cloud, self.world, self.values = cloud, world, values
        creds = GcloudCredentials()   # one run's: as connectors.this_machine makes them
        self.shortcuts = (GcloudShortcut(creds), KubectlShortcut(creds))
        self.answered: set[tuple] = set()

    def fast(self, argv: list[str], env: dict[str, str]) -> Ran | None:
        for s in self.shortcuts:
            got = s.run(list(argv), dict(env), 60)
            if got is not None:
                return got
        return None

    def compare(self, key: tuple, golden: str) -> list[str]:
        """The differences of one form (none: the same both ways)."""
        env, argv = dict(key[0]), concrete(key[1], self.values)
        full = {**self.cloud.env(self.world), **env}
        times = 2 if parse_write(argv) is not None else 1
        saved = self.cloud.kube.snapshot()
        real = [subprocess.run(argv, env=full, capture_output=True, text=True, timeout=120) for _ in range(times)]
        real_after = kube_state(self.cloud.kube)
        self.cloud.kube.restore(saved)
        fast = [self.fast(argv, full) for _ in range(times)]
        fast_after = kube_state(self.cloud.kube)
        self.cloud.kube.restore(saved)
        said, out = shlex.join(argv), []
        for i, (r, f) in enumerate(zip(real, fast)):
            if f is None:   # left to its process (a gcloud read that failed): nothing answered in-process
                continue
            self.answered.add(key)
            a, b = outcome(r.returncode, r.stdout, r.stderr), outcome(f.rc, f.stdout, f.stderr)
            if a != b:
                out.append(f"{said} (run {i + 1}; {golden}):\n    process:    {str(a)[:600]}\n"
                           f"    in-process: {str(b)[:600]}")
        if times == 2 and real_after != fast_after and all(f is not None for f in fast):
            out.append(f"{said}: the nodes and pods after it differ:\n    process:    {real_after}\n"
                       f"    in-process: {fast_after}")
        return out


def seeded(cloud: Cloud, world: str) -> dict[str, str]:
    """The world a finished `invoke up` leaves (and the watch's rights, which
    only stall_watch: cluster applies): the forms' values in it."""
    cloud.seed_full(world)
    if world == STANDARD:
        from playbooks.cloud import manifests
        plural = {"ServiceAccount": "serviceaccounts", "ClusterRole": "clusterroles", "Role": "roles",
                  "ClusterRoleBinding": "clusterrolebindings", "RoleBinding": "rolebindings"}
        for doc in manifests.watch_rbac_docs(cloud.envdata(world)):
            cloud.kube.create(plural[doc["kind"]], doc)
    cloud.get_credentials(world)
    nodes = sorted(n["metadata"]["name"] for n in cloud.kube.list("nodes", selector="cloud.google.com/gke-nodepool"
                                                                               "=v6e-16-0"))
    pods = sorted(cloud.kube.worker_pods(cloud.envdata(world).namespace))
    return world_values(cloud, world, nodes[0] if nodes else "gke-gone-0000", pods[0] if pods else "gone-0000")


def world_values(cloud: Cloud, world: str, node: str, pod: str) -> dict[str, str]:
    e = cloud.envdata(world)
    location = e.zone if world == STANDARD else e.region
    return {"NODE": node, "POD": pod, "POOL": "v6e-16-0", "AT": str(int(time.time()) + 120),
            "CONTEXT": f"gke_{PROJECT}_{location}_{e.cluster_name}", "PROJECT": PROJECT, "CLUSTER": e.cluster_name,
            "LOCATION": location, "REGION": e.region, "MACHINE_TYPE": cloud.envdata(STANDARD).machine_type,
            "NS": e.namespace, "BUCKET": e.gs_bucket, "QUOTA": QUOTA}


def differences(cloud: Cloud, forms: dict, worlds: tuple[str, ...] = ("seeded", "bare", "autopilot")
                ) -> tuple[list[str], set]:
    """Each form both ways in each world: the seeded Standard environment,
    a Standard cluster with nothing in it, the seeded Autopilot one (its
    forms only). The differences, and the forms answered in-process."""
    out: list[str] = []
    answered: set = set()
    for name in worlds:
        cloud.reset()
        world = AUTOPILOT if name == "autopilot" else STANDARD
        if name == "bare":
            cloud.seed_cluster(world)
            cloud.get_credentials(world)
            values = world_values(cloud, world, "gke-gone-0000", "gone-0000")
        else:
            values = seeded(cloud, world)
        ways = BothWays(cloud, world, values)
        for key, (home, golden) in forms.items():
            if (home == AUTOPILOT) == (name == "autopilot") and not (name == "bare" and key[1][:3] in SAME_WHEN_BARE):
                out += ways.compare(key, golden)
        answered |= ways.answered
    return out, answered


@pytest.mark.clients
def test_every_golden_form_a_shortcut_answers_is_answered_as_its_process_answers_it(cloud: Cloud):
    forms = golden_forms()
    kubectl = {key[1][1] for key in forms if key[1][0] == "kubectl"}
    assert {"get", "cordon", "uncordon", "taint", "label", "delete"} <= kubectl, sorted(forms)
    assert len([key for key in forms if key[1][0] == "gcloud"]) >= 10, sorted(forms)
    found, answered = differences(cloud, forms)
    assert not found, f"{len(found)} difference(s) of {len(forms)} forms:\n" + "\n".join(found)
    never = [shlex.join(key[1]) for key in forms if key not in answered]
    assert not never, f"never answered in-process, so never compared: {never}"


@pytest.mark.clients
def test_a_shortcut_broken_on_purpose_is_caught(cloud: Cloud, monkeypatch):
    """The taint's word and gcloud's networks list's own columns, each
    broken in the shortcut: the comparison names those two forms."""
    real_taints = kube_api.new_taints
    monkeypatch.setattr(kube_api, "new_taints", lambda node, old, w: ("tainted", real_taints(node, old, w)[1]))
    monkeypatch.setattr(gcp_api, "_networks", gcp_api.json_text)
    forms = {key: v for key, v in golden_forms().items()
             if (key[1][:3] == ("kubectl", "taint", "nodes") and "--overwrite" in key[1])
             or key[1][:4] == ("gcloud", "compute", "networks", "list")}
    assert len(forms) == 2, sorted(forms)
    found, _ = differences(cloud, forms, worlds=("seeded",))
    assert any(f.startswith("kubectl taint nodes ") for f in found), found
    assert any(f.startswith("gcloud compute networks list ") for f in found), found


# -- the marks ------------------------------------------------------------------------------
def test_the_dry_runs_mark_each_line_a_shortcut_would_answer_and_no_other():
    """The goldens: a kubectl or gcloud line a shortcut takes (its parser
    says so, a ``${NAME}`` taken as a plain name) ends in its mark, and no
    other line has one."""
    wrong = []
    for where, line, shown in golden_commands():
        got = split(shown)
        assert got is None or got[1][:2] != ["kubectl", "logs"], f"{where}: {line}: a form claimed() does not know"
        takes = got is not None and claimed(concrete(form_of(got[1])[0], PLAIN))
        if takes != (MARK in line):
            wrong.append(f"{where}: {line}")
    assert not wrong, "\n".join(wrong[:20])
    marked = [line for _, line, _ in golden_commands() if MARK in line]
    assert {line.split(MARK)[1] for line in marked} == {
        "kubernetes client, no kubectl process", "Google Cloud REST API, a gcloud process only if it fails"}


def test_a_dry_run_with_processes_only_marks_nothing(monkeypatch):
    """TPU_PLAYBOOKS_PROCESSES_ONLY=1: every command would run as its
    process, and the dry run says nothing else (the real `invoke`: this
    process's connector is made once)."""
    monkeypatch.setenv("TPU_PLAYBOOKS_PROCESSES_ONLY", "1")
    rc, out, err = dry_run("dev", ["hosts.quarantine", "v6e-16-0", "--why=x"], real_cli=True)
    assert rc == 0 and "PROCESSES STARTED" not in err, err
    assert "  apply  kubectl cordon " in out and MARK not in out, out
    monkeypatch.delenv("TPU_PLAYBOOKS_PROCESSES_ONLY")
    rc, out, err = dry_run("dev", ["hosts.quarantine", "v6e-16-0", "--why=x"], real_cli=True)
    assert rc == 0 and f"--context=gke_my-tpu-project_us-east5-b_maxtext-multislice{MARK}kubernetes client" in out


class Answering:
    """A shortcut for the run log's test: it answers `kubectl cordon` only."""

    name = "test client"

    def answers(self, argv: list[str], env: dict[str, str], streamed: bool) -> str | None:
        return "test client, no kubectl process" if argv[:2] == ["kubectl", "cordon"] and not streamed else None

    def run(self, argv: list[str], env: dict[str, str], timeout: float | None) -> Ran | None:
        return Ran(0, f"node/{argv[2]} cordoned\n", "", 0.0) if self.answers(argv, env, False) else None

    def stream(self, argv, env, on_line) -> Ran | None:
        return None


def test_the_run_log_says_which_commands_were_answered_in_process(tmp_path: Path):
    here = LocalConnector(tmp_path, {"PATH": "/usr/bin:/bin"}, shortcuts=(Answering(),))
    runner = Runner(Mode.APPLY, here, log=RunLog(tmp_path / "log"))
    (tmp_path / "log").mkdir()
    log = StepLog(None, False)
    runner.act(Command(("kubectl", "cordon", "n1")), log, "cordon")
    runner.act(Command(("true",)), log, "true")
    first, second = (p.read_text() for p in sorted((tmp_path / "log").iterdir()))
    assert first.splitlines()[:2] == [
        "$ kubectl cordon n1",
        "# on this machine, answered in-process by the test client: no kubectl process ran; exit 0 after 0.0s"]
    assert second.splitlines()[1].startswith("# on this machine; exit 0 after "), second
    assert here.in_process(["kubectl", "cordon", "n1"]) == "test client, no kubectl process"
    assert here.in_process(["kubectl", "uncordon", "n1"]) is None
    assert all(MARK not in line for line in log.lines), log.lines   # marks on the screen: a dry run's only
