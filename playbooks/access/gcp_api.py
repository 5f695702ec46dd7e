"""Google Cloud's REST APIs as a speed-up of the gcloud reads the probes
start most, on this machine (``core.connector.base.Shortcut``).

Each gcloud process spends about a second of CPU before it asks anything.
The local connector answers the read-only commands below through the same
REST call gcloud makes, with the token and the properties gcloud resolved
(``gcloud_credentials``: one `gcloud config config-helper` per run): the
same endpoint (an ``api_endpoint_overrides`` property, set in gcloud's
configuration or as ``CLOUDSDK_API_ENDPOINT_OVERRIDES_<API>``, or Google's),
the same CA file (``core/custom_ca_certs_file``), the same proxy variables,
the same project. It prints what gcloud prints for that command: the
resource or the list as JSON (keys sorted, two spaces, as gcloud's
``--format=json``), or ``value(projectNumber)``'s (``value(projectId)``'s)
one line.

Only a success is answered here, and one NotFound: a bucket that is not
there, which gcloud storage says in a line of its own whatever the API's
words (``ERROR: (gcloud.storage.buckets.describe) gs://B not found: 404.``,
exit 1: ``BUCKET_NOT_FOUND``; the plays' parse reads "not found: 404").
Anything else (and, for the rest of the
run, that command line: a failing API is asked once per attempt, not
twice; a NotFound only that once: what was missing may be made by the next
step), an error status, a connection that fails, a token that could not be had, a property this
module does not follow (a proxy set in gcloud's configuration, an
impersonated service account, another universe, a quota project), or a
flag the command line adds, returns None: the command runs as the gcloud
process it is, and gcloud says in its own words what went wrong (the plays'
parses and the retry policy read gcloud's words, and only those). The
project's tests compare both answers against the fakes, command by command
(tests/test_gcp_api.py; every form the dry runs' goldens hold, with the
CLOUDSDK_* variables they run with: tests/test_in_process.py). The run's log
says of each command answered here that no gcloud process ran; a dry run
marks its line (``GcloudShortcut.answers``).

Where gcloud has no account (its config-helper refused with gcloud's
words, ``GcloudCredentials.refusal``), each command below is answered with
that refusal under its own name, exit 1, as its process would say it
before any API call (``no_account``; the subnets' list also prints
``[]``): a status or an up on a machine not yet signed in starts one
gcloud for them, not one per read.

The commands answered, with exactly these flags:

- ``gcloud container clusters list --format=json --project=P``
- ``gcloud container node-pools list --cluster=C --location=L --format=json --project=P``
- ``gcloud compute networks list --format=json --project=P``
- ``gcloud compute networks subnets list --regions=R --format=json --project=P``
- ``gcloud services list --enabled --format=json --project=P``
- ``gcloud projects get-iam-policy P --format=json``
- ``gcloud projects describe P --format=value(projectNumber)`` (or
  ``value(projectId)``)
- ``gcloud storage buckets get-iam-policy gs://B --format=json``
- ``gcloud storage buckets describe gs://B --raw --format=json(K,...)``, K
  among the bucket's plain string fields (``RAW_BUCKET_KEYS``): the JSON API's
  bucket (``--raw``: gcloud's own shape is not rebuilt here), only those keys
  (gcloud's projection: a key the bucket lacks is left out; its times, which
  gcloud prints its own way even with ``--raw``, never asked)
- ``gcloud beta quotas info describe Q --service=S --project=P --format=json``
- ``gcloud container get-server-config --location=L --format=json --project=P``
- ``gcloud compute machine-types list --filter=name=M --format=json --project=P``
  (M a plain machine type name: gcloud's ``=`` is then a case-insensitive
  whole-value match, applied by gcloud to the aggregated list it reads)
- ``gcloud auth print-access-token`` (the helper's token: no API)
- ``gcloud config list --format=json`` (from the helper's properties: no API)

Set ``TPU_PLAYBOOKS_PROCESSES_ONLY=1`` to start every command as its
process (``connectors.this_machine``).
"""
from __future__ import annotations

import functools
import json
import os
import re
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from playbooks.access.gcloud_credentials import Credentials, GcloudCredentials
from playbooks.core.connector import Ran
from playbooks.core.http import NoRedirect, plain_http_refused

# gcloud's base URL of each API (its default when no override is set).
DEFAULT_BASE = {
    "compute": "https://compute.googleapis.com/compute/v1/",
    "container": "https://container.googleapis.com/",
    "serviceusage": "https://serviceusage.googleapis.com/",
    "cloudresourcemanager": "https://cloudresourcemanager.googleapis.com/",
    "storage": "https://storage.googleapis.com/storage/v1/",
    "cloudquotas": "https://cloudquotas.googleapis.com/",
}
READ_TIMEOUT = 30.0     # a read that takes longer runs again as its process
MAX_PAGES = 50          # a list longer than this many pages runs as its process
# Properties that change how gcloud makes a request in ways this module does
# not follow: with any of them set, every command runs as its process.
NOT_FOLLOWED = (("proxy", None), ("auth", "impersonate_service_account"), ("core", "universe_domain"),
                ("billing", "quota_project"), ("context_aware", None), ("auth", "authority_selector"))


# Fields of a list's answer that say it is partial (a zone or a region that
# did not answer): gcloud warns and exits 0, or exits 1 with a strict compute
# list; the plays must not read what is missing as absent. Such an answer
# runs again as its process, which says it as gcloud does.
PARTIAL = ("missingZones", "unreachable", "unreachables", "warning")


class Fallback(Exception):
    """Not answered here: the command runs as its process. ``status``: the
    API's HTTP status, if it answered one. ``lasting``: that command line is
    gcloud's for the rest of the run (not after a NotFound)."""

    def __init__(self, why: str, status: int | None = None):
        super().__init__(why)
        self.status = status

    @property
    def lasting(self) -> bool:
        return self.status != 404


def json_text(value: Any) -> str:
    """gcloud's ``--format=json``: two-space indent, keys sorted."""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _flags(argv: list[str], n_words: int) -> tuple[list[str], dict[str, str]] | None:
    """The positional words after the command's own ``n_words`` and its
    ``--k=v`` / ``--flag`` flags; None for a flag given twice."""
    words, flags = [], {}
    for a in argv[n_words:]:
        if a.startswith("--"):
            k, _, v = a[2:].partition("=")
            if k in flags:
                return None
            flags[k] = v if "=" in a else "\0"
        else:
            words.append(a)
    return words, flags


class Call:
    """One REST read: method, API, path under its base, query, body, and
    how its answer becomes gcloud's output."""

    def __init__(self, api: str, path: str, shape: Callable[[Any], str], query: dict[str, str] | None = None,
                 method: str = "GET", body: Any = None, items: str | None = None, aggregated: bool = False,
                 stderr: str = "", not_found: str | None = None, refused_stdout: str = ""):
        self.api, self.path, self.shape, self.query = api, path, shape, dict(query or {})
        self.method, self.body, self.items, self.aggregated = method, body, items, aggregated
        self.stderr = stderr  # what gcloud says on stderr when it succeeds
        self.not_found = not_found  # what it says, exiting 1, when the API answers 404 (None: its process says it)
        self.refused_stdout = refused_stdout  # what it prints on stdout when it has no account (``no_account``)


def parse(argv: list[str]) -> Call | None:
    """The REST read a command line asks for; None when it is not one of
    those answered here (with exactly its flags)."""
    if argv[:1] != ["gcloud"]:
        return None
    a = argv[1:]
    q = urllib.parse.quote

    def take(n: int, want: set[str], words: int = 0) -> tuple[list[str], dict[str, str]] | None:
        got = _flags(a, n)
        if got is None or set(got[1]) != want or len(got[0]) != words or got[1].get("format") not in (None, "json"):
            return None
        return got

    if a[:3] == ["container", "clusters", "list"] and (g := take(3, {"format", "project"})):
        return Call("container", f"v1/projects/{q(g[1]['project'])}/locations/-/clusters", json_text,
                    items="clusters")
    if a[:3] == ["container", "node-pools", "list"] and (g := take(3, {"cluster", "location", "format", "project"})):
        f = g[1]
        return Call("container", f"v1/projects/{q(f['project'])}/locations/{q(f['location'])}/clusters/"
                                 f"{q(f['cluster'])}/nodePools", json_text, items="nodePools")
    if a[:3] == ["compute", "networks", "list"] and (g := take(3, {"format", "project"})):
        return Call("compute", f"projects/{q(g[1]['project'])}/global/networks", _networks, items="items")
    if a[:4] == ["compute", "networks", "subnets", "list"] and (g := take(4, {"regions", "format", "project"})):
        f = g[1]
        if "," in f["regions"] or not f["regions"]:
            return None
        # (its lister has printed the list's opening when the credentials fail: `[]`, measured with gcloud 528)
        return Call("compute", f"projects/{q(f['project'])}/regions/{q(f['regions'])}/subnetworks", json_text,
                    items="items", refused_stdout="[]\n")
    if a[:2] == ["services", "list"] and (g := take(2, {"enabled", "format", "project"})) and \
            g[1]["enabled"] == "\0":
        return Call("serviceusage", f"v1/projects/{q(g[1]['project'])}/services", json_text,
                    query={"filter": "state:ENABLED"}, items="services")
    if a[:2] == ["projects", "get-iam-policy"] and (g := take(2, {"format"}, words=1)):
        return Call("cloudresourcemanager", f"v1/projects/{q(g[0][0])}:getIamPolicy", json_text, method="POST",
                    body={"options": {"requestedPolicyVersion": 3}})
    if a[:2] == ["projects", "describe"] and a[2:3] and len(a) == 4 and not a[2].startswith("-") and \
            (field := PROJECT_VALUES.get(a[3])):
        return Call("cloudresourcemanager", f"v1/projects/{q(a[2])}", functools.partial(_project_value, field))
    if a[:2] == ["storage", "buckets"]:
        return _bucket_call(a)
    if a[:4] == ["beta", "quotas", "info", "describe"] and (g := take(4, {"service", "project", "format"}, words=1)):
        f = g[1]
        return Call("cloudquotas", f"v1beta/projects/{q(f['project'])}/locations/global/services/"
                                   f"{q(f['service'])}/quotaInfos/{q(g[0][0])}", json_text)
    if a[:2] == ["container", "get-server-config"] and (g := take(2, {"location", "format", "project"})):
        f = g[1]
        return Call("container", f"v1/projects/{q(f['project'])}/locations/{q(f['location'])}/serverConfig",
                    json_text, stderr=f"Fetching server config for {f['location']}\n")
    if a[:3] == ["compute", "machine-types", "list"] and (g := take(3, {"filter", "format", "project"})) and \
            re.fullmatch(r"name=[a-z0-9][a-z0-9-]*", g[1]["filter"]):
        name = g[1]["filter"][len("name="):]
        return Call("compute", f"projects/{q(g[1]['project'])}/aggregated/machineTypes",
                    lambda items: json_text([m for m in items if str(m.get("name", "")).lower() == name]),
                    query={"includeAllScopes": "True", "maxResults": "500", "returnPartialSuccess": "True"},
                    items="machineTypes", aggregated=True)
    return None


def _bucket_call(a: list[str]) -> Call | None:
    """`gcloud storage buckets get-iam-policy gs://B --format=json` and
    `gcloud storage buckets describe gs://B --raw --format=json(K,...)`."""
    got = _flags(a, 3)
    name = got[0][0][5:].rstrip("/") if got is not None and len(got[0]) == 1 else ""
    if got is None or not got[0][0].startswith("gs://") or not name or "/" in name:
        return None
    bucket, flags = urllib.parse.quote(name), got[1]
    missing = BUCKET_NOT_FOUND.format(verb=a[2], url=f"gs://{name}")
    if a[2] == "get-iam-policy" and flags == {"format": "json"}:
        return Call("storage", f"b/{bucket}/iam", json_text, query={"optionsRequestedPolicyVersion": "3"},
                    not_found=missing)
    if a[2] == "describe" and set(flags) == {"format", "raw"} and flags["raw"] == "\0" and \
            (keys := _projection(flags["format"], RAW_BUCKET_KEYS)):
        return Call("storage", f"b/{bucket}",
                    lambda doc: json_text({k: doc[k] for k in keys if isinstance(doc, dict) and k in doc}),
                    query={"projection": "full"}, not_found=missing)
    return None


# gcloud storage's words for a bucket the API answers 404 for (its
# NotFoundError, whatever the API's message), on stderr, exit 1: measured
# with gcloud 528 for both commands.
BUCKET_NOT_FOUND = "ERROR: (gcloud.storage.buckets.{verb}) {url} not found: 404.\n"


# The bucket's fields a `--raw` describe may project here: plain strings,
# printed by gcloud as the API gives them.
RAW_BUCKET_KEYS = frozenset({"name", "location", "locationType", "storageClass"})


def _projection(fmt: str, allowed: frozenset[str]) -> tuple[str, ...] | None:
    """The keys of ``json(K1,K2,...)`` when every one is ``allowed``."""
    m = re.fullmatch(r"json\(([A-Za-z]+(?:,[A-Za-z]+)*)\)", fmt)
    keys = tuple(m.group(1).split(",")) if m else ()
    return keys if keys and set(keys) <= allowed else None


# The last word of each command answered here (its name: gcloud.GROUP...VERB).
VERBS = ("list", "describe", "get-iam-policy", "get-server-config")


def no_account(argv: list[str], helper_said: str) -> str:
    """What gcloud prints for ``argv`` when it has no account: the
    helper's refusal (``GcloudCredentials.refusal``) under this command's
    name, as every command says it (measured with gcloud 528 for each
    command answered here)."""
    words = []
    for a in argv[1:]:
        words.append(a)
        if a in VERBS:
            break
    return helper_said.replace("(gcloud.config.config-helper)", f"(gcloud.{'.'.join(words)})", 1)


def _networks(items: Any) -> str:
    """`gcloud compute networks list` adds two columns of its own to each
    network (its networks_utils.AddModesForListFormat): the subnet mode
    (LEGACY with an IPv4Range, AUTO, CUSTOM) and the BGP routing mode."""
    out = []
    for n in items:
        mode = "LEGACY" if n.get("IPv4Range") is not None else "AUTO" if n.get("autoCreateSubnetworks") else "CUSTOM"
        extra = {"x_gcloud_subnet_mode": mode}
        routing = (n.get("routingConfig") or {}).get("routingMode")
        if routing is not None:
            extra["x_gcloud_bgp_routing_mode"] = routing
        out.append({**n, **extra})
    return json_text(out)


# `gcloud projects describe P --format=value(K)`: the fields answered here
# (the storage play's number, the doctor's id), printed as the one line
# gcloud prints.
PROJECT_VALUES = {"--format=value(projectNumber)": "projectNumber", "--format=value(projectId)": "projectId"}


def _project_value(field: str, doc: Any) -> str:
    value = doc.get(field) if isinstance(doc, dict) else None
    if not value or not isinstance(value, str | int):
        raise Fallback(f"no {field}")
    return f"{value}\n"


def _no_proxy(host: str, env: Mapping[str, str]) -> bool:
    """``no_proxy``'s rule as curl and gcloud read it: a host, a domain
    suffix, or ``*``."""
    for entry in (env.get("no_proxy") or env.get("NO_PROXY") or "").split(","):
        entry = entry.strip().lstrip(".")
        if entry == "*" or (entry and (host == entry or host.endswith("." + entry))):
            return True
    return False


class GcloudShortcut:
    """``base.Shortcut`` for the gcloud reads above."""

    name = "Google Cloud REST API"

    def __init__(self, credentials: GcloudCredentials):
        self.credentials = credentials
        # Command lines whose read was not a success once: from then on, in
        # this run, their gcloud process answers (a failing API is asked
        # once per attempt, not twice; its retries are gcloud's words).
        self.left_to_gcloud: set[tuple[str, ...]] = set()

    def run(self, argv: list[str], env: dict[str, str], timeout: float | None) -> Ran | None:
        if argv[:1] != ["gcloud"]:
            return None
        start = time.monotonic()
        local = FROM_HELPER.get(tuple(argv[1:]))
        call = None if local else parse(argv)
        if (call is None and not local) or tuple(argv) in self.left_to_gcloud:
            return None
        cred = self.credentials.get(env)
        if cred is None:
            refused = self.credentials.refusal(env)
            if refused is None or call is None:
                return None
            return Ran(1, call.refused_stdout, no_account(argv, refused), time.monotonic() - start)
        if any(cred.prop(s, n) if n else cred.properties.get(s) for s, n in NOT_FOLLOWED):
            return None
        if local:
            return Ran(0, local(cred), "", time.monotonic() - start)
        assert call is not None
        try:
            out = call.shape(self._read_renewing(call, cred, env, min(timeout or READ_TIMEOUT, READ_TIMEOUT)))
        except Fallback as e:
            if e.status == 404 and call.not_found is not None:
                return Ran(1, "", call.not_found, time.monotonic() - start)
            if e.lasting:
                self.left_to_gcloud.add(tuple(argv))
            return None
        return Ran(0, out, call.stderr, time.monotonic() - start)

    def stream(self, argv: list[str], env: dict[str, str], on_line: Callable[[str], None]) -> Ran | None:
        return None

    def answers(self, argv: list[str], env: dict[str, str], streamed: bool) -> str | None:
        """The command lines above (``parse``, ``FROM_HELPER``), none
        streamed. Said from the line alone: in a run such a line still runs
        as its gcloud process where the REST call fails (a bucket's NotFound
        aside), or gcloud has a property not followed here."""
        if streamed or argv[:1] != ["gcloud"] or (tuple(argv[1:]) not in FROM_HELPER and parse(argv) is None):
            return None
        return "Google Cloud REST API, a gcloud process only if it fails"

    def _read_renewing(self, call: Call, cred: Credentials, env: Mapping[str, str], timeout: float) -> Any:
        """The read; where the API refused the token (401), once more with a
        renewed one (``GcloudCredentials.renew``); no new token: the 401
        stands (the command runs as its process)."""
        try:
            return self._read(call, cred, env, timeout)
        except Fallback as e:
            if e.status != 401:
                raise
            fresh = self.credentials.renew(env, cred.token)
            if fresh is None:
                raise
        return self._read(call, fresh, env, timeout)

    def _read(self, call: Call, cred: Credentials, env: Mapping[str, str], timeout: float) -> Any:
        """The call's answer; a list's pages joined under ``call.items``."""
        base = str(cred.prop("api_endpoint_overrides", call.api) or DEFAULT_BASE[call.api])
        url = base.rstrip("/") + "/" + call.path
        if call.items is None:
            return self._request(call, url, call.query, cred, env, timeout)
        items: list[Any] = []
        query = dict(call.query)
        for _ in range(MAX_PAGES):
            doc = self._request(call, url, query, cred, env, timeout)
            if not isinstance(doc, dict):
                raise Fallback("not an object")
            if any(doc.get(k) for k in PARTIAL):
                raise Fallback("a partial answer")
            items.extend(_scoped(doc, call.items) if call.aggregated else doc.get(call.items) or [])
            token = doc.get("nextPageToken")
            if not token:
                return items
            query["pageToken"] = str(token)
        raise Fallback("too many pages")

    @staticmethod
    def _request(call: Call, url: str, query: dict[str, str], cred: Credentials, env: Mapping[str, str],
                 timeout: float) -> Any:
        parts = urllib.parse.urlsplit(url)
        if (why := plain_http_refused(url)) is not None:
            raise Fallback(why)
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = json.dumps(call.body).encode() if call.body is not None else None
        req = urllib.request.Request(url, data=data, method=call.method)
        req.add_unredirected_header("Authorization", f"Bearer {cred.token}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        ca = cred.prop("core", "custom_ca_certs_file")
        context = _tls_context(str(ca) if ca else None)
        proxy = env.get("https_proxy") or env.get("HTTPS_PROXY")
        proxies = {} if not proxy or _no_proxy(parts.hostname or "", env) else {"https": proxy}
        opener = urllib.request.build_opener(urllib.request.ProxyHandler(proxies),
                                             urllib.request.HTTPSHandler(context=context), NoRedirect())
        try:
            with opener.open(req, timeout=timeout) as r:
                body = r.read()
        except urllib.error.HTTPError as e:  # any status not 2xx
            raise Fallback(str(e), status=e.code) from e
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise Fallback(str(e)) from e
        try:
            return json.loads(body)
        except ValueError as e:
            raise Fallback("not JSON") from e


@functools.lru_cache(maxsize=4)
def _tls_context(cafile: str | None) -> ssl.SSLContext:
    """One TLS context per CA bundle for the run: each made anew loads the
    bundle again (22 ms here, on every request of every page)."""
    return ssl.create_default_context(cafile=cafile) if cafile else ssl.create_default_context()


def _scoped(doc: dict, key: str) -> list[Any]:
    """An aggregated list's items, scope by scope in the order given; a
    scope's warning other than "nothing here" makes the answer partial."""
    scopes = doc.get("items") or {}
    if not isinstance(scopes, dict):
        raise Fallback("not an aggregated list")
    out: list[Any] = []
    for scope in scopes.values():
        if not isinstance(scope, dict):
            raise Fallback("not an aggregated list")
        if (scope.get("warning") or {}).get("code") not in (None, "NO_RESULTS_ON_PAGE"):
            raise Fallback("a partial answer")
        out.extend(scope.get(key) or [])
    return out


# The commands answered from the config-helper's answer alone (no API).
FROM_HELPER: dict[tuple[str, ...], Callable[[Any], str]] = {
    ("config", "list", "--format=json"): lambda cred: json_text(cred.properties),
    ("auth", "print-access-token"): lambda cred: cred.token + "\n",
}


def processes_only(environ: Mapping[str, str] | None = None) -> bool:
    """``TPU_PLAYBOOKS_PROCESSES_ONLY=1``: no in-process answers at all."""
    return (os.environ if environ is None else environ).get("TPU_PLAYBOOKS_PROCESSES_ONLY") == "1"
