"""A hang named by its evidence: the classifier on recorded py-spy dumps
(tests/data/stacks, in the format Ray's /worker/traceback returns: py-spy
dump's text) and heartbeats; the follower's heartbeats kept apart from the
timeline; the trainer's heartbeat."""
import sys
import threading
import time

import pytest

from playbooks.runs import events as E
from playbooks.runs import hang_diagnosis as H
from playbooks.runs.hang_evidence import Heartbeats, group_start, names
from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "trainer"))
import heartbeat as trainer_heartbeat

STACKS = ROOT / "tests" / "data" / "stacks"
NOW = 1_800_000_000.0


def stack(name: str) -> str:
    return (STACKS / f"{name}.txt").read_text()


def worker(i: int, kind: str | None = "blocked", beat: float | None = NOW - 10, step: int | None = 41,
           no_answer: bool = False, unread: str | None = None) -> H.Worker:
    return H.Worker(f"twin-s{i // 2}-w{i % 2}", i, f"twin-s{i // 2}", stack(kind) if kind else None, no_answer, unread,
                    beat, 30.0, step)


def test_each_recorded_stack_is_in_what_it_shows():
    assert H.context(stack("input")) == H.INPUT
    assert H.context(stack("compile")) == H.COMPILE
    assert H.context(stack("checkpoint")) == H.CHECKPOINT
    assert H.context(stack("blocked")) is None and H.blocked(stack("blocked"))
    # Orbax's background thread finishing an async save is not the training thread: still a blocked worker.
    assert H.context(stack("blocked_async_save")) is None and H.blocked(stack("blocked_async_save"))
    assert not H.blocked(stack("input")) and not H.blocked(stack("compile"))


def test_a_frozen_worker_is_missing_from_the_collective_the_others_wait_in():
    ws = [worker(0), worker(1), worker(3),
          worker(2, kind=None, no_answer=True, beat=NOW - 200, step=40)]
    d = H.diagnose(ws, NOW)
    assert (d.cause, d.culprits) == (H.MISSING, ("twin-s1-w0",))
    assert d.line.startswith("hang: host twin-s1-w0 (slice twin-s1) missing from the collective the other 3 wait in")
    assert f"its heartbeat stopped {time.strftime('%H:%M', time.localtime(NOW - 200))}" in d.line
    assert "others at step 41" in d.line


def test_heartbeats_alone_name_the_silent_host_when_no_stack_can_be_read():
    off = "profiling is off on the Ray head"
    ws = [worker(i, kind=None, unread=off) for i in range(3)] + [worker(3, kind=None, unread=off, beat=NOW - 95)]
    d = H.diagnose(ws, NOW)
    assert (d.cause, d.culprits) == (H.MISSING, ("twin-s1-w1",))
    assert "silent while the other 3 beat on" in d.line
    # A beat within 3 intervals is not stale: nobody is named.
    ws[3] = worker(3, kind=None, unread=off, beat=NOW - 85)
    assert H.diagnose(ws, NOW).cause == H.UNKNOWN


def test_one_host_in_its_input_pipeline_while_the_others_wait():
    d = H.diagnose([worker(0), worker(1), worker(2, kind="input"), worker(3)], NOW)
    assert (d.cause, d.culprits) == (H.INPUT, ("twin-s1-w0",))
    assert "in the input pipeline while the other 3 wait in a collective" in d.line


def test_every_host_compiling_is_a_compile_not_one_culprit():
    d = H.diagnose([worker(i, kind="compile", step=None) for i in range(4)], NOW)
    assert d.cause == H.COMPILE and len(d.culprits) == 4
    assert d.line.startswith("hang: every host compiling")


def test_one_host_in_its_checkpoints_io():
    d = H.diagnose([worker(0, kind="checkpoint"), worker(1), worker(2), worker(3, kind="blocked_async_save")], NOW)
    assert (d.cause, d.culprits) == (H.CHECKPOINT, ("twin-s0-w0",))


def test_a_host_behind_the_others_is_named_with_what_its_stack_shows():
    ws = [worker(0), worker(1), worker(2, kind="input", step=40), worker(3)]
    d = H.diagnose(ws, NOW)
    assert (d.cause, d.culprits) == (H.INPUT, ("twin-s1-w0",))
    assert "last step 40; the other 3 at step 41" in d.line
    ws[2] = worker(2, kind=None, step=40, unread="HTTP 500: py-spy failed")
    d = H.diagnose(ws, NOW)
    assert (d.cause, d.culprits) == (H.MISSING, ("twin-s1-w0",))


@pytest.mark.parametrize("ws", [
    [],
    [worker(i, kind=None, beat=None, step=None, unread="profiling is off on the Ray head") for i in range(4)],
])
def test_no_evidence_is_unknown_and_says_why(ws):
    d = H.diagnose(ws, NOW)
    assert (d.cause, d.culprits) == (H.UNKNOWN, ())
    assert "no evidence" in d.line
    if ws:
        assert "profiling is off" in d.line


def test_all_waiting_alike_names_nobody():
    d = H.diagnose([worker(i) for i in range(4)], NOW)
    assert (d.cause, d.culprits) == (H.UNKNOWN, ())
    assert "4 of 4 stacks read wait in a collective" in d.line


def test_every_worker_silent_is_the_group_not_a_host():
    d = H.diagnose([worker(i, kind=None, no_answer=True, beat=NOW - 500) for i in range(4)], NOW)
    assert (d.cause, d.culprits) == (H.UNKNOWN, ())


# -- the follower's heartbeats --------------------------------------------------------
def beat(rank: int, t: float, step: int | None = 5, **kw) -> dict:
    return {"t": t, "kind": E.HEARTBEAT, "step": step, "rank": rank, "every": 30.0, "slice": "g-0", "host": str(rank),
            "hostname": "box", "pid": 100 + rank, "node_id": f"n{rank}", **kw}


def test_heartbeats_are_kept_apart_from_the_timeline_the_last_per_rank():
    hb = Heartbeats()
    step = {"t": 5.0, "kind": E.STEP, "step": 3}
    assert hb.take([beat(0, 10.0), step, beat(0, 40.0, step=6), beat(1, 12.0), beat(0, 20.0)]) == [step]
    assert [(b["rank"], b["t"]) for b in hb.since(0)] == [(0, 40.0), (1, 12.0)]
    assert [b["rank"] for b in hb.since(30.0)] == [0]  # a beat from before the current group is not its


def test_a_group_starts_at_its_latest_start_and_hosts_sharing_a_hostname_are_named_by_slice():
    assert group_start([{"t": 100.0, "kind": E.WORKER_STARTED}, {"t": 300.0, "kind": E.JAX_INITIALIZED},
                        {"t": 400.0, "kind": E.STEP}]) == 295.0
    assert names([beat(0, 1.0), beat(1, 1.0)]) == {0: "g-0-0", 1: "g-0-1"}
    assert names([beat(0, 1.0, hostname="pod-a"), beat(1, 1.0, hostname="pod-b")]) == {0: "pod-a", 1: "pod-b"}


# -- the trainer's heartbeat ----------------------------------------------------------------
def test_the_trainer_beats_at_once_then_every_interval_until_stopped():
    said: list[dict] = []
    got = threading.Event()

    def emit(kind, **fields):
        said.append({"kind": kind, **fields})
        if len(said) >= 3:
            got.set()

    steps = iter([None, 4, 5, 6, 7, 8])
    hb = trainer_heartbeat.Heartbeat(emit, {"rank": 2, "pid": 7}, lambda: next(steps), every=0.05).start()
    assert got.wait(5)
    hb.stop()
    hb.thread.join(2)
    assert not hb.thread.is_alive() and hb.thread.daemon
    assert said[0] == {"kind": "heartbeat", "step": None, "every": 0.05, "rank": 2, "pid": 7}
    assert [s["step"] for s in said[:3]] == [None, 4, 5]


def test_the_trainer_heartbeat_interval_comes_from_the_job_env():
    assert trainer_heartbeat.interval({}) == 30.0
    assert trainer_heartbeat.interval({"TRAINER_HEARTBEAT_S": "5"}) == 5.0
    assert trainer_heartbeat.interval({"TRAINER_HEARTBEAT_S": "0.01"}) == 1.0
    assert trainer_heartbeat.interval({"TRAINER_HEARTBEAT_S": "soon"}) == 30.0


def test_the_job_gives_the_heartbeat_a_quarter_of_stall_after_and_keeps_ray_from_folding_it():
    import re

    from playbooks.job.spec import trainer_env
    from tests.conftest import env
    assert trainer_env(env("local", stall_after=20), False)["TRAINER_HEARTBEAT_S"] == "5"
    assert trainer_env(env("local", stall_after=5), False)["TRAINER_HEARTBEAT_S"] == "1"
    assert trainer_env(env("local", stall_after=3600), False)["TRAINER_HEARTBEAT_S"] == "30"
    assert "TRAINER_HEARTBEAT_S" not in trainer_env(env("local"), False)  # the trainer's 30 s
    # Ray's driver never folds a line its allow regex finds: each worker's beat, as the trainer prints it.
    allow = re.compile(trainer_env(env("dev"), False)["RAY_DEDUP_LOGS_ALLOW_REGEX"])
    assert allow.search('(RayTrainWorker pid=7, ip=10.0.0.3) trainer event: {"t": 1.0, "kind": "heartbeat"}')
