"""A notice to go, turned into a save (issue 37): the command that gives a
TPU host's Ray node its notice (playbooks/config/host_notice.py: the worker pod's
preStop hook on GKE, chaos.preempt-worker on the twin), the trainer's watch
that turns Ray Train's preemption mark into JAX's notice
(trainer/notice.py), and the events of a save finalized (or not) that the
run's accounting of saves reads. The whole path, drain to restore with no
step replayed, runs in tests/test_local_e2e.py and the soak."""
import json
import os
import subprocess
import sys
import time

import pytest

from playbooks.config import host_notice as notice
from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "trainer"))
import notice as trainer_notice

import maxtext_ray as mr


def events(out: str) -> list[dict]:
    return [json.loads(line.split(mr.EVENT, 1)[1]) for line in out.splitlines() if mr.EVENT in line]


# -- the notice, as Ray is given it ---------------------------------------------------------
def test_the_drain_names_the_node_the_reason_and_the_deadline():
    assert notice.drain_argv(15, "goes", "abc", "127.0.0.2:6390") == (
        "ray", "drain-node", "--address=127.0.0.2:6390", "--node-id=abc", "--reason=DRAIN_NODE_REASON_PREEMPTION",
        "--reason-message=goes", "--deadline-remaining-seconds=15")
    # In a pod: the node it runs on, the cluster it joined.
    assert notice.drain_argv(30, "x") == ("ray", "drain-node", "--reason=DRAIN_NODE_REASON_PREEMPTION",
                                          "--reason-message=x", "--deadline-remaining-seconds=30")


@pytest.mark.parametrize("grace, ok", [(1, True), (30, True), (3600, True), (0, False), (3601, False),
                                        (2.5, False), (-1, False)])
def test_a_grace_out_of_range_is_refused_in_one_line(grace, ok):
    problem = notice.grace_problem(grace)
    assert (problem is None) == ok
    if not ok:
        assert problem == f"--grace {grace:g}: must be a whole number of seconds from 1 to 3600"


def test_the_prestop_hook_drains_its_node_then_waits_while_a_training_worker_runs(tmp_path):
    """The hook's own program, run as the kubelet runs it: a `ray` on PATH
    that records its arguments, and a process titled as Ray Train's worker
    that ends after 2 s: the hook drains at once and returns only after it."""
    record = tmp_path / "ray-argv"
    fake = tmp_path / "bin" / "ray"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {record}\n")
    fake.chmod(0o755)
    # This machine may run real training workers (another test's): the
    # hook's program looks for a title of this test's own.
    title = f"ray::TestTrainWorker{os.getpid()}"
    command = notice.prestop_hook()["preStop"]["exec"]["command"]
    assert command[:2] == ["python", "-c"] and repr(notice.TRAIN_WORKER.encode()) in command[2]
    program = command[2].replace(repr(notice.TRAIN_WORKER.encode()), repr(title.encode()))
    # Each of its waits said on its output: "at once" is no wait, however slow a loaded machine is.
    assert "    time.sleep(1)\n" in program
    program = program.replace("    time.sleep(1)\n", "    time.sleep(1)\n    print('waited', flush=True)\n")
    worker = subprocess.Popen(["bash", "-c", f"exec -a '{title}.train_fn' sleep 2"])
    try:
        start = time.monotonic()
        env = dict(os.environ, PATH=f"{fake.parent}:{os.environ['PATH']}")
        done = subprocess.run([sys.executable, "-c", program], env=env, timeout=30, capture_output=True, text=True)
        took = time.monotonic() - start
    finally:
        worker.kill()
    assert done.returncode == 0
    said = record.read_text().splitlines()
    assert said == list(notice.drain_argv(notice.POD_GRACE_S, said[2].split("=", 1)[1]))[1:]
    assert said[1:] == ["--reason=DRAIN_NODE_REASON_PREEMPTION", "--reason-message=the pod is terminating: a "
                        "preemption, a maintenance or a deletion", "--deadline-remaining-seconds=30"]
    assert 1.0 < took < 10 and "waited" in done.stdout, (took, done.stdout)
    # With no training worker, it returns at once: no wait.
    alone = subprocess.run([sys.executable, "-c", program], env=env, timeout=30, check=True, capture_output=True,
                           text=True)
    assert alone.stdout == ""


# -- the trainer's watch -------------------------------------------------------------------
MARK = {"nodes": ["n1"], "ranks": [1], "deadline": 2e9}


def test_a_mark_becomes_one_notice_and_one_event(capsys):
    marks, sent = [None, MARK, MARK], []
    w = trainer_notice.NoticeWatch(mr.event, lambda: 43, lambda: sent.append(1) or True,
                                   look=lambda: marks.pop(0))
    assert not w.check()                   # no mark yet
    assert w.check() and w.check()         # the mark: acted on once
    assert sent == [1]
    [e] = events(capsys.readouterr().out)
    assert (e["kind"], e["step"], e["nodes"], e["ranks"], e["save_asked"]) == ("notice_received", 43, ["n1"], [1],
                                                                               True)
    assert 0 < e["grace_s"] <= 2e9 - time.time() + 1


def test_a_notice_that_cannot_be_sent_says_why(capsys):
    w = trainer_notice.NoticeWatch(mr.event, lambda: None, lambda: False, look=lambda: dict(MARK, deadline=None))
    assert w.check()
    [e] = events(capsys.readouterr().out)
    assert (e["save_asked"], e["why"], e["grace_s"]) == (False, "no JAX preemption service in this process", None)

    def boom():
        raise OSError("no such process")
    w = trainer_notice.NoticeWatch(mr.event, lambda: 1, boom, look=lambda: MARK)
    assert w.check()
    assert events(capsys.readouterr().out)[0]["why"] == "OSError: no such process"


def test_a_notice_before_its_groups_first_step_line_names_the_step_the_group_restored_from(capsys):
    """MaxText writes a step's line only after the next step
    (metric_logger.py's buffer_and_write_metrics): a group that restored
    from step 30 has no step line yet; its notice names step 30, not None."""
    p = mr.Progress()
    p.line("restoring from this run's directory step 30")
    assert (p.last_step, p.at_step) == (None, 30)
    w = trainer_notice.NoticeWatch(mr.event, lambda: p.at_step, lambda: True, look=lambda: MARK)
    assert w.check()
    assert events(capsys.readouterr().out)[0]["step"] == 30
    p.line("completed step: 31, seconds: 1.000, TFLOP/s/device: 1.0, Tokens/s/device: 1.0, loss: 9.0")
    assert p.at_step == 31
    assert mr.Progress().at_step is None  # a fresh group before its first line: none to name
    # The trainer's rank 0 hands the watch this step (train_loop_per_worker).
    import inspect
    assert "NoticeWatch(event, lambda: PROGRESS.at_step," in inspect.getsource(mr.train_loop_per_worker)


def test_a_look_that_fails_is_tried_again():
    looks = []

    def look():
        looks.append(1)
        if len(looks) == 1:
            raise RuntimeError("GCS busy")
        return MARK
    w = trainer_notice.NoticeWatch(lambda *a, **k: None, lambda: 1, lambda: True, look=look)
    assert not w.check() and w.check()


# -- a save finalized, as MaxText 0.2.5 and Orbax 0.12.8 log it ---------------------------------
SAVE_10 = ["Waited 0.5 seconds for step 10 to finish before starting checkpointing.",
           "Started an asynchronous checkpoint save for step 10"]
DONE_10 = "[process=0][thread=save_finalize][step=10] CheckpointManager Save Finalize is done on all hosts."
FAILED_10 = ("[step=10] Checkpointer failed: one or more items may not be finalized. Skipping finalization of step "
             "checkpoint.")


def finalized(tmp_path, lines, made: bool) -> dict:
    h = mr.MaxTextEvents()
    h.checkpoint_dir = str(tmp_path)
    if made:
        (tmp_path / "10").mkdir()
    out = None
    for i, line in enumerate(lines):
        out = h.line(line, 100.0 + i) or out
    return out


def test_a_save_finalized_is_one_event_with_its_seconds(tmp_path, capsys):
    e = finalized(tmp_path, [*SAVE_10, DONE_10], made=True)
    assert (e["kind"], e["step"], e["finalized"], e["seconds"]) == ("checkpoint_finalized", 10, True, 2.0)


def test_a_save_orbax_skipped_or_whose_directory_is_not_finalized_is_not(tmp_path):
    e = finalized(tmp_path, [*SAVE_10, FAILED_10, DONE_10], made=True)
    assert (e["finalized"], e["why"]) == (False, "Orbax skipped its finalization after a save error (the worker's "
                                                 "log has it)")
    (tmp_path / "x").mkdir()
    e = finalized(tmp_path / "x", [*SAVE_10, DONE_10], made=False)
    assert not e["finalized"] and e["why"].endswith("/x/10 is not a finalized checkpoint")
    # A directory Orbax is still writing is not finalized either.
    (tmp_path / "y" / "10.orbax-checkpoint-tmp").mkdir(parents=True)
    assert not mr.step_finalized(str(tmp_path / "y"), 10)


def test_the_save_schedule_is_maxtexts_config(capsys):
    class Config:
        checkpoint_period, enable_checkpointing, steps, async_checkpointing = 10, True, 600, True
        save_checkpoint_on_start, save_checkpoint_on_completion, checkpoint_dir = True, True, "/ckpt/"
    e = mr.save_schedule(Config())
    assert {k: e[k] for k in ("kind", "checkpoint_period", "enabled", "steps", "save_checkpoint_on_start",
                              "save_checkpoint_on_completion")} == {
        "kind": "save_schedule", "checkpoint_period": 10, "enabled": True, "steps": 600,
        "save_checkpoint_on_start": True, "save_checkpoint_on_completion": True}


def test_the_chaos_notice_says_before_it_is_given_whether_it_holds_a_save():
    from playbooks.job.save_period import Times
    from playbooks.plays.chaos import grace_words
    t = Times(0.2, 1.9, 2.5, "run r's median save", measured=True)
    assert grace_words(1, t) == ("a notice of 1 s is shorter than a save (1.9 s to finalized, measured): the save it "
                                 "asks for will be cut; the run goes back to its last finalized checkpoint (at most "
                                 "one checkpoint period replayed)")
    assert grace_words(30, t).startswith("a notice of 30 s holds a save (1.9 s to finalized")
    assert "not known" in grace_words(30, None)
