"""A first run's cost, before anything is read (issue 64, item 6): `invoke
capacity` prices every part of the plan that bills (the TPU slices, the
cluster's CPU pool from the Billing Catalog's N1 SKUs or `prices:`, GKE's
cluster fee) and `invoke train` estimates the run with the step time it
estimates when none was measured, said so; where no price can be read (a
dry run reads no catalog) the reason is said once, with how to get one.
The dry runs are `invoke --dry` in this process with process creation
refused (tests/goldens.py); the real gcloud against the fake catalog is
tests/test_clients_prices.py."""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import yaml

from playbooks.cloud import prices as P
from playbooks.runs import cost
from tests.conftest import ROOT, env
from tests.goldens import dry_run
from tests.test_cost import DECOYS, ON_DEMAND, SPOT, catalog_of, sku

# The N1 SKUs as the catalog lists them ("Americas": one SKU for many
# regions), at us-central1's list prices, with the decoys that share their words.
N1_CORE = sku("N1 Predefined Instance Core running in Americas", "OnDemand", ["us-central1", "us-east5"], "0",
              31611000)
N1_RAM = sku("N1 Predefined Instance Ram running in Americas", "OnDemand", ["us-central1", "us-east5"], "0",
             4237000, unit="GiBy.h")
N1_DECOYS = [sku("Spot Preemptible N1 Predefined Instance Core running in Americas", "Preemptible", ["us-east5"],
                 "0", 6655000),
             sku("N1 Sole Tenancy Instance Core running in Americas", "OnDemand", ["us-east5"], "0", 34773000),
             sku("N1 Predefined Instance Core running in Americas", "Commit1Yr", ["us-east5"], "0", 19915000)]
NODE = 16 * 0.031611 + 60 * 0.004237   # n1-standard-16: 16 vCPUs, 60 GiB


def inventory(tmp_path: Path, name: str, **changes) -> Path:
    """The shipped inventory with one environment's keys changed."""
    doc = yaml.safe_load((ROOT / "inventory.yaml").read_text())
    doc["environments"][name].update(changes)
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def step_lines(out: str, task: str) -> list[str]:
    """A step's lines of a transcript, from its TASK line to the next."""
    lines = out.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"TASK [{task}]"))
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith(("TASK [", "PLAY RECAP"))), len(lines))
    return lines[start:end]


# -- the CPU pool's N1 prices ------------------------------------------------------------------------
def test_the_cpu_pools_n1_skus_are_read_with_the_tpu_ones_and_price_a_node_by_its_vcpus_and_memory():
    from playbooks.cloud import cluster_prices as C
    c = catalog_of(*DECOYS, *N1_DECOYS, ON_DEMAND, SPOT, N1_CORE, N1_RAM)
    assert c.rates[P.N1_CORE] == {"us-central1": 0.031611, "us-east5": 0.031611}
    assert c.rates[P.N1_RAM] == {"us-central1": 0.004237, "us-east5": 0.004237}  # per GiB-hour (GiBy.h)
    assert c.rates["on-demand"] == {"us-east5": 2.7, "europe-west4": 2.97} and c.problems == []
    rate = C.node_rate(env("dev"), "n1-standard-16", c)
    assert rate.usd == pytest.approx(NODE) and "16 vCPU x $0.03161 + 60 GiB x $0.004237" in rate.text()
    assert "Cloud Billing Catalog" in rate.source and "sustained-use" in rate.source
    # Cached with them; a cache written before the N1 SKUs were read is read again, never taken as "none".
    doc = json.loads(json.dumps(c.doc()))
    again = P.from_cache(doc, "https://cloudbilling.googleapis.com/", time.time())
    assert again is not None and C.node_rate(env("dev"), "n1-standard-16", again).usd == pytest.approx(NODE)
    doc.pop("n1")
    assert P.from_cache(doc, "https://cloudbilling.googleapis.com/", time.time()) is None
    # The inventory's price wins; a catalog without N1 in the region names why and the key that prices it.
    assert C.node_rate(env("dev", prices={"default-pool": 0.5}), "n1-standard-16", c).usd == 0.5
    bare = C.node_rate(env("dev"), "n1-standard-16", catalog_of(ON_DEMAND))
    assert bare.usd is None and "has no N1 core SKU in us-east5" in bare.text()
    assert "set prices.default-pool (USD per node-hour)" in bare.text()


def test_a_sku_of_the_n1_ram_not_per_gib_hour_is_a_problem_and_no_price():
    from playbooks.cloud import cluster_prices as C
    bad = json.loads(json.dumps(N1_RAM))
    bad["pricingInfo"][0]["pricingExpression"]["usageUnit"] = "h"
    c = catalog_of(N1_CORE, bad)
    assert P.N1_RAM not in c.rates and "is priced per 'h', not per GiB-hour" in c.problems[0]
    assert C.node_rate(env("dev"), "n1-standard-16", c).usd is None


# -- `invoke capacity`: every part that bills ---------------------------------------------------------
def test_the_plan_costs_every_part_that_bills_from_the_inventorys_prices_in_a_dry_run(tmp_path):
    """A dry run reads no catalog (no process starts): with `prices:` for
    the TPUs and the CPU pool, the plan's line counts the two v6e-16 slices,
    the default-pool's 3 x n1-standard-16 and the cluster fee, each named."""
    inv = inventory(tmp_path, "dev", prices={"on-demand": 2.7, "default-pool": 0.76})
    rc, out, err = dry_run("dev", ["capacity"], inv)
    assert rc == 0 and "PROCESSES STARTED" not in err, err
    lines = step_lines(out, "capacity : price of the plan")
    assert not any("cloudbilling" in ln for ln in lines)  # every part priced here: no catalog to read
    assert lines[-1] == ("ok: [capacity : price of the plan] would check: the plan costs $88.78/h: 2 TPU slice(s) "
                         "(32 chips) $86.40/h, default-pool $2.28/h, cluster fee $0.10/h"), lines
    assert "  note   default-pool: n1-standard-16: 3 nodes x $0.76/node-hour = $2.28/h (inventory prices:)" in lines
    fee = next(ln for ln in lines if "cluster fee:" in ln)
    assert "$0.10/h (GKE's list price, https://cloud.google.com/kubernetes-engine/pricing;" in fee
    assert "free tier's $74.40 a month per billing account" in fee and "prices.cluster-fee: 0" in fee
    assert any("not counted: each node's boot disk, the bucket's storage and network traffic" in ln for ln in lines)


def test_on_autopilot_the_plan_has_no_cpu_pool_of_ours_and_names_the_pods_it_bills(tmp_path):
    inv = inventory(tmp_path, "dev-autopilot", prices={"on-demand": 2.7, "cluster-fee": 0})
    rc, out, err = dry_run("dev-autopilot", ["capacity"], inv)
    assert rc == 0, err
    lines = step_lines(out, "capacity : price of the plan")
    assert lines[-1].endswith("the plan costs $86.40/h: 2 TPU slice(s) (32 chips) $86.40/h, cluster fee $0.00/h")
    assert not any("default-pool" in ln for ln in lines)
    assert any("not counted: the pods' CPU and memory requests, the Ray head's among them" in ln for ln in lines)


def test_where_no_price_can_be_read_the_plan_says_so_once_with_how_to_get_one():
    """The shipped dev environment has no `prices:`: a dry run reads no
    catalog, so the slices and the CPU pool have no price; one line says
    why and how to get one, the per-slice lines do not repeat it."""
    rc, out, err = dry_run("dev", ["capacity"])
    assert rc == 0, err
    lines = step_lines(out, "capacity : price of the plan")
    assert lines[-1] == ("ok: [capacity : price of the plan] would check: the plan costs at least $0.10/h (cluster "
                         "fee $0.10/h); no price for v6e-16-0, v6e-16-1, default-pool (not read in a dry run): set "
                         "prices.on-demand (USD per chip-hour) and prices.default-pool (USD per node-hour) in the "
                         "inventory, or run without --dry so the Cloud Billing Catalog is read (`invoke capacity` "
                         "and playbook.mode=check change nothing)"), lines
    assert "  note   v6e-16-0: on-demand: 16 chips, no price" in lines
    assert "  note   default-pool: n1-standard-16: 3 nodes, no price" in lines
    assert out.count("set prices.on-demand") == 1 and out.count("prices.default-pool") == 1  # the recap too
    assert "unknown" not in "\n".join(lines)


# -- `invoke train`: the estimate with the estimated step time ---------------------------------------------
def test_a_first_runs_estimate_uses_the_estimated_step_time_said_so_and_prices_it(tmp_path):
    """No run measured a step here: the estimate takes the step time the
    checkpoint period estimates (its next line), says it is estimated, and
    with `prices:` gives dollars in a dry run."""
    inv = inventory(tmp_path, "dev", prices={"on-demand": 2.7})
    rc, out, err = dry_run("dev", ["train"], inv)
    assert rc == 0, err
    [line] = [ln for ln in out.splitlines() if ln.startswith("ok: [train : cost estimate]")]
    period = next(ln for ln in out.splitlines() if ln.startswith("ok: [train : checkpoint period]"))
    m = re.search(r"\(100 steps x ([\d.]+) s \(estimated, as the checkpoint period's line shows; none measured: ", line)
    assert m is not None and "unknown" not in line, line
    assert f"/ {m.group(1)} s a step" in period  # the same estimate as the period's
    money = re.search(r"x 32 chips = [\d.]+ chip-hours x \$2\.7 = \$([\d.]+) \(", line)
    assert money is not None, line
    assert float(money.group(1)) == pytest.approx(100 * float(m.group(1)) / 3600 * 32 * 2.7, rel=0.01)
    assert "an estimate: its step time estimated" in line and "set prices" not in out


def test_a_first_runs_estimate_without_a_price_says_why_once_with_how_to_get_one():
    rc, out, err = dry_run("dev", ["train"])
    assert rc == 0, err
    [line] = [ln for ln in out.splitlines() if ln.startswith("ok: [train : cost estimate]")]
    assert "(estimated, as the checkpoint period's line shows" in line and "unknown" not in line, line
    assert line.endswith("no price (not read in a dry run: set prices.on-demand (USD per chip-hour) in the inventory, "
                         "or run without --dry so the Cloud Billing Catalog is read (`invoke capacity` and "
                         "playbook.mode=check change nothing))"), line
    assert out.count("set prices.") == 1  # the basis's probe lines do not repeat it
    assert "32 chips, no price (the cost estimate says why)" in out


def test_the_estimate_says_a_measured_step_time_is_measured_and_an_estimated_one_estimated():
    b = cost.env_basis(env("dev", prices={"on-demand": 2.0}), ["on-demand", "on-demand"], None)
    measured = cost.estimate(100, cost.StepTime(2.0, "median of 10 steps of run r"), b)
    guessed = cost.estimate(100, cost.estimated_step(2.0, "none here"), b)
    assert "(median of 10 steps of run r)" in measured and "a lower bound" in measured and "estimated" not in measured
    assert "(estimated, as the checkpoint period's line shows; none measured: none here)" in guessed
    assert "an estimate: its step time estimated" in guessed
    # The same arithmetic: 100 x 2 s x 32 chips x $2 = $3.56.
    assert "= 1.778 chip-hours x $2 = $3.56" in measured and "= 1.778 chip-hours x $2 = $3.56" in guessed
