"""A host set aside by the follower (stall_action: restart, a failed
health gate) on recorded timelines: the hang's seconds are the stall's up
to the quarantine, then a lost host's detection and restart; the chips of a
slice set aside are their own cause on GKE (its nodes bill), not billed on
the twin (its host stopped)."""
from __future__ import annotations

import pytest

from playbooks.runs import cost, goodput
from playbooks.runs import events as E
from tests.test_cost import POOLS, SLICES, on_gke, recorded, seconds, t_of
from tests.test_goodput import ev, start, steps


def hang_set_aside() -> list[dict]:
    """Steps 1-5 to 31 s; no step after; the stall seen at 61 s, its hang
    named, host tpu-group-1-0 set aside at 62; Ray marks its node dead and
    Ray Train fails the group at 66; a one-slice group from 70 restores
    step 5 and steps on from 80."""
    return (start() + steps(1, 5, 27)
            + [ev(61, "stall_started", 5, since=31 + 1_800_000_000.0, p90=1.0, limit=30),
               ev(61.5, "hang_diagnosed", 5, culprits=["tpu-group-1-0"], cause="missing_from_collective",
                  line="hang: host tpu-group-1-0 (slice tpu-group-1) missing from the collective"),
               ev(62, "quarantined", 5, host="tpu-group-1-0", slice="tpu-group-1", why="hang: ...",
                  by="stall_action: restart"),
               ev(66, "worker_lost", 5, by="node", source="ray"), ev(66, "failure", 5, decision="RETRY"),
               ev(66, "stall_ended", 5, since=31 + 1_800_000_000.0, by="failure"),
               ev(70, "workers_restarted", 5, workers=1), ev(71, "jax_initialized"),
               ev(72, "restore_started", 5), ev(74, "restored", 5, seconds=2.0)]
            + steps(6, 10, 80))


def test_a_hang_set_aside_is_stall_until_the_quarantine_then_detection_and_restart():
    r = goodput.account(hang_set_aside(), "run")
    assert r["badput_s"]["stall"] == pytest.approx(62 - 31)  # the last step to the quarantine, not to the failure
    assert r["badput_s"]["detection"] == pytest.approx(66 - 62)
    assert r["badput_s"]["restart"] > 0 and r["badput_s"]["restore"] == pytest.approx(2.0)
    [inc] = r["incidents"]
    assert inc["kind"] == "stall" and inc["quarantined"] == ["tpu-group-1-0"] and inc["lost_at_step"] == 5
    assert inc["recover_s"] == pytest.approx(80 - 31) and "ended" not in inc  # one incident, recovered
    text = "\n".join(goodput.lines(r))
    assert "set aside: tpu-group-1-0 (`invoke hosts`)" in text and "recovered in 49.0 s" in text


def test_without_the_quarantine_the_same_hang_is_stall_to_the_failure():
    """What the accounting above depends on: the event, not the stall."""
    evs = [e for e in hang_set_aside() if e["kind"] != "quarantined"]
    r = goodput.account(evs, "run")
    assert r["badput_s"]["stall"] == pytest.approx(66 - 31) and r["badput_s"]["detection"] == 0
    assert "quarantined" not in r["incidents"][0]


def quarantined_instead_of_lost(evs: list[dict], slice_: str) -> list[dict]:
    """The recorded run with its host's loss (the chaos kill, or the pod
    preempted) made a quarantine of ``slice_`` by the follower."""
    out = []
    for e in evs:
        if e["kind"] == E.WORKER_LOST and e["source"] in ("chaos", "pods"):
            e = {"t": e["t"], "kind": E.QUARANTINED, "step": None, "source": "train", "job": e.get("job"),
                 "host": slice_ if slice_ in POOLS else f"{slice_}-0", "slice": slice_, "why": "hang: ...",
                 "by": "stall_action: restart"}
        out.append(e)
    return out


def report(evs: list[dict]) -> tuple[dict, list]:
    _, segs = goodput.account_with_segments(evs, "r")
    return cost.report(evs, segs, goodput.CAUSES, cost.recorded_basis(evs), True), segs


def test_on_gke_a_slice_set_aside_bills_as_quarantined_until_the_end():
    """Its nodes exist (cordoned, tainted): billed, in no worker group."""
    evs = quarantined_instead_of_lost(on_gke(recorded(rates=(2.7, 2.7)), "v6e-16-0"), "v6e-16-0")
    c, segs = report(evs)
    start_, end = segs[0][0], segs[-1][1]
    q = t_of(evs, E.QUARANTINED)
    assert c["chip_hours"] == pytest.approx(seconds(segs, start_, end) * 8 / 3600, abs=1e-4)  # both billed throughout
    assert c["badput_chip_hours"][cost.QUARANTINED] == pytest.approx(seconds(segs, q, end) * 4 / 3600, abs=1e-4)
    assert c["productive_chip_hours"] + sum(c["badput_chip_hours"].values()) == pytest.approx(c["chip_hours"],
                                                                                             abs=1e-3)
    assert c["badput_cost"][cost.QUARANTINED] == pytest.approx(c["badput_chip_hours"][cost.QUARANTINED] * 2.7,
                                                              abs=0.006)
    assert "quarantined (set aside, billed)" in "\n".join(goodput.lines({**goodput.account(evs, "r"), "cost": c}))
    # Its pool made again (a pod placed on it): billed as a slice again, no longer set aside.
    back = q + 5
    again = sorted(evs + [{"t": back, "kind": E.SCHEDULED, "step": None, "source": "pods", "pod": "w-9",
                           "slice": "tpu-group-0", "node": "gke-v6e-16-0-0001", "pool": "v6e-16-0"}],
                   key=lambda e: e["t"])
    c2, segs2 = report(again)
    assert c2["badput_chip_hours"][cost.QUARANTINED] == pytest.approx(seconds(segs2, q, back) * 4 / 3600, abs=1e-4)


def released(evs: list[dict], t: float, slice_: str) -> list[dict]:
    """The run with `invoke hosts.release` of the host set aside at ``t``."""
    host = next(e["host"] for e in evs if e["kind"] == E.QUARANTINED)
    return sorted(evs + [{"t": t, "kind": E.RELEASED, "step": None, "source": "hosts", "host": host,
                          "slice": slice_, "by": "hosts.release"}], key=lambda e: e["t"])


def test_on_gke_a_released_slice_is_quarantined_until_its_release_then_held():
    """Released, its nodes are no longer set aside: billed, held (in no
    worker group) until a group takes the slice; the chips billed unchanged."""
    evs = quarantined_instead_of_lost(on_gke(recorded(rates=(2.7, 2.7)), "v6e-16-0"), "v6e-16-0")
    q = t_of(evs, E.QUARANTINED)
    before, _ = report(evs)
    after, segs = report(released(evs, q + 7, "v6e-16-0"))
    assert after["badput_chip_hours"][cost.QUARANTINED] == pytest.approx(seconds(segs, q, q + 7) * 4 / 3600, abs=1e-4)
    assert after["badput_chip_hours"][cost.QUARANTINED] < before["badput_chip_hours"][cost.QUARANTINED]
    # Billed as before: what was quarantined after the release is held, or used where no group was set.
    assert after["badput_chip_hours"][cost.HELD] > before["badput_chip_hours"].get(cost.HELD, 0)
    assert after["chip_hours"] == pytest.approx(before["chip_hours"], abs=1e-6)
    assert after["productive_chip_hours"] + sum(after["badput_chip_hours"].values()) == pytest.approx(
        after["chip_hours"], abs=1e-3)


def test_a_release_after_the_jobs_end_does_not_make_the_run_longer():
    """Written before the job's end was read back (a detached job), it sorts after it."""
    evs = quarantined_instead_of_lost(on_gke(recorded(rates=(2.7, 2.7)), "v6e-16-0"), "v6e-16-0")
    late = released(evs, max(e["t"] for e in evs) + 30, "v6e-16-0")
    assert late[-1]["kind"] == E.RELEASED
    assert goodput.account(late, "r")["wall_s"] == goodput.account(evs, "r")["wall_s"]
    assert report(late)[0] == report(evs)[0]


def twin_set_aside() -> list[dict]:
    """The recorded run on the twin (simulated chips), tpu-group-0 set aside instead of lost."""
    evs = recorded(names=SLICES)
    for e in evs:
        if e["kind"] == E.PRICED:
            e["simulated"] = True
    return quarantined_instead_of_lost(evs, "tpu-group-0")


def test_on_the_twin_a_released_host_is_billed_again_from_its_release():
    evs = twin_set_aside()
    q = t_of(evs, E.QUARANTINED)
    c, segs = report(released(evs, q + 7, "tpu-group-0"))
    start_, end = segs[0][0], segs[-1][1]
    assert c["chip_hours"] == pytest.approx(
        (seconds(segs, start_, q) * 8 + seconds(segs, q, q + 7) * 4 + seconds(segs, q + 7, end) * 8) / 3600, abs=1e-4)


def test_on_the_twin_a_host_set_aside_is_stopped_and_not_billed():
    evs = twin_set_aside()
    c, segs = report(evs)
    start_, end = segs[0][0], segs[-1][1]
    q = t_of(evs, E.QUARANTINED)
    assert c["chip_hours"] == pytest.approx((seconds(segs, start_, q) * 8 + seconds(segs, q, end) * 4) / 3600,
                                            abs=1e-4)
    assert c["badput_chip_hours"][cost.QUARANTINED] == 0
