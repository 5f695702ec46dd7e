"""Google's REST APIs answering the gcloud reads the probes start most
(``playbooks/access/gcp_api.py``), and the one gcloud credential a run
shares (``gcloud_credentials.py``).

Each command answered, once through the real gcloud and once through the
shortcut, on the same state of the fakes (tests/fakes/gcp.py): the same
output. An answer that is not a success (an error status, a partial list,
a server that does not answer) is not answered: the command runs as its
process and gcloud says it. With no account, each is refused in gcloud's
own words, as its process refuses it. Then whole runs: a converged `up` and a
`status` start at most two thirds of the client processes they started
before (18 and 13), with the same rows as a run that starts every command as
its process."""
from __future__ import annotations

import contextlib
import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from playbooks.access.cli_clients import NO_ACCOUNT_WORDS
from playbooks.access.gcloud_credentials import GcloudCredentials, TokenCache, cache_key, parse_helper
from playbooks.access.gcp_api import GcloudShortcut, parse
from tests.fakes.cloud import PROJECT, TOKEN, Cloud
from tests.fakes.gcp import HttpError, unauthenticated

P = f"--project={PROJECT}"
BUCKET = f"gs://{PROJECT}-ckpt"
ANSWERED = [
    ["gcloud", "container", "clusters", "list", "--format=json", P],
    ["gcloud", "container", "node-pools", "list", "--cluster=maxtext-multislice", "--location=us-east5-b",
     "--format=json", P],
    ["gcloud", "compute", "networks", "list", "--format=json", P],
    ["gcloud", "compute", "networks", "subnets", "list", "--regions=us-east5", "--format=json", P],
    ["gcloud", "services", "list", "--enabled", "--format=json", P],
    ["gcloud", "projects", "get-iam-policy", PROJECT, "--format=json"],
    ["gcloud", "projects", "describe", PROJECT, "--format=value(projectNumber)"],
    ["gcloud", "projects", "describe", PROJECT, "--format=value(projectId)"],
    ["gcloud", "storage", "buckets", "get-iam-policy", BUCKET, "--format=json"],
    ["gcloud", "storage", "buckets", "describe", BUCKET, "--raw", "--format=json(name,location,storageClass)"],
    ["gcloud", "beta", "quotas", "info", "describe", "TPUS-PER-TPU-FAMILY-per-project-region",
     "--service=compute.googleapis.com", P, "--format=json"],
    ["gcloud", "container", "get-server-config", "--location=us-east5-b", "--format=json", P],
    ["gcloud", "compute", "machine-types", "list", "--filter=name=ct6e-standard-4t", "--format=json", P],
    ["gcloud", "auth", "print-access-token"],
    ["gcloud", "config", "list", "--format=json"],
]


def same(cloud: Cloud, argv: list[str], creds: GcloudCredentials) -> tuple[str, str]:
    """The real gcloud's stdout and the shortcut's, for one command (the
    shortcut's credentials shared by a test's reads, as one run's are)."""
    real = cloud.client(*argv)
    assert real.returncode == 0, (argv, real.stderr)
    got = GcloudShortcut(creds).run(argv, cloud.env(), 60)
    assert got is not None, f"not answered in-process: {argv}"
    assert got.rc == 0 and got.stderr == real.stderr, (got.stderr, real.stderr)
    return real.stdout, got.stdout


def loaded(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


@pytest.mark.clients
def test_each_read_is_answered_as_gcloud_prints_it(cloud: Cloud):
    """On a whole environment (every list holds something), then on a bare
    project (the empty lists)."""
    cloud.seed_full()
    cloud.gcp.add_network("other-net", mtu=1460)
    creds = GcloudCredentials()
    for argv in ANSWERED:
        real, got = same(cloud, argv, creds)
        assert loaded(got) == loaded(real), argv
        assert got == real or not argv[-1].startswith("--format=json") or argv[1] == "config", (argv, got, real)
    cloud.reset()
    for argv in ANSWERED[:1] + ANSWERED[2:4]:
        real, got = same(cloud, argv, creds)
        assert loaded(got) == loaded(real) == [], argv


@pytest.mark.clients
def test_a_long_list_is_read_to_its_last_page(cloud: Cloud):
    for i in range(7):
        cloud.gcp.add_network(f"net-{i}")
    cloud.gcp.server.fail("GET", r"/global/networks$", 200, {
        "kind": "compute#networkList", "items": [{"name": "net-0"}], "nextPageToken": "p2"}, times=1)
    got = GcloudShortcut(GcloudCredentials()).run(ANSWERED[2], cloud.env(), 60)
    assert got is not None
    names = [n["name"] for n in json.loads(got.stdout)]
    assert names[0] == "net-0" and len(names) == 8, names
    pages = [r for r in cloud.gcp.server.since(0) if r.method == "GET" and r.path.endswith("/global/networks")]
    assert [r.query.get("pageToken") for r in pages][-2:] == [None, "p2"], [r.query for r in pages]


@pytest.mark.clients
@pytest.mark.parametrize("fault", [
    ("GET", r"/global/networks$", 503, {"error": {"code": 503, "message": "unavailable", "status": "UNAVAILABLE"}}),
    ("GET", r"/global/networks$", 403, {"error": {"code": 403, "message": "denied", "status": "PERMISSION_DENIED"}}),
    ("GET", r"/global/networks$", 200, {"items": [], "warning": {"code": "UNREACHABLE", "message": "a region"}}),
    ("GET", r"/locations/-/clusters$", 200, {"clusters": [], "missingZones": ["us-east5-b"]}),
])
def test_an_answer_that_is_not_a_success_runs_as_its_process(cloud: Cloud, fault):
    """An error status or a partial list is never printed here (an empty
    partial list would read as "absent"): None, so gcloud runs and says it."""
    method, path, status, body = fault
    cloud.gcp.server.fail(method, path, status, body, times=1)
    argv = ANSWERED[0] if "clusters" in path else ANSWERED[2]
    shortcut = GcloudShortcut(GcloudCredentials())
    assert shortcut.run(argv, cloud.env(), 60) is None
    asked = len(cloud.gcp.server.since(0))
    # the fault is spent, but that command line is gcloud's for the rest of the run: asked once per attempt
    assert shortcut.run(argv, cloud.env(), 60) is None and len(cloud.gcp.server.since(0)) == asked
    assert shortcut.run(ANSWERED[4], cloud.env(), 60) is not None, "another command is still answered"


@pytest.mark.clients
def test_a_missing_thing_runs_as_its_process_but_a_missing_bucket_is_answered_in_gcloud_storages_words(cloud: Cloud):
    """The node pools of a cluster that is not there: gcloud's own NotFound
    (the plays' parse reads its words), not an answer of ours. A NotFound is
    not a failing API: the next look is in-process again (the next step may
    have made the cluster), and answered once it is there."""
    shortcut = GcloudShortcut(GcloudCredentials())
    assert shortcut.run(ANSWERED[1], cloud.env(), 60) is None
    asked = len(cloud.gcp.server.since(0))
    assert shortcut.run(ANSWERED[1], cloud.env(), 60) is None
    assert len(cloud.gcp.server.since(0)) == asked + 1, "asked again after a NotFound"
    cloud.seed_cluster()
    assert shortcut.run(ANSWERED[1], cloud.env(), 60) is not None
    # A bucket not there yet: gcloud storage says it in one line of its own
    # (exit 1, "gs://B not found: 404.", its parse reads it), whatever the
    # API's message: answered here as gcloud answers it, and asked again.
    cloud.gcp.st.buckets.clear()
    for bucket in (a for a in ANSWERED if a[2:4] in (["buckets", "describe"], ["buckets", "get-iam-policy"])):
        real = cloud.client(*bucket)
        asked = len(cloud.gcp.server.since(0))
        got = shortcut.run(bucket, cloud.env(), 60)
        assert got is not None and (got.rc, got.stdout, got.stderr) == (real.returncode, real.stdout, real.stderr)
        assert got.stderr == f"ERROR: (gcloud.storage.buckets.{bucket[3]}) {BUCKET} not found: 404.\n"
        assert len(cloud.gcp.server.since(0)) == asked + 1
    cloud.seed_full()
    bucket = next(a for a in ANSWERED if a[2:4] == ["buckets", "describe"])
    assert json.loads(shortcut.run(bucket, cloud.env(), 60).stdout)["storageClass"] == "STANDARD"
    # Any other failure stays gcloud's to say.
    cloud.gcp.server.fail("GET", r"/b/[^/]+$", 403, {"error": {"code": 403, "message": "denied"}}, times=1)
    assert shortcut.run(bucket, cloud.env(), 60) is None


@pytest.mark.clients
def test_only_the_machine_type_named_and_only_a_whole_aggregated_list_is_answered(cloud: Cloud):
    """gcloud's ``name=M`` on the aggregated list: M in every zone that has
    it, nothing else; a zone that did not answer leaves it to gcloud."""
    argv = ANSWERED[-3]
    creds = GcloudCredentials()
    real, got = same(cloud, argv, creds)
    assert got == real and {m["name"] for m in json.loads(got)} == {"ct6e-standard-4t"}, got
    assert len(json.loads(got)) >= 2, "one entry per zone that has it"
    cloud.gcp.server.fail("GET", r"/aggregated/machineTypes$", 200, {"items": {
        "zones/us-east5-b": {"machineTypes": [{"name": "ct6e-standard-4t", "zone": "us-east5-b"}]},
        "zones/us-east5-c": {"warning": {"code": "UNREACHABLE", "message": "zone down"}}}}, times=1)
    assert GcloudShortcut(creds).run(argv, cloud.env(), 60) is None


@pytest.mark.clients
def test_properties_it_does_not_follow_leave_every_command_to_gcloud(cloud: Cloud):
    env = cloud.env(CLOUDSDK_AUTH_IMPERSONATE_SERVICE_ACCOUNT="sa@fake-tpu-project.iam.gserviceaccount.com")
    assert GcloudShortcut(GcloudCredentials()).run(ANSWERED[2], env, 60) is None
    # the helper itself asked IAM for the impersonated token (refused by the sink): gcloud's way, not ours
    assert cloud.sink.lines == ["CONNECT iamcredentials.googleapis.com:443 HTTP/1.1"], cloud.sink.lines
    cloud.sink.lines.clear()
    env = cloud.env(CLOUDSDK_PROXY_TYPE="http", CLOUDSDK_PROXY_ADDRESS="127.0.0.1", CLOUDSDK_PROXY_PORT="9")
    assert GcloudShortcut(GcloudCredentials()).run(ANSWERED[2], env, 60) is None


@pytest.mark.clients
def test_without_an_account_each_read_is_refused_in_gclouds_own_words_after_one_helper(cloud: Cloud):
    """gcloud with no account refuses every command with the same words, its
    own name first, before any API call: each read is answered with the
    helper's refusal under its name, as its process prints it (compared
    command by command), after one helper and no request. The commands
    answered from the helper's answer (its token, gcloud's properties) run
    as their process, which says it."""
    cloud.use_access_token_file()   # a gcloud configuration with no account, once the file is gone
    env = cloud.env()
    del env["CLOUDSDK_AUTH_ACCESS_TOKEN_FILE"]
    creds = GcloudCredentials()
    shortcut = GcloudShortcut(creds)
    mark = cloud.gcp.server.mark()
    asked = []
    for argv in ANSWERED:
        got = shortcut.run(argv, env, 60)
        if parse(argv) is None:
            assert got is None, argv
            continue
        assert got is not None, argv
        asked.append((argv, got))
    assert creds.helper_runs == 1, "a helper that failed is not asked again in the run"
    assert not cloud.gcp.server.since(mark)
    with ThreadPoolExecutor(max_workers=2) as pool:
        real = list(pool.map(lambda a: subprocess.run(a[0], env=env, capture_output=True, text=True, timeout=120),
                             asked))
    for (argv, got), r in zip(asked, real, strict=True):
        assert r.returncode == 1 and NO_ACCOUNT_WORDS in r.stderr, (argv, r.stderr)
        assert (got.rc, got.stdout, got.stderr) == (r.returncode, r.stdout, r.stderr), argv


@pytest.mark.clients
def test_one_helper_serves_the_run_and_a_config_change_asks_again(cloud: Cloud):
    cloud.seed_full()
    creds = GcloudCredentials()
    sc = GcloudShortcut(creds)
    for argv in ANSWERED[:4]:
        assert sc.run(argv, cloud.env(), 60) is not None
    # a compute command's own reporting variables do not ask again
    assert sc.run(ANSWERED[2], cloud.env(CLOUDSDK_CORE_VERBOSITY="debug"), 60) is not None
    assert creds.helper_runs == 1
    assert cloud.client("gcloud", "config", "set", "core/project", PROJECT).returncode == 0
    assert sc.run(ANSWERED[2], cloud.env(), 60) is not None
    assert creds.helper_runs == 2, "gcloud's configuration sentinel changed: the helper is asked again"
    assert json.loads(sc.run(ANSWERED[-1], cloud.env(), 60).stdout)["core"]["project"] == PROJECT


@pytest.mark.clients
def test_a_token_with_an_expiry_is_kept_for_the_next_run_until_gcloud_is_changed(cloud: Cloud, tmp_path):
    """The fakes' gcloud is signed in with a service account: its token has
    an expiry. A later run (a new GcloudCredentials on the same cache) uses
    the kept answer and starts no config-helper, until `gcloud config set`
    touches gcloud's sentinel; another gcloud configuration has its own
    entry; the file is its owner's alone."""
    cloud.seed_full()
    cache = TokenCache(tmp_path / "tokens")
    first = GcloudCredentials(cache)
    assert GcloudShortcut(first).run(ANSWERED[0], cloud.env(), 60) is not None and first.helper_runs == 1
    kept = list((tmp_path / "tokens").iterdir())
    assert len(kept) == 1 and kept[0].stat().st_mode & 0o777 == 0o600
    assert json.loads(kept[0].read_text())["token"] == TOKEN
    later = GcloudCredentials(cache)
    out = GcloudShortcut(later).run(ANSWERED[0], cloud.env(CLOUDSDK_CORE_VERBOSITY="debug"), 60)
    assert out is not None and json.loads(out.stdout)[0]["name"] == "maxtext-multislice"
    assert later.helper_runs == 0, "the kept token served the next run"
    assert cloud.client("gcloud", "config", "set", "core/project", PROJECT).returncode == 0
    again = GcloudCredentials(cache)
    assert GcloudShortcut(again).run(ANSWERED[0], cloud.env(), 60) is not None
    assert again.helper_runs == 1, "gcloud's configuration sentinel changed: the helper is asked again"
    other = cloud.env()
    cloud.fresh_clients()  # another gcloud configuration folder, signed in too
    elsewhere = GcloudCredentials(cache)
    assert GcloudShortcut(elsewhere).run(ANSWERED[0], cloud.env(), 60) is not None and elsewhere.helper_runs == 1
    assert cache_key(other) != cache_key(cloud.env()) and len(list((tmp_path / "tokens").iterdir())) == 2


@pytest.mark.clients
def test_a_token_without_an_expiry_is_never_kept(cloud: Cloud, tmp_path):
    cloud.use_access_token_file()
    cloud.seed_full()
    cache = TokenCache(tmp_path / "tokens")
    for _ in range(2):
        creds = GcloudCredentials(cache)
        assert GcloudShortcut(creds).run(ANSWERED[0], cloud.env(), 60) is not None and creds.helper_runs == 1
    assert not (tmp_path / "tokens").exists() or not list((tmp_path / "tokens").iterdir())


def test_a_kept_token_near_its_expiry_or_unreadable_is_not_used(tmp_path):
    env = {"CLOUDSDK_CONFIG": str(tmp_path / "gcloud"), "PATH": "/nonexistent"}
    cache = TokenCache(tmp_path / "tokens")
    later = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))
    soon = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 120))
    got = parse_helper(json.dumps({"credential": {"access_token": "t", "token_expiry": later},
                                   "configuration": {"properties": {"core": {"project": "p"}}}}), time.monotonic())
    cache.store(env, got)
    assert cache.load(env, time.monotonic()).prop("core", "project") == "p"
    assert cache.load({**env, "CLOUDSDK_CORE_PROJECT": "q"}, time.monotonic()) is None   # another key
    # what gcloud is told only for its reporting is not part of the key
    assert cache.load({**env, "CLOUDSDK_CORE_VERBOSITY": "debug", "TERM": "x"}, time.monotonic()) is not None
    got.expiry = soon
    cache.store(env, got)
    assert cache.load(env, time.monotonic()) is None, "within five minutes of its expiry"
    for text in ("", "[]", '{"token": "t"}', '{"token": 1, "expiry": "x", "properties": {}, "sentinel": "", '
                 '"sentinel_mtime": null}'):
        (tmp_path / "tokens" / f"{cache_key(env)}.json").write_text(text)
        assert cache.load(env, time.monotonic()) is None, text
    # a token read back is renewed as the helper's own would be
    assert GcloudCredentials(cache).get(env) is None  # no gcloud to ask: nothing, not the unreadable entry


@pytest.mark.parametrize("argv", [
    ["gcloud", "compute", "networks", "list", "--format=yaml", P],
    ["gcloud", "compute", "networks", "list", "--format=json", P, "--filter=name=x"],
    ["gcloud", "compute", "networks", "list", "--format=json"],
    ["gcloud", "compute", "networks", "subnets", "list", "--regions=us-east5,us-east1", "--format=json", P],
    ["gcloud", "compute", "networks", "list", "--format=json", P, P],
    ["gcloud", "services", "list", "--format=json", P],
    ["gcloud", "projects", "describe", PROJECT, "--format=json"],
    ["gcloud", "compute", "machine-types", "list", "--filter=name~ct6e", "--format=json", P],
    ["gcloud", "compute", "machine-types", "list", "--filter=name=ct6e*", "--format=json", P],
    ["gcloud", "auth", "print-access-token", "--lifetime=60"],
    ["gcloud", "storage", "buckets", "describe", BUCKET, "--format=json"],
    ["gcloud", "storage", "buckets", "describe", BUCKET, "--raw", "--format=json"],
    ["gcloud", "storage", "buckets", "describe", BUCKET, "--raw", "--format=json(name,updated)"],
    ["gcloud", "storage", "buckets", "describe", BUCKET, "--format=json(name,location)"],
    ["gcloud", "storage", "buckets", "describe", "gs://", "--raw", "--format=json(name)"],
    ["gcloud", "storage", "buckets", "describe", f"{BUCKET}/o", "--raw", "--format=json(name)"],
    ["gcloud", "container", "clusters", "create", "x", "--format=json", P],
    ["kubectl", "get", "pods"],
])
def test_a_command_line_not_answered_here_is_left_to_its_process(argv):
    """Any other flag, format or verb: not parsed (no credentials asked)."""
    assert parse(argv) is None
    creds = GcloudCredentials()
    assert GcloudShortcut(creds).run(argv, {"PATH": "/nonexistent"}, 10) is None or argv[1:3] == ["config", "list"]
    assert creds.helper_runs == 0


def test_the_helpers_token_is_renewed_before_it_expires():
    soon = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 120))
    later = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))
    doc = {"credential": {"access_token": "t", "token_expiry": soon}, "configuration": {"properties": {}}}
    assert not parse_helper(json.dumps(doc), time.monotonic()).fresh()  # within the five minutes' margin
    doc["credential"]["token_expiry"] = later
    assert parse_helper(json.dumps(doc), time.monotonic()).fresh()
    doc["credential"]["access_token"] = None
    assert parse_helper(json.dumps(doc), time.monotonic()) is None


def rows(run) -> list[tuple[str, str]]:
    doc = json.loads(run.out[run.out.index("{"):])
    return [(i["what"], i["verdict"], i["state"], i["reason"]) for i in doc["items"]]


@pytest.mark.clients
def test_a_converged_up_and_a_status_start_two_thirds_of_the_processes_with_the_same_verdicts(cloud: Cloud):
    """Before this module: 18 client processes for a converged `up` and 13
    for `status` (gcloud, gsutil, kubectl, the auth plugin and the gcloud it
    starts). Now at most two thirds, and every row as a run that starts
    each command as its process finds it; no auth plugin at all (the
    kubernetes client is given gcloud's token)."""
    cloud.seed_full()
    cloud.get_credentials()
    up = cloud.invoke("up")
    assert up.rc == 0, up
    assert up.recaps()[-1]["changed"] == 0, up
    status = cloud.invoke("status", "--json")
    assert status.rc == 0, status
    assert len(up.processes) <= 12 and len(status.processes) <= 8, (up.processes, status.processes)
    assert not up.started("gke-gcloud-auth-plugin", "kubectl") and not status.started("gke-gcloud-auth-plugin")
    slow_up = cloud.invoke("up", TPU_PLAYBOOKS_PROCESSES_ONLY="1")
    slow = cloud.invoke("status", "--json", TPU_PLAYBOOKS_PROCESSES_ONLY="1")
    assert slow.rc == 0 and slow_up.rc == 0, slow
    assert len(slow.processes) > len(status.processes) + 6, slow.processes  # the switch does start them all
    # ... and, as on a controller, no more than the 13 of before this module (one kubectl for every
    # Kubernetes object, the node pools in `clusters list`, the project's number in the enabled services).
    assert len(slow.processes) <= 13 and len(slow.started("kubectl")) == 1, slow.processes
    assert rows(slow) == rows(status)
    assert [(r["ok"], r["changed"]) for r in slow_up.recaps()] == [(r["ok"], r["changed"]) for r in up.recaps()]


ROTATED = "ya29.fake-access-token-rotated"


@contextlib.contextmanager
def rotated(cloud: Cloud, kube: bool = False, gcp: bool = True):
    """The fakes' token changed to ROTATED (the old one answered 401) for
    the block; then the fakes' own token back and new client folders, as
    gcloud's cache now holds the rotated token (the fakes outlive a test)."""
    was = cloud.gcp.token, cloud.kube.token
    try:
        if gcp:
            cloud.gcp.token = ROTATED
        if kube:
            cloud.kube.token = ROTATED
        yield
    finally:
        cloud.gcp.token, cloud.kube.token = was
        cloud.fresh_clients()


@pytest.mark.clients
def test_a_token_the_api_refuses_is_dropped_and_renewed_once_not_used_for_its_hour(cloud: Cloud, tmp_path):
    """A kept token the APIs now answer 401 (revoked, its key disabled): the
    read is not left to gcloud for the rest of the run while the run keeps
    the dead token (and the next run reads it again from the file): the
    token is dropped here and in the file, renewed once with gcloud's own
    cache refreshed (`config-helper --force-auth-refresh`), and the read
    answered with the new one, as every later read is, with no renewal
    more. A token the API refuses again is not renewed in a loop: the
    command runs as its process, which says it."""
    cloud.seed_full()
    cache = TokenCache(tmp_path / "tokens")
    creds = GcloudCredentials(cache)
    sc = GcloudShortcut(creds)
    assert sc.run(ANSWERED[0], cloud.env(), 60) is not None and creds.renewals == 0
    with rotated(cloud):  # the fakes now refuse TOKEN with 401, and give ROTATED at their token endpoint
        got = sc.run(ANSWERED[2], cloud.env(), 60)
        assert got is not None and got.rc == 0, "the refused token was renewed and the read answered in-process"
        assert creds.renewals == 1 and creds.helper_runs == 2
        assert json.loads(next((tmp_path / "tokens").iterdir()).read_text())["token"] == ROTATED
        assert sc.run(ANSWERED[1], cloud.env(), 60) is not None and creds.renewals == 1
        later = GcloudCredentials(cache)  # the next run reads the renewed token from the file
        assert GcloudShortcut(later).run(ANSWERED[0], cloud.env(), 60) is not None and later.helper_runs == 0


@pytest.mark.clients
def test_a_token_refused_after_its_renewal_leaves_the_read_to_its_process(cloud: Cloud, tmp_path):
    cloud.seed_full()
    creds = GcloudCredentials(TokenCache(tmp_path / "tokens"))
    sc = GcloudShortcut(creds)
    assert sc.run(ANSWERED[0], cloud.env(), 60) is not None
    server = cloud.gcp.server
    real_check = server._check_auth

    def refuse_api_reads(req):  # every API read refused, the token endpoint still answering
        if req.path != "/oauth2/token":
            raise HttpError(401, unauthenticated())

    server._check_auth = refuse_api_reads
    try:
        assert sc.run(ANSWERED[2], cloud.env(), 60) is None, "refused again: left to gcloud, which says it"
        assert creds.renewals == 1
    finally:
        server._check_auth = real_check


@pytest.mark.clients
def test_the_kubernetes_clients_refused_token_is_renewed_once(cloud: Cloud, tmp_path):
    """The kubernetes client is given gcloud's token in place of the auth
    plugin: an API server that answers it 401 gets the renewed token on the
    same request, not "Unauthorized" for the rest of the token's hour."""
    from playbooks.access.kube_api import KubectlShortcut

    cloud.seed_full()
    cloud.get_credentials()
    creds = GcloudCredentials(TokenCache(tmp_path / "tokens"))
    kc = KubectlShortcut(creds)
    argv = ["kubectl", "get", "nodes", "--output=json", f"--context=gke_{PROJECT}_us-east5-b_maxtext-multislice"]
    first = kc.run(argv, cloud.env(), 30)
    assert first is not None and first.rc == 0, (first.stdout, first.stderr)
    with rotated(cloud, kube=True):
        again = kc.run(argv, cloud.env(), 30)
        assert again is not None and again.rc == 0, (again.stdout, again.stderr, creds.renewals, creds.helper_runs)
        assert creds.renewals == 1


@pytest.mark.clients
def test_the_kubernetes_client_sends_the_token_renewed_before_its_expiry(cloud: Cloud, tmp_path, monkeypatch):
    """gcloud's token renewed ahead of its expiry (``GcloudCredentials.get``
    gives a new one) is the one the next request sends: the client's own
    key for it, not an alias it never reads (kubernetes 37 reads
    "BearerToken" before "authorization")."""
    from dataclasses import replace

    from playbooks.access.kube_api import KubectlShortcut

    cloud.seed_full()
    cloud.get_credentials()
    creds = GcloudCredentials(TokenCache(tmp_path / "tokens"))
    kc = KubectlShortcut(creds)
    argv = ["kubectl", "get", "nodes", "--output=json", f"--context=gke_{PROJECT}_us-east5-b_maxtext-multislice"]
    assert kc.run(argv, cloud.env(), 30).rc == 0
    held = creds.get(cloud.env())
    monkeypatch.setattr(creds, "get", lambda env: replace(held, token=ROTATED))
    with rotated(cloud, kube=True, gcp=False):
        again = kc.run(argv, cloud.env(), 30)
        assert again.rc == 0 and creds.renewals == 0, again.stderr
