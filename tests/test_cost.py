"""What a run costs: the Cloud Billing Catalog's answer read as the API
documents it (pages, pricingInfo, tieredRates, units and nanos) or refused
in one line, the cache, chip-hours and dollars by cause on a recorded
timeline (`invoke goodput`, `invoke runs`), and the estimate before a
submit. The catalog against a loopback fake with the real gcloud is
tests/test_clients_prices.py."""
from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import time

import pytest
import yaml

from playbooks.cloud import prices as P
from playbooks.runs import cost, goodput
from playbooks.runs import events as E
from tests.conftest import INVOKE, ROOT, env

RECORDED = ROOT / "tests" / "data" / "timelines" / "lost-host-recovered.jsonl"


def sku(description: str, usage: str, regions: list[str], units: str | int = "2", nanos: int = 700000000,
        unit: str = "h", **extra) -> dict:
    """A SKU as the catalog lists it (the fields of its documentation)."""
    return {"name": f"services/{P.SERVICE_ID}/skus/X", "skuId": "2549-F208-72FA", "description": description,
            "category": {"serviceDisplayName": "Compute Engine", "resourceFamily": "Compute", "resourceGroup": "TPU",
                         "usageType": usage},
            "serviceRegions": regions,
            "pricingInfo": [{"effectiveTime": "2026-12-01T00:00:00Z", "summary": "",
                             "pricingExpression": {"usageUnit": unit, "usageUnitDescription": "hour",
                                                   "baseUnit": "s", "baseUnitConversionFactor": 3600,
                                                   "displayQuantity": 1,
                                                   "tieredRates": [{"startUsageAmount": 0, "unitPrice": {
                                                       "currencyCode": "USD", "units": units, "nanos": nanos}}]},
                             "currencyConversionRate": 1}],
            "serviceProviderName": "Google", **extra}


# Verbatim descriptions of live v6e SKUs (us-east5 is "Columbus"), with the
# decoys that share their words.
ON_DEMAND = sku("TpuV6e running in Columbus", "OnDemand", ["us-east5"])
SPOT = sku("TpuV6e attached to Spot Preemptible VMs running in Columbus", "Preemptible", ["us-east5"], "1", 403300000)
FLEX = sku("DWS Defined Duration V6e running in Columbus", "OnDemand", ["us-east5"], "1", 350000000)
DECOYS = [sku("Capacity Optimized TpuV6e running in Columbus", "OnDemand", ["us-east5"], "9", 0),
          sku("Commitment v1: TpuV6e running in Columbus for 1 Year", "Commit1Yr", ["us-east5"], "1", 890000000),
          sku("Reserved V6e TPU in Columbus in Calendar Mode", "OnDemand", ["us-east5"], "1", 890000000),
          sku("TpuV6e running in Netherlands", "OnDemand", ["europe-west4"], "2", 970000000),
          sku("N2 Instance Core running in Columbus", "OnDemand", ["us-east5"], "0", 31611000)]


def catalog_of(*skus: dict) -> P.Catalog:
    c = P.Catalog(time.time(), "https://cloudbilling.googleapis.com/")
    P.add_rates(c, list(skus))
    return c


# -- the catalog's answer ----------------------------------------------------------------
def test_each_option_is_its_own_sku_and_the_decoys_are_not_taken():
    c = catalog_of(*DECOYS, ON_DEMAND, SPOT, FLEX)
    assert c.rates == {"on-demand": {"us-east5": 2.7, "europe-west4": 2.97}, "spot": {"us-east5": 1.4033},
                       "flex-start": {"us-east5": 1.35}}
    assert c.problems == []


@pytest.mark.parametrize("first_page", [True, False])
def test_two_skus_for_one_option_and_region_are_a_problem_and_no_price_never_the_last_one_read(first_page):
    """A second SKU matching on-demand in us-east5 (another id, another
    price), on the same page or the next: which one is meant cannot be
    told, so that option has no price there (named in one line), whatever
    the order; the other options and regions keep theirs, and so does the
    cache."""
    other = sku("TpuV6e running in Columbus (Tier 2)", "OnDemand", ["us-east5", "europe-west4"], "3", 0)
    other["skuId"] = "AAAA-BBBB-CCCC"
    pages = [[ON_DEMAND, SPOT, other]] if first_page else [[ON_DEMAND, SPOT], [other]]
    for order in (pages, [list(reversed(p)) for p in reversed(pages)]):
        c = P.Catalog(time.time(), "https://cloudbilling.googleapis.com/")
        for page in order:
            P.add_rates(c, page)
        assert "us-east5" not in c.rates["on-demand"] and c.rates["on-demand"]["europe-west4"] == 3.0
        assert c.rates["spot"] == {"us-east5": 1.4033}
        [problem] = c.problems
        assert "two SKUs for v6e on-demand in us-east5" in problem and "2549-F208-72FA" in problem \
            and "AAAA-BBBB-CCCC" in problem and "\n" not in problem
        p = P.price(env("dev"), "on-demand", c)
        assert p.per_chip_hour is None and "two SKUs for v6e on-demand in us-east5" in p.text()
        assert p.text().startswith("no price (") and "set prices.on-demand" in p.why
        assert P.price(env("dev"), "spot", c).per_chip_hour == 1.4033
        again = P.from_cache(json.loads(json.dumps(c.doc())), "https://cloudbilling.googleapis.com/", time.time())
        assert again is not None and P.price(env("dev"), "on-demand", again).why == p.why
    # The same SKU listed twice (a page boundary read again) is one price.
    assert catalog_of(ON_DEMAND, ON_DEMAND).rates == {"on-demand": {"us-east5": 2.7}}


@pytest.mark.parametrize("change, words", [
    ({"units": "two"}, "units is 'two', not an int64"),
    ({"units": 2.5}, "units is 2.5, not an int64"),
    ({"nanos": "700000000"}, "nanos is '700000000', not an int32"),
    ({"nanos": 10**10}, "not an int32"),
    ({"currencyCode": "EUR"}, "is in 'EUR', not USD as asked"),
    ({"units": "-3"}, "costs $-2.3/chip-hour: not between 0 and 100"),
    ({"units": "9000"}, "not between 0 and 100"),
])
def test_a_price_that_is_not_what_the_api_documents_is_a_problem_and_no_price(change, words):
    bad = json.loads(json.dumps(ON_DEMAND))
    bad["pricingInfo"][0]["pricingExpression"]["tieredRates"][0]["unitPrice"].update(change)
    c = catalog_of(bad, SPOT)
    assert "on-demand" not in c.rates and c.rates["spot"] == {"us-east5": 1.4033}
    [problem] = c.problems
    assert words in problem and "SKU 2549-F208-72FA (TpuV6e running in Columbus)" in problem
    p = P.price(env("dev"), "on-demand", c)
    assert p.per_chip_hour is None and words in p.why


@pytest.mark.parametrize("mangle, words", [
    (lambda s: s.update(pricingInfo=[]), "pricingInfo is not a non-empty list"),
    (lambda s: s["pricingInfo"][0].pop("pricingExpression"), "pricingExpression is not an object"),
    (lambda s: s["pricingInfo"][0]["pricingExpression"].update(usageUnit="GiBy"), "priced per 'GiBy', not per hour"),
    (lambda s: s["pricingInfo"][0]["pricingExpression"].update(tieredRates={}), "tieredRates is not a non-empty"),
    (lambda s: s.update(serviceRegions="us-east5"), "serviceRegions is not a list"),
])
def test_a_sku_missing_what_the_api_documents_is_reported(mangle, words):
    bad = json.loads(json.dumps(ON_DEMAND))
    mangle(bad)
    c = catalog_of(bad)
    assert c.rates == {} and words in c.problems[0]


def test_missing_units_or_nanos_are_zero_as_proto3_json_leaves_them_out_and_a_price_per_minute_is_per_hour():
    s = json.loads(json.dumps(ON_DEMAND))
    s["pricingInfo"][0]["pricingExpression"]["tieredRates"][0]["unitPrice"] = {"currencyCode": "USD", "nanos": 45000000}
    s["pricingInfo"][0]["pricingExpression"]["usageUnit"] = "min"
    assert catalog_of(s).rates["on-demand"]["us-east5"] == pytest.approx(2.7)


@pytest.mark.parametrize("page, words", [
    ([], "a page is list, not an object"),
    ({"skus": {}}, "skus is not a list"),
    ({"skus": [], "nextPageToken": 5}, "nextPageToken is 5, not a string"),
])
def test_a_page_that_is_not_what_the_api_documents_is_refused(page, words):
    with pytest.raises(P.CatalogError, match=words):
        P.page_skus(page)
    assert P.page_skus({}) == ([], "")  # the last page of an empty list: no skus, no token


class Pages:
    """A connector stand-in: gcloud's token, and the catalog's pages."""

    def __init__(self, pages: list):
        self.pages, self.urls, self.headers = pages, [], []

    def getenv(self, name):
        return None

    def run(self, argv, timeout=None):
        from playbooks.core.connector import Ran
        assert argv == P.TOKEN
        return Ran(0, "ya29.token\n", "", 0.1)

    def get_json(self, url, timeout=10.0, headers=None, ca_file=None):
        self.urls.append(url)
        self.headers.append(headers)
        return self.pages[len(self.urls) - 1]


def test_every_page_is_read_with_the_token_and_a_page_token_that_comes_again_stops():
    via = Pages([{"skus": [*DECOYS], "nextPageToken": "p2"}, {"skus": [SPOT, ON_DEMAND]}])
    c = P.fetch(via)  # type: ignore[arg-type]
    assert c.rates["spot"] == {"us-east5": 1.4033} and c.rates["on-demand"]["us-east5"] == 2.7
    assert via.urls == [f"https://cloudbilling.googleapis.com/v1/services/{P.SERVICE_ID}/skus?currencyCode=USD&"
                        f"pageSize=5000",
                        f"https://cloudbilling.googleapis.com/v1/services/{P.SERVICE_ID}/skus?currencyCode=USD&"
                        f"pageSize=5000&pageToken=p2"]
    assert via.headers == [{"Authorization": "Bearer ya29.token"}] * 2
    loop = Pages([{"skus": [], "nextPageToken": "a"}, {"skus": [], "nextPageToken": "a"}])
    with pytest.raises(P.CatalogError, match="nextPageToken 'a' came twice"):
        P.fetch(loop)  # type: ignore[arg-type]
    endless = Pages([{"skus": [], "nextPageToken": str(i)} for i in range(P.MAX_PAGES + 1)])
    with pytest.raises(P.CatalogError, match=f"more than {P.MAX_PAGES} pages"):
        P.fetch(endless)  # type: ignore[arg-type]


@pytest.mark.parametrize("doc", [
    None, [], "x", {"endpoint": "https://cloudbilling.googleapis.com/"},
    {"fetched_at": "yesterday", "endpoint": "https://cloudbilling.googleapis.com/", "currency": "USD", "rates": {}},
    {"fetched_at": 1.0, "endpoint": "https://cloudbilling.googleapis.com/", "currency": "USD", "rates": {}},
    {"fetched_at": "NOW", "endpoint": "https://elsewhere/", "currency": "USD", "rates": {}},
    {"fetched_at": "NOW", "endpoint": "https://cloudbilling.googleapis.com/", "currency": "USD",
     "rates": {"on-demand": {"us-east5": -1}}},
    {"fetched_at": "NOW", "endpoint": "https://cloudbilling.googleapis.com/", "currency": "USD",
     "rates": {"bargain": {"us-east5": 1}}},
    {"fetched_at": "NOW", "endpoint": "https://cloudbilling.googleapis.com/", "currency": "USD",
     "rates": {"spot": {"us-east5": True}}},
])
def test_a_damaged_stale_or_foreign_cache_is_never_trusted(doc):
    good = catalog_of(ON_DEMAND).doc()
    now = time.time()
    if isinstance(doc, dict) and doc.get("fetched_at") == "NOW":
        doc = {**doc, "fetched_at": now}
    assert P.from_cache(doc, "https://cloudbilling.googleapis.com/", now) is None
    assert P.from_cache(good, "https://cloudbilling.googleapis.com/", now).rates == {"on-demand": {"us-east5": 2.7}}
    assert P.from_cache(good, "https://cloudbilling.googleapis.com/", now + P.STALE_AFTER + 1) is None


def test_the_cached_catalog_is_read_from_this_machine_only_never_from_a_controller_that_is_down(monkeypatch, tmp_path):
    """`invoke goodput`/`runs` price a run from the cached catalog: with a
    controller (down, or any), nothing is asked of it (no `env` over SSH
    for the endpoint override), and a cache that cannot be read is no
    catalog, never an error."""
    from playbooks.access import connectors
    from playbooks.core.errors import Unreachable

    def down(env):
        raise Unreachable("controller me@192.0.2.1 is unreachable: timed out")
    monkeypatch.setattr(connectors, "connector", down)
    cache = tmp_path / "prices.json"
    monkeypatch.setattr(P, "cache_path", lambda env: str(cache))
    remote = env("dev", controller="me@192.0.2.1")
    assert P.cached(remote) is None  # no cache yet
    cache.write_text(json.dumps(catalog_of(ON_DEMAND, SPOT).doc()))
    c = P.cached(remote)
    assert c is not None and P.price(remote, "spot", c).per_chip_hour == 1.4033
    # Without a controller, the endpoint is this machine's, still no request.
    assert P.cached(env("dev")).rates["on-demand"] == {"us-east5": 2.7}
    monkeypatch.setitem(connectors.this_machine().base_env, P.ENDPOINT_VAR, "https://127.0.0.1:9/")
    assert P.cached(env("dev")) is None  # another endpoint's cache is not this one's
    cache.unlink()
    cache.mkdir()  # not a file: cannot be read
    assert P.cached(remote) is None


def test_the_inventory_wins_and_a_reservation_is_priced_only_there():
    e = env("dev", capacity=["reservation", "spot"], reservation="my-res", prices={"spot": 1.0})
    c = catalog_of(SPOT, ON_DEMAND)
    assert P.price(e, "spot", c) == P.Price("spot", 1.0, "inventory prices:")
    r = P.price(e, "reservation", c)
    assert r.per_chip_hour is None and "set prices.reservation" in r.why
    assert not P.needs_catalog(env("dev", prices={"on-demand": 2.7}))
    assert P.needs_catalog(e) is False  # reservation: never from the catalog; spot: the inventory's
    assert P.price(env("dev"), "on-demand", "could not read the Cloud Billing Catalog: HTTP 403").why.startswith(
        "could not read")
    elsewhere = P.price(env("dev", region="us-south1", zone="us-south1-a"), "on-demand", c)
    assert "has no v6e on-demand SKU in us-south1" in elsewhere.why


# -- chip-hours and dollars on a recorded timeline ----------------------------------------
SLICES = ["tpu-group-0", "tpu-group-1"]  # the twin's slices' names (TPU_NAME), index = slice


def recorded(priced: bool = True, rates=(2.7, 2.7), names: list[str] | None = None) -> list[dict]:
    """The recorded run (two simulated slices of one 4-chip host, slice 0's
    host killed after step 16, a one-host group on slice 1 to the end),
    with the basis a GKE submit records (``names``: where each slice's
    option is known, as the twin records it); the chaos kill names its
    slice, as chaos.delete-worker records it now."""
    evs = [json.loads(x) for x in RECORDED.read_text().splitlines()]
    for e in evs:
        if e["kind"] == E.WORKER_LOST and e["source"] == "chaos":
            e["slice"] = "tpu-group-0"
    if priced:
        t0 = min(e["t"] for e in evs) - 1
        b = cost.Basis(2, 1, 4, ["on-demand", "spot"], list(rates), ["inventory prices:"], names=names or [])
        evs.append({"t": t0, "kind": E.PRICED, "step": None, "source": "train", **b.event_fields()})
    return sorted(evs, key=lambda e: e["t"])


def t_of(evs: list[dict], kind: str, **fields) -> float:
    return next(e["t"] for e in evs if e["kind"] == kind and all(e.get(k) == v for k, v in fields.items()))


def seconds(segs, a: float, b: float) -> float:
    """The seconds of the goodput segments within [a, b]."""
    return sum(max(0.0, min(y, b) - max(x, a)) for x, y, _ in segs)


def test_each_causes_chip_hours_are_its_seconds_times_the_chips_used_and_the_parts_add_up_to_the_billed():
    evs = recorded(names=SLICES)
    _, segs = goodput.account_with_segments(evs, "r")
    c = cost.report(evs, segs, goodput.CAUSES, cost.recorded_basis(evs), True)
    start, end = segs[0][0], segs[-1][1]
    kill = t_of(evs, E.WORKER_LOST, source="chaos")
    # Billed: both hosts until slice 0's is killed, then slice 1's alone.
    assert c["chip_hours"] == pytest.approx((seconds(segs, start, kill) * 8 + seconds(segs, kill, end) * 4) / 3600,
                                            abs=1e-4)
    # Every chip-hour once: the productive, each cause's and the held add up to the billed.
    assert c["productive_chip_hours"] + sum(c["badput_chip_hours"].values()) == pytest.approx(c["chip_hours"],
                                                                                             abs=1e-3)
    assert c["used_chip_hours"] == pytest.approx(c["chip_hours"] - c["badput_chip_hours"][cost.HELD], abs=1e-4)
    # A second's chip-hours: the scheduling wait held every chip.
    sched = sum(b - a for a, b, k in segs if k == "scheduling")
    assert c["badput_chip_hours"]["scheduling"] == pytest.approx(sched * 8 / 3600, abs=1e-4)
    # One price of every slice: it, never made up for one.
    same = recorded(rates=(2.7, 2.7))
    one = cost.report(same, segs, goodput.CAUSES, cost.recorded_basis(same), True)
    assert one["per_chip_hour"] == 2.7 and one["cost"] == pytest.approx(one["chip_hours"] * 2.7, abs=0.01)
    for cause, h in one["badput_chip_hours"].items():
        assert one["badput_cost"][cause] == pytest.approx(h * 2.7, abs=0.006)


def swapped(evs: list[dict]) -> list[dict]:
    """The same run with its slices' names swapped: slice 1 lost, slice 0 going on."""
    swap = {"tpu-group-0": "tpu-group-1", "tpu-group-1": "tpu-group-0"}
    return [{**e, **({"slice": swap[e["slice"]]} if e.get("slice") in swap else {})} for e in evs]


@pytest.mark.parametrize("lost, survivor_rate", [("slice 0 (on-demand)", 1.4033), ("slice 1 (spot)", 2.7)])
def test_a_mixed_price_run_that_loses_a_slice_prices_the_one_slice_period_at_the_survivors_price(lost, survivor_rate):
    """One on-demand ($2.7) and one Spot ($1.4033) slice: while both run,
    each at its own price; after the loss, the surviving slice's, never the
    mean ($2.052) of the two."""
    evs = recorded(rates=(2.7, 1.4033), names=SLICES)
    if lost.startswith("slice 1"):
        evs = swapped(evs)
    _, segs = goodput.account_with_segments(evs, "r")
    c = cost.report(evs, segs, goodput.CAUSES, cost.recorded_basis(evs), True)
    start, end = segs[0][0], segs[-1][1]
    kill = t_of(evs, E.WORKER_LOST, source="chaos")
    both = seconds(segs, start, kill) * 4 * (2.7 + 1.4033) / 3600
    alone = seconds(segs, kill, end) * 4 * survivor_rate / 3600
    assert c["cost"] == pytest.approx(round(both + alone, 2), abs=0.006)
    assert c["per_chip_hour"] is None and "slice 0 on-demand $2.7, slice 1 spot $1.403 per chip-hour" in c["price"]
    # The productive steps of the one-slice group: the survivor's price.
    regroup = t_of(evs, E.WORKER_STARTED, workers=1)
    after = sum(min(b, end) - max(a, regroup) for a, b, k in segs if k == "productive" and b > regroup)
    before = c["productive_chip_hours"] - after * 4 / 3600
    assert c["productive_cost"] == pytest.approx(before * (2.7 + 1.4033) / 2 + after * 4 / 3600 * survivor_rate,
                                                 abs=0.006)


def priced_as_a_range(evs: list[dict], lost_by: str) -> tuple[dict, list]:
    """The run's cost report and the range it must give: both
    slices (on-demand $2.7, Spot $1.4033) until the loss recorded by
    ``lost_by``, then one slice at the Spot price to the on-demand one."""
    _, segs = goodput.account_with_segments(evs, "r")
    c = cost.report(evs, segs, goodput.CAUSES, cost.recorded_basis(evs), True)
    start, end = segs[0][0], segs[-1][1]
    lost = t_of(evs, E.WORKER_LOST, source=lost_by)
    both = seconds(segs, start, lost) * 4 * (2.7 + 1.4033) / 3600
    one = seconds(segs, lost, end) * 4 / 3600
    return c, [pytest.approx(round(both + one * 1.4033, 2), abs=0.006),
               pytest.approx(round(both + one * 2.7, 2), abs=0.006)]


def test_where_which_slice_survived_is_not_recorded_the_dollars_are_the_range_never_the_mean():
    """A GKE submit does not record which replica is on which pool: while one
    slice of two is held, its price is the Spot one's to the on-demand one's."""
    evs = recorded(rates=(2.7, 1.4033))
    c, want = priced_as_a_range(evs, "chaos")
    assert c["cost"] == want
    assert cost.cost_text(c) == f"{c['chip_hours']:.4g} chip-hours, ${c['cost'][0]:,.2f}-{c['cost'][1]:,.2f}"
    # Every slice held (the scheduling wait): exact.
    assert isinstance(c["badput_cost"]["scheduling"], float)


POOLS = ["v6e-16-0", "v6e-16-1"]  # GKE Standard: slice i is node pool i (its option: options[i])


def on_gke(evs: list[dict], lost_on: str, pools: bool = True) -> list[dict]:
    """The recorded run as GKE records it: the priced event with each
    slice's node pool and no names, the pod watch's first look (each
    replica's pod placed on a node of its pool, before the run), and slice
    0's (tpu-group-0's) loss a preemption of its pod with its node.
    ``lost_on``: the pool replica tpu-group-0 is on (the other replica is
    on the other pool: KubeRay pins neither)."""
    other = next(p for p in POOLS if p != lost_on)
    t0 = min(e["t"] for e in evs) - 5
    out = []
    for e in evs:
        if e["kind"] == E.PRICED:
            e = {**e, "names": [], **({"pools": POOLS} if pools else {})}
        elif e["kind"] == E.WORKER_LOST and e["source"] == "chaos":
            e = {**e, "source": "pods", "by": "preemption", "pod": "w-0", "host": None}
        out.append(e)
    for i, (replica, pool) in enumerate((("tpu-group-0", lost_on), ("tpu-group-1", other))):
        out.append({"t": t0, "kind": E.SCHEDULED, "step": None, "source": "pods", "pod": f"w-{i}",
                    "slice": replica, "node": f"gke-{pool}-0000", **({"pool": pool} if pools else {})})
    return sorted(out, key=lambda e: e["t"])


@pytest.mark.parametrize("lost_on, survivor_rate", [("v6e-16-1", 2.7), ("v6e-16-0", 1.4033)])
def test_on_gke_the_pods_node_pools_price_the_one_slice_period_at_the_survivors_price_not_a_range(
        lost_on, survivor_rate):
    """An on-demand ($2.7, pool v6e-16-0) and a Spot ($1.4033, pool
    v6e-16-1) slice: the replica lost is the one on ``lost_on`` (the
    scheduled events say which pool each replica's node is in); the group
    goes on with the other, priced at its own option's price."""
    evs = on_gke(recorded(rates=(2.7, 1.4033)), lost_on)
    basis = cost.recorded_basis(evs)
    assert basis.pools == POOLS and basis.names == []
    _, segs = goodput.account_with_segments(evs, "r")
    c = cost.report(evs, segs, goodput.CAUSES, basis, True)
    start, end = segs[0][0], segs[-1][1]
    lost = t_of(evs, E.WORKER_LOST, source="pods")
    both = seconds(segs, start, lost) * 4 * (2.7 + 1.4033) / 3600
    alone = seconds(segs, lost, end) * 4 * survivor_rate / 3600
    assert isinstance(c["cost"], float) and c["cost"] == pytest.approx(round(both + alone, 2), abs=0.006)
    assert c["chip_hours"] == pytest.approx((seconds(segs, start, lost) * 8 + seconds(segs, lost, end) * 4) / 3600,
                                            abs=1e-4)
    assert all(not isinstance(m, list) for m in c["badput_cost"].values())
    assert "a range" not in "\n".join(cost.header_lines(c))


def test_on_gke_without_the_pods_pools_which_slice_survived_is_a_range():
    """The same run, its events without pools (a watch that could not read
    the nodes, a run recorded before): the one-slice period is the range."""
    for evs in (on_gke(recorded(rates=(2.7, 1.4033)), "v6e-16-1", pools=False),
                # the pools of the slices recorded, the replicas' not: still not known
                [{k: v for k, v in e.items() if k != "pool"} for e in on_gke(recorded(rates=(2.7, 1.4033)),
                                                                              "v6e-16-1")]):
        c, want = priced_as_a_range(evs, "pods")
        assert c["cost"] == want
        assert "a range" in "\n".join(cost.header_lines(c))


def test_the_priced_event_on_gke_standard_records_each_slices_node_pool():
    """What `train` records at its submit: slice i's node pool (what its
    option was read from), none on Autopilot (it makes its own nodes)."""
    from playbooks.core.facts import ABSENT
    from playbooks.job.spec import build_job
    from playbooks.plays import train

    def look(fact):
        return ABSENT if fact.name.startswith("cluster") else []

    for name, pools in (("dev", ["v6e-16-0", "v6e-16-1"]), ("dev-autopilot", None)):
        e = env(name, prices={"on-demand": 2.7, "spot": 1.4})
        b = train.basis_fact(build_job(e, "llama3-8b")).derive(look)
        assert train.slice_pools(e) == pools and (b.pools or None) == pools
        assert cost.basis_of({"kind": E.PRICED, **b.event_fields()}).pools == (pools or [])
        assert ("pools" in b.event_fields()) == bool(pools)


def test_a_replica_seen_on_two_pools_or_two_on_one_pool_is_not_known():
    b = cost.Basis(2, 1, 4, ["on-demand", "spot"], [2.7, 1.4], pools=POOLS)
    sched = [{"kind": E.SCHEDULED, "slice": s, "pool": p} for s, p in
             (("tpu-group-0", "v6e-16-0"), ("tpu-group-0", "v6e-16-1"), ("tpu-group-1", "v6e-16-1"))]
    where = cost.placed(sched)
    assert where == {"tpu-group-1": "v6e-16-1"}
    assert cost.resolve(b, where).names == ["", "tpu-group-1"]
    # tpu-group-1 held alone: the Spot slice's; tpu-group-0 held alone: on the slice no name is known of.
    r = cost.resolve(b, where)
    assert r.rate_sum(cost.Held(frozenset({"tpu-group-1"}), 1)) == (1.4, 1.4)
    assert r.rate_sum(cost.Held(frozenset({"tpu-group-0"}), 1)) == (2.7, 2.7)
    assert r.rate_sum(cost.Held(frozenset(), 1)) == (1.4, 2.7)  # which one not known: the range
    two = cost.placed([{"kind": E.SCHEDULED, "slice": s, "pool": "v6e-16-0"} for s in ("tpu-group-0", "tpu-group-1")])
    assert cost.resolve(b, two).names == []  # two replicas on one pool: neither known
    assert cost.basis_of({**b.event_fields(), "pools": ["v6e-16-0"]}).pools == []  # one a slice, or none


@pytest.mark.parametrize("platform", ["twin", "twin-sick", "gke"])
def test_a_returned_slice_is_billed_from_its_return_until_the_grow_as_held_not_training(platform):
    """Slice 0 is back (the twin: its host started again, whole or sick;
    GKE: a pod placed on its new node) before the elastic group grows to it:
    its chips are billed from then, not used until the grow."""
    evs = recorded(rates=(2.7, 1.4033), names=SLICES)
    end = max(e["t"] for e in evs)
    regroup = t_of(evs, E.WORKER_STARTED, workers=1)
    back, grow = regroup + 5.0, regroup + 12.5
    assert grow < end - 1
    if platform.startswith("twin"):
        evs.append({"t": back, "kind": E.HOST_SICKENED if platform == "twin-sick" else E.HOST_BACK, "step": None,
                    "source": "chaos", "host": "tpu-group-0-0", "slice": "tpu-group-0", "job": "rayjob-elastic-8b-3"})
    else:  # the pods: a preemption takes slice 0's node, its pod is placed on a node again
        for e in evs:
            if e["kind"] == E.WORKER_LOST and e["source"] == "chaos":
                e.update(source="pods", by="preemption", pod="w-0", host=None)
        evs.append({"t": back, "kind": E.SCHEDULED, "step": None, "source": "pods", "pod": "w-0b",
                    "slice": "tpu-group-0", "node": "n-0b"})
    evs += [{"t": grow, "kind": E.WORKER_STARTED, "step": None, "rank": r, "workers": 2, "slice": s, "host": "0",
             "source": "trainer", "job": "rayjob-elastic-8b-3"} for r, s in enumerate(SLICES)]
    evs.sort(key=lambda e: e["t"])
    _, segs = goodput.account_with_segments(evs, "r")
    c = cost.report(evs, segs, goodput.CAUSES, cost.recorded_basis(evs), True)
    held = seconds(segs, back, grow) * 4 / 3600
    assert c["badput_chip_hours"][cost.HELD] == pytest.approx(held, abs=1e-4)
    assert c["badput_cost"][cost.HELD] == pytest.approx(round(held * 2.7, 2), abs=0.006)  # slice 0: on-demand
    kill = t_of(evs, E.WORKER_LOST, step=None)
    start = segs[0][0]
    billed = seconds(segs, start, kill) * 8 + seconds(segs, kill, back) * 4 + seconds(segs, back, end) * 8
    assert c["chip_hours"] == pytest.approx(billed / 3600, abs=1e-4)
    assert c["used_chip_hours"] == pytest.approx(c["chip_hours"] - held, abs=1e-4)
    text = "\n".join(goodput.lines({**goodput.account(evs, "r"), "cost": c}))
    assert "held, not training (billed, not in the worker group)" in text and "$" in text.split("held, not")[1]


def test_a_pod_that_failed_keeps_its_node_billed_a_preempted_one_does_not():
    evs = recorded(rates=(2.7, 2.7), names=SLICES)
    for e in evs:
        if e["kind"] == E.WORKER_LOST and e["source"] == "chaos":
            e.update(source="pods", by="pod failed", pod="w-0", host=None)
    _, segs = goodput.account_with_segments(evs, "r")
    c = cost.report(evs, segs, goodput.CAUSES, cost.recorded_basis(evs), True)
    assert c["chip_hours"] == pytest.approx(seconds(segs, segs[0][0], segs[-1][1]) * 8 / 3600, abs=1e-4)
    regroup = t_of(evs, E.WORKER_STARTED, workers=1)
    assert c["badput_chip_hours"][cost.HELD] == pytest.approx(seconds(segs, regroup, segs[-1][1]) * 4 / 3600,
                                                              abs=1e-4)


def test_each_priced_event_prices_the_time_from_it_a_resubmits_price_not_the_whole_run():
    evs = recorded(rates=(2.7, 2.7), names=SLICES)
    _, segs = goodput.account_with_segments(evs, "r")
    mid = t_of(evs, E.WORKER_STARTED, workers=1)
    again = cost.Basis(2, 1, 4, ["spot", "spot"], [1.0, 1.0], ["inventory prices:"], names=SLICES)
    evs2 = sorted([*evs, {"t": mid, "kind": E.PRICED, "step": None, "source": "train", **again.event_fields()}],
                  key=lambda e: e["t"])
    c = cost.report(evs2, segs, goodput.CAUSES, cost.recorded_basis(evs2), True)
    start, end = segs[0][0], segs[-1][1]
    kill = t_of(evs, E.WORKER_LOST, source="chaos")
    first = (seconds(segs, start, kill) * 8 + seconds(segs, kill, mid) * 4) / 3600
    assert c["cost"] == pytest.approx(round(first * 2.7 + seconds(segs, mid, end) * 4 / 3600 * 1.0, 2), abs=0.006)
    assert [p["slices"][0]["per_chip_hour"] for p in c["prices"]] == [2.7, 1.0]
    assert "from 2" in "\n".join(cost.header_lines(c))  # each submission's prices, from its time


def test_the_gap_between_two_jobs_is_billed_held_not_training():
    evs = recorded(rates=(2.7, 2.7), names=SLICES)
    end = max(e["t"] for e in evs)
    evs += [{"t": end + 1, "kind": E.JOB_END, "step": None, "source": "train", "status": "STOPPED",
             "job": "rayjob-elastic-8b-3"},
            {"t": end + 61, "kind": E.SUBMITTED, "step": None, "source": "train", "job": "rayjob-elastic-8b-4"},
            {"t": end + 70, "kind": E.JOB_END, "step": None, "source": "train", "status": "FAILED",
             "job": "rayjob-elastic-8b-4"}]
    _, segs = goodput.account_with_segments(evs, "r")
    c = cost.report(evs, segs, goodput.CAUSES, cost.recorded_basis(evs), True)
    # Slice 1's host alive through the gap: 60 s x 4 chips held, not training (slice 0's was killed).
    gap = seconds(segs, end + 1, end + 61)
    assert gap == pytest.approx(60)
    assert c["badput_chip_hours"][cost.HELD] >= gap * 4 / 3600 - 1e-6


def test_a_slice_without_a_price_leaves_the_run_with_chip_hours_only_never_a_figure():
    evs = recorded(rates=(2.7, None), names=SLICES)
    _, segs = goodput.account_with_segments(evs, "r")
    c = cost.report(evs, segs, goodput.CAUSES, cost.recorded_basis(evs), True)
    assert c["chip_hours"] > 0 and "cost" not in c and c["per_chip_hour"] is None
    assert cost.cost_text(c) == f"{c['chip_hours']:.4g} chip-hours"


@pytest.fixture
def gke_cli(tmp_path, hermetic):
    """`invoke` on a GKE environment whose runs are recorded timelines
    (goodput and runs read no cloud)."""
    name = "cost-test"
    base = yaml.safe_load((ROOT / "inventory.yaml").read_text())["environments"]["dev"]
    inv = tmp_path / "inventory.yaml"

    def run(*args: str, **keys) -> subprocess.CompletedProcess:
        inv.write_text(yaml.safe_dump({"default": name, "environments": {name: {**base, **keys}}}))
        return subprocess.run([INVOKE, *args], cwd=ROOT, env={**hermetic, "INVOKE_PLAYBOOK_INVENTORY": str(inv),
                                                             "TZ": "UTC"},
                              capture_output=True, text=True, timeout=120)

    def keep(run_name: str, evs: list[dict]) -> None:
        d = ROOT / ".state" / name / "training" / run_name
        d.mkdir(parents=True, exist_ok=True)
        (d / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evs))

    run.keep = keep  # type: ignore[attr-defined]
    yield run
    shutil.rmtree(ROOT / ".state" / name, ignore_errors=True)


def test_goodput_shows_the_runs_cost_and_each_causes_and_runs_lists_every_run(gke_cli):
    gke_cli.keep("priced", recorded())
    unpriced = recorded(priced=False)
    for e in unpriced:
        e["t"] -= 3600  # an hour older
    gke_cli.keep("older", unpriced)
    r = gke_cli("goodput", "--run=priced", "--json")
    assert r.returncode == 0, r.stderr
    c = json.loads(r.stdout)["cost"]
    assert c["basis"] == "recorded when the run was submitted" and c["chips"] == 8
    text = gke_cli("goodput", "--run=priced").stdout
    assert (f"cost: {c['chip_hours']:.4g} chip-hours billed, ${c['cost']:,.2f} ({c['used_chip_hours']:.4g} used by "
            f"the worker group), 8 chips\n    at $2.7/chip-hour") in text, text
    assert f"${c['badput_cost']['restart']:,.2f}" in text
    # Not recorded (a run submitted before prices were): the inventory's price now, said so.
    old = json.loads(gke_cli("goodput", "--run=older", "--json", prices={"on-demand": 2.0}).stdout)["cost"]
    assert old["basis"].startswith("not recorded with the run") and old["per_chip_hour"] == 2.0
    assert old["chips"] == 32  # the environment's 2 x v6e-16
    # `invoke runs`: both, newest first, with their cost; --json's times are seconds since the epoch.
    doc = json.loads(gke_cli("runs", "--json", prices={"on-demand": 2.0}).stdout)
    rows = doc["runs"]
    assert [x["run"] for x in rows] == ["priced", "older"]
    assert rows[0]["jobs"] == [{"job": "rayjob-elastic-8b-3", "end": max(e["t"] for e in recorded()),
                                "status": "SUCCEEDED"}]
    # The environment's cost: read from the cluster, here unknown (no gcloud account), said so.
    assert doc["environment_cost"]["unknown"].startswith("the cluster could not be read"), doc["environment_cost"]
    assert rows[0]["cost"] == c["cost"] and rows[0]["state"] == "SUCCEEDED" and rows[0]["steps"] == 60
    assert rows[0]["target_steps"] == 60 and rows[0]["last_event"] == max(e["t"] for e in recorded())
    # What the recorded run did not record is unknown, never made up.
    assert (rows[0]["model"], rows[0]["final_loss"], rows[0]["mfu"]) == (None, None, None)
    table = gke_cli("runs").stdout.splitlines()
    assert table[0].split() == ["run", "model", "state", "jobs", "steps", "of", "wall", "goodput", "loss", "MFU",
                                "saves", "chip-hours", "cost", "last", "event"]
    cells = table[1].split()
    assert cells[:6] == ["priced", "-", "SUCCEEDED", "1", "60", "60"] and f"${c['cost']:,.2f}" in table[1]
    # The last event with its date and zone (the test's TZ: UTC).
    assert table[1].endswith(time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(rows[0]["last_event"]))), table
    # A run without a price: "no price" in its row, and why once, naming it (never "no price: no price").
    assert "no price" in table[2]
    assert table[3:-1] == ["older: no price (the catalog was not read: set prices.on-demand (USD per chip-hour) in "
                           "the inventory)"], table
    assert table[-1].startswith("environment cost: unknown: the cluster could not be read"), table


def test_the_estimate_is_steps_left_times_the_step_time_measured_times_the_chips_times_the_price():
    b = cost.Basis(2, 4, 4, ["on-demand"] * 2, [2.7, 2.7], ["Cloud Billing Catalog 2026-12-04"])
    line = cost.estimate(79, cost.StepTime(2.0, "median of 57 steps of run r"), b)
    assert line == ("cost estimate: (79 steps x 2 s (median of 57 steps of run r)) x 32 chips = 1.404 chip-hours x "
                    "$2.7 = $3.79 (2.63 min at $86.40/h; a lower bound: start-up, compile and checkpoint saves not "
                    "included (none measured)); $2.7/chip-hour (on-demand $2.7; Cloud Billing Catalog 2026-12-04)"), line
    # The run's measured start-up, compile (per job) and checkpoint saves (per step) are added, and said.
    over = cost.Overhead(30.0, 12.0, 0.1, "r")
    line = cost.estimate(79, cost.StepTime(2.0, "median of 57 steps of run r"), b, overhead=over)
    assert line.startswith("cost estimate: (79 steps x 2 s (median of 57 steps of run r) + 30 s start-up + 12 s "
                           "compile + 7.9 s checkpoint saves (run r's, per job)) x 32 chips = 1.848 chip-hours x $2.7 "
                           "= $4.99 (3.47 min at $86.40/h; at least: waiting for capacity and incidents not "
                           "included)"), line
    report = goodput.account(recorded(priced=False), "r")
    o = cost.overhead_of(report, "r")
    assert o is not None and o.startup_s == report["badput_s"]["startup"] > 0
    assert o.checkpoint_per_step_s == pytest.approx(report["badput_s"]["checkpoint"] / report["steps"]["counted"])
    assert "unknown ($86.40/h while it runs)" in cost.estimate(79, None, b, why="none measured")
    sim = cost.Basis(2, 1, 4, simulated=True)
    assert cost.estimate(20, cost.StepTime(0.3, "x"), sim) == (
        "cost estimate: (20 steps x 0.3 s (x)) x 8 chips = 0.01333 chip-hours (a lower bound: start-up, compile and "
        "checkpoint saves not included (none measured)); no price: a local run's chips are simulated")
    # Autopilot: its ComputeClass picks each node's option, not recorded: the cheapest to the dearest.
    auto = cost.env_basis(env("dev", mode="autopilot", capacity=["spot", "on-demand"],
                              prices={"spot": 1.0, "on-demand": 3.0}), None, None)
    assert auto.rates == [None, None] and auto.ranges == [[1.0, 3.0], [1.0, 3.0]] and auto.per_chip_hour is None
    assert "Autopilot's ComputeClass picks each node's option among spot, on-demand: not recorded" in auto.price_text()
    line = cost.estimate(79, cost.StepTime(2.0, "m"), auto)
    assert "= $" in line and "-" in line.split("= $")[1].split(" ")[0], line


def test_the_step_time_is_the_runs_own_else_the_newest_run_of_its_model_past_each_groups_first_steps():
    evs = recorded(priced=False)
    vals = cost.group_step_seconds(evs, 2)  # the two-host group's steps, past its first two
    own = cost.measured([("r", evs)], "r", "llama3-8b", 2)
    assert own is not None and own.basis == f"median of {len(vals)} steps of run r"
    assert own.seconds == pytest.approx(statistics.median(vals))
    assert len(vals) < len(cost.group_step_seconds(evs))  # the one-host group's are not taken when there are these
    # Another run counts only when it trained the same model (its model_check says which).
    said = [*evs, {"t": evs[-1]["t"], "kind": E.MODEL_CHECK, "model": "llama3-8b", "step": None}]
    assert cost.measured([("other", said), ("r", [])], "r", "llama3-8b", 2) == cost.StepTime(
        own.seconds, f"median of {len(vals)} steps of run other", "other")
    assert cost.measured([("other", said)], "r", "llama3-70b", 2) is None
    assert cost.measured([("other", evs)], "r", "llama3-8b", 2) is None  # no model said: not taken


def test_runs_gives_the_model_the_steps_asked_the_final_loss_and_the_mfu_from_the_timeline():
    """From the events the trainer records: its model_check, each step's
    loss and TFLOP/s per device, jax_initialized's steps; past each worker
    group's compile steps for the MFU, as the summary after `train`."""
    from playbooks.runs import run_list
    evs = recorded()
    for e in evs:
        if e["kind"] == E.STEP:
            e.update(loss=10 - e["step"] / 10, tflops_per_device=459.0 if e["step"] > 1 else 1.0)
    evs.insert(0, {"t": evs[0]["t"], "kind": E.MODEL_CHECK, "step": None, "source": "trainer", "model": "llama3-8b",
                   "expected_billion": 8.03})
    report, segs = goodput.account_with_segments(evs, "r")
    report["cost"] = cost.report(evs, segs, goodput.CAUSES, cost.recorded_basis(evs), True)
    from playbooks.runs.train_summary import Summary
    r = run_list.row("r", evs, report, Summary(chip="v6e"))
    assert (r["model"], r["target_steps"], r["final_loss"], r["mfu"]) == ("llama3-8b", 60, pytest.approx(4.1), 0.5)
    # A local run's chips are CPU devices: no MFU against a TPU peak they never had.
    assert run_list.row("r", evs, report, Summary(chip="v6e", simulated=True))["mfu"] is None
    assert run_list.cells(r)[:10] == ["r", "llama3-8b", "SUCCEEDED", "1", "60", "60", "1.5 min", "30.6%", "4.100",
                                      "50.00%"]


def test_a_task_that_only_looks_keeps_its_newest_log_folders_and_nothing_else_is_pruned(gke_cli):
    """`watch invoke runs` must not grow .state/<env>/runs/ for days: of each
    task that only looks, the newest KEEP_LOGS folders stay; another task's,
    one holding a driver log and the runs' timelines are never pruned."""
    from playbooks.cli.session import KEEP_LOGS
    runs = ROOT / ".state" / "cost-test" / "runs"
    gke_cli.keep("priced", recorded())
    old = [f"20260101-{i:06d}-runs" for i in range(KEEP_LOGS + 5)]
    kept_log = "20250101-000000-runs"
    others = ["20250101-000000-train", "20250101-000001-status", "20250101-000002-runsx", "notes"]
    for name in [*old, kept_log, *others]:
        (runs / name).mkdir(parents=True)
        (runs / name / "001-x.log").write_text("x")
    (runs / kept_log / "job.log").write_text("a driver log")
    r = gke_cli("runs")
    assert r.returncode == 0, r.stderr
    left = sorted(p.name for p in runs.iterdir())
    mine = [n for n in left if n.endswith("-runs") and n != kept_log]
    assert len(mine) == KEEP_LOGS and mine[:-1] == old[-(KEEP_LOGS - 1):], mine  # the newest: this run's own
    assert kept_log in left and all(n in left for n in others), left
    assert (ROOT / ".state" / "cost-test" / "training" / "priced" / "events.jsonl").is_file()
