"""What a TPU chip-hour of the environment's generation costs, per capacity option, in the
environment's region: from the inventory's ``prices:`` (which wins), else
Google's Cloud Billing Catalog API, read with the user's credentials and
cached under ``.state/<env>/prices.json`` with its date. No figure is ever
made up: an option with no price known is "no price" (chip-hours only).

The catalog (https://cloud.google.com/billing/v1/how-tos/catalog-api):
``GET https://cloudbilling.googleapis.com/v1/services/SERVICE_ID/skus``,
pages of up to 5000 SKUs (``pageSize``), ``nextPageToken`` empty or absent
on the last; each SKU has ``description``, ``category.usageType``,
``serviceRegions`` and ``pricingInfo[].pricingExpression`` with
``usageUnit`` and ``tieredRates[].unitPrice`` (Money: ``currencyCode``,
``units`` an int64 sent as a string, ``nanos`` an int32). An OAuth bearer
token is accepted in place of an API key (the discovery document: ``key``
is "Required unless you provide an OAuth 2.0 token").

Which SKUs: TPU v5e, v5p, v6e and TPU7x are in the Compute Engine service
(6F81-5844-456A), one SKU per option and region (or one for several:
``serviceRegions``). On-demand, flex-start, Calendar mode and a "Capacity
Optimized" SKU are all usageType OnDemand, so each option is matched by its
description from its start (and its usageType), the region by
``serviceRegions`` (descriptions name cities). Each generation's patterns
are its record's (``config/tpu.py``), each with the catalog answer it was
checked against (docs/tpu-generations.md, [S26]-[S28]); an option whose
known SKU does not say what its hour is of (TPU7x's) is the record's
``unpriced``, said in the price line. Commitments and Calendar mode are not
capacity options of this project; a reservation is priced as the inventory
says (``prices.reservation``: it is often prepaid).

A Spot price never goes missing in silence: a SKU of the generation (its
record's ``sku_family``) that is Spot by its usageType (Preemptible) or its
words (Spot, Preemptible) but that no pattern takes is a problem named in
one line, and the spot price line gives it as the reason there is none.

The cluster's CPU pool is N1 (the tutorial's n1-standard-16), in the same
service: one SKU per vCPU-hour (``N1 Predefined Instance Core running in
...``, usageUnit ``h``) and one per GiB-hour of RAM (``N1 Predefined
Instance Ram running in ...``, usageUnit ``GiBy.h``), usageType OnDemand,
each for a region or several (``serviceRegions``: "Americas" is one SKU for
many), as SkyPilot's fetcher prices N1 VMs (sky/catalog/data_fetchers/
fetch_gcp.py, ``SERIES_TO_DESCRIPTION['n1']``: "N1 Predefined Instance",
its Core or Ram). Matched from the description's start: the Spot
("Spot Preemptible N1 ..."), commitment ("Commitment v1: N1 ...") and
sole-tenancy SKUs begin otherwise. Read with the TPU SKUs, in the same
pages (``cluster_prices.py`` prices the pool from them).

Where no catalog is read (a dry run starts no process; a read that
failed), a price says so once, with how to get one (``how``): the
inventory's ``prices:`` key, and in a dry run a run without --dry, which
reads the catalog.
"""
from __future__ import annotations

import json
import math
import re
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from playbooks.access import connectors
from playbooks.config import paths
from playbooks.config.choices import capacity_option
from playbooks.config.schema import DEFAULT_POOL, MAX_PRICE, PRICE_UNITS, Environment, capacities
from playbooks.config.tpu import GENERATIONS as GENERATIONS_BY_NAME
from playbooks.config.tpu import V6E, Generation, generation
from playbooks.core.connector import Connector
from playbooks.core.errors import ProbeFailed
from playbooks.core.facts import ABSENT, Fact

SERVICE_ID = "6F81-5844-456A"  # Compute Engine
ENDPOINT = "https://cloudbilling.googleapis.com/"
API = "cloudbilling.googleapis.com"  # the Cloud Billing API: enabled by `prereqs` when the catalog is read
# gcloud's own override of this API's endpoint (property
# api_endpoint_overrides/cloudbilling), and its custom CA bundle.
ENDPOINT_VAR = "CLOUDSDK_API_ENDPOINT_OVERRIDES_CLOUDBILLING"
CA_VAR = "CLOUDSDK_CORE_CUSTOM_CA_CERTS_FILE"
CURRENCY = "USD"
PAGE_SIZE = 5000
MAX_PAGES = 40          # Compute Engine lists ~32,000 SKUs: 7 pages
STALE_AFTER = 24 * 3600  # a cached catalog older than a day is read again
TOKEN = ["gcloud", "auth", "print-access-token"]

def skus(gen: Generation) -> dict[str, tuple[re.Pattern, str]]:
    """Each option's SKU of a generation, by its description (from its
    start) and usageType."""
    return {o: (re.compile(pattern, re.I), usage) for o, (pattern, usage) in gen.skus.items()}


SKUS = skus(V6E)
PER_HOUR = {"h": 1.0, "min": 60.0, "s": 3600.0}  # usageUnit -> its price x this = per hour

# The CPU pool's N1 SKUs (the module says where from): part -> (description
# from its start, usageType, usageUnit -> its price x this = per hour, the unit).
N1_CORE, N1_RAM = "N1 core", "N1 RAM"
N1_SKUS: dict[str, tuple[re.Pattern, str, dict[str, float], str]] = {
    N1_CORE: (re.compile(r"N1 Predefined Instance Core running in ", re.I), "OnDemand", PER_HOUR, "vCPU-hour"),
    N1_RAM: (re.compile(r"N1 Predefined Instance Ram running in ", re.I), "OnDemand", {"GiBy.h": 1.0},
             "GiB-hour")}
DRY_RUN = "not read in a dry run"  # the catalog's value in a dry run: no process starts


def how(keys: list[str] | tuple[str, ...], why: str) -> str:
    """How to get the prices of ``keys`` (the inventory's ``prices:``
    keys) that the catalog did not give for ``why``."""
    given = " and ".join(f"prices.{k} (USD per {PRICE_UNITS.get(k, 'hour')})" for k in keys)
    run = (", or run without --dry so the Cloud Billing Catalog is read (`invoke capacity` and playbook.mode=check "
           "change nothing)") if why == DRY_RUN else ""
    return f"set {given} in the inventory{run}"


class CatalogError(Exception):
    """The catalog's answer is not what the API documents."""


@dataclass(frozen=True)
class Price:
    """One option's price per chip-hour, or None (``why`` says why not)."""

    option: str
    per_chip_hour: float | None
    source: str = ""   # "inventory prices:", "Cloud Billing Catalog 2026-12-04"
    why: str = ""
    key: str = ""      # no price: the inventory's prices: key that gives one, when ``why`` does not say it

    @property
    def said(self) -> str:
        """Why there is no price, and how to get one."""
        return f"{self.why}: {how([self.key], self.why)}" if self.key else self.why

    def text(self) -> str:
        if self.per_chip_hour is None:
            return f"no price ({self.said})"
        return f"${self.per_chip_hour:.4g}/chip-hour ({self.source})"


@dataclass
class Catalog:
    """One generation's rates read from the catalog: option -> region -> USD
    per chip-hour, when it was read, and what could not be read of it;
    ``unpriced``: option -> region -> why the catalog's answer gives no one
    price there (two SKUs for it). ``read_from``: while pages are read, the
    SKU each rate came from (not cached)."""

    fetched_at: float
    endpoint: str
    rates: dict[str, dict[str, float]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    tpu: str = V6E.name
    unpriced: dict[str, dict[str, str]] = field(default_factory=dict)
    read_from: dict[tuple[str, str], tuple[str, float]] = field(default_factory=dict, repr=False, compare=False)

    @property
    def date(self) -> str:
        return time.strftime("%Y-%m-%d", time.gmtime(self.fetched_at))

    def doc(self) -> dict:
        return ({"fetched_at": self.fetched_at, "date": self.date, "endpoint": self.endpoint, "currency": CURRENCY,
                 "service": SERVICE_ID, "rates": self.rates, "problems": self.problems, "unpriced": self.unpriced,
                 "n1": True}
                | ({} if self.tpu == V6E.name else {"tpu": self.tpu}))

    def take(self, option: str, region: str, price: float, where: str) -> None:
        """A SKU's price of an option in a region: the rate there, unless
        another SKU priced it already (then neither: which one is meant cannot
        be told, so it is a problem and no price, never the last one read)."""
        if region in self.unpriced.get(option, {}):
            return
        before = self.read_from.get((option, region))
        if before is None or before == (where, price):  # the first, or the same SKU listed again
            self.read_from[(option, region)] = (where, price)
            self.rates.setdefault(option, {})[region] = price
            return
        what, unit = (option, N1_SKUS[option][3]) if option in N1_SKUS else (f"{self.tpu} {option}", "chip-hour")
        why = (f"two SKUs for {what} in {region}: {before[0]} at ${before[1]:.4g}/{unit} and "
               f"{where} at ${price:.4g}/{unit}; which one is meant cannot be told")
        self.problems.append(why)
        self.unpriced.setdefault(option, {})[region] = why
        del self.rates[option][region]
        if not self.rates[option]:
            del self.rates[option]


# -- reading an answer ---------------------------------------------------------------
def money(m: Any, where: str) -> float:
    """A Money value in USD (``units`` + ``nanos`` / 1e9)."""
    if not isinstance(m, dict):
        raise CatalogError(f"{where}.unitPrice is not an object")
    if m.get("currencyCode", CURRENCY) != CURRENCY:
        raise CatalogError(f"{where}.unitPrice is in {m.get('currencyCode')!r}, not {CURRENCY} as asked")
    units, nanos = m.get("units", "0"), m.get("nanos", 0)
    if isinstance(units, bool) or not isinstance(units, (str, int)) or not re.fullmatch(r"-?\d{1,12}", str(units)):
        raise CatalogError(f"{where}.unitPrice.units is {units!r}, not an int64 (a string of digits)")
    if isinstance(nanos, bool) or not isinstance(nanos, int) or not -999_999_999 <= nanos <= 999_999_999:
        raise CatalogError(f"{where}.unitPrice.nanos is {nanos!r}, not an int32 of nanos")
    return round(int(units) + nanos / 1e9, 9)


def unit_price(sku: dict, where: str, units: Mapping[str, float] = PER_HOUR, per: str = "chip-hour") -> float:
    """A SKU's price per hour of its unit (``units``: the usageUnits taken,
    each with what its price is multiplied by; ``per``: the unit said): its
    current pricing (the last of ``pricingInfo``), the rate from usage 0
    (the first tier)."""
    infos = sku.get("pricingInfo")
    if not isinstance(infos, list) or not infos or not isinstance(infos[-1], dict):
        raise CatalogError(f"{where}.pricingInfo is not a non-empty list")
    expr = infos[-1].get("pricingExpression")
    if not isinstance(expr, dict):
        raise CatalogError(f"{where}.pricingInfo[-1].pricingExpression is not an object")
    unit = expr.get("usageUnit")
    if not isinstance(unit, str) or unit not in units:
        raise CatalogError(f"{where} is priced per {unit!r}, not per {'hour' if units is PER_HOUR else per}")
    tiers = expr.get("tieredRates")
    if not isinstance(tiers, list) or not tiers or not all(isinstance(t, dict) for t in tiers):
        raise CatalogError(f"{where}.pricingExpression.tieredRates is not a non-empty list")
    first = min(tiers, key=lambda t: t.get("startUsageAmount", 0) if isinstance(t.get("startUsageAmount", 0),
                                                                               (int, float)) else math.inf)
    price = money(first.get("unitPrice"), f"{where}.tieredRates[0]") * units[unit]
    if not 0 < price <= MAX_PRICE:
        raise CatalogError(f"{where} costs ${price:g}/{per}: not between 0 and {MAX_PRICE:g}")
    return price


def page_skus(doc: Any) -> tuple[list, str]:
    """A page's SKUs and the next page's token ('' on the last)."""
    if not isinstance(doc, dict):
        raise CatalogError(f"a page is {type(doc).__name__}, not an object with skus")
    skus, token = doc.get("skus", []), doc.get("nextPageToken", "")
    if not isinstance(skus, list):
        raise CatalogError("skus is not a list")
    if not isinstance(token, str):
        raise CatalogError(f"nextPageToken is {token!r}, not a string")
    return skus, token


def option_of(sku: Any, gen: Generation = V6E) -> str | None:
    """The capacity option a SKU prices (of ``gen``), or None."""
    if not isinstance(sku, dict) or not isinstance(sku.get("description"), str):
        return None
    usage = (sku.get("category") or {}).get("usageType") if isinstance(sku.get("category"), dict) else None
    for option, (pattern, want) in skus(gen).items():
        if pattern.match(sku["description"]) and usage == want:
            return option
    return None


def n1_part(sku: Any) -> str | None:
    """The N1 part (``N1_CORE``, ``N1_RAM``) a SKU prices, or None."""
    if not isinstance(sku, dict) or not isinstance(sku.get("description"), str):
        return None
    usage = (sku.get("category") or {}).get("usageType") if isinstance(sku.get("category"), dict) else None
    return next((part for part, (pattern, want, _, _) in N1_SKUS.items()
                 if pattern.match(sku["description"]) and usage == want), None)


SPOT_WORDS = re.compile(r"\b(Spot|Preemptible)\b", re.I)


def unmatched_spot(sku: Any, gen: Generation) -> str | None:
    """Why a SKU no pattern took is a Spot price of ``gen`` gone missing: its
    description names the generation and it is Spot by its usageType or its
    words (None: it is not, or the record has no spot pattern to miss)."""
    spot = gen.spot_sku()
    if (spot is None or not isinstance(sku, dict) or not isinstance(sku.get("description"), str)
            or option_of(sku, gen) is not None):
        return None
    desc = sku["description"]
    usage = (sku.get("category") or {}).get("usageType") if isinstance(sku.get("category"), dict) else None
    if not re.search(gen.sku_family, desc, re.I) or not (usage == spot[1] or SPOT_WORDS.search(desc)):
        return None
    return (f"SKU {sku.get('skuId', '?')} ({desc[:80]}, usageType {usage}) is a {gen.name} spot SKU by its "
            f"{'usageType' if usage == spot[1] else 'words'}, but no pattern of the {gen.name} record "
            f"(config/tpu.py) takes it: its price is not read")


def add_rates(catalog: Catalog, page: list) -> None:
    """The generation's SKUs of a page into the catalog's rates; a matching
    SKU that is not what the API documents is a problem of its own (that
    option and region stay without a price), and so is a Spot SKU of the
    generation no pattern takes (``unmatched_spot``)."""
    gen = GENERATIONS_BY_NAME[catalog.tpu]
    for sku in page:
        part = n1_part(sku)
        option = part or option_of(sku, gen)
        if option is None:
            if (missed := unmatched_spot(sku, gen)) is not None:
                catalog.problems.append(missed)
            continue
        regions = sku.get("serviceRegions")
        where = f"SKU {sku.get('skuId', '?')} ({sku['description'][:80]})"
        if not isinstance(regions, list) or not all(isinstance(r, str) for r in regions):
            catalog.problems.append(f"{where}: serviceRegions is not a list of regions")
            continue
        try:
            price = unit_price(sku, where, *N1_SKUS[part][2:]) if part else unit_price(sku, where)
        except CatalogError as e:
            catalog.problems.append(str(e))
            continue
        for r in regions:
            catalog.take(option, r, price, where)


# -- fetching -------------------------------------------------------------------------------
def endpoint(via: Connector) -> str:
    e = via.getenv(ENDPOINT_VAR) or ENDPOINT
    return e if e.endswith("/") else e + "/"


def skus_url(base: str, token: str = "") -> str:
    q = {"currencyCode": CURRENCY, "pageSize": str(PAGE_SIZE)} | ({"pageToken": token} if token else {})
    return f"{base}v1/services/{SERVICE_ID}/skus?{urllib.parse.urlencode(q)}"


def access_token(via: Connector) -> str:
    """The user's OAuth access token, from gcloud (never shown, never logged)."""
    r = via.run(TOKEN, timeout=60)
    token = r.stdout.strip()
    if r.rc != 0 or not token or "\n" in token:
        said = (r.stderr.strip().splitlines() or ["no token printed"])[-1][:200]
        raise ProbeFailed("access token", " ".join(TOKEN), r.rc, "", r.stderr,
                          why=f"could not get an access token (`{' '.join(TOKEN)}` exited {r.rc}): {said}")
    return token


def fetch(via: Connector, now: float | None = None, gen: Generation = V6E) -> Catalog:
    """Every page of the Compute Engine SKUs (bounded), the generation's rates kept."""
    base = endpoint(via)
    catalog = Catalog(time.time() if now is None else now, base, tpu=gen.name)
    headers = {"Authorization": f"Bearer {access_token(via)}"}
    ca = via.getenv(CA_VAR)
    token, seen = "", set()
    for _ in range(MAX_PAGES):
        doc = via.get_json(skus_url(base, token), timeout=60, headers=headers, ca_file=ca)
        if doc is ABSENT:
            raise ProbeFailed("catalog", skus_url(base), None, "", "HTTP 404",
                              why=f"could not look: {base}v1/services/{SERVICE_ID}/skus answered 404 (no such service)")
        page, token = page_skus(doc)
        add_rates(catalog, page)
        if not token:
            return catalog
        if token in seen:
            raise CatalogError(f"nextPageToken {token[:40]!r} came twice: the pages go round")
        seen.add(token)
    raise CatalogError(f"more than {MAX_PAGES} pages of {PAGE_SIZE} SKUs")


# -- the cache ---------------------------------------------------------------------------------
def cache_path(env: Environment) -> str:
    return paths.prices_cache(env.name)


def from_cache(doc: Any, base: str, now: float, gen: Generation = V6E) -> Catalog | None:
    """The cached catalog when it is whole, of this endpoint and generation
    and fresh; None (read it again) otherwise."""
    try:
        if not isinstance(doc, dict) or doc.get("endpoint") != base or doc.get("currency") != CURRENCY:
            return None
        if doc.get("tpu", V6E.name) != gen.name or doc.get("n1") is not True:
            return None  # another generation's, or read before the N1 SKUs were: read again
        at = doc["fetched_at"]
        if isinstance(at, bool) or not isinstance(at, (int, float)) or not 0 <= now - at <= STALE_AFTER:
            return None
        rates = doc["rates"]
        ok = isinstance(rates, dict) and all(
            (o in gen.skus or o in N1_SKUS) and isinstance(rs, dict) and all(
                isinstance(r, str) and isinstance(p, (int, float)) and not isinstance(p, bool)
                and 0 < p <= MAX_PRICE for r, p in rs.items()) for o, rs in rates.items())
        problems = doc.get("problems", [])
        if not ok or not isinstance(problems, list) or not all(isinstance(p, str) for p in problems):
            return None
        # A cache written before two SKUs for one price were told apart
        # (no "unpriced") may hold the last one read: read again.
        unpriced = doc["unpriced"]
        if not isinstance(unpriced, dict) or not all(
                (o in gen.skus or o in N1_SKUS) and isinstance(rs, dict)
                and all(isinstance(r, str) and isinstance(w, str) for r, w in rs.items())
                for o, rs in unpriced.items()):
            return None
        return Catalog(float(at), base, {o: dict(rs) for o, rs in rates.items()}, list(problems), gen.name,
                       {o: dict(rs) for o, rs in unpriced.items()})
    except (KeyError, TypeError):
        return None


def cached(env: Environment, now: float | None = None) -> Catalog | None:
    """The cached catalog when fresh and whole, from this machine's state
    only: never a request, to the API or to a controller (for the read-only
    reports: goodput, runs, logs). Its endpoint must be this machine's where
    the catalog is read here; with a ``controller`` the catalog is read
    there, under the controller's endpoint, and asking the controller for it
    would be a request: the endpoint the cache says it was read from is
    taken (``read_catalog`` checks it on the next read)."""
    here = connectors.this_machine()
    try:
        raw = here.read(cache_path(env))
        doc = json.loads(raw) if raw else None
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if connectors.controller(env):
        base = doc.get("endpoint") if isinstance(doc, dict) else None
        if not isinstance(base, str):
            return None
    else:
        base = endpoint(here)
    return from_cache(doc, base, time.time() if now is None else now, generation(env))


def read_catalog(env: Environment, now: float | None = None) -> Catalog:
    """The cached catalog if fresh and whole, else read from the API (and
    cached); the API's failures raise ProbeFailed or CatalogError."""
    now = time.time() if now is None else now
    via, here = connectors.connector(env), connectors.this_machine()
    base = endpoint(via)
    raw = here.read(cache_path(env))
    try:
        cached = from_cache(json.loads(raw), base, now, generation(env)) if raw else None
    except (ValueError, UnicodeDecodeError):
        cached = None  # damaged: read again
    if cached is not None:
        return cached
    catalog = fetch(via, now, generation(env))
    here.make_dirs(paths.env_dir(env.name))
    here.write(cache_path(env), json.dumps(catalog.doc(), indent=1).encode())
    return catalog


def catalog_fact(env: Environment) -> Fact:
    """The generation's rates of the catalog, or why they could not be read
    (a value, never an error: a price is never what stops a run)."""
    gen = generation(env)
    def look() -> Catalog | str:
        try:
            return read_catalog(env)
        except CatalogError as e:
            return f"the Cloud Billing Catalog's answer is not what the API documents: {e}"
        except ProbeFailed as e:
            return f"could not read the Cloud Billing Catalog: {e.why.removeprefix('could not look: ')}"

    url = skus_url(f"${{{ENDPOINT_VAR}:-{ENDPOINT}}}")
    return Fact(name=f"{gen.name} prices", python=look, assumed=DRY_RUN,
                display=f"curl -fsS -H \"Authorization: Bearer $(gcloud auth print-access-token)\" \"{url}\"  "
                        f"# every page; cached in {cache_path(env)} for a day",
                describe=lambda c: (f"{sum(len(r) for o, r in c.rates.items() if o not in N1_SKUS)} {gen.name} "
                                    f"price(s), {c.date}" if isinstance(c, Catalog) else c))


# -- prices of an environment ------------------------------------------------------------------
def needs_catalog(env: Environment, options: list[str] | tuple[str, ...] | None = None, cpu: bool = False) -> bool:
    """Whether some option has no price in the inventory (and could have one
    in the catalog); ``cpu``: or the cluster's CPU pool (Standard's)."""
    given = env.get("prices") or {}
    pool = cpu and env.platform.cloud and env.cluster_mode.cpu_pool_nodes > 0 and DEFAULT_POOL not in given
    return pool or any(o not in given and o in generation(env).skus for o in (options or capacities(env)))


def price(env: Environment, option: str, catalog: Catalog | str | None) -> Price:
    """An option's price per chip-hour in the environment's region."""
    given = env.get("prices") or {}
    if option in given:
        return Price(option, float(given[option]), "inventory prices:")
    if not capacity_option(option).catalog_priced:
        return Price(option, None, why="a reservation is priced as the inventory says: set prices.reservation "
                                       "(0 when it is prepaid)")
    gen = generation(env)
    if option in gen.unpriced:
        return Price(option, None, why=f"{gen.title}'s {option} SKU is not priced here: {gen.unpriced[option]}: "
                                       f"set prices.{option}")
    if option not in gen.skus:
        return Price(option, None, why=f"no Cloud Billing Catalog SKU of {gen.title} {option} is known: set "
                                       f"prices.{option}")
    if not isinstance(catalog, Catalog):
        return Price(option, None, why=catalog or "the catalog was not read", key=option)
    rate = catalog.rates.get(option, {}).get(env.region)
    if (two := catalog.unpriced.get(option, {}).get(env.region)) is not None:
        return Price(option, None, why=f"the Cloud Billing Catalog ({catalog.date}) lists {two}: set prices.{option}")
    if rate is None:
        ours = [p for p in catalog.problems if f"{catalog.tpu} {option} SKU" in p]
        more = f"; {(ours or catalog.problems)[0]}" if catalog.problems else ""
        return Price(option, None, why=f"the Cloud Billing Catalog ({catalog.date}) has no {catalog.tpu} {option} "
                                       f"SKU in {env.region}{more}", key=option)
    return Price(option, rate, f"Cloud Billing Catalog {catalog.date}")

