"""stall_action: restart and a failed health gate: which host the follow
sets aside by itself (runs/restart.py), and the watch that does it through
the engine (runs/follow.py, play.run_within): once per stall, with the
names the evidence gave, never in check mode, never a host not named."""
from __future__ import annotations

import json

import pytest

from playbooks.core.facts import Action
from playbooks.core.runner import Mode, Runner, StepLog
from playbooks.core.step import Step, Verify, change
from playbooks.runs import restart, timeline
from playbooks.runs.hang_diagnosis import MISSING, UNKNOWN, Diagnosis
from tests.test_goodput import T0, FakeContext, WatchedEnv, ev, start, steps

TWIN = {"tpu-group-0-0": "tpu-group-0", "tpu-group-1-0": "tpu-group-1"}
GKE = {"v6e-16-0": "v6e-16-0", "v6e-16-1": "v6e-16-1"}


def q(elastic: bool = True, hosts: dict | None = None, refused: str | None = None) -> restart.Quarantine:
    return restart.Quarantine(elastic, hosts or TWIN, lambda *a: [], refused)


def twin_host(name: str) -> str | None:
    return name if name in TWIN else None


# -- the decision --------------------------------------------------------------------------
def test_an_elastic_jobs_hung_host_is_set_aside_by_its_name_and_the_job_goes_on():
    p = restart.for_stall(q(), ("tpu-group-1-0",), twin_host, "run-1", "run")
    assert p.hosts == ("tpu-group-1-0",) and not p.stop
    assert "host tpu-group-1-0 quarantined" in p.line and "`invoke hosts.release tpu-group-1-0`" in p.line


def test_a_gke_culprit_is_its_pods_node_pool():
    pools = {"ray-worker-abc": "v6e-16-1"}
    p = restart.for_stall(q(hosts=GKE), ("ray-worker-abc",), pools.get, "run-1", "run")
    assert p.hosts == ("v6e-16-1",) and not p.stop
    # Two hosts of one slice: the slice set aside once.
    p = restart.for_stall(q(hosts=GKE), ("a", "b"), {"a": "v6e-16-0", "b": "v6e-16-0"}.get, "run-1", "run")
    assert p.hosts == ("v6e-16-0",)


def test_a_job_that_is_not_elastic_is_stopped_naming_the_host_and_none_is_set_aside():
    p = restart.for_stall(q(elastic=False), ("tpu-group-1-0",), twin_host, "run-1", "run")
    assert p.hosts == () and p.stop
    assert "names host tpu-group-1-0" in p.line and "`invoke hosts.quarantine tpu-group-1-0`" in p.line
    assert "`invoke train` resumes run run" in p.line


@pytest.mark.parametrize("culprits, why", [((), "names no host (cause unknown)"),
                                           (None, "the hang diagnosis failed")])
def test_no_culprit_named_stops_the_job_and_sets_none_aside(culprits, why):
    p = restart.for_stall(q(), culprits, twin_host, "run-1", "run")
    assert p.hosts == () and p.stop and why in p.line and "no host is set aside" in p.line


def test_a_name_that_is_no_host_every_slice_or_autopilot_stops_the_job_instead():
    unknown = restart.for_stall(q(), ("tpu-group-9-0",), twin_host, "run-1", "run")
    assert unknown.stop and unknown.hosts == () and "tpu-group-9-0, which is no host" in unknown.line
    every = restart.for_stall(q(), tuple(TWIN), twin_host, "run-1", "run")
    assert every.stop and every.hosts == () and "every slice of the job" in every.line
    # One slice already set aside by this follow: the other is the last one.
    last = restart.for_stall(q(), ("tpu-group-1-0",), twin_host, "run-1", "run", gone=["tpu-group-0-0"])
    assert last.stop and last.hosts == ()
    auto = restart.for_stall(q(refused="Autopilot makes its own nodes"), ("tpu-group-1-0",), twin_host, "r-1", "r")
    assert auto.stop and auto.hosts == () and "Autopilot" in auto.line


def test_a_gates_failed_hosts_are_named_as_the_twin_and_gke_name_them():
    bad = [{"hostname": "same-machine", "slice": "tpu-group-1", "host": 0, "rank": 1, "failed": ["devices"]},
           {"hostname": "", "slice": None, "host": None}, "not a host"]
    assert restart.gate_names(bad, simulated=True) == ["tpu-group-1-0"]
    assert restart.gate_names([{"hostname": "ray-worker-abc", "slice": "x", "host": 2}], simulated=False) == \
        ["ray-worker-abc"]


def test_a_gate_failure_sets_aside_for_an_elastic_job_only_and_names_the_host_otherwise():
    p = restart.for_gate(q(), ["tpu-group-1-0"], twin_host, "run-1")
    assert p is not None and p.hosts == ("tpu-group-1-0",) and not p.stop
    for who, why in ((q(elastic=False), "the job is not elastic"), (None, "stall_action is not restart")):
        p = restart.for_gate(who, ["tpu-group-1-0"], twin_host, "run-1")
        assert p is not None and p.hosts == () and not p.stop and why in p.line
        assert "`invoke hosts.quarantine tpu-group-1-0`" in p.line
    assert restart.for_gate(q(), [], twin_host, "run-1") is None
    unmapped = restart.for_gate(q(), ["elsewhere"], twin_host, "run-1")
    assert unmapped is not None and unmapped.hosts == ()


# -- the watch: the quarantine run through the engine ----------------------------------------
class StepsContext(FakeContext):
    """A follower's step context with the engine's parts that sub-steps need."""

    def __init__(self, acting: bool = True, status: str = "RUNNING"):
        super().__init__(status)
        self.acting = acting
        self.runner = Runner(Mode.APPLY if acting else Mode.CHECK)
        self.log = StepLog(self.said.append, False)
        self.heartbeat = 30.0

    @staticmethod
    def sleep(_s: float) -> None:
        pass

    def clock(self) -> float:  # each look a second later: a verify's wait ends
        self.ticks = getattr(self, "ticks", 0.0) + 1.0
        return self.ticks


class FakeQuarantine:
    """hosts.quarantine's steps, faked: each call recorded, its one step a
    change (an in-process action) verified by what it did; ``fails``: a
    change that does not hold."""

    def __init__(self, fails: bool = False):
        self.calls: list[tuple[str, str, str]] = []
        self.set: list[str] = []
        self.fails = fails

    def __call__(self, name: str, why: str, by: str) -> list[Step]:
        self.calls.append((name, why, by))
        from playbooks.core.facts import Fact
        held = Fact(name="set aside", python=lambda: list(self.set), display="# what is set aside")
        act = Action(f"# set {name} aside", lambda: None if self.fails else self.set.append(name))
        return [Step("quarantine", f"record {name}", lambda look: change(act, reason=f"recorded {name}"),
                     verify=Verify(held, lambda hs: None if name in hs else "not set aside", timeout=3,
                                   interval=1))]


def watched(tmp_path, monkeypatch, fake: FakeQuarantine, elastic: bool = True, acting: bool = True,
            culprits: tuple[str, ...] = ("tpu-group-1-0",), held=None):
    from playbooks.config import paths
    from playbooks.runs import follow
    monkeypatch.setattr(paths, "here", lambda rel: tmp_path / rel)
    ctx, env = StepsContext(acting), WatchedEnv(30, "restart")
    qq = restart.Quarantine(elastic, TWIN, fake, held=held)
    f = follow.Follower(ctx, env, "run", "run-1", quarantine=qq)
    if not acting:  # check mode keeps no timeline: one given, to show the watch still acts on nothing
        f.timeline = timeline.Writer(env, "run", "run-1", None)
    for e in start() + steps(1, 5, 27):
        f.line(f"(RayTrainWorker pid=1) trainer event: {json.dumps(e)}")
    now = [T0 + 31 + 30]
    w = follow.Watch(f, "http://127.0.0.1:8265", None, 1.0, clock=lambda: now[0])
    d = Diagnosis(MISSING if culprits else UNKNOWN, culprits, "hang: host tpu-group-1-0 missing from the collective",
                  2)
    monkeypatch.setattr(w, "diagnose", lambda: d)
    return ctx, env, f, w, now


def _stall_again(f, w, now, culprit: str | None = None) -> None:
    """A step, then no step for long: a second stall, its hang naming
    ``culprit`` (None: the host the first one named)."""
    f.line(f"(RayTrainWorker pid=1) trainer event: {json.dumps(ev(now[0] - T0, 'step', 6, seconds=1.0))}")
    now[0] += 100
    if culprit is not None:
        w.diagnose = lambda: Diagnosis(MISSING, (culprit,), f"hang: host {culprit} missing from the collective", 2)
    w.tick()


def test_a_stall_sets_the_culprit_aside_once_through_the_engine_and_the_job_goes_on(tmp_path, monkeypatch):
    fake = FakeQuarantine()
    ctx, env, f, w, now = watched(tmp_path, monkeypatch, fake)
    w.tick()
    w.tick()
    now[0] += 100
    w.tick()  # the same stall: nothing again
    assert fake.calls == [("tpu-group-1-0", "hang: host tpu-group-1-0 missing from the collective",
                           "stall_action: restart")]
    assert fake.set == ["tpu-group-1-0"] and ctx.ran == [] and not f.stopped  # not stopped: it goes on
    assert "  apply  # set tpu-group-1-0 aside" in ctx.said
    assert "  changed: [quarantine : record tpu-group-1-0] recorded tpu-group-1-0" in ctx.said
    assert any(s.startswith("stall_action: restart: job run-1: host tpu-group-1-0 quarantined") for s in ctx.said)
    [e] = [e for e in timeline.read(env, "run") if e["kind"] == "quarantined"]
    assert (e["host"], e["slice"], e["by"]) == ("tpu-group-1-0", "tpu-group-1", "stall_action: restart")
    # A second stall (after a step): called again, for the host it names.
    _stall_again(f, w, now)
    assert len(fake.calls) == 2


def test_a_host_given_back_is_a_slice_again_for_the_next_stall(tmp_path, monkeypatch):
    """The watch set tpu-group-1-0 aside; a person gave it back (out of the
    record); a later hang on tpu-group-0-0 sets that one aside and the job
    goes on, rather than stopping as if no slice were left."""
    fake = FakeQuarantine()
    ctx, _, f, w, now = watched(tmp_path, monkeypatch, fake, held=lambda: set(fake.set))
    w.tick()
    assert fake.set == ["tpu-group-1-0"] and not f.stopped
    fake.set.remove("tpu-group-1-0")  # `invoke hosts.release tpu-group-1-0`
    _stall_again(f, w, now, "tpu-group-0-0")
    assert [c[0] for c in fake.calls] == ["tpu-group-1-0", "tpu-group-0-0"] and not f.stopped and ctx.ran == []
    assert f.quarantined == ["tpu-group-0-0"]


@pytest.mark.parametrize("record", ["kept", "unreadable"])
def test_a_host_still_set_aside_or_a_record_that_cannot_be_read_leaves_no_slice_for_the_next_stall(
        tmp_path, monkeypatch, record):
    from playbooks.core.errors import ProbeFailed

    def unreadable():
        raise ProbeFailed("quarantined hosts", "cat x", 1, "", "not JSON", why="could not look: x not JSON")
    fake = FakeQuarantine()
    ctx, _, f, w, now = watched(tmp_path, monkeypatch, fake,
                                held=(lambda: set(fake.set)) if record == "kept" else unreadable)
    w.tick()
    _stall_again(f, w, now, "tpu-group-0-0")
    assert [c[0] for c in fake.calls] == ["tpu-group-1-0"] and f.stopped and len(ctx.ran) == 1
    assert f.quarantined == ["tpu-group-1-0"]


def test_a_host_given_back_that_fails_its_gate_again_is_set_aside_again(tmp_path, monkeypatch):
    fake = FakeQuarantine()
    ctx, _, f, w, now = watched(tmp_path, monkeypatch, fake, held=lambda: set(fake.set))
    f.line(gate_line(58, ("tpu-group-1", 0)))
    now[0] = T0 + 60
    w.tick()
    fake.set.remove("tpu-group-1-0")  # given back, and sick again at the next grow
    f.line(gate_line(80, ("tpu-group-1", 0)))
    w.tick()
    assert [c[0] for c in fake.calls] == ["tpu-group-1-0", "tpu-group-1-0"] and not f.stopped and ctx.ran == []


def test_a_stall_that_names_no_host_stops_the_job_and_sets_none_aside(tmp_path, monkeypatch):
    fake = FakeQuarantine()
    ctx, env, f, w, _ = watched(tmp_path, monkeypatch, fake, culprits=())
    w.tick()
    assert fake.calls == [] and ctx.ran == ["ray job stop --address http://127.0.0.1:8265 run-1"] and f.stopped
    assert any("no host is set aside" in s for s in ctx.said)
    kinds = [e["kind"] for e in timeline.read(env, "run")]
    assert "stopped" in kinds and "quarantined" not in kinds


def test_a_job_that_is_not_elastic_is_stopped_not_set_aside(tmp_path, monkeypatch):
    fake = FakeQuarantine()
    ctx, _, f, w, _ = watched(tmp_path, monkeypatch, fake, elastic=False)
    w.tick()
    assert fake.calls == [] and f.stopped and len(ctx.ran) == 1
    assert any("names host tpu-group-1-0" in s for s in ctx.said)


def test_a_quarantine_that_fails_stops_the_job_instead(tmp_path, monkeypatch):
    fake = FakeQuarantine(fails=True)
    ctx, env, f, w, _ = watched(tmp_path, monkeypatch, fake)
    w.tick()
    assert len(fake.calls) == 1 and f.stopped and len(ctx.ran) == 1
    assert any(s.startswith("stall_action: restart: host tpu-group-1-0 could not be set aside") for s in ctx.said)
    assert "quarantined" not in [e["kind"] for e in timeline.read(env, "run")]


def test_nothing_is_set_aside_or_stopped_in_check_mode(tmp_path, monkeypatch):
    fake = FakeQuarantine()
    ctx, _env, f, w, _ = watched(tmp_path, monkeypatch, fake, acting=False)
    w.restart(Diagnosis(MISSING, ("tpu-group-1-0",), "hang: ...", 2))
    f.line("trainer event: " + json.dumps(ev(40, "health_gate", ok=False, unhealthy=[
        {"hostname": "m", "slice": "tpu-group-1", "host": 0, "failed": ["devices"]}])))
    w.gate()
    assert fake.calls == [] and ctx.ran == [] and not f.stopped


def gate_line(t: float, *bad: tuple[str, int]) -> str:
    return "(RayTrainWorker pid=1) trainer event: " + json.dumps(ev(t, "health_gate", ok=False, hosts=2, unhealthy=[
        {"hostname": "same-machine", "slice": s, "host": h, "rank": 1, "failed": ["devices", "matmul"]}
        for s, h in bad]))


@pytest.mark.parametrize("elastic", [True, False])
def test_a_failed_health_gate_sets_its_host_aside_for_an_elastic_job_once(tmp_path, monkeypatch, elastic):
    fake = FakeQuarantine()
    ctx, env, f, w, now = watched(tmp_path, monkeypatch, fake, elastic=elastic)
    f.line(gate_line(58, ("tpu-group-1", 0)))
    f.line(f"(RayTrainWorker pid=1) trainer event: {json.dumps(ev(59, 'step', 6, seconds=1.0))}")
    now[0] = T0 + 60
    w.tick()
    w.tick()
    if elastic:
        assert fake.calls == [("tpu-group-1-0", "failed its health checks: devices, matmul", "health gate")]
        assert any(s.startswith("health gate: host tpu-group-1-0 quarantined") for s in ctx.said)
        [e] = [e for e in timeline.read(env, "run") if e["kind"] == "quarantined"]
        assert e["by"] == "health gate"
    else:
        assert fake.calls == []
        assert [s for s in ctx.said if s.startswith("health gate:")] == [
            "health gate: job run-1's worker group failed its checks on tpu-group-1-0; not set aside (the job is "
            "not elastic): `invoke hosts.quarantine tpu-group-1-0` sets it aside"]
    assert ctx.ran == [] and not f.stopped


def test_a_gke_culprit_maps_through_its_pods_node_to_the_pool(tmp_path, monkeypatch):
    """GKE: the worker's name is its pod's hostname; the pod's node's pool is the host."""
    from playbooks.cloud import kube_objects
    from playbooks.config import paths
    from playbooks.config.choices import PLATFORMS
    from playbooks.runs import follow
    from tests.test_goodput import pod
    monkeypatch.setattr(paths, "here", lambda rel: tmp_path / rel)
    env = WatchedEnv(30, "restart")
    env.platform, env.capacity = PLATFORMS["gke"], "on-demand"
    monkeypatch.setattr(kube_objects, "pods_and_events",
                        lambda _env: ([pod("ray-w-0", node="gke-n-0"), pod("ray-w-1", "u2", node="gke-n-1")], []))
    monkeypatch.setattr(kube_objects, "node", lambda _env, n: {"metadata": {"name": n, "labels": {
        "cloud.google.com/gke-nodepool": "v6e-16-1" if n == "gke-n-1" else "v6e-16-0"}}})
    f = follow.Follower(StepsContext(), env, "run", "run-1", quarantine=restart.Quarantine(True, GKE, FakeQuarantine()))
    w = follow.Watch(f, "http://x", None, 1.0, clock=lambda: T0)
    assert (w.host_of("ray-w-1"), w.host_of("ray-w-0"), w.host_of("ray-w-9")) == ("v6e-16-1", "v6e-16-0", None)


def test_steps_run_within_a_step_are_printed_not_run_in_a_dry_run_and_stop_at_a_failure():
    """The engine's helper: each step through the same runner and mode."""
    from playbooks.core.play import StepContext, run_within
    from playbooks.core.step import fail
    ran: list[str] = []
    mk = [Step("p", "one", lambda look: change(Action("# one", lambda: ran.append("one")), reason="did one")),
          Step("p", "two", lambda look: fail("two is broken")),
          Step("p", "three", lambda look: change(Action("# three", lambda: ran.append("three")), reason="3"))]
    for mode, want in ((Mode.DRY, []), (Mode.APPLY, ["one"])):
        said: list[str] = []
        ctx = StepContext(Runner(mode), mk[0], StepLog(said.append, False))
        done = run_within(ctx, mk)
        assert ran == want and [s.title for s, _ in done] == ["p : one", "p : two"]  # three: not run after the failure
        assert said[:2] == ["  step   [p : one]", "  apply  # one"]
        assert said[2] == ("  changed: [p : one] would change: did one" if mode is Mode.DRY else
                           "  changed: [p : one] did one")
        assert "  failed: [p : two] two is broken" in said
