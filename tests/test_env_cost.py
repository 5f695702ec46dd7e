"""What the environment costs while it stands (`invoke status`, `invoke
runs`): its TPU node pools, its default CPU pool and the cluster fee, by
the hour as it stands and since `up`, each part priced or named as
unpriced with its reason; read from the cluster and its nodes as the
loopback fakes' API shows them; `runs` shows a run's stops and its jobs."""
from __future__ import annotations

import json
import time

import pytest

from playbooks.cloud import env_cost
from playbooks.cloud import prices as P
from playbooks.core.errors import ProbeFailed
from playbooks.core.facts import ABSENT, Completed
from playbooks.runs import events as E
from playbooks.runs import run_list
from tests.conftest import env
from tests.fakes.cloud import Cloud

NOW = 1_796_400_000.0
HOUR = 3600.0


def rfc3339(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + ".123456789Z"


@pytest.fixture(scope="module")
def cluster() -> dict:
    """The Standard cluster as the fake's `clusters list` shows it (the
    fake's own constructors, without its server): its default-pool (3 x
    n1-standard-16, as the tutorial's create makes it) and two v6e-16 pools
    as `nodepools` asks for them, one on demand and one Spot; created ten
    hours before NOW."""
    from types import SimpleNamespace

    from tests.fakes import gcp as G
    from tests.fakes.cloud import STANDARD, inventory
    fake = G.FakeGcp.__new__(G.FakeGcp)
    fake.st, fake.kube, fake.url, fake.project, fake.flex_start_empty = G.State("p", "1"), None, "http://x", "p", set()
    e = SimpleNamespace(**inventory(1, 2)["environments"][STANDARD], subnet_1_name="tpu-subnet-1",
                        subnet_2_name="tpu-subnet-2")
    fake.add_cluster(e.zone, {"name": e.cluster_name, "nodePools": [
        {"name": "default-pool", "initialNodeCount": 3, "config": {"machineType": "n1-standard-16"}}]})
    seeds = SimpleNamespace(envdata=lambda env_name=None: e)
    for i, capacity in enumerate(("on-demand", "spot")):
        fake.add_pool(e.zone, e.cluster_name, Cloud.pool_spec(seeds, f"v6e-16-{i}", capacity=capacity))  # type: ignore[arg-type]
    c = fake._public_cluster(fake.st.clusters[(e.zone, e.cluster_name)])
    assert env_cost.seconds(c["createTime"]) is not None  # the fake says when, as GKE does
    c["createTime"] = rfc3339(NOW - 10 * HOUR)
    return c


def nodes(**pools: list[float]) -> dict[str, list[float | None]]:
    return {p.replace("_", "-"): list(ts) for p, ts in pools.items()}


def catalog() -> P.Catalog:
    c = P.Catalog(NOW, "https://cloudbilling.googleapis.com/")
    c.rates = {"on-demand": {"us-east5": 2.7}, "spot": {"us-east5": 1.4}}
    return c


ENV = {"kind": "gke", "mode": "standard", "region": "us-east5", "zone": "us-east5-b", "slices": 2, "topology": "4x4"}


def test_the_fakes_cluster_has_what_the_cost_is_read_from(cluster):
    """GKE's Cluster has createTime (NodePool has none): the pools' nodes
    carry their own creation times."""
    assert env_cost.seconds(cluster["createTime"]) == pytest.approx(NOW - 10 * HOUR, abs=1)
    assert [p["name"] for p in cluster["nodePools"]] == ["default-pool", "v6e-16-0", "v6e-16-1"]
    assert all("createTime" not in p for p in cluster["nodePools"])


def test_the_environment_costs_its_pools_by_the_hour_and_since_up_each_node_from_its_creation(cluster):
    e = env("dev", **ENV, prices={"default-pool": 0.76, "cluster-fee": 0.1})
    have = nodes(default_pool=[NOW - 10 * HOUR] * 3, v6e_16_0=[NOW - 9 * HOUR] * 4,
                 v6e_16_1=[NOW - 2 * HOUR] * 3 + [NOW - 1 * HOUR])  # a Spot node made again an hour ago
    c = env_cost.priced(e, cluster, have, catalog(), NOW)
    by = {p.name: p for p in c.parts}
    # By the hour: 16 chips on demand, 16 on Spot, 3 CPU nodes, the fee.
    assert by["v6e-16-0"].per_hour == pytest.approx(16 * 2.7)
    assert by["v6e-16-1"].per_hour == pytest.approx(16 * 1.4)
    assert by["default-pool"].per_hour == pytest.approx(3 * 0.76)
    assert by["cluster fee"].per_hour == pytest.approx(0.1)
    assert c.hourly == pytest.approx(43.2 + 22.4 + 2.28 + 0.1)
    # Since up: each node from its own creation, the fee from the cluster's.
    assert by["v6e-16-0"].since_up == pytest.approx(4 * 9 * 4 * 2.7)
    assert by["v6e-16-1"].since_up == pytest.approx((3 * 2 + 1) * 4 * 1.4)
    assert by["default-pool"].since_up == pytest.approx(3 * 10 * 0.76)
    assert by["cluster fee"].since_up == pytest.approx(10 * 0.1, abs=1e-3)
    assert c.since_up == pytest.approx(388.8 + 39.2 + 22.8 + 1.0, abs=1e-2)
    head = env_cost.headline(c)
    assert head.startswith("environment cost: $67.98/h as it stands, $451.80 since up ") and "(10.0 h, at least)" \
        in head, head
    assert "without" not in head
    doc = c.doc()
    assert doc["per_hour"] == 67.98 and doc["unpriced"] == [] and "lower bound" in doc["lower_bound"]


def test_a_part_without_a_price_is_named_with_its_reason_and_left_out_of_the_sums(cluster):
    e = env("dev", **ENV)  # no prices: the CPU pool and the fee have none anywhere; no catalog read
    have = nodes(default_pool=[NOW - HOUR] * 3, v6e_16_0=[NOW - HOUR] * 4, v6e_16_1=[NOW - HOUR] * 4)
    c = env_cost.priced(e, cluster, have, None, NOW)
    # The fee has GKE's list price ($0.10/h) when the inventory gives none.
    assert [p.name for p in c.unpriced] == ["default-pool", "v6e-16-0", "v6e-16-1"]
    assert c.hourly == pytest.approx(0.10)
    text = "\n".join(env_cost.lines(c))
    assert "; without default-pool, v6e-16-0, v6e-16-1: no price" in text, text
    assert "prices.default-pool" in text, text
    assert "free tier" in text, text
    assert "no Cloud Billing Catalog read in the last day" in text, text
    # With the catalog: the TPU pools priced, the CPU pool's N1 SKUs absent from this catalog still named.
    c = env_cost.priced(e, cluster, have, catalog(), NOW)
    assert [p.name for p in c.unpriced] == ["default-pool"]
    assert c.hourly == pytest.approx(16 * 2.7 + 16 * 1.4 + 0.10)


def test_nodes_that_cannot_be_read_give_the_pools_as_configured_and_no_hours_since_up(cluster):
    e = env("dev", **ENV, prices={"on-demand": 2.7, "spot": 1.4})
    c = env_cost.priced(e, cluster, None, None, NOW, "kubectl: no context")
    by = {p.name: p for p in c.parts}
    assert by["v6e-16-0"].units == 4 and by["v6e-16-0"].per_hour == pytest.approx(43.2)
    assert by["v6e-16-0"].since_up is None and "its nodes could not be read: kubectl: no context" in \
        by["v6e-16-0"].unknown_since
    assert "(as configured)" in by["v6e-16-0"].what
    assert "without v6e-16-0, v6e-16-1: hours unknown" in env_cost.headline(c)


def test_reading_says_what_it_could_not_read_and_never_stops():
    e = env("dev", **ENV)

    def no_account(fact):
        raise ProbeFailed("cluster", "gcloud container clusters list", 1, "",
                          "ERROR: (gcloud.container.clusters.list) You do not currently have an active account "
                          "selected.", why="could not look: gcloud exited 1")

    assert env_cost.headline(env_cost.read(e, no_account, NOW)) == (
        "environment cost: unknown: the cluster could not be read: gcloud has no account")
    assert env_cost.read(e, lambda f: ABSENT, NOW).absent.startswith("no cluster ")
    assert env_cost.read(env("local"), no_account, NOW).absent.startswith("a local cluster")


def test_node_times_are_read_from_kubectls_nodes_per_pool():
    # The nodes among the one read of our objects (gke.objects_command): a pod is no node.
    items = {"items": [
        {"kind": "Node", "metadata": {"name": f"n{i}", "creationTimestamp": rfc3339(NOW - i * HOUR),
                                      "labels": {env_cost.POOL_LABEL: "v6e-16-0"}}} for i in (1, 2)]
        + [{"kind": "Node", "metadata": {"name": "x", "creationTimestamp": "yesterday",
                                         "labels": {env_cost.POOL_LABEL: "p"}}},
           {"kind": "Node", "metadata": {"name": "unpooled"}},
           {"kind": "Pod", "metadata": {"name": "pod", "creationTimestamp": rfc3339(NOW),
                                        "labels": {env_cost.POOL_LABEL: "v6e-16-0"}}}]}
    got = env_cost.node_times(Completed("kubectl get pods,nodes", 0, json.dumps(items), ""))
    assert got["v6e-16-0"] == [pytest.approx(NOW - HOUR, abs=1), pytest.approx(NOW - 2 * HOUR, abs=1)]
    assert got["p"] == [None] and "" not in got


def test_the_inventory_prices_the_cpu_pool_and_the_fee_and_refuses_another_key_in_one_line():
    from playbooks.config.schema import prices as rule
    assert rule({"default-pool": 0.76, "cluster-fee": 0, "spot": 1.4}, {}) is None
    bad = rule({"cpu-pool": 1.0}, {})
    assert bad is not None and "is not a capacity option, default-pool or cluster-fee" in bad.why
    bad = rule({"cluster-fee": -1}, {})
    assert bad is not None and "USD per hour" in bad.why


def test_prereqs_enables_the_billing_api_only_where_a_price_is_read_from_the_catalog():
    from playbooks.plays import prereqs
    assert P.API in prereqs.services(env("dev"))
    tpus = {"on-demand": 2.7, "spot": 1.4, "flex-start": 1.3, "reservation": 0}
    # `invoke capacity` prices Standard's CPU pool from the catalog's N1 SKUs where `prices:` does not.
    assert P.API in prereqs.services(env("dev", prices=tpus))
    assert P.API not in prereqs.services(env("dev", prices={**tpus, "default-pool": 0.76}))
    assert P.API not in prereqs.services(env("dev-autopilot", prices=tpus))  # no CPU pool of ours


# -- runs: stops and jobs ---------------------------------------------------------------------------
def _job(sid: str, t: float, status: str | None) -> list[dict]:
    out = [{"t": t, "kind": E.SUBMITTED, "job": sid, "run": "r", "step": None}]
    if status:
        out.append({"t": t + 60, "kind": E.JOB_END, "job": sid, "status": status, "step": 10})
    return out


def test_a_run_stopped_and_resumed_is_not_a_plain_succeeded_and_lists_its_jobs():
    evs = _job("r-1", 0, "STOPPED") + _job("r-2", 100, "SUCCEEDED")
    assert run_list.state(evs) == "SUCCEEDED after 1 stop"
    assert run_list.jobs(evs) == [{"job": "r-1", "end": 60.0, "status": "STOPPED"},
                                  {"job": "r-2", "end": 160.0, "status": "SUCCEEDED"}]
    evs2 = _job("r-1", 0, "STOPPED") + _job("r-2", 100, "FAILED") + _job("r-3", 200, "STOPPED") \
        + _job("r-4", 300, None)
    assert run_list.state(evs2) == "no end seen after 2 stops, 1 failure"
    assert run_list.state(_job("r-1", 0, "SUCCEEDED")) == "SUCCEEDED"
    assert run_list.state([]) == "no end seen"

