"""The environment's lease across machines: a Kubernetes
``coordination.k8s.io/v1`` Lease ``tpu-playbooks-<env>`` in the namespace
``default`` of its GKE cluster (every machine that drives the environment
reaches it once the cluster exists). Written through kubectl, as every
Kubernetes change of the project (so on the controller host when there is
one): ``kubectl create -f -`` (409 AlreadyExists when it exists), ``kubectl
replace -f -`` carrying the ``metadata.resourceVersion`` read (409 Conflict
when another wrote it since: the precondition), ``kubectl get``. The
lease's decisions are the engine's (``playbooks/core/lease.py``); this is
its ``Store``.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
from typing import Any

from playbooks.access.cli_clients import http_status, kube_object
from playbooks.cloud.gke import kube, kube_context
from playbooks.config.schema import Environment
from playbooks.core.command import Command
from playbooks.core.errors import CommandFailed
from playbooks.core.facts import ABSENT, Completed, Fact
from playbooks.core.lease import CONFLICT, EXISTS, GONE, OK, Record
from playbooks.core.runner import Runner, StepLog

NAMESPACE = "default"  # every cluster has it, from its first moment
DURATION = 600          # seconds a renewal keeps the lease (renewed every playbook.heartbeat)
REQUEST_TIMEOUT = "30s"  # a cluster deleted under a renewal must not hang it


def lease_name(env: Environment) -> str:
    return f"tpu-playbooks-{env.name}"


def where(env: Environment) -> str:
    return f"Lease {NAMESPACE}/{lease_name(env)} in cluster {env.cluster_name}"


def micro_time(t: float) -> str:
    """Kubernetes' MicroTime (RFC 3339, microseconds, UTC)."""
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: Any) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def manifest(env: Environment, holder: str, acquired: float | None, now: float, version: str = "") -> dict:
    """The Lease held by ``holder`` ("": released), renewed ``now``;
    ``version``: the resourceVersion a replace must find."""
    md: dict[str, Any] = {"name": lease_name(env), "namespace": NAMESPACE,
                          "labels": {"app.kubernetes.io/managed-by": "tpu-playbooks"}}
    if version:
        md["resourceVersion"] = version
    spec: dict[str, Any] = {"renewTime": micro_time(now), "leaseDurationSeconds": DURATION}
    if holder:
        spec["holderIdentity"] = holder
    if holder and acquired is not None:
        spec["acquireTime"] = micro_time(acquired)
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": md, "spec": spec}


def record(obj: dict) -> Record:
    spec = obj.get("spec") or {}
    return Record(holder=str(spec.get("holderIdentity") or ""), acquired=parse_time(spec.get("acquireTime")),
                  renewed=parse_time(spec.get("renewTime")),
                  duration=float(spec.get("leaseDurationSeconds") or DURATION),
                  version=str((obj.get("metadata") or {}).get("resourceVersion") or ""))


def write_command(env: Environment, verb: str, doc: dict) -> Command:
    """``printf '%s' <the Lease> | kubectl <create|replace> -f -``: nothing
    written anywhere but the cluster."""
    feed = Command(("printf", "%s", json.dumps(doc, separators=(",", ":"))))
    argv = kube(env, verb, "-f", "-", "--output=json", f"--request-timeout={REQUEST_TIMEOUT}").argv
    return Command(argv, pipe_from=feed, timeout=120)


def lease_fact(env: Environment) -> Fact:
    return Fact(name=f"lease {lease_name(env)}",
                command=kube(env, "get", "lease", lease_name(env), f"--namespace={NAMESPACE}", "--ignore-not-found",
                             "--output=json", f"--request-timeout={REQUEST_TIMEOUT}"),
                parse=kube_object(f"lease {lease_name(env)}"),
                describe=lambda o: f"held by {o['spec'].get('holderIdentity')}"
                if (o.get("spec") or {}).get("holderIdentity") else "released")


@dataclasses.dataclass
class KubeLease:
    """The Store of ``playbooks/core/lease.py``, through a runner (apply
    mode) and the log its lines go to."""

    env: Environment
    runner: Runner
    log: StepLog
    step: str = "lease"

    @property
    def where(self) -> str:
        return where(self.env)

    @property
    def context(self) -> str:
        return kube_context(self.env)

    def read(self) -> Record | None:
        got = self.runner.look(lease_fact(self.env), self.log, self.step, fresh=True)
        return None if got is ABSENT else record(got)

    def _write(self, verb: str, doc: dict) -> tuple[str, Record | None]:
        try:
            c = self.runner.act(write_command(self.env, verb, doc), self.log, self.step)
        except CommandFailed as e:
            answer = Completed(e.line, e.rc if e.rc is not None else 1, e.stdout, e.stderr)
            status, text = http_status(answer), e.stderr + e.stdout
            if status == 409 and "AlreadyExists" in text:
                return EXISTS, None
            if status == 409:
                return CONFLICT, None
            if status == 404:
                return GONE, None
            raise
        assert c is not None, "a lease is written in apply mode only"
        return OK, record(json.loads(c.stdout))

    def create(self, holder: str, now: float) -> tuple[str, Record | None]:
        return self._write("create", manifest(self.env, holder, now, now))

    def replace(self, holder: str, acquired: float | None, now: float, version: str) -> tuple[str, Record | None]:
        return self._write("replace", manifest(self.env, holder, acquired, now, version))
