"""What `invoke status` says is coming for each TPU slice
(playbooks/cloud/slice_ends.py): its nodes' scheduled host maintenance
(GKE's node label: present, absent, malformed, past) and a flex-start
pool's end (GKE's default run duration or the pool's own, from its first
node; past its end; what cannot be read said, never a traceback)."""
from __future__ import annotations

import calendar
import time

from playbooks.cloud import slice_ends as S

NOW = float(calendar.timegm((2026, 12, 5, 12, 0, 0)))
POOL_LABEL = "cloud.google.com/gke-nodepool"
CAP = "tpu-playbooks/capacity"


def stamp(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def node(name: str, pool: str = "v6e-16-0", created: float = NOW - 3600, **labels: str) -> dict:
    return {"metadata": {"name": name, "creationTimestamp": stamp(created),
                         "labels": {POOL_LABEL: pool, **labels}}}


def nodes(*items: dict) -> dict[str, list[S.Node]]:
    return S.nodes_by_pool({"items": list(items)}, POOL_LABEL)


FLEX = {"name": "v6e-16-0", "config": {"flexStart": True}}
ON_DEMAND = {"name": "v6e-16-0", "config": {}}


def test_words_for_times_and_durations():
    assert S.utc(NOW) == "2026-12-05 12:00Z"
    assert S.span(2 * 86400 + 3 * 3600 + 59) == "2 d 3 h"
    assert S.span(3 * 3600 + 5 * 60) == "3 h 5 min"
    assert S.span(12 * 60 + 30) == "12 min" and S.span(20) == "under a minute"
    assert S.until(NOW + 90000, NOW) == "in 1 d 1 h" and S.until(NOW - 600, NOW) == "10 min ago"
    assert S.rfc3339("2026-12-05T12:00:00Z") == NOW and S.rfc3339("yesterday") is None and S.rfc3339(None) is None
    assert S.seconds("604800s") == 604800 and S.seconds("3600.5s") == 3600.5 and S.seconds("7d") is None


def test_no_label_is_none_scheduled():
    by = nodes(node("a"), node("b"))
    assert S.slice_words("v6e-16-0", by["v6e-16-0"], ON_DEMAND, False, NOW) == \
        ("v6e-16-0: no maintenance scheduled", False)


def test_the_earliest_of_the_pools_labels_in_utc_and_how_far():
    later, sooner = NOW + 5 * 86400, NOW + 2 * 86400 + 3 * 3600
    by = nodes(node("a", **{S.MAINTENANCE_LABEL: str(int(later))}), node("b", **{S.MAINTENANCE_LABEL: str(int(sooner))}),
               node("c"), node("x", pool="v6e-16-1"))
    words, due = S.slice_words("v6e-16-0", by["v6e-16-0"], ON_DEMAND, False, NOW)
    assert due and words == "v6e-16-0: maintenance 2026-12-07 15:00Z, in 2 d 3 h (node b; 2 nodes scheduled)"
    assert S.slice_words("v6e-16-1", by["v6e-16-1"], ON_DEMAND, False, NOW) == \
        ("v6e-16-1: no maintenance scheduled", False)


def test_a_time_already_past_is_due():
    by = nodes(node("a", **{S.MAINTENANCE_LABEL: str(int(NOW - 600))}))
    assert S.slice_words("p", by["v6e-16-0"], None, False, NOW)[0] == "p: maintenance 2026-12-05 11:50Z, due 10 min ago (node a)"


def test_a_malformed_label_is_said_never_guessed():
    by = nodes(node("a", **{S.MAINTENANCE_LABEL: "soon"}), node("b", **{S.MAINTENANCE_LABEL: "-5"}),
               node("c", **{S.MAINTENANCE_LABEL: "nan"}))
    words, due = S.slice_words("p", by["v6e-16-0"], ON_DEMAND, False, NOW)
    assert not due
    assert words == ("p: maintenance label of node a unreadable: 'soon'; maintenance label of node b unreadable: "
                     "'-5'; maintenance label of node c unreadable: 'nan'")
    # A readable one beside a malformed one: both said.
    by = nodes(node("a", **{S.MAINTENANCE_LABEL: "x"}), node("b", **{S.MAINTENANCE_LABEL: str(int(NOW + 3600))}))
    words, due = S.slice_words("p", by["v6e-16-0"], ON_DEMAND, False, NOW)
    assert due and words == ("p: maintenance 2026-12-05 13:00Z, in 1 h 0 min (node b); "
                             "maintenance label of node a unreadable: 'x'")


def test_a_flex_start_pool_ends_seven_days_after_its_first_node_by_default():
    first = NOW - 2 * 86400 + 2 * 3600  # 1 d 22 h ago: 5 d 2 h left
    by = nodes(node("a", created=first + 60), node("b", created=first))
    assert S.is_flex_start(FLEX, by["v6e-16-0"], CAP) and not S.is_flex_start(ON_DEMAND, by["v6e-16-0"], CAP)
    words, _ = S.slice_words("v6e-16-0", by["v6e-16-0"], FLEX, True, NOW)
    assert words == ("v6e-16-0: no maintenance scheduled; flex-start ends 2026-12-10 14:00Z, in 5 d 2 h "
                     "(7 d 0 h from its first node, GKE's default)")


def test_a_pools_own_max_run_duration_and_one_past_its_end():
    pool = {"config": {"flexStart": True, "maxRunDuration": "86400s"}}
    by = nodes(node("a", created=NOW - 86400 - 7200))
    assert S.flex_end_words(pool, by["v6e-16-0"], NOW) == \
        "flex-start ends 2026-12-05 10:00Z, past its end by 2 h 0 min (1 d 0 h from its first node, " \
        "the pool's max run duration)"


def test_what_a_flex_start_end_cannot_be_read_from_is_said():
    assert S.flex_end_words(FLEX, [], NOW) == "flex-start, no nodes yet: it runs 7 d 0 h from when they come"
    assert S.slice_words("p", [], FLEX, True, NOW)[0] == \
        "p: flex-start, no nodes yet: it runs 7 d 0 h from when they come"
    assert S.flex_end_words({"config": {"flexStart": True, "maxRunDuration": "a week"}}, [], NOW) == \
        "flex-start end unknown: max run duration unreadable: 'a week'"
    bad = [S.Node("a", {}, "not a time")]
    assert S.flex_end_words(FLEX, bad, NOW) == "flex-start end unknown: creation time of node a unreadable: 'not a time'"


def test_without_the_pool_list_flex_start_is_read_from_the_nodes_labels():
    assert S.is_flex_start(None, [S.Node("a", {CAP: "flex-start"})], CAP)
    assert S.is_flex_start(None, [S.Node("a", {S.FLEX_START_NODE_LABEL: "true"})], CAP)
    assert not S.is_flex_start(None, [S.Node("a", {CAP: "spot"})], CAP)


def test_a_node_list_that_is_not_what_kubectl_writes_is_no_traceback():
    assert S.nodes_by_pool({}, POOL_LABEL) == {} and S.nodes_by_pool(None, POOL_LABEL) == {}
    assert S.nodes_by_pool({"items": [{}]}, POOL_LABEL) == {"": [S.Node("?", {}, None)]}
