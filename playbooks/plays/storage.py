"""§5 Storage and identity: the checkpoint bucket, the Kubernetes service
account, and the workload-identity binding that lets it use the bucket.
With ``stall_watch: cluster`` on GKE the Ray head runs as an account of its
own (``manifests.head_ksa_name``, made with the watch's rights by the
``raycluster`` play): the same binding for it, a second one the tutorial
does not have, since the head mounts the bucket too (its Ray Train driver
writes the run's storage there)."""
from __future__ import annotations

import dataclasses
import re
from typing import Any

from playbooks.access.cli_clients import fact, gcloud, json_list, json_object, text_value
from playbooks.cloud import manifests
from playbooks.cloud.gke import bucket_fact, kube, kube_get, services_command
from playbooks.config import tutorial as T
from playbooks.config.schema import Environment
from playbooks.core.command import Command, placeholder
from playbooks.core.errors import ProbeFailed
from playbooks.core.facts import ABSENT, Completed
from playbooks.core.step import Step, Verify, change, drift, ok

PLAY = "storage"


def project_number_fact(env: Environment):
    c = gcloud("projects", "describe", env.project_id, "--format=value(projectNumber)")
    c = dataclasses.replace(c, binds="PROJECT_NUMBER")
    return fact("project number", c, text_value(), assumed=placeholder("PROJECT_NUMBER"))


def listed_number_fact(env: Environment):
    """The project's number as its enabled services name it (``parent``:
    ``projects/123``): from prereqs' look at them, the same command, so no
    call of its own. Said only by a list that names one number."""
    def parse(c: Completed) -> str:
        numbers = {str(s.get("parent", "")) for s in json_list(what="project number")(c) if isinstance(s, dict)}
        found = [n.split("/", 1)[1] for n in numbers if re.fullmatch(r"projects/\d+", n)]
        if len(found) != 1 or len(numbers) != 1:
            raise ProbeFailed("project number", c.line, c.rc, c.stdout, c.stderr,
                              why=f"the enabled services name no one project number ({sorted(numbers) or 'none'})")
        return found[0]

    return fact("project number", services_command(env), parse, assumed=placeholder("PROJECT_NUMBER"))


def bucket_policy_fact(env: Environment):
    return fact(f"IAM policy of gs://{env.gs_bucket}",
                gcloud("storage", "buckets", "get-iam-policy", f"gs://{env.gs_bucket}", "--format=json"),
                json_object(), assumed={"bindings": []},
                describe=lambda p: f"{len(p.get('bindings', []))} binding(s)")


def principal(env: Environment, project_number: str, account: str | None = None) -> str:
    """The workload-identity principal of Kubernetes service account
    ``account`` (the tutorial's ``ksa_name`` by default) of the namespace."""
    return (f"principal://iam.googleapis.com/projects/{project_number}/locations/global/workloadIdentityPools/"
            f"{env.project_id}.svc.id.goog/subject/ns/{env.namespace}/sa/{account or env.ksa_name}")


def has_member(policy: Any, role: str, member: str) -> bool:
    return any(b.get("role") == role and member in (b.get("members") or [])
               for b in (policy or {}).get("bindings") or [])


def bucket_step(env: Environment) -> Step:
    probe = bucket_fact(env)

    def decide(look):
        b = look(probe)
        if b is ABSENT:
            return change(Command(("gsutil", "mb", "-p", env.project_id, "-c", T.BUCKET_STORAGE_CLASS,
                                   "-l", env.region, f"gs://{env.gs_bucket}")), reason="created")
        diffs = []
        loc = str(b.get("location", "")).lower()
        if loc != env.region.lower():
            diffs.append(f"location is {b.get('location')}, want {env.region.upper()}")
        cls = b.get("storageClass") or b.get("default_storage_class")
        if cls and cls.upper() != T.BUCKET_STORAGE_CLASS:
            diffs.append(f"storage class is {cls}, want {T.BUCKET_STORAGE_CLASS}")
        if diffs:
            return drift(f"bucket {env.gs_bucket}: " + "; ".join(diffs))
        return ok(f"bucket gs://{env.gs_bucket} exists")

    return Step(PLAY, f"bucket gs://{env.gs_bucket}", decide, id="storage:bucket",
                verify=Verify(probe, lambda b: "bucket not found" if b is ABSENT else None, timeout=60, interval=5))


def namespace_step(env: Environment) -> Step:
    probe = kube_get(env, "namespace", env.namespace)

    def decide(look):
        if look(probe) is ABSENT:
            return change(kube(env, "create", "namespace", env.namespace), reason="created")
        return ok(f"namespace {env.namespace} exists")

    return Step(PLAY, f"namespace {env.namespace}", decide, id="storage:namespace", after=("kube:credentials",),
                verify=Verify(probe, lambda n: "namespace not found" if n is ABSENT else None))


def ksa_step(env: Environment) -> Step:
    probe = kube_get(env, "serviceaccount", env.ksa_name, env.namespace)

    def decide(look):
        if look(probe) is ABSENT:
            return change(kube(env, "create", "serviceaccount", env.ksa_name, "--namespace", env.namespace),
                          reason="created")
        return ok(f"service account {env.namespace}/{env.ksa_name} exists")

    return Step(PLAY, f"Kubernetes service account {env.ksa_name}", decide, id="storage:ksa",
                after=("kube:credentials", "storage:namespace"),
                verify=Verify(probe, lambda s: "service account not found" if s is ABSENT else None))


def binding_step(env: Environment, account: str | None = None) -> Step:
    """The tutorial's binding of ``ksa_name``, or (``account``) the same
    command for the head's own account, after the first (both change the
    bucket's one IAM policy)."""
    number, listed = project_number_fact(env), listed_number_fact(env)
    policy = bucket_policy_fact(env)
    sa = account or env.ksa_name
    who, subject = f"{env.namespace}/{sa}", f"/subject/ns/{env.namespace}/sa/{sa}"

    def decide(look):
        # The member's number from the enabled services prereqs read; the
        # tutorial's `gcloud projects describe` only when they cannot say it,
        # and for the grant's command line (PROJECT_NUMBER, as the tutorial).
        try:
            known = look(listed)
        except ProbeFailed:
            known = look(number)
        if has_member(look(policy), T.BUCKET_ROLE, principal(env, known, sa)):
            return ok(f"{T.BUCKET_ROLE} already granted to {who}")
        return change(gcloud("storage", "buckets", "add-iam-policy-binding", f"gs://{env.gs_bucket}",
                             "--member", principal(env, look(number), sa), "--role", T.BUCKET_ROLE),
                      reason=f"granted {T.BUCKET_ROLE} to {who}")

    def granted(p):
        # The member holds the project number, which the decide step looked up
        # (cached); in a dry run nothing is verified.
        return None if any(b.get("role") == T.BUCKET_ROLE and any(m.endswith(subject) for m in b.get("members") or [])
                           for b in (p or {}).get("bindings") or []) else f"{T.BUCKET_ROLE} not granted yet"

    # The workload identity pool (<project>.svc.id.goog) comes with the
    # cluster's workload identity.
    after: tuple[str, ...] = ("storage:bucket", "cluster:cluster")
    name, sid = f"workload identity binding {T.BUCKET_ROLE}", "storage:binding"
    if account is not None:
        name, sid, after = f"{name} of the head's {account}", "storage:head-binding", (*after, "storage:binding")
    return Step(PLAY, name, decide, id=sid, after=after, verify=Verify(policy, granted, timeout=60, interval=5),
                probes=(listed,))


def steps(env: Environment) -> list[Step]:
    out = [bucket_step(env)]
    if env.namespace != "default":
        out.append(namespace_step(env))
    out += [ksa_step(env), binding_step(env)]
    if manifests.head_ksa_name(env) != env.ksa_name:
        out.append(binding_step(env, manifests.head_ksa_name(env)))
    return out
