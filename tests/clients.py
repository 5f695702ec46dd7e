"""What the tests of the real clients against the loopback fakes share
(tests/test_clients_*.py): the tutorial's names, and how a run is read.

Each test runs ``invoke`` as a user would (a subprocess, a temp inventory,
apply mode) and asserts on what the fakes received. "Changing requests" are
POST/PUT/PATCH/DELETE, minus the RPCs that are POSTs by protocol but change
nothing (getIamPolicy, compute operations/wait, the OAuth token endpoint).

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


def ok_run(run: Run) -> Run:
    assert run.rc == 0, str(run)
    return run


def failed_run(run: Run) -> Run:
    assert run.rc != 0, str(run)
    return run
