"""A slice's announced end, as the watch decides it (issue 37): which hosts
get their notice now (``runs/maintenance_watch.py``), what is coming read
from GKE's node labels and a flex-start pool's nodes
(``cloud/slice_ends.coming``), the twin's record of its simulated
maintenance (``twin/maintenance_sim.py``). Pure, or this machine's files."""
from __future__ import annotations

import time

import pytest

from playbooks.cloud import slice_ends
from playbooks.core.errors import ProbeFailed
from playbooks.runs import events as E
from playbooks.runs import maintenance_watch as M
from playbooks.twin import maintenance_sim


def test_a_host_is_noticed_within_the_lead_once_per_time_and_in_time_order():
    coming = {"b": (1000.0, "host maintenance at ..."), "a": (950.0, "flex-start end at ..."),
              "c": (5000.0, "far")}
    assert [c.host for c in M.due(coming, now=900.0, lead=100.0, noticed=set())] == ["a", "b"]
    assert [c.host for c in M.due(coming, now=900.0, lead=100.0, noticed={("a", 950.0)})] == ["b"]
    # A time moved later is a new notice; one already past is still given (at once).
    assert [c.host for c in M.due({"a": (960.0, "")}, 900.0, 100.0, {("a", 950.0)})] == ["a"]
    assert [c.host for c in M.due({"a": (800.0, "")}, 900.0, 10.0, set())] == ["a"]


def test_the_notices_a_timeline_has_are_not_given_twice_and_the_save_after_one_is_found():
    evs = [{"t": 1.0, "kind": E.NOTICE_GIVEN, "by": M.BY, "host": "p1", "at": 50.0},
           {"t": 2.0, "kind": E.NOTICE_GIVEN, "by": "chaos", "host": "p2", "at": 60.0},
           {"t": 3.0, "kind": E.CHECKPOINT_FINALIZED, "step": 9, "finalized": False},
           {"t": 4.0, "kind": E.CHECKPOINT_FINALIZED, "step": 10, "finalized": True}]
    assert M.noticed_in(evs) == {("p1", 50.0)}
    assert M.saved_after(evs, 1.5) == 10 and M.saved_after(evs, 4.0) is None


def node(name: str, pool: str, **labels: str) -> dict:
    return {"metadata": {"name": name, "creationTimestamp": "2026-12-01T00:00:00Z",
                         "labels": {"cloud.google.com/gke-nodepool": pool, **labels}}}


def test_what_is_coming_for_each_pool_is_its_nearest_end():
    doc = {"items": [node("n0", "p0", **{slice_ends.MAINTENANCE_LABEL: "2000000000"}),
                     node("n1", "p0", **{slice_ends.MAINTENANCE_LABEL: "1900000000"}),
                     node("n2", "p1", **{slice_ends.FLEX_START_NODE_LABEL: "true"}),
                     node("n3", "p2"), node("n4", "other", **{slice_ends.MAINTENANCE_LABEL: "1"})]}
    got = slice_ends.coming(doc, "cloud.google.com/gke-nodepool", "tpu-playbooks/capacity", ["p0", "p1", "p2"])
    assert got["p0"] == (1900000000.0, "host maintenance at 2030-03-17 17:46Z (node n1)")
    end = time.mktime(time.strptime("2026-12-08", "%Y-%m-%d")) - time.timezone
    assert got["p1"] == (end, "flex-start end at 2026-12-08 00:00Z (7 d 0 h from its first node)")
    assert "p2" not in got and "other" not in got


def test_the_twins_record_is_read_and_a_broken_one_is_could_not_look(tmp_path, monkeypatch):
    class Env:
        name = "t"
    monkeypatch.setattr(maintenance_sim.paths, "maintenance", lambda env: str(tmp_path / "m.json"))
    assert maintenance_sim.read(Env()) == {}
    maintenance_sim.schedule(Env(), ["h0", "h1"], 123.0).fn()
    assert maintenance_sim.read(Env()) == {"h0": 123.0, "h1": 123.0}
    maintenance_sim.done(Env(), ["h0"]).fn()
    assert maintenance_sim.read(Env()) == {"h1": 123.0}
    (tmp_path / "m.json").write_text('{"hosts": {"h0": "soon"}}')
    with pytest.raises(ProbeFailed, match="is not a record of times"):
        maintenance_sim.read(Env())


def test_a_slice_set_aside_for_its_maintenance_is_given_back_once_it_is_no_longer_announced():
    coming = {"p0": (1000.0, "host maintenance at ...")}
    assert M.over({"p0"}, coming) == []           # still announced: its maintenance is not done
    assert M.over({"p0", "p1"}, coming) == ["p1"]  # its label gone: GKE removes it when done
    assert M.over(set(), {}) == []
