"""§1 Project prerequisites: the APIs (the tutorial's, and the Cloud Billing API where a price is
read from its catalog) and the three IAM roles of user_identifier (a user, or a service account)."""
from __future__ import annotations

from typing import Any

from playbooks.access.cli_clients import fact, gcloud, json_list, json_object
from playbooks.cloud import prices
from playbooks.cloud.gke import services_command
from playbooks.config import tutorial as T
from playbooks.config.schema import Environment
from playbooks.core.step import Step, Verify, change, ok

PLAY = "prereqs"


def _enabled_services(items: list) -> set[str]:
    out = set()
    for s in items:
        name = (s.get("config") or {}).get("name") or str(s.get("name", "")).rsplit("/", 1)[-1]
        if s.get("state", "ENABLED") == "ENABLED":
            out.add(name)
    return out


def services(env: Environment) -> tuple[str, ...]:
    """The tutorial's APIs, and the Cloud Billing API where a price is read
    from its catalog (an option, or the CPU pool, the inventory's ``prices:``
    does not price)."""
    return T.SERVICES + ((prices.API,) if prices.needs_catalog(env, cpu=True) else ())


def services_fact(env: Environment):
    return fact("enabled services",
                services_command(env),
                json_list(_enabled_services), assumed=set(),
                describe=lambda s: "enabled: " + (", ".join(x for x in services(env) if x in s)
                                                  or "none of the needed"))


def policy_fact(env: Environment):
    return fact(f"IAM policy of {env.project_id}",
                gcloud("projects", "get-iam-policy", env.project_id, "--format=json"),
                json_object(), assumed={"bindings": []},
                describe=lambda p: f"{len(p.get('bindings', []))} binding(s)")


# Google's domain for service accounts: NAME@PROJECT.iam.gserviceaccount.com,
# PROJECT_NUMBER-compute@developer.gserviceaccount.com (Compute Engine's
# default), PROJECT@appspot.gserviceaccount.com (App Engine's), Google's
# service agents (...@gcp-sa-*.iam.gserviceaccount.com, ...@cloudservices...).
SERVICE_ACCOUNT_DOMAIN = "gserviceaccount.com"


def iam_member(identifier: str) -> str:
    """The IAM member that `user_identifier` names: `serviceAccount:` for a
    service account's email (IAM takes one only as serviceAccount:), else
    `user:` as in the tutorial. Every place that builds the member calls
    this."""
    domain = identifier.rsplit("@", 1)[-1].lower()
    if domain == SERVICE_ACCOUNT_DOMAIN or domain.endswith("." + SERVICE_ACCOUNT_DOMAIN):
        return f"serviceAccount:{identifier}"
    return f"user:{identifier}"


def has_binding(policy: Any, role: str, member: str) -> bool:
    for b in (policy or {}).get("bindings", []):
        if b.get("role") == role and member in b.get("members", []) and not b.get("condition"):
            return True
    return False


def steps(env: Environment) -> list[Step]:
    out: list[Step] = []
    svc = services_fact(env)

    apis = services(env)

    def decide_services(look):
        enabled = look(svc)
        missing = [s for s in apis if s not in enabled]
        if not missing:
            return ok("already enabled")
        return change(gcloud("services", "enable", *apis, project=env.project_id),
                      reason="enabled " + ", ".join(missing))

    out.append(Step(PLAY, "APIs " + " ".join(apis), decide_services,
                    verify=Verify(svc, lambda e: None if set(apis) <= e else
                                  "not enabled yet: " + ", ".join(sorted(set(apis) - e)),
                                  timeout=120, interval=10),
                    id="prereqs:apis"))
    pol = policy_fact(env)
    member = iam_member(env.user_identifier)
    previous: tuple[str, ...] = ()
    for role in T.USER_ROLES:
        def decide(look, role=role):
            if has_binding(look(pol), role, member):
                return ok(f"{member} already has {role}")
            return change(gcloud("projects", "add-iam-policy-binding", env.project_id,
                                 f"--member={member}", f"--role={role}"),
                          reason=f"granted {role}")

        def granted(p, role: str = role) -> str | None:
            return None if has_binding(p, role, member) else f"{member} lacks {role}"

        out.append(Step(PLAY, f"role {role}", decide,
                        verify=Verify(pol, granted, timeout=60, interval=5),
                        id=f"prereqs:{role}", after=previous))
        # One at a time: each binding rewrites the project's IAM policy
        # (read, modify, write with an etag), so two at once would race.
        previous = (f"prereqs:{role}",)
    return out
