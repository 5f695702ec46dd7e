"""Prices: `invoke capacity` and `invoke train` with the v6e prices of the
Cloud Billing Catalog, read with the user's credentials (`gcloud auth
print-access-token`'s token, answered in-process from the run's one real
`gcloud config config-helper`: tests/clients.py) from a loopback fake that answers as the API's
documentation shows (pages of SKUs, pricingInfo, tieredRates, units and
nanos); the cache; the inventory's prices winning; a catalog that fails or
answers what the API does not document, said in one line, never a stop.

What every such test shares: tests/clients.py.
"""
from __future__ import annotations

import json
import time

import pytest

from playbooks.cloud import prices as P
from playbooks.runs import events as E
from tests.clients import BUCKET, ROOT, TOKEN, Cloud, ok_run
from tests.fakes import gcp as G
from tests.fakes.cloud import STANDARD
from tests.test_cost import DECOYS, FLEX, ON_DEMAND, SPOT, sku
from tests.test_cost_plan import N1_CORE, N1_DECOYS, N1_RAM

pytestmark = pytest.mark.clients

SKUS = f"/cloudbilling/v1/services/{P.SERVICE_ID}/skus"
CACHE = ROOT / ".state" / STANDARD / "prices.json"


def filler(n: int) -> list[dict]:
    """Other Compute Engine SKUs, so the v6e ones come on a later page."""
    return [sku(f"N2 Instance Core running in Region {i}", "OnDemand", [f"region-{i}"], "0", 31611000)
            for i in range(n)]


def catalog(cloud: Cloud, skus: list[dict]) -> None:
    cloud.gcp.st.skus[P.SERVICE_ID] = skus


def test_capacity_prices_each_slice_from_the_catalog_read_page_by_page_with_the_users_token(cloud: Cloud):
    # 5,008 SKUs: the on-demand and Spot v6e ones and the CPU pool's N1 ones on the second page of 5,000.
    catalog(cloud, [*DECOYS, *N1_DECOYS, *filler(4990), FLEX, ON_DEMAND, SPOT, N1_CORE, N1_RAM])
    cloud.change_inventory(capacity=["spot", "on-demand"])
    cloud.gcp.set_quota("PREEMPTIBLE-TPU-V6E-per-project-region", [({"region": "us-east5"}, 16), ({}, 0)])
    run = ok_run(cloud.invoke("capacity"))
    reads = run.calls("GET", SKUS)
    assert len(reads) == 2, run
    assert [r.query.get("pageToken") for r in reads] == [None, "5000"]
    assert all(r.query["currencyCode"] == "USD" and r.headers["authorization"] == f"Bearer {TOKEN}" for r in reads)
    day = time.strftime("%Y-%m-%d", time.gmtime())
    assert (f"v6e-16-0: spot: 16 chips x $1.403/chip-hour = $22.45/h (Cloud Billing Catalog {day})") in run.out, run.out
    assert (f"v6e-16-1: on-demand: 16 chips x $2.7/chip-hour = $43.20/h (Cloud Billing Catalog {day})") in run.out
    assert (f"default-pool: n1-standard-16: 3 nodes x $0.76/node-hour = $2.28/h (16 vCPU x $0.03161 + 60 GiB x "
            f"$0.004237: Cloud Billing Catalog {day}; a list price") in run.out, run.out
    assert ("ok: [capacity : price of the plan] the plan costs $68.03/h: 2 TPU slice(s) (32 chips) $65.65/h, "
            "default-pool $2.28/h, cluster fee $0.10/h") in run.out, run.out
    assert TOKEN not in run.out and TOKEN not in CACHE.read_text()  # the token is never shown nor kept
    # Cached with its date: a second look reads no page.
    doc = json.loads(CACHE.read_text())
    assert doc["date"] == day and doc["rates"]["spot"] == {"us-east5": 1.4033}
    assert doc["rates"]["N1 RAM"] == {"us-central1": 0.004237, "us-east5": 0.004237}
    again = ok_run(cloud.invoke("capacity"))
    assert again.calls("GET", SKUS) == [] and "$68.03/h" in again.out
    # Damaged (and so, as test_cost.py shows case by case, stale or foreign): read again, never trusted.
    CACHE.write_bytes(b"\xff{not json")
    assert len(ok_run(cloud.invoke("capacity")).calls("GET", SKUS)) == 2
    assert json.loads(CACHE.read_text())["rates"]["on-demand"]["us-east5"] == 2.7


def test_the_inventorys_prices_win_and_read_no_catalog_and_a_reservation_is_priced_only_there(cloud: Cloud):
    catalog(cloud, [ON_DEMAND, SPOT, N1_CORE, N1_RAM])
    cloud.change_inventory(prices={"on-demand": 2.5, "default-pool": 0.5, "cluster-fee": 0})
    run = ok_run(cloud.invoke("capacity"))
    assert run.calls("GET", SKUS) == []
    assert "v6e-16-0: on-demand: 16 chips x $2.5/chip-hour = $40.00/h (inventory prices:)" in run.out
    assert "the plan costs $81.50/h: 2 TPU slice(s) (32 chips) $80.00/h, default-pool $1.50/h, cluster fee $0.00/h" \
        in run.out, run.out


@pytest.mark.parametrize("fault, words", [
    ((403, G.gerror(403, "Cloud Billing API has not been used in project 123456789012 before or it is disabled.",
                    "PERMISSION_DENIED", "accessNotConfigured")),
     "could not read the Cloud Billing Catalog: HTTP 403: PERMISSION_DENIED: Cloud Billing API has not "
     "been used in project 123456789012"),
    ((503, G.unavailable()), "could not read the Cloud Billing Catalog: HTTP 503: UNAVAILABLE: The service "
                             "is currently unavailable."),
    ((200, ["not", "an", "object"]), "the Cloud Billing Catalog's answer is not what the API documents: a "
                                     "page is list, not an object with skus)"),
])
def test_a_catalog_that_fails_or_answers_otherwise_is_no_price_in_one_line_never_a_stop(cloud: Cloud, fault, words):
    catalog(cloud, [ON_DEMAND])
    cloud.gcp.server.fail("GET", SKUS, fault[0], fault[1], times=99)
    run = ok_run(cloud.invoke("capacity"))
    # Said once, for every part it leaves without a price, with the keys that price them.
    assert ("ok: [capacity : price of the plan] the plan costs at least $0.10/h (cluster fee $0.10/h); no price for "
            f"v6e-16-0, v6e-16-1, default-pool ({words}") in run.out, run.out
    said = [ln for ln in run.out.splitlines() if words in ln and not ln.startswith("  probe ")]  # the read's own line
    assert len(said) == 1 and "set prices.on-demand (USD per chip-hour) and prices.default-pool" in said[0], said
    assert "Traceback" not in run.out and not CACHE.exists()  # a failure is not cached


def test_a_sku_not_as_documented_is_named_and_the_other_options_keep_their_price(cloud: Cloud):
    bad = json.loads(json.dumps(ON_DEMAND))
    bad["pricingInfo"][0]["pricingExpression"]["tieredRates"][0]["unitPrice"]["units"] = "two"
    catalog(cloud, [bad, SPOT])
    cloud.change_inventory(capacity=["spot", "on-demand"])
    cloud.gcp.set_quota("PREEMPTIBLE-TPU-V6E-per-project-region", [({"region": "us-east5"}, 16), ({}, 0)])
    run = ok_run(cloud.invoke("capacity"))
    assert ("no price for v6e-16-1 (the Cloud Billing Catalog (" in run.out
            and "has no v6e on-demand SKU in us-east5; SKU 2549-F208-72FA (TpuV6e running in Columbus).tieredRates"
                "[0].unitPrice.units is 'two', not an int64" in run.out), run.out
    assert "v6e-16-0: spot: 16 chips x $1.403/chip-hour" in run.out


def test_a_spot_sku_no_pattern_takes_is_named_in_the_spot_line_never_a_silent_gap(cloud: Cloud):
    """The catalog's v6e Spot SKU reads otherwise than the record's pattern
    (a rename): the spot slice has no price and its line names that SKU as
    the reason, read through the real gcloud token; on-demand keeps its
    price."""
    renamed = sku("TpuV6e Spot Preemptible running in Columbus", "Preemptible", ["us-east5"], "1", 403300000)
    catalog(cloud, [ON_DEMAND, renamed])
    cloud.change_inventory(capacity=["spot", "on-demand"])
    cloud.gcp.set_quota("PREEMPTIBLE-TPU-V6E-per-project-region", [({"region": "us-east5"}, 16), ({}, 0)])
    run = ok_run(cloud.invoke("capacity"))
    assert ("no price for v6e-16-0 (the Cloud Billing Catalog (" in run.out
            and "has no v6e spot SKU in us-east5; SKU 2549-F208-72FA (TpuV6e Spot Preemptible running in Columbus, "
                "usageType Preemptible) is a v6e spot SKU by its usageType, but no pattern of the v6e record "
                "(config/tpu.py) takes it: its price is not read)" in run.out), run.out
    assert "v6e-16-1: on-demand: 16 chips x $2.7/chip-hour" in run.out


def test_train_estimates_the_cost_before_it_submits_and_records_the_basis_for_goodput(cloud: Cloud):
    """Check mode reads for real: the steps left after checkpoint 20, the
    step time a recorded run of the model measured here, the pools' option,
    the catalog's price."""
    catalog(cloud, [ON_DEMAND])
    cloud.seed_full()
    cloud.get_credentials()
    for o in ("20/commit_success.txt", "20/model_params/d/0"):
        cloud.gcp.add_object(BUCKET, f"rayjob-multi-slice/checkpoints/{o}")
    d = ROOT / ".state" / STANDARD / "training" / "rayjob-multi-slice"
    d.mkdir(parents=True, exist_ok=True)
    t0 = time.time() - 600
    steps = [{"t": t0 + i, "kind": E.STEP, "step": i, "seconds": 2.0, "source": "trainer"} for i in range(12)]
    evs = [{"t": t0 - 1, "kind": E.WORKERS_STARTED, "workers": 8, "step": None, "source": "ray_train"},
           {"t": t0 - 0.5, "kind": E.MODEL_CHECK, "model": "llama3-8b", "step": None, "source": "trainer"}, *steps]
    (d / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evs))
    try:
        run = ok_run(cloud.invoke("train", "--skip-preflight", "--set", f"base_output_directory=gs://{BUCKET}/",
                                  INVOKE_PLAYBOOK_MODE="check"))
        day = time.strftime("%Y-%m-%d", time.gmtime())
        assert (f"ok: [train : cost estimate] cost estimate: (79 steps x 2 s (median of 10 steps of run "
                f"rayjob-multi-slice)) x 32 chips = 1.404 chip-hours x $2.7 = $3.79 (2.63 min at $86.40/h; a lower "
                f"bound: start-up, compile and checkpoint saves not included (none measured)); "
                f"$2.7/chip-hour (on-demand $2.7; Cloud Billing Catalog {day})") in run.out, run.out
        assert run.changes == []
        # Check mode records nothing.
        assert E.PRICED not in (d / "events.jsonl").read_text()
    finally:
        (d / "events.jsonl").unlink(missing_ok=True)
