"""`invoke status` while the APIs fail: every row is listed whatever failed
before it, each saying what is or "unknown because <what could not be
read, and why>"; a row that needs what could not be read is unknown too,
never "as asked" and never absent; the diagnosis names the first thing
not as asked; `--json` has every item; it ends in bounded time, exit 1,
no traceback. A 503 from each API (GKE, Compute, Storage, Kubernetes) one
at a time, and all at once.

The real gcloud, gsutil and kubectl against the loopback fakes
(tests/clients.py).
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
    (KUBE, ["raycluster : RayCluster maxtext-tpu-cluster", "status : RayCluster workers", "status : TPU nodes ready"],
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
