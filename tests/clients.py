"""What the tests of the real clients against the loopback fakes share
(tests/test_clients_*.py): the tutorial's names, and how a run is read.

Each test runs ``invoke`` as a user would (a subprocess, a temp inventory,
apply mode) and asserts on what the fakes received. "Changing requests" are
POST/PUT/PATCH/DELETE, minus the RPCs that are POSTs by protocol but change
nothing (getIamPolicy, compute operations/wait, the OAuth token endpoint).

What runs as a process and what does not: a run's local connector answers
some commands in-process, as it does for a user (``base.Shortcut``):
gcloud's reads through Google's REST APIs (playbooks/access/gcp_api.py,
with the token of the run's one real `gcloud config config-helper`, or of
one an earlier run kept; a read the API fails runs as its gcloud process),
kubectl's gets, logs, cordon, uncordon, taint, label and pod deletes through
the `kubernetes` client (playbooks/access/kube_api.py), `ray job logs`
through the Ray Jobs SDK; no process starts for those. Everything else is
the real process: gcloud's changes, gsutil, kubectl's applies, creates,
port-forward and every kubectl the client does not take (with
gke-gcloud-auth-plugin), the rest of the ray CLI.
tests/test_in_process.py runs every form of those commands the goldens hold
both ways and compares them; `pytest --processes-only` (tests/conftest.py)
makes every command of a test its real process, as each test of the files
whose plays write (marked ``both_ways``) runs a second time in `make test`. A run's log says of each command
answered in-process that no process ran for it (``logged``).

The dashboard play is included in `invoke up`: the fake dashboard answers on
the inventory's dashboard_port (as the port-forward would), so the play
finds it and `ray list nodes` reads the fake cluster's Ray pods from it.
"""
from __future__ import annotations

from tests.fakes.cloud import AUTOPILOT, PROJECT, PROJECT_NUMBER, ROOT, TOKEN, USER, Cloud, Run

__all__ = ["AUTOPILOT", "PROJECT", "PROJECT_NUMBER", "ROOT", "TOKEN", "USER", "Cloud", "Run"]

NET1, NET2 = "maxtext-multislice-net-1", "maxtext-multislice-net-2"
CLUSTER = "maxtext-multislice"
BUCKET = f"{PROJECT}-ckpt"
ZONE_PATH = f"/container/v1/projects/{PROJECT}/locations/us-east5-b"
WORKLOAD_PRINCIPAL = (f"principal://iam.googleapis.com/projects/{PROJECT_NUMBER}/locations/global/"
                      f"workloadIdentityPools/{PROJECT}.svc.id.goog/subject/ns/default/sa/maxtext-ksa")


def bodies(run: Run, method: str, pattern: str) -> list[dict]:
    return [r.body for r in run.calls(method, pattern)]


def recap(run: Run, play: str) -> dict:
    found = [r for r in run.recaps() if r["play"] == play]
    assert found, f"no recap for {play}\n{run}"
    return found[-1]


def affinity_values(pod_spec: dict) -> list[str]:
    """The capacity options the TPU workers' node affinity admits (our label)."""
    [term] = pod_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    [expr] = term["matchExpressions"]
    assert (expr["key"], expr["operator"]) == ("tpu-playbooks/capacity", "In")
    return expr["values"]


def recap_lines(run: Run, play: str) -> str:
    """The recap block of a play (its step lines and their notes)."""
    return run.out.split(f"PLAY RECAP [{play} ", 1)[1].split("\n\n", 1)[0]


def logged(cloud: Cloud, task: str, since: float) -> list[str]:
    """The command files of ``task``'s run logs (.state/<env>/runs/<stamp>-<task>/:
    each command's line, where and how it ran, its output) written since
    ``since`` (a ``time.time()``), in their order."""
    runs = ROOT / ".state" / cloud.envdata().name / "runs"
    return [f.read_text() for d in sorted(runs.glob(f"*-{task}")) for f in sorted(d.glob("*.log"))
            if f.stat().st_mtime >= since]


def ok_run(run: Run) -> Run:
    assert run.rc == 0, str(run)
    return run


def failed_run(run: Run) -> Run:
    assert run.rc != 0, str(run)
    return run
