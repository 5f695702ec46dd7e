"""The parts the long steps were split into, each on its own with a look
that answers by fact name: the node pool step's (``Pool``), the capacity
plan's (``Planner``, ``_Quota``) and the job's (``checked_request``,
``trainer_env``, ``place_locally``, ``place_on_gke``, ``check_whole``). The
steps whole are in test_steps.py and the client tests."""
import pytest

from playbooks.core.errors import InputError, ProbeFailed
from playbooks.core.facts import ABSENT
from playbooks.core.step import CHANGE, DRIFT, FAIL, OK, WAIT
from tests.conftest import env

LISTED = env("dev", capacity=["reservation", "spot"], reservation="zeta-resv")


def looking(answers):
    def look(fact):
        a = answers[fact.name]
        if isinstance(a, Exception):
            raise a
        return a
    return look


def quota(value):
    return {"dimensionsInfos": [{"dimensions": {"region": "us-east5"}, "details": {"value": str(value)}}]}


def reservation(count, in_use=0, machine="ct6e-standard-4t"):
    return {"name": "zeta-resv", "status": "READY", "specificReservation": {
        "count": str(count), "inUseCount": str(in_use), "instanceProperties": {"machineType": machine}}}


SPOT = "quota PREEMPTIBLE-TPU-V6E-per-project-region"


# -- the capacity plan -------------------------------------------------------------------------------------
def test_a_quota_is_its_value_less_what_our_pools_hold_and_negative_means_no_limit():
    from playbooks.cloud.capacity_plan import _Quota
    q = _Quota("PREEMPTIBLE-TPU-V6E in us-east5", 64, 16, "")
    assert q.left == 48 and q.fits(48) and not q.fits(49)
    assert q.permits() == "quota PREEMPTIBLE-TPU-V6E in us-east5 permits 64 chips, 16 of them held by this " \
                          "cluster's pools"
    unlimited = _Quota("X", -1, 0, "")
    assert unlimited.fits(10**9) and unlimited.permits() == "quota X permits no limit"
    unread = _Quota("X", None, 0, "quota X: could not look")
    assert unread.left is None and unread.fits(16) and unread.permits() == "quota X: could not look"


def test_the_planner_spends_the_reservations_whole_slices_first_then_the_quota():
    from playbooks.cloud.capacity_plan import Planner
    p = Planner(LISTED, looking({"cluster maxtext-multislice": ABSENT, SPOT: quota(16),
                                 "reservation zeta-resv": reservation(6)}))
    assert (p.res_free, p.res_why) == (1, "6 of 6 hosts free")   # 6 hosts: one whole slice of 4
    first, second = p.slot(0), p.slot(1)
    assert (first.option, first.why, first.proven) == ("reservation", "6 of 6 hosts free", True)
    assert (second.option, second.proven) == ("spot", True)
    third = p.slot(2)                                            # the quota's 16 chips are spent
    assert third.option is None and third.words == "none"


def test_a_check_that_could_not_look_takes_the_slice_unproven_and_offers_none_counted():
    from playbooks.cloud.capacity_plan import Planner
    denied = ProbeFailed("capacity : quota", "gcloud beta quotas info describe", 1,
                         stderr="ERROR: PERMISSION_DENIED: the Cloud Quotas API is disabled",
                         why="PERMISSION_DENIED: the Cloud Quotas API is disabled")
    p = Planner(env("dev", capacity=["spot"]), looking({"cluster maxtext-multislice": ABSENT, SPOT: denied}))
    offer = p.offer("spot")
    assert offer.slices is None and "could not look" not in offer.why and "PERMISSION_DENIED" in offer.why
    slot = p.take_quota(0, "v6e-16-0", "spot")
    assert slot is not None and not slot.proven and slot.why.startswith("not checked: quota PREEMPTIBLE-TPU-V6E")


def test_a_reservation_of_another_machine_type_gives_no_slice_and_says_why():
    from playbooks.cloud.capacity_plan import Planner
    p = Planner(LISTED, looking({"cluster maxtext-multislice": ABSENT, SPOT: quota(0),
                                 "reservation zeta-resv": reservation(8, machine="ct5p-hightpu-4t")}))
    assert p.res_free == 0 and "ct5p-hightpu-4t" in p.res_why
    assert p.take_reservation(0, "v6e-16-0") is None


def test_the_planner_keeps_a_running_pool_and_counts_its_chips_against_its_quota():
    from playbooks.cloud.capacity_plan import Planner
    from tests.test_steps import pool
    p = Planner(env("dev", capacity=["spot"]), looking({
        "cluster maxtext-multislice": [{"name": "maxtext-multislice"}], "node pools": [pool("v6e-16-1", capacity="spot")],
        SPOT: quota(32)}))
    assert list(p.kept) == [1] and p.left["PREEMPTIBLE-TPU-V6E-per-project-region"].left == 16
    assert p.slot(1).exists and p.slot(1).why == "its pool, RUNNING"


# -- the node pool step ------------------------------------------------------------------------------------
def pool_look(pool_answer, plan_option="spot", e=LISTED):
    from playbooks.cloud.capacity_plan import Plan, Slot
    plan = Plan((Slot(0, "v6e-16-0", plan_option, plan_option or "none", "test"),), (), ("reservation", "spot"), 16)
    return looking({"node pool v6e-16-0": pool_answer, "capacity plan": plan, "gcloud's version": "555.0.0"})


def test_an_absent_pool_is_created_with_the_plans_option():
    from playbooks.plays.nodepools import Pool
    d = Pool(LISTED, 0).decide(pool_look(ABSENT))
    assert d.kind == CHANGE and d.reason.startswith("created (4x4, 4 nodes, spot")
    assert [c.argv[:4] for c in d.commands] == [("gcloud", "container", "node-pools", "create")]
    assert "--spot" in d.commands[0].argv and d.instead is not None


def test_no_option_for_the_slice_fails_before_any_command():
    from playbooks.plays.nodepools import Pool
    d = Pool(LISTED, 0).decide(pool_look(ABSENT, plan_option=None))
    assert d.kind == FAIL and d.commands == () and "(the capacity plan)" in d.reason


@pytest.mark.parametrize("status, kind, words", [
    ("RUNNING", OK, "is RUNNING (4x4, spot)"),
    ("PROVISIONING", WAIT, "another operation is making it"),
    ("STOPPING", FAIL, "being deleted"),
])
def test_a_pool_of_the_right_shape_is_done_made_elsewhere_or_going(status, kind, words):
    from playbooks.plays.nodepools import Pool
    from tests.test_steps import pool
    p = dict(pool("v6e-16-0", capacity="spot"), status=status)
    d = Pool(env("dev", capacity=["spot"]), 0).as_it_is(p)
    assert d.kind == kind and words in d.reason


def test_a_pool_of_another_shape_is_drift_and_a_broken_one_is_replaced():
    from playbooks.plays.nodepools import Pool
    from tests.test_steps import pool
    e = env("dev", capacity=["spot"])
    version = {"gcloud's version": "555.0.0"}  # a gcloud that sends the Spot pools' kubeletConfig
    d = Pool(e, 0).decide(looking({"node pool v6e-16-0": pool("v6e-16-0", topology="2x4", capacity="spot"), **version}))
    assert d.kind == DRIFT and "topology" in d.reason
    broken = dict(pool("v6e-16-0", capacity="spot"), status="ERROR", statusMessage="GCE_STOCKOUT")
    d = Pool(e, 0).decide(looking({"node pool v6e-16-0": broken, **version}))
    assert d.kind == CHANGE and [c.argv[3] for c in d.commands] == ["delete", "create"]
    assert d.reason.startswith("replaced a broken pool (was ERROR")


def test_a_create_refused_for_capacity_moves_to_the_next_option_and_for_anything_else_stands():
    from playbooks.plays.nodepools import Pool
    e = env("dev", capacity=["spot", "on-demand"])
    pool = Pool(e, 0)
    from playbooks.cloud.capacity_plan import Offer, Plan, Slot
    plan = Plan((Slot(0, "v6e-16-0", "spot", "spot", "t"),), (Offer("on-demand", "on-demand", 1, "q"),),
                ("spot", "on-demand"), 16)
    look = looking({"node pool v6e-16-0": ABSENT, "capacity plan": plan})
    nxt = pool.instead(look, "ERROR: code=503, message=GCE_STOCKOUT: the zone does not have enough resources", "spot")
    assert nxt is not None and nxt.kind == CHANGE and "--spot" not in nxt.commands[-1].argv
    assert nxt.reason.endswith("in place of spot (no TPU capacity)")
    assert pool.instead(look, "ERROR: code=400, message=Invalid value for field 'machineType'", "spot") is None
    empty = Plan(plan.slots, (Offer("on-demand", "on-demand", 0, "q"),), plan.options, 16)
    assert pool.instead(looking({"node pool v6e-16-0": ABSENT, "capacity plan": empty}),
                        "GCE_STOCKOUT: the zone does not have enough resources", "spot") is None  # proven empty: no move


def test_the_verify_waits_for_running_and_ends_at_once_on_a_broken_pool():
    from playbooks.core.step import Broken
    from playbooks.plays.nodepools import Pool
    from tests.test_steps import pool
    p = Pool(env("dev"), 0)
    assert p.running(ABSENT) == "node pool not found"
    assert p.running(dict(pool("v6e-16-0"), status="PROVISIONING")) == "status PROVISIONING"
    assert p.running(pool("v6e-16-0")) is None
    with pytest.raises(Broken, match="is ERROR"):
        p.running(dict(pool("v6e-16-0"), status="ERROR", statusMessage="GCE_STOCKOUT"))


# -- the job -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, words", [
    (("70b", None, (), ""), "--model '70b' is not allowed"),
    (("llama3-8b", 0, (), ""), "--steps 0 must be at least 1"),
    (("llama3-8b", 5, ("steps=6",), ""), "--steps 5 and --set steps=6 say two things"),
    (("llama3-8b", None, (), "nope"), "--preset 'nope' is not defined for llama3-8b"),
])
def test_the_request_is_refused_when_a_flag_is_wrong_or_two_contradict(args, words):
    from playbooks.job.spec import checked_request
    with pytest.raises(InputError, match=words.replace("(", r"\(").replace(")", r"\)")):
        checked_request(*args)


def test_the_request_gives_the_set_pairs_in_order():
    from playbooks.job.spec import checked_request
    assert checked_request("llama3-8b", None, ("per_device_batch_size=2", "max_target_length=512"), "") == \
        [("per_device_batch_size", "2"), ("max_target_length", "512")]


def test_the_trainer_reads_the_shape_and_only_an_elastic_job_its_retries():
    from playbooks.job.spec import trainer_env
    e = env("dev")
    fixed, elastic = trainer_env(e, False), trainer_env(e, True)
    assert fixed["TRAINER_SLICES"] == "2" and fixed["TRAINER_TOPOLOGY"] == "4x4"
    assert "TRAINER_START_RETRIES" not in fixed
    assert elastic["TRAINER_START_RETRIES"] == str(e.start_retries)
    assert elastic["TRAINER_RESIZE_SAVE_TIMEOUT_S"] == str(e.resize_save_timeout)


def test_a_local_job_writes_under_its_environments_state_and_a_gke_job_in_the_bucket():
    from playbooks.job.spec import build_job
    local = build_job(env("local"), "llama3-8b")
    assert local.env_vars["JAX_PLATFORMS"] == "cpu" and local.bucket is None
    for key in ("base_output_directory", "jax_cache_dir", "metrics_file"):
        assert "/.state/local/" in (local.arg(key) or ""), key
    assert local.env_vars["RAY_ADDRESS"] == "127.0.0.2:6390"
    gke = build_job(env("dev"), "llama3-8b")
    assert "JAX_PLATFORMS" not in gke.env_vars and gke.bucket == "my-tpu-project-maxtext-ckpt"
    assert gke.arg("jax_cache_dir") == "gs://my-tpu-project-maxtext-ckpt/jax_cache"
    assert gke.arg("metrics_file") is None


def test_the_whole_job_is_checked_after_every_change():
    from playbooks.job.spec import build_job
    with pytest.raises(InputError, match="dcn_data_parallelism=2 fixes the slice count"):
        build_job(env("dev"), "llama3-8b", elastic=True, sets=("dcn_data_parallelism=2",))
    with pytest.raises(InputError, match="override_model_config=true"):
        build_job(env("dev"), "llama3-8b", sets=("base_num_decoder_layers=2",))
    assert build_job(env("dev"), "llama3-8b", sets=("base_num_decoder_layers=2", "override_model_config=true"))


# -- a followed log read again from its start (runs/follow.py: Replay) --------------------
class _Taker:
    """A follower stand-in: the hashes of the lines read, where the job's
    log began among them, the lines taken."""

    def __init__(self, read: list[str], log_from: int | None):
        from array import array
        self.read = array("q", (hash(x) for x in read))
        self.log_from = log_from
        self.taken: list[str] = []

    def line(self, text: str) -> None:
        self.read.append(hash(text))
        self.taken.append(text)


SUBMITTED = ["Job submission server address: x", "", "Job 'r-1' submitted successfully", "",
             "Tailing logs until the job exits (disable with --no-wait):"]


@pytest.mark.parametrize("before, log_from, again, new", [
    # `ray job submit`'s own lines first, then the log: re-read from the log's start.
    ([*SUBMITTED, "a", "b", "c"], 5, ["a", "b", "c", "d", "e"], ["d", "e"]),
    # The log's first line is blank, as lines of the submit's own are: still each line once.
    ([*SUBMITTED, "", "a", "b"], 5, ["", "a", "b", "c"], ["c"]),
    # The log's first line is one the submit printed too: matched by its place after the submit's lines.
    ([*SUBMITTED, "Tailing logs until the job exits (disable with --no-wait):", "a"], 5,
     ["Tailing logs until the job exits (disable with --no-wait):", "a", "b"], ["b"]),
    # Nothing of the log read before the drop: every line is new.
    (["Job submission server address: x"], None, ["a", "b"], ["a", "b"]),
    # A line that repeats (a step line twice in a log): matched by its place, not by its text.
    (["a", "x", "a", "x"], 0, ["a", "x", "a", "x", "a", "x"], ["a", "x"]),
    # A log that is not the one read (another job's): nothing is skipped past the first difference.
    (["a", "b"], 0, ["a", "c", "b"], ["c", "b"]),
])
def test_a_log_read_again_skips_the_lines_read_once_each_and_loses_none(before, log_from, again, new):
    from playbooks.runs.follow import Replay
    f = _Taker(before, log_from)
    replay = Replay(f)  # type: ignore[arg-type]
    for text in again:
        replay(text)
    assert f.taken == new and replay.skipped == len(again) - len(new)
    assert replay.new == bool(new)


# -- a follow's stream: the CLI's own traceback, a clean close (runs/follow.py) ---------------------
class _FollowCtx:
    """What a follow asks of its step: acting, lines said and noted, the
    streams run (each a list of lines and an exit code), a clock."""

    acting = True

    def __init__(self, streams: list[tuple[list[str], int]] = ()):
        self.said: list[str] = []
        self.notes: list[str] = []
        self.streams = list(streams)
        self.ran: list[str] = []
        self.t = 0.0

    def echo(self, line: str) -> None:
        self.said.append(line)

    def note(self, text: str) -> None:
        self.notes.append(text)

    def clock(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s

    def act(self, command) -> None:
        self.ran.append(command.line())

    def stream(self, command, on_line):
        from playbooks.core.facts import Completed
        self.ran.append(command.line())
        lines, rc = self.streams.pop(0)
        for line in lines:
            on_line(line)
        return Completed(command.line(), rc, "\n".join(lines), "")


CLI_DIED = ["Traceback (most recent call last):", '  File "/usr/bin/ray", line 8, in <module>', "    sys.exit(main())",
            "", "The above exception was the direct cause of the following exception:", "",
            "Traceback (most recent call last):", '  File "aiohttp/client.py", line 1, in read',
            "aiohttp.client_exceptions.ServerDisconnectedError: Server disconnected"]
JOB_FAILED = ["Traceback (most recent call last):", '  File "maxtext_ray.py", line 3, in fit',
              "ValueError: the job's own error"]


@pytest.fixture
def followed(tmp_path, monkeypatch):
    """A follower of job r-1 (its timeline under tmp_path) and its kept log."""
    from playbooks.config import paths
    from playbooks.runs.follow import Follower
    monkeypatch.setattr(paths, "here", lambda rel: tmp_path / rel)

    def make(ctx, job=None):
        log = tmp_path / "job.log"
        return Follower(ctx, env("dev"), "r", "r-1", log, job=job), log
    return make


def test_the_streaming_clis_own_traceback_stays_out_of_the_jobs_log_and_the_jobs_does_not(followed):
    from playbooks.core.facts import Completed
    ctx = _FollowCtx()
    f, log = followed(ctx)
    # The job's own traceback, then more of its lines: the job's (in order).
    for line in [*SUBMITTED, "a", *JOB_FAILED, "", "(RayTrainWorker pid=1) b"]:
        f.line(line)
    # The CLI dies with the link: its traceback last, the command failed.
    for line in ["c", *CLI_DIED]:
        f.line(line)
    f.stream_ended(Completed("ray job logs", 1, "", ""))
    f.close()
    kept = log.read_text().splitlines()
    assert kept == [*SUBMITTED, "a", *JOB_FAILED, "", "(RayTrainWorker pid=1) b", "c"]
    assert not any("ServerDisconnectedError" in s for s in ctx.said)
    assert ctx.notes == ["the log's stream ended with its CLI's own error (not the job's: kept out of its log): "
                         "aiohttp.client_exceptions.ServerDisconnectedError: Server disconnected"]
    # A job whose log ends with its traceback, the stream ending well: the job's.
    ctx = _FollowCtx()
    f, log = followed(ctx, job={"status": "RUNNING"})
    log.unlink()
    for line in ["a", *JOB_FAILED]:
        f.line(line)
    f.stream_ended(Completed("ray job logs", 0, "", ""))
    f.close()
    assert log.read_text().splitlines() == ["a", *JOB_FAILED] and ctx.notes == []


def test_a_replay_after_a_blank_first_line_and_the_clis_traceback_writes_each_line_once(followed):
    from playbooks.core.facts import Completed
    from playbooks.runs.follow import Replay
    ctx = _FollowCtx()
    f, log = followed(ctx)
    for line in [*SUBMITTED, "", "a", "b", *CLI_DIED]:
        f.line(line)
    f.stream_ended(Completed("ray job submit", 1, "", ""))
    assert f.log_from == len(SUBMITTED)
    replay = Replay(f)
    for line in ["", "a", "b", "c", "d"]:
        replay(line)
    f.close()
    assert log.read_text().splitlines() == [*SUBMITTED, "", "a", "b", "c", "d"]


class _Dashboard:
    """The Jobs API as a follow reads it: up, and the job's statuses in turn
    (the last one kept)."""

    def __init__(self, statuses: list[str]):
        self.statuses = statuses

    def get_json(self, url, timeout=10.0, headers=None, ca_file=None):
        if url.endswith("/api/version"):
            return {"ray_version": "2.60.0"}
        status = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
        return {"submission_id": "r-1", "status": status}


@pytest.mark.parametrize("kind", ["dev", "local"])
def test_a_clean_close_of_the_stream_while_the_job_runs_is_followed_on_not_a_failure(followed, monkeypatch, kind):
    """The stream ends with exit 0 while the Jobs API says RUNNING (asked
    again a moment later, still RUNNING): the log is followed on from where
    it was, every line once, to the job's end; the step is not ended on the
    stream's word."""
    from playbooks.access.ray_api import job_logs_command
    from playbooks.core.facts import Completed
    from playbooks.runs.follow import Relink
    ctx = _FollowCtx(streams=[(["a", "b", "c"], 0)])
    f, log = followed(ctx, job={"status": "RUNNING"})
    e = env(kind)
    f.env = e
    for line in ["a", "b"]:
        f.line(line)
    dash = _Dashboard(["RUNNING", "RUNNING", "SUCCEEDED"])
    done, lost = Relink(ctx, e, f, "http://127.0.0.1:8265", dash).until_end(Completed("ray job logs", 0, "", ""))
    f.close()
    assert lost is None and done.ok
    assert ctx.ran == [job_logs_command("http://127.0.0.1:8265", "r-1", follow=True).line()]  # no port-forward
    assert log.read_text().splitlines() == ["a", "b", "c"]
    assert any("its stream ended, the job still running" in s for s in ctx.said), ctx.said
