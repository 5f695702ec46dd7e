"""How the command-line clients (gcloud, gsutil, kubectl, ray) are called,
and how their output is read: a proven NotFound, a value, or "could not look".
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from playbooks.core.command import Command
from playbooks.core.errors import ProbeFailed
from playbooks.core.facts import ABSENT, Completed, Fact

# -- transient or not: from what each client really prints ---------------------
# The HTTP status of a failed call, as each client shows it:
_STATUS_FORMS = (
    re.compile(r"\bcode=(\d{3})\b"),                      # gcloud container: "ResponseError: code=503, ..."
    re.compile(r"'status': '?(\d{3})'?"),                  # apitools' HttpError (services, projects)
    re.compile(r"\bHTTP ?Error (\d{3})\b", re.I),          # "HTTPError 503: ..."
    re.compile(r"\b[A-Z]\w*Exception: (\d{3})\b"),          # gsutil: "ServiceException: 503 ..."
    # gcloud compute prints only the server's message, but with
    # core/verbosity=debug it logs every request's status line.
    re.compile(r'^DEBUG: https?://\S+ "[A-Z]+ [^"]*" (\d{3}) ', re.M),
)
# gcloud storage (and other gRPC-style errors) print the status's name.
_STATUS_NAMES = {"RESOURCE_EXHAUSTED": 429, "UNAVAILABLE": 503, "INTERNAL": 500, "DEADLINE_EXCEEDED": 504,
                 "PERMISSION_DENIED": 403, "UNAUTHENTICATED": 401, "INVALID_ARGUMENT": 400, "NOT_FOUND": 404,
                 "ALREADY_EXISTS": 409, "FAILED_PRECONDITION": 400, "ABORTED": 409, "OUT_OF_RANGE": 400,
                 "UNIMPLEMENTED": 501, "CANCELLED": 499}
_STATUS_NAME = re.compile(r"\) (" + "|".join(_STATUS_NAMES) + r"): ")
# kubectl names the reason: "Error from server (ServiceUnavailable): ...".
_KUBE_REASONS = {"TooManyRequests": 429, "ServiceUnavailable": 503, "InternalError": 500, "Timeout": 504,
                 "Forbidden": 403, "Unauthorized": 401, "NotFound": 404, "BadRequest": 400, "Conflict": 409,
                 "Invalid": 422, "AlreadyExists": 409, "MethodNotAllowed": 405, "Gone": 410}
_KUBE_REASON = re.compile(r"Error from server \((\w+)\)")

TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})

# Rate quotas are transient whatever their status (compute answers some with
# 403 rateLimitExceeded, which Google's docs say to retry with backoff).
_RATE_LIMITED = re.compile(r"(rateLimitExceeded|Rate Limit Exceeded|RATE_LIMIT_EXCEEDED|"
                           r"Quota exceeded for quota metric .* per (minute|100 seconds|second))", re.I)
# GKE runs one cluster-level operation, or one per node pool, at a time, and
# its own (upgrades, repairs: right after a cluster is made) count. Another
# one running is said in three forms (GKE's concurrent-operations
# troubleshooting page), each a 400 FAILED_PRECONDITION that means "wait":
#   Cluster is running incompatible operation OPERATION
#   Operation OPERATION is currently ACTIONING cluster CLUSTER. Please wait and try again once it is done
#   Cluster is currently being created, deleted, updated or repaired and cannot be updated
# and past five at once as a 429 (`Too many operations: cluster "X" hits the
# concurrent operations quota 5`, transient anyway). Retried only by commands
# given patience for it: every cluster and node pool change
# (gke.container_change).
_OPERATION_RUNNING = re.compile(r"(is running incompatible operation|incompatible operation|"
                                r"Operation \S+ is currently \w+ cluster|operation .* is currently running|"
                                r"Please wait and try again|"
                                r"is currently being created, deleted, updated or repaired|"
                                r"Too many operations)", re.I)
# Two read-modify-writes of one IAM policy at once (two runs granting roles
# together): the second setIamPolicy is a 409 ABORTED, whose message says to
# do the whole read-modify-write again, which is what running
# `add-iam-policy-binding` again does (it reads the policy afresh). Worth
# another try, whatever its status.
_CONCURRENT_POLICY = re.compile(r"There were concurrent policy changes")
# No status at all: the request never got an answer.
_NO_ANSWER = re.compile(r"(Connection reset by peer|Connection aborted|RemoteDisconnected|timed out|"
                        r"TLS handshake timeout|i/o timeout|the server is currently unable to handle the request|"
                        r"Unable to connect to the server)", re.I)


# gcloud keeps its configuration and credentials in SQLite files of its
# config folder; gcloud commands running at once (parallel steps, prefetched
# probes) can find one locked, and gcloud then crashes before or after its
# request: "ERROR: gcloud crashed (OperationalError): database is locked"
# (exit 1; Google's scripting page: parallel gcloud commands are "not
# supported"). Local contention that passes: worth another try. A change is
# tried again only after a fresh look shows it was not made (Runner.act).
_GCLOUD_DB_LOCKED = re.compile(r"gcloud crashed \(OperationalError\): database is locked")


# kubectl's own wait ran out (`kubectl delete --timeout`, `kubectl wait`):
# the server answered; what it waited for did not come. Trying again waits
# for the same thing again (a pod Terminating on a dead node: pod_delete).
_WAIT_TIMED_OUT = re.compile(r"^error: timed out waiting for the condition", re.M)


def http_status(c: Completed) -> int | None:
    """The HTTP status of the call that failed, from the client's output:
    the last error status it shows (4xx/5xx), if it shows one."""
    text = c.stderr + "\n" + c.stdout
    found: list[int] = []
    for form in _STATUS_FORMS:
        found += [int(m) for m in form.findall(text)]
    found += [_STATUS_NAMES[m] for m in _STATUS_NAME.findall(text)]
    found += [_KUBE_REASONS[m] for m in _KUBE_REASON.findall(text) if m in _KUBE_REASONS]
    errors = [code for code in found if code >= 400]
    return errors[-1] if errors else None


def is_transient(c: Completed, patient: bool = False) -> bool:
    """Worth another try: turned away (429, 5xx, a rate quota), or never
    answered. A status that says the request itself is wrong or denied
    (400, 401, 403, 404, 409) is never retried."""
    if c.rc in (0, 2, 127):  # success; gcloud's parse error; no such program
        return False
    text = c.stderr + "\n" + c.stdout
    if _WAIT_TIMED_OUT.search(text):
        return False
    if _RATE_LIMITED.search(text) or _GCLOUD_DB_LOCKED.search(text) or _CONCURRENT_POLICY.search(text):
        return True
    if patient and _OPERATION_RUNNING.search(text):
        return True
    status = http_status(c)
    if status is not None:
        return status in TRANSIENT_STATUS
    return bool(_NO_ANSWER.search(text))


# What each client prints when a create finds what it makes already there
# (409 alreadyExists): gcloud compute (its status only in the debug log, left
# out of what is shown) "The resource 'projects/p/global/networks/n' already
# exists"; gcloud container "ResponseError: code=409, message=Already exists:
# projects/..."; gsutil mb "ServiceException: 409 A Cloud Storage bucket named
# 'b' already exists" or "409 Your previous request to create the named bucket
# succeeded and you already own it."; gcloud storage "ALREADY_EXISTS"; kubectl
# create "Error from server (AlreadyExists): ... already exists".
_ALREADY_EXISTS = re.compile(r"(already exists|you already own it|\bAlreadyExists\b|\bALREADY_EXISTS\b)", re.I)


def already_exists(c: Completed) -> bool:
    """A change refused because what it makes is there already (another run
    made it meanwhile): the step looks again and decides again
    (RetryPolicy.already_exists). A status other than 409, where the client
    shows one, is something else (a 400 whose text says "exists")."""
    if c.rc in (0, 2, 127):
        return False
    status = http_status(c)
    return status in (None, 409) and bool(_ALREADY_EXISTS.search(c.stderr + "\n" + c.stdout))


# gcloud compute hides the HTTP status of a failed call (see _STATUS_FORMS):
# its commands run with debug verbosity, which logs it; what is shown of
# their output is the error without the debug log.
COMPUTE_DEBUG = (("CLOUDSDK_CORE_VERBOSITY", "debug"),)
_DEBUG_LINE = re.compile(r"^(DEBUG|INFO): ")


def without_debug_log(text: str) -> str:
    """gcloud's stderr without its debug log: from its "ERROR:" line on
    when there is one, else its other lines (warnings, "Created [...]")."""
    lines = text.splitlines()
    errors = [i for i, line in enumerate(lines) if line.startswith("ERROR: ")]
    if errors:
        return "\n".join(lines[errors[-1]:])
    out, in_record = [], False
    for line in lines:
        if _DEBUG_LINE.match(line):
            in_record = True
            continue
        if in_record and (line.startswith((" ", "\t", ")")) or not line.strip()):
            continue  # a debug record's continuation lines
        in_record = False
        out.append(line)
    return "\n".join(out)


def gcloud(*args: str, project: str | None = None, quiet: bool = False) -> Command:
    argv = ["gcloud", *args]
    if project:
        argv.append(f"--project={project}")
    if quiet:
        argv.append("--quiet")
    if args and args[0] == "compute":
        return Command(tuple(argv), env=COMPUTE_DEBUG, stderr_filter=without_debug_log)
    return Command(tuple(argv))


def kubectl(*args: str, context: str | None = None) -> Command:
    """kubectl with its context named; before a ``--`` (`kubectl exec POD
    -- CMD`), after which every argument is the command's."""
    argv = ["kubectl", *args]
    if context:
        at = argv.index("--") if "--" in argv else len(argv)
        argv.insert(at, f"--context={context}")
    return Command(tuple(argv))


def _fail(c: Completed, what: str) -> ProbeFailed:
    return ProbeFailed(what, c.line, c.rc, c.stdout, c.stderr,
                       why=f"could not look (exit code {c.rc}): {c.first_error_line() or 'no message'}")


# A gcloud list that lost some of its requests but exited 0: what it printed
# is not the whole list. Compute regional lists (see gke.STRICT_COMPUTE_LISTS);
# `container clusters list` when GKE answers with missingZones.
_PARTIAL = re.compile(r"^WARNING: (Some requests did not succeed|The following zones did not respond)", re.M)


def _json(c: Completed, what: str, empty: str = "") -> Any:
    """A successful command's output as JSON, or "could not look"."""
    try:
        return json.loads(c.stdout or empty)
    except json.JSONDecodeError:
        raise ProbeFailed(what, c.line, c.rc, c.stdout, c.stderr, why="output is not JSON") from None


def json_list(select: Callable[[list], Any] | None = None, what: str = "probe") -> Callable[[Completed], Any]:
    """A successful list is proof: what it does not hold does not exist."""

    def parse(c: Completed) -> Any:
        if not c.ok or _PARTIAL.search(c.stderr):
            raise _fail(c, what)
        items = _json(c, what, empty="[]")
        if isinstance(items, dict):
            items = items.get("items", [items])
        return select(items) if select else items

    return parse


def by_name(name: str, key: str = "name") -> Callable[[list], Any]:
    def select(items: list) -> Any:
        for it in items:
            if it.get(key) == name or str(it.get(key, "")).rsplit("/", 1)[-1] == name:
                return it
        return ABSENT
    return select


def json_object(what: str = "probe") -> Callable[[Completed], Any]:
    def parse(c: Completed) -> Any:
        if not c.ok:
            raise _fail(c, what)
        return _json(c, what)
    return parse


def kube_object(what: str = "probe") -> Callable[[Completed], Any]:
    """``kubectl get ... --ignore-not-found -o json``: empty output on success
    is the API server's own NotFound."""

    def parse(c: Completed) -> Any:
        if not c.ok:
            raise _fail(c, what)
        if not c.stdout.strip():
            return ABSENT
        return _json(c, what)
    return parse


def kube_list(select: Callable[[Any], Any], what: str = "probe") -> Callable[[Completed], Any]:
    """``kubectl get a/x b/y --ignore-not-found -o json``: a List of what
    exists (empty output: none of them); ``select`` picks one."""
    parse_one = kube_object(what)

    def parse(c: Completed) -> Any:
        got = parse_one(c)
        if got is ABSENT:
            got = {"items": []}
        elif "items" not in got:  # one object found: kubectl prints it alone
            got = {"items": [got]}
        return select(got)
    return parse


_GCS_NOT_FOUND = re.compile(r"(not found: 404|HTTPError 404|404.*(bucket|does not exist|Not Found)|NotFoundException)",
                            re.I)


def gcs_describe(what: str = "probe") -> Callable[[Completed], Any]:
    """``gcloud storage buckets describe``: a 404 is a proven absence, any
    other failure (401, 403, network) is not."""

    def parse(c: Completed) -> Any:
        if c.ok:
            return _json(c, what)
        err = c.stderr + c.stdout
        if _GCS_NOT_FOUND.search(err) and not re.search(r"\b(401|403)\b", err):
            return ABSENT
        raise _fail(c, what)
    return parse


def compute_describe(what: str = "probe") -> Callable[[Completed], Any]:
    """``gcloud compute ... describe``: it prints only the server's message,
    but its debug log (COMPUTE_DEBUG) has the status; a 404 is a proven
    absence, any other failure is not."""

    def parse(c: Completed) -> Any:
        if c.ok:
            return _json(c, what)
        if http_status(c) == 404:
            return ABSENT
        raise _fail(c, what)
    return parse


def text_value(what: str = "probe") -> Callable[[Completed], Any]:
    def parse(c: Completed) -> Any:
        if not c.ok:
            raise _fail(c, what)
        v = c.stdout.strip()
        if not v:
            raise ProbeFailed(what, c.line, c.rc, c.stdout, c.stderr, why="empty answer")
        return v
    return parse


# gcloud's own words when it has no account (any command, before any API call).
NO_ACCOUNT_WORDS = "do not currently have an active account"


def fact(name: str, command: Command, parse: Callable[[Completed], Any], assumed: Any = ABSENT,
         describe: Callable[[Any], str] | None = None) -> Fact:
    return Fact(name=name, command=command, parse=parse, assumed=assumed, describe=describe)
