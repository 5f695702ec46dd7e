"""How the command-line clients (gcloud, gsutil, kubectl, ray) are called,
and how their output is read: a proven NotFound, a value, or "could not look".
"""
from __future__ import annotations

import json
import re
from typing import Any, Callable

from .core.command import Command
from .core.errors import ProbeFailed
from .core.runner import ABSENT, Completed, Fact

# Errors worth another try: the request was turned away, not acted on.
_TRANSIENT = re.compile(
    r"(HTTPError 429|HTTPError 503|HTTPError 502|code=429|code=503|code=502|"
    r"\b429\b.*(Too Many Requests|rate)|\b503\b.*(Service Unavailable|unavailable)|"
    r"rateLimitExceeded|Rate Limit Exceeded|RATE_LIMIT_EXCEEDED|backendError|"
    r"currently unable to handle the request|ServiceUnavailable|"
    r"incompatible operation|operation .* is currently running|Please wait and try again|"
    # gcloud compute and gcloud storage print only the server's message, no
    # status code: a 503's "The service is currently unavailable." and a 429
    # rate quota's "Quota exceeded for quota metric 'X' and limit 'X per minute'".
    r"The service is currently unavailable|Quota exceeded for quota metric .* per (minute|100 seconds|second))",
    re.IGNORECASE,
)


def is_transient(c: Completed) -> bool:
    return c.rc not in (0, 2, 127) and bool(_TRANSIENT.search(c.stderr + "\n" + c.stdout))


def gcloud(*args: str, project: str | None = None, quiet: bool = False) -> Command:
    argv = ["gcloud", *args]
    if project:
        argv.append(f"--project={project}")
    if quiet:
        argv.append("--quiet")
    return Command(tuple(argv))


def kubectl(*args: str, context: str | None = None) -> Command:
    argv = ["kubectl", *args]
    if context:
        argv.append(f"--context={context}")
    return Command(tuple(argv))


def _fail(c: Completed, what: str) -> ProbeFailed:
    return ProbeFailed(what, c.line, c.rc, c.stdout, c.stderr,
                       why=f"could not look (exit code {c.rc}): {c.first_error_line() or 'no message'}")


# A gcloud list that lost some of its requests but exited 0: what it printed
# is not the whole list. Compute regional lists (see gke.STRICT_COMPUTE_LISTS);
# `container clusters list` when GKE answers with missingZones.
_PARTIAL = re.compile(r"^WARNING: (Some requests did not succeed|The following zones did not respond)", re.M)


def json_list(select: Callable[[list], Any] | None = None, what: str = "probe") -> Callable[[Completed], Any]:
    """A successful list is proof: what it does not hold does not exist."""

    def parse(c: Completed) -> Any:
        if not c.ok or _PARTIAL.search(c.stderr):
            raise _fail(c, what)
        try:
            items = json.loads(c.stdout or "[]")
        except json.JSONDecodeError:
            raise ProbeFailed(what, c.line, c.rc, c.stdout, c.stderr, why="output is not JSON") from None
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
        try:
            return json.loads(c.stdout)
        except json.JSONDecodeError:
            raise ProbeFailed(what, c.line, c.rc, c.stdout, c.stderr, why="output is not JSON") from None
    return parse


def kube_object(what: str = "probe") -> Callable[[Completed], Any]:
    """``kubectl get ... --ignore-not-found -o json``: empty output on success
    is the API server's own NotFound."""

    def parse(c: Completed) -> Any:
        if not c.ok:
            raise _fail(c, what)
        if not c.stdout.strip():
            return ABSENT
        try:
            return json.loads(c.stdout)
        except json.JSONDecodeError:
            raise ProbeFailed(what, c.line, c.rc, c.stdout, c.stderr, why="output is not JSON") from None
    return parse


_GCS_NOT_FOUND = re.compile(r"(not found: 404|HTTPError 404|404.*(bucket|does not exist|Not Found)|NotFoundException)", re.I)


def gcs_describe(what: str = "probe") -> Callable[[Completed], Any]:
    """``gcloud storage buckets describe``: a 404 is a proven absence, any
    other failure (401, 403, network) is not."""

    def parse(c: Completed) -> Any:
        if c.ok:
            try:
                return json.loads(c.stdout)
            except json.JSONDecodeError:
                raise ProbeFailed(what, c.line, c.rc, c.stdout, c.stderr, why="output is not JSON") from None
        err = c.stderr + c.stdout
        if _GCS_NOT_FOUND.search(err) and not re.search(r"\b(401|403)\b", err):
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


def fact(name: str, command: Command, parse: Callable[[Completed], Any], assumed: Any = ABSENT,
         describe: Callable[[Any], str] | None = None) -> Fact:
    return Fact(name=name, command=command, parse=parse, assumed=assumed, describe=describe)
