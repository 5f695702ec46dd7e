"""Which cached answers a change clears (playbooks/access/staleness.py, the
Runner's ``stale`` policy): a compute change keeps the bucket's answer and
reads the networks again; a role granted, an API enabled, a change of an
unknown family and an in-process action clear everything, as does any
change for an in-process fact; without a policy the Runner clears all."""
from __future__ import annotations

import pytest

from playbooks.access import staleness
from playbooks.access.cli_clients import gcloud, kubectl
from playbooks.core.command import Command
from playbooks.core.connector import LocalConnector, Ran
from playbooks.core.facts import Action, Fact
from playbooks.core.runner import Mode, Runner, StepLog


@pytest.mark.parametrize("argv, family", [
    (("gcloud", "compute", "networks", "subnets", "list", "--format=json"), "gcloud compute"),
    (("gcloud", "beta", "quotas", "info", "describe", "x"), "gcloud quotas"),
    (("gcloud", "--quiet", "container", "node-pools", "create", "p"), "gcloud container"),
    (("gsutil", "ls", "gs://b"), "gcloud storage"),
    (("/usr/bin/kubectl", "apply", "-f", "-"), "kubectl"),
    (("ray", "job", "submit"), None),
    (("gcloud",), None),
])
def test_the_family_of_a_command(argv, family):
    assert staleness.family(Command(argv)) == family


def fact(*argv: str) -> Fact:
    return Fact(" ".join(argv), Command(argv), parse=lambda c: c.stdout)


NETWORKS = fact("gcloud", "compute", "networks", "list")
BUCKET = fact("gcloud", "storage", "buckets", "describe", "gs://b")
POOLS = fact("gcloud", "container", "node-pools", "list")
QUOTA = fact("gcloud", "beta", "quotas", "info", "describe", "tpu")
PODS = fact("kubectl", "get", "pods")
POLICY = fact("gcloud", "projects", "get-iam-policy", "p")
EVERY = {NETWORKS, BUCKET, POOLS, QUOTA, PODS, POLICY}
IN_PROCESS = Fact("pid file", python=lambda: 1)


@pytest.mark.parametrize("change, cleared", [
    (gcloud("compute", "networks", "create", "n"), {NETWORKS}),
    (gcloud("storage", "buckets", "create", "gs://b"), {BUCKET}),
    (Command(("gsutil", "mb", "gs://b")), {BUCKET}),
    (gcloud("container", "node-pools", "create", "p"), {NETWORKS, POOLS, QUOTA, PODS}),
    (kubectl("apply", "-f", "-"), {NETWORKS, POOLS, QUOTA, PODS}),
    (gcloud("projects", "add-iam-policy-binding", "p"), EVERY),
    (gcloud("services", "enable", "container.googleapis.com"), EVERY),
    (Command(("ray", "job", "submit", "--", "python", "x")), EVERY),
    (Action("write a state file", lambda: None), EVERY),
])
def test_what_each_change_may_have_changed(change, cleared):
    assert {f for f in EVERY if staleness.stale(change, f)} == cleared
    assert staleness.stale(change, IN_PROCESS)  # whatever changed


class Counting(LocalConnector):
    """Answers every command at once and keeps what ran."""

    def __init__(self, root: str):
        super().__init__(root)
        self.ran: list[str] = []

    def run(self, argv, env=(), input=None, cwd=None, timeout=None):
        self.ran.append(" ".join(argv))
        return Ran(0, f"answer {len(self.ran)}", "", 0.0)


def looks_after_a_change(tmp_path, stale, change) -> list[str]:
    conn = Counting(str(tmp_path))
    runner = Runner(Mode.APPLY, conn, stale=stale)
    log = StepLog(None, True)
    for f in (NETWORKS, BUCKET, POOLS):
        runner.look(f, log, "look")
    runner.act(change, log, "change")
    conn.ran.clear()
    for f in (NETWORKS, BUCKET, POOLS):
        runner.look(f, log, "look again")
    return conn.ran


def test_the_runner_asks_again_only_what_the_change_may_have_changed(tmp_path):
    ran = looks_after_a_change(tmp_path, staleness.stale, gcloud("compute", "networks", "create", "n"))
    assert ran == ["gcloud compute networks list"]  # the bucket's and the pools' answers were kept
    ran = looks_after_a_change(tmp_path, staleness.stale, Action("kill a pid", lambda: None))
    assert ran == ["gcloud compute networks list", "gcloud storage buckets describe gs://b",
                   "gcloud container node-pools list"]


def test_without_a_policy_a_change_clears_every_answer(tmp_path):
    ran = looks_after_a_change(tmp_path, None, gcloud("compute", "networks", "create", "n"))
    assert len(ran) == 3
