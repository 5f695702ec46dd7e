"""Transient or not, from what each client really prints (outputs captured
from gcloud 528, gsutil, kubectl and ray against the loopback fakes, with
messages no rule knows); and the line of an output that says what failed."""
import pytest

from playbooks.access.cli_clients import already_exists, http_status, is_transient, without_debug_log
from playbooks.core.errors import error_line
from playbooks.core.facts import Completed

COMPUTE_503 = """DEBUG: Running [gcloud.compute.networks.create] with arguments: [--mtu: "8896", NAME: "n1"]
INFO: Using access token from file: [/tmp/clients-1/token]
DEBUG: Starting new HTTPS connection (1): 127.0.0.1:42155
DEBUG: https://127.0.0.1:42155 "POST /compute/v1/projects/p/global/networks?alt=json HTTP/11" {code} 175
DEBUG: Chosen display Format:list[title="Could not fetch resource:",always-display-title]
DEBUG: (gcloud.compute.networks.create) Could not fetch resource:
 - Backend hiccup zq7
Traceback (most recent call last):
  File "/usr/lib/google-cloud-sdk/lib/googlecloudsdk/calliope/cli.py", line 985, in Execute
googlecloudsdk.calliope.exceptions.ToolException: Could not fetch resource:
 - Backend hiccup zq7

ERROR: (gcloud.compute.networks.create) Could not fetch resource:
 - Backend hiccup zq7

"""
APITOOLS_503 = ("ERROR: (gcloud.services.list) HttpError accessing <https://127.0.0.1:36347/serviceusage/v1/projects/"
                "p/services?alt=json>: response: <{'server': 'BaseHTTP/0.6', 'content-type': 'application/json', "
                "'status': 503}>, content <{\"error\": {\"code\": 503, \"message\": \"su hiccup\", \"status\": "
                "\"UNAVAILABLE\"}}>\nThis may be due to network connectivity issues.")


def c(stderr: str, rc: int = 1, stdout: str = "") -> Completed:
    return Completed("cmd", rc, stdout, stderr)


@pytest.mark.parametrize("stderr, status, transient", [
    (COMPUTE_503.format(code=503), 503, True),          # compute: only its debug log has the status
    (COMPUTE_503.format(code=429), 429, True),
    (COMPUTE_503.format(code=403), 403, False),
    (COMPUTE_503.format(code=400), 400, False),
    ("ERROR: (gcloud.storage.buckets.describe) RESOURCE_EXHAUSTED: Slow down zz", 429, True),
    ("ERROR: (gcloud.storage.buckets.describe) UNAVAILABLE: Storage gone yy", 503, True),
    ("ERROR: (gcloud.storage.buckets.describe) INTERNAL: Storage int", 500, True),
    ("ERROR: (gcloud.storage.buckets.describe) [None] does not have permission to access b instance [bk]", None,
     False),
    ("ERROR: (gcloud.container.clusters.list) ResponseError: code=503, message=GKE hiccup", 503, True),
    ("ERROR: (gcloud.container.clusters.list) ResponseError: code=403, message=GKE no.", 403, False),
    (APITOOLS_503, 503, True),
    ("ERROR: (gcloud.projects.describe) RESOURCE_EXHAUSTED: crm slow", 429, True),
    ("ServiceException: 503 Backend Error", 503, True),
    ("AccessDeniedException: 403 tester@example.com does not have storage.buckets.create access", 403, False),
    ('Error from server (ServiceUnavailable): the server is currently unable to handle the request', 503, True),
    ('Error from server (Forbidden): pods is forbidden: User "x" cannot list resource "pods"', 403, False),
    ("Unable to connect to the server: net/http: TLS handshake timeout", None, True),
    # kubectl delete --timeout=3s of a pod kept Terminating (its node's kubelet dead; kubectl 1.32 against
    # tests/fakes/kube.py): its own wait ran out, the server answered; waiting again waits for the same.
    ('E1207 19:59:42.984381    6390 reflector.go:166] "Unhandled Error" err="k8s.io/client-go/tools/watch/'
     'informerwatcher.go:146: Failed to watch *unstructured.Unstructured: context deadline exceeded - error from a '
     'previous attempt: context deadline exceeded"\nerror: timed out waiting for the condition on pods/p1\n', None,
     False),
    # A 403 for a rate quota is Google's way of saying "slow down".
    ("ERROR: (gcloud.compute.networks.list) Some requests did not succeed:\n - Quota exceeded for quota metric "
     "'Queries' and limit 'Queries per minute' of service 'compute.googleapis.com'", None, True),
    ("Error: Failed to make request to http://localhost:8299/api/v0/nodes. Failed to connect to API server.",
     None, False),
    # gcloud commands at once, one config folder: its SQLite store locked (seen in the clients tests).
    ("ERROR: gcloud crashed (OperationalError): database is locked\n\nIf you would like to report this issue, "
     "please run the following command:\n  gcloud feedback", None, True),
])
def test_status_and_transience_as_the_clients_print_them(stderr, status, transient):
    assert http_status(c(stderr)) == status
    assert is_transient(c(stderr)) is transient


# GKE's three forms of "another operation runs" (its concurrent-operations
# troubleshooting page), as gcloud container prints a 400 FAILED_PRECONDITION.
BUSY = (
    "Cluster is running incompatible operation operation-1234.",
    "Operation operation-1234 is currently upgrading cluster maxtext-multislice. Please wait and try again once it "
    "is done.",
    "Cluster is currently being created, deleted, updated or repaired and cannot be updated.",
)


@pytest.mark.parametrize("message", BUSY)
def test_an_operation_of_someone_else_is_waited_out_only_by_patient_commands(message):
    busy = c(f"ERROR: (gcloud.container.node-pools.create) ResponseError: code=400, message={message}")
    assert is_transient(busy, patient=True) and not is_transient(busy, patient=False)


def test_too_many_operations_is_waited_out_and_another_400_is_not():
    many = c('ERROR: (gcloud.container.node-pools.create) ResponseError: code=429, message=Too many operations: '
             'cluster "maxtext-multislice" hits the concurrent operations quota 5, please try again later.')
    assert is_transient(many, patient=True) and is_transient(many, patient=False)
    other = c("ERROR: (gcloud.container.node-pools.create) ResponseError: code=400, message=Cluster is not "
              "updatable: its version is not supported.")
    assert not is_transient(other, patient=True)


def test_a_parse_error_or_a_missing_program_is_never_transient():
    assert not is_transient(c("ERROR: (gcloud) unrecognized arguments: --x  (code=503)", rc=2))
    assert not is_transient(c("gcloud: command not found", rc=127))


def test_the_debug_log_is_kept_out_of_what_is_shown():
    shown = without_debug_log(COMPUTE_503.format(code=503))
    assert shown.splitlines() == ["ERROR: (gcloud.compute.networks.create) Could not fetch resource:",
                                  " - Backend hiccup zq7"]
    ok = "DEBUG: x\nDEBUG: Chosen display Format:    table(\n      name,\n    )\nCreated [https://x/n1].\nWARNING: y"
    assert without_debug_log(ok).splitlines() == ["Created [https://x/n1].", "WARNING: y"]


@pytest.mark.parametrize("text, line", [
    ("Usage: ray list [OPTIONS] {actors|jobs|placement-\n                groups|nodes}\nTry 'ray list --help' for "
     "help.\n\nError: Failed to make request to http://localhost:8299/api/v0/nodes.",
     "Error: Failed to make request to http://localhost:8299/api/v0/nodes."),
    ("ERROR: (gcloud.compute.networks.list) Some requests did not succeed:\n - Backend hiccup zq7\n",
     "ERROR: (gcloud.compute.networks.list) Some requests did not succeed: - Backend hiccup zq7"),
    ("Traceback (most recent call last):\n  File \"x\", line 1\nValueError: bad thing\n", "ValueError: bad thing"),
    ("W1201 warming up\nerror: the server doesn't have a resource type \"rayclusters\"",
     "error: the server doesn't have a resource type \"rayclusters\""),
    ("just one line", "just one line"),
])
def test_the_line_that_says_what_went_wrong(text, line):
    assert error_line(text) == line


# A create that finds what it makes already there (another run made it
# meanwhile), as each client printed it against the fakes (gcloud 528, gsutil,
# kubectl); and failures of other kinds that must not be read so.
@pytest.mark.parametrize("stderr, exists", [
    ("ERROR: (gcloud.compute.networks.create) Could not fetch resource:\n - The resource "
     "'projects/fake-tpu-project/global/networks/maxtext-multislice-net-1' already exists\n", True),
    ("Note: Your Pod address range (`--cluster-ipv4-cidr`) can accommodate at most 1008 node(s).\n"
     "ERROR: (gcloud.container.clusters.create) ResponseError: code=409, message=Already exists: "
     "projects/fake-tpu-project/locations/us-east5-b/clusters/maxtext-multislice.", True),
    ("ERROR: (gcloud.container.node-pools.create) ResponseError: code=409, message=Already exists: "
     "projects/fake-tpu-project/locations/us-east5-b/clusters/maxtext-multislice/nodePools/v6e-16-0.", True),
    ("Creating gs://fake-tpu-project-ckpt/...\nServiceException: 409 A Cloud Storage bucket named "
     "'fake-tpu-project-ckpt' already exists. Try another name.", True),
    ('error: failed to create serviceaccount: serviceaccounts "maxtext-ksa" already exists', True),
    ('Error from server (AlreadyExists): namespaces "maxtext" already exists', True),
    # Two runs granting roles at once: a conflict to try again, not something made.
    ("ERROR: (gcloud.projects.add-iam-policy-binding) Resource in projects [fake-tpu-project:setIamPolicy] is the "
     "subject of a conflict: There were concurrent policy changes. Please retry the whole read-modify-write with "
     "exponential backoff.", False),
    ("ERROR: (gcloud.compute.networks.create) Could not fetch resource:\n - Required 'compute.networks.create' "
     "permission for 'projects/p'", False),
    ("ERROR: (gcloud.container.clusters.create) ResponseError: code=400, message=The network already exists in "
     "another region.", False),     # a status other than 409 whose text says "exists"
])
def test_already_exists_as_the_clients_print_it(stderr, exists):
    assert already_exists(c(stderr)) is exists
    assert not already_exists(c(stderr, rc=0))


def test_concurrent_iam_policy_changes_are_tried_again():
    """Two runs granting roles at once: the second setIamPolicy is 409 ABORTED,
    and Google's message says to do the whole read-modify-write again (which
    running add-iam-policy-binding again does)."""
    assert is_transient(c("ERROR: (gcloud.projects.add-iam-policy-binding) Resource in projects "
                          "[fake-tpu-project:setIamPolicy] is the subject of a conflict: There were concurrent policy "
                          "changes. Please retry the whole read-modify-write with exponential backoff."))
