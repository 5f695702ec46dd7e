"""`invoke status` while the APIs fail: every row is listed whatever failed
before it, each saying what is or "unknown because <what could not be
read, and why>"; a row that needs what could not be read is unknown too,
never "as asked" and never absent; the diagnosis names the first thing
not as asked; `--json` has every item; it ends in bounded time, exit 1,
no traceback. A 503 from each API (GKE, Compute, Storage, Kubernetes) one
at a time, and all at once.

Through `invoke status` against the loopback fakes: its gcloud and kubectl
reads answered in-process, as for a user, each 503 read in the words the
real process would print (a read the API fails runs as its gcloud process;
tests/clients.py says what runs how).
"""
from __future__ import annotations

import json
import time

import pytest

from tests.clients import Cloud, failed_run, ok_run
from tests.fakes import gcp as G

pytestmark = pytest.mark.clients

# Each API's reads, as the fakes' paths (searched).
GKE = r"^/container/"
COMPUTE = r"^/compute/"
STORAGE = r"^/storage/"
KUBE = r"^/(api|apis)/"
BOUND_S = 150  # every look retried within its bound, the rows at once
WHOLE: dict[str, dict] = {}  # the rows of a status with every API answering (the same for every case)


def unavailable(cloud: Cloud, *apis: str) -> None:
    for api in apis:
        server = cloud.kube.server if api == KUBE else cloud.gcp.server
        body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "the server is currently unable "
                "to handle the request", "reason": "ServiceUnavailable", "code": 503} if api == KUBE else G.unavailable()
        server.fail("GET", api, 503, body, times=10_000)


def items(run) -> dict[str, dict]:
    out = run.out
    assert "{\n" in out, out[-3000:]
    doc = json.loads(out[out.index("{\n"):out.rindex("\n}") + 2])
    return {i["what"]: i for i in doc["items"]}, doc


@pytest.fixture
def up(cloud: Cloud) -> Cloud:
    cloud.seed_full()
    cloud.get_credentials()
    if not WHOLE:
        WHOLE.update(items(ok_run(cloud.invoke("status", "--json")))[0])
    cloud.whole = WHOLE  # type: ignore[attr-defined]
    return cloud


@pytest.mark.parametrize("api, unknown, still", [
    (GKE, ["cluster : GKE cluster maxtext-multislice", "nodepools : TPU node pool v6e-16-0",
           "status : maintenance exclusions"],
     ["network : VPC maxtext-multislice-net-1", "storage : bucket gs://fake-tpu-project-ckpt",
      "raycluster : RayCluster maxtext-tpu-cluster", "status : RayCluster workers", "status : jobs"]),
    (KUBE, ["raycluster : RayCluster maxtext-tpu-cluster", "status : RayCluster workers", "status : TPU nodes ready",
            "status : TPU host maintenance, flex-start ends"],
     ["cluster : GKE cluster maxtext-multislice", "nodepools : TPU node pool v6e-16-0", "status : jobs",
      "storage : bucket gs://fake-tpu-project-ckpt"]),
    (COMPUTE, ["network : VPC maxtext-multislice-net-1"],
     ["cluster : GKE cluster maxtext-multislice", "raycluster : RayCluster maxtext-tpu-cluster", "status : jobs"]),
    (STORAGE, ["storage : bucket gs://fake-tpu-project-ckpt"],
     ["cluster : GKE cluster maxtext-multislice", "raycluster : RayCluster maxtext-tpu-cluster", "status : jobs"]),
], ids=["gke", "kubernetes", "compute", "storage"])
def test_a_503_from_one_api_leaves_every_row_listed_its_own_unknown(up: Cloud, api, unknown, still):
    unavailable(up, api)
    start = time.monotonic()
    run = failed_run(up.invoke("status", "--json"))
    took = time.monotonic() - start
    assert took < BOUND_S, took
    assert "Traceback" not in run.out
    got, doc = items(run)
    assert set(got) == set(up.whole), set(up.whole) ^ set(got)  # every row, whatever failed before it
    table = {w: (i["verdict"], i["reason"][:150]) for w, i in got.items()}
    for what in unknown:
        assert got[what]["verdict"] == "unknown", table
        assert got[what]["reason"].startswith("unknown because "), got[what]
        # Each client's own words for a 503 (gcloud compute drops the status, prints the server's message).
        assert any(w in got[what]["reason"].lower() for w in ("503", "unavailable", "could not be read")), \
            got[what]["reason"]
    for what in still:
        assert got[what]["verdict"] == up.whole[what]["verdict"] == "as asked", table
    # Nothing is as asked, or absent, that could not be looked at.
    for what, i in got.items():
        if up.whole[what]["verdict"] == "as asked" and i["verdict"] != "as asked":
            assert i["verdict"] == "unknown", (what, table)
    assert doc["as_asked"] is False and doc["diagnosis"]
    assert "unknown because" in doc["diagnosis"]
    if api == GKE:  # the table too: every row, none "not run"
        text = failed_run(up.invoke("status")).out
        assert "Traceback" not in text and "not run" not in text
        assert all(what in text for what in got), text[-3000:]


def test_every_api_at_once_still_lists_every_row_in_bounded_time(up: Cloud):
    unavailable(up, GKE, COMPUTE, STORAGE, KUBE)
    start = time.monotonic()
    run = failed_run(up.invoke("status", "--json"))
    assert time.monotonic() - start < BOUND_S
    got, doc = items(run)
    assert set(got) == set(up.whole) and doc["diagnosis"].endswith(tuple(i["reason"] for i in got.values()))
    assert all(i["verdict"] in ("unknown", "as asked", "not used", "missing", "not ready") for i in got.values()), got
    looked = [w for w, i in got.items() if i["verdict"] == "unknown"]
    assert len(looked) >= 8, looked


# -- what is coming for each slice (playbooks/cloud/slice_ends.py) -------------------------
SLICE_ENDS = "status : TPU host maintenance, flex-start ends"
MAINTENANCE_LABEL = "cloud.google.com/scheduled-maintenance-time"


def pool_nodes(cloud: Cloud, pool: str) -> list[dict]:
    return [n for n in cloud.kube.list("nodes") if n["metadata"]["labels"].get("cloud.google.com/gke-nodepool") == pool]


def test_a_nodes_scheduled_maintenance_is_said_for_its_whole_slice(up: Cloud):
    """GKE's label on one node of one pool, read by `invoke status` (its
    kubectl get answered by the `kubernetes` client, compared with kubectl
    in tests/test_in_process.py): that
    slice's earliest maintenance in UTC and how far; the other slice none;
    the note that one node stops the whole slice. A malformed value is said."""
    at = int(time.time()) + 2 * 86400 + 3 * 3600 + 1800
    first, second = pool_nodes(up, "v6e-16-1")[:2]
    with up.kube.lock:
        first["metadata"]["labels"][MAINTENANCE_LABEL] = str(at)
        second["metadata"]["labels"][MAINTENANCE_LABEL] = "next tuesday"
    got, _ = items(ok_run(up.invoke("status", "--json")))
    row = got[SLICE_ENDS]
    when = time.strftime("%Y-%m-%d %H:%MZ", time.gmtime(at))
    assert row["verdict"] == "as asked", row
    assert row["reason"] == (f"v6e-16-0: no maintenance scheduled; v6e-16-1: maintenance {when}, in 2 d 3 h "
                             f"(node {first['metadata']['name']}); maintenance label of node "
                             f"{second['metadata']['name']} unreadable: 'next tuesday'"), row
    assert row["notes"] == ["a slice runs only whole: one node's maintenance interrupts all of v6e-16-1 (GKE "
                            "terminates a TPU node for it: TPUs do not live-migrate)"], row
    table = ok_run(up.invoke("status")).out
    assert "Traceback" not in table and f"v6e-16-1: maintenance {when}, in 2 d 3 h" in table, table[-3000:]
    assert "one node's maintenance interrupts all of v6e-16-1" in table


def test_a_flex_start_slice_says_when_it_ends(cloud: Cloud):
    """Flex-start pools (GKE's pool config, no max run duration: GKE's
    default 7 days): each ends 7 days after its first node came."""
    cloud.change_inventory(capacity="flex-start", capacity_wait=600)
    cloud.seed_to_cluster()
    e = cloud.envdata()
    for i in range(e.slices):
        spec = cloud.pool_spec(f"v6e-16-{i}", capacity="flex-start")
        spec["initialNodeCount"] = 0
        spec["config"]["flexStart"] = True
        spec["autoscaling"] = {"enabled": True, "minNodeCount": 0, "maxNodeCount": 4, "locationPolicy": "ANY"}
        cloud.gcp.add_pool(e.zone, e.cluster_name, spec)
    cloud.get_credentials()
    came = time.time() - 2 * 86400 + 1800  # 5 d 0 h 30 min left
    nodes = pool_nodes(cloud, "v6e-16-0")
    assert len(nodes) == 4 and pool_nodes(cloud, "v6e-16-1")
    with cloud.kube.lock:
        nodes[2]["metadata"]["creationTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(came))
    run = cloud.invoke("status", "--json")
    assert "Traceback" not in run.out
    row = items(run)[0][SLICE_ENDS]
    end = time.strftime("%Y-%m-%d %H:%MZ", time.gmtime(int(came) + 7 * 86400))
    assert row["reason"].startswith(f"v6e-16-0: no maintenance scheduled; flex-start ends {end}, in 5 d 0 h "
                                    "(7 d 0 h from its first node, GKE's default); v6e-16-1: no maintenance "
                                    "scheduled; flex-start ends "), row
    assert "in 6 d 23 h (7 d 0 h from its first node, GKE's default)" in row["reason"], row
