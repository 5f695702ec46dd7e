"""`invoke goodput` as a user runs it, on recorded and damaged timelines:
its figure beside Google's ml-goodput-measurement on the same run, the
library's badput type of each of our causes, and a timeline damaged any way
(bytes that are not UTF-8, cut lines, wrong types, a huge line) read for
what it holds, with a one-line note, never a traceback."""
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from playbooks.runs import goodput, goodput_reference, timeline
from tests.conftest import INVOKE, ROOT

ENV = "goodput-report-test"
RECORDED = ROOT / "tests" / "data" / "timelines" / "lost-host-recovered.jsonl"


@pytest.fixture
def cli(tmp_path, hermetic):
    base = yaml.safe_load((ROOT / "inventory.yaml").read_text())["environments"]["local"]
    inv = tmp_path / "inventory.yaml"
    inv.write_text(yaml.safe_dump({"default": ENV, "environments": {ENV: {**base, "gcs_port": 7700,
                                                                          "dashboard_port": 8310}}}))
    e = {**hermetic, "INVOKE_PLAYBOOK_INVENTORY": str(inv)}
    state = ROOT / ".state" / ENV

    def goodput_of(run: str, data: bytes, *flags: str) -> subprocess.CompletedProcess:
        d = state / "training" / run
        d.mkdir(parents=True, exist_ok=True)
        (d / timeline.FILE).write_bytes(data)
        return subprocess.run([INVOKE, "goodput", f"--run={run}", *flags], cwd=ROOT, env=e, capture_output=True,
                              text=True, timeout=60)
    yield goodput_of
    shutil.rmtree(state, ignore_errors=True)


def test_ours_and_the_librarys_on_a_recorded_run_that_recovers_from_a_loss(cli):
    """The run: two slices, one host killed after step 16, the job going on
    with one slice from checkpoint 10 (6 steps replayed), recovered in 20.3 s."""
    r = cli("recorded", RECORDED.read_bytes(), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    ours, lib = doc["goodput_pct"], doc["library"]
    assert lib["library"] == "ml-goodput-measurement" and lib["version"] == "0.2.3"
    assert (lib["max_productive_step"], lib["disruptions"]) == (59, 1)
    assert (ours, lib["goodput_pct"]) == (30.62, 31.78)
    assert abs(ours - lib["goodput_pct"]) < 3  # the README says why where they differ more
    [lost] = doc["incidents"]
    assert (lost["lost_at_step"], lost["restored_from_step"], lost["replayed_steps"]) == (16, 10, 6)
    assert lib["badput_pct"]["WASTED_PROGRESS_FROM_DISRUPTION"] > 0
    assert lib["badput_pct"]["INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION"] > 0
    # Every cause of ours named by the library's badput type it falls under.
    assert set(doc["badput_library_type"]) == set(goodput.CAUSES)
    from ml_goodput_measurement.src.goodput_utils import BadputType
    assert set(doc["badput_library_type"].values()) <= {t.name for t in BadputType}
    text = cli("recorded", RECORDED.read_bytes())
    assert text.returncode == 0
    assert "goodput of run recorded (job rayjob-elastic-8b-3): 30.6% of 88.3 s" in text.stdout
    assert "ml-goodput-measurement 0.2.3 on the same steps: 31.8%" in text.stdout


def test_goodput_says_the_runs_saves_and_its_json_carries_them(cli):
    """A run whose save of step 20 its loss cut (``tests/test_saves.py``)."""
    from tests.test_saves import CUT, cut
    data = "".join(json.dumps(e) + "\n" for e in cut()).encode()
    text = cli("saves", data)
    assert text.returncode == 0, text.stderr
    assert ("  saves: 2 of 3 finalized\n    step 20: cut: the worker group went 3.5 s after the save began\n"
            in text.stdout), text.stdout
    doc = json.loads(cli("saves", data, "--json").stdout)
    assert doc["saves"]["line"] == CUT and [s["step"] for s in doc["saves"]["missing"]] == [20]
    old = json.loads(cli("recorded", RECORDED.read_bytes(), "--json").stdout)["saves"]
    assert (old["known"], old["begun"]) == (False, 7)


def test_goodput_counts_a_save_finalized_on_disk_by_orbaxs_marker(cli):
    """The same run, its checkpoints folder on this machine (the twin's,
    under .state/ENV/data/): step 20's directory renamed from its
    .orbax-checkpoint-tmp folder, Orbax's marker of a finalized step."""
    from playbooks.config import paths
    from tests.test_saves import cut
    data = "".join(json.dumps(e) + "\n" for e in cut()).encode()
    folder = Path(paths.local_job(ENV)["data"]) / "disk" / "checkpoints"
    (folder / "20.orbax-checkpoint-tmp-1800000039").mkdir(parents=True)
    for step in (0, 10):
        (folder / str(step)).mkdir()
    doc = json.loads(cli("disk", data, "--json").stdout)["saves"]
    assert (doc["finalized"], doc["due"], doc["on_disk"]) == (2, 3, [0, 10])  # the save of 20 not finalized there
    (folder / "20.orbax-checkpoint-tmp-1800000039").rename(folder / "20")
    text = cli("disk", data)
    assert text.returncode == 0, text.stderr
    assert ("  saves: 3 of 3 finalized\n    step 20: finalized, no line said so: its step directory is finalized "
            "on disk (Orbax's marker)\n") in text.stdout, text.stdout


def test_the_librarys_records_are_maxtexts_a_start_per_worker_group_each_step_each_time_it_runs():
    events = timeline.parse(RECORDED.read_text())
    recs = goodput_reference.records(events)
    starts = [r for r in recs if "job_start_time" in r]
    steps = [r["step_count"] for r in recs if "step_count" in r]
    assert len(starts) == 2 and starts[0]["job_start_time"] == min(float(e["t"]) for e in events)
    assert steps == list(range(0, 17)) + list(range(11, 60))  # 11-16 again after the restore from 10
    assert next(r for r in recs if "job_end_time" in r)["job_end_time"] == max(float(e["t"]) for e in events)
    assert goodput_reference.compute([])["error"] == "no step recorded"


def test_an_ended_runs_library_figure_is_kept_and_given_back_until_its_records_change(tmp_path):
    """The library's import is most of `invoke goodput`'s time: an ended
    run's figure is kept beside its timeline with a digest of the library's
    records and version, and read back while both are the same."""
    events = timeline.parse(RECORDED.read_text())
    keep = tmp_path / "goodput-library.json"
    first = goodput_reference.compute(events, keep=str(keep))
    doc = json.loads(keep.read_text())
    assert doc["result"] == first and first["goodput_pct"] == 31.78
    assert doc["key"] == goodput_reference.digest("0.2.3", goodput_reference.records(events))
    # Read back, not computed: a figure put in the file is the one given.
    keep.write_text(json.dumps({**doc, "result": {**first, "goodput_pct": 12.5}}))
    assert goodput_reference.compute(events, keep=str(keep))["goodput_pct"] == 12.5
    # Other records (the last step gone): computed again, and kept instead.
    last_step = max(i for i, e in enumerate(events) if e["kind"] == "step")
    fewer = events[:last_step] + events[last_step + 1:]
    again = goodput_reference.compute(fewer, keep=str(keep))
    assert again["goodput_pct"] not in (12.5, None) and json.loads(keep.read_text())["result"] == again
    # A file that is not ours is computed over; a running job (no end) is never kept.
    keep.write_text("{not json")
    assert goodput_reference.compute(events, keep=str(keep)) == first
    running = [e for e in events if e["kind"] != "job_end"]
    keep.unlink()
    assert "goodput_pct" in goodput_reference.compute(running, keep=str(keep)) and not keep.exists()


DAMAGE = {
    "not UTF-8": b'{"t": 1796299000.0, "kind": "step", "step": 3, "note": "\xff\xfe"}\n',
    "cut short": b'{"t": 1796299000.0, "kind": "st',
    "not JSON": b"<<<<<<< HEAD\n",
    "wrong types": b'{"t": "soon", "kind": "step"}\n{"t": 1796299000.0, "kind": 7}\n[1, 2]\n"a string"\n',
    "not a time": b'{"t": NaN, "kind": "step"}\n{"t": 1e300, "kind": "step"}\n{"t": true, "kind": "step"}\n',
    "huge line": b'{"t": 1796299000.0, "kind": "step", "x": "' + b"y" * (1 << 20) + b'"}\n',
    "deep nesting": b'{"t": 1796299000.0, "kind": "step", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n",
}


@pytest.mark.parametrize("what", list(DAMAGE))
def test_a_damaged_timeline_gives_the_events_that_can_be_read_and_says_how_many_lines_were_skipped(cli, what):
    good = RECORDED.read_bytes()
    lines = good.splitlines(keepends=True)
    bad = DAMAGE[what]
    damaged = b"".join(lines[:40]) + bad + b"".join(lines[40:]) + (b"\n" if not bad.endswith(b"\n") else b"")
    skipped = len([ln for ln in bad.splitlines() if ln.strip()])
    r = cli("damaged", damaged, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "internal error" not in r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["skipped_lines"] == skipped
    assert doc["note"].startswith(f"{skipped} line(s) of .state/{ENV}/training/damaged/events.jsonl could not be "
                                  f"read")
    assert (doc["goodput_pct"], len(doc["incidents"])) == (30.62, 1)  # the events around it, all read
    if what == "not UTF-8":  # the person's report says it too, last
        text = cli("damaged", damaged)
        assert text.returncode == 0 and text.stdout.strip().splitlines()[-1].startswith(f"note: {skipped} line(s)")


def test_a_timeline_of_nothing_but_damage_is_one_line(cli):
    r = cli("rubbish", b"\xff\xfe\x00\x01\n\x80\x80\n")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "no event of its timeline could be read: 2 line(s) of" in r.stdout + r.stderr


def test_a_huge_line_is_read_past_in_bounded_pieces(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_bytes(b'{"t": 1.0, "kind": "a"}\n' + b"z" * (5 * timeline.MAX_LINE) + b'\n{"t": 2.0, "kind": "b"}\n')
    with open(p, "rb") as f:
        lines = list(timeline.lines_of(f))
    assert [len(ln) for ln in lines] == [23, timeline.MAX_LINE + 1, 23]
    got = timeline.parse_lines(lines)
    assert [e["kind"] for e in got.events] == ["a", "b"] and got.skipped == 1


T0 = 1_796_000_000.0


def _steps_run(gap: list[dict], gap_s: float) -> list[dict]:
    """Step 0 (14 s with its compile), steps 1-19 a second each, then ``gap``
    (its events gap_s seconds long), steps 20-39 a second each, the end."""
    def ev(t: float, kind: str, step: int | None = None, **f) -> dict:
        return {"t": T0 + t, "kind": kind, "step": step, "source": "test", "job": "run-1", **f}
    e = [ev(0, "submitted"), ev(10, "workers_started", workers=1), ev(12, "jax_initialized"),
         *(ev(26 + i, "step", i, seconds=14.0 if i == 0 else 1.0) for i in range(20))]
    e += [ev(45 + dt, kind, step, **f) for dt, kind, step, f in gap]
    e += [ev(45 + gap_s + 1 + i, "step", 20 + i, seconds=1.0) for i in range(20)]
    return e + [ev(45 + gap_s + 21, "job_end", status="SUCCEEDED")]


GROW = [(0.5, "resize", None, {"by": "Ray Train resized the worker group 1 -> 2"}),
        (1.0, "checkpoint_saved", 19, {}), (5.0, "workers_restarted", None, {"workers": 2}),
        (20.0, "jax_initialized", None, {}), (22.0, "restore_started", 19, {}),
        (23.0, "restored", 19, {"seconds": 1.0})]
HANG = [(30.0, "stall_started", None, {"since": T0 + 45}), (40.0, "stall_ended", None, {})]  # since step 19


@pytest.mark.parametrize("gap", [GROW, HANG], ids=["a grow that replays nothing", "a hang"])
def test_the_library_counts_a_gap_without_a_step_going_back_as_training(gap):
    """Why the library's figure is far above ours on a run with a grow or a
    hang: it has step starts only, and a step's time is from its start to the
    next's. A grow that saved first (no step again) and a hang are, to it, one
    long step: its productive time grows by the whole 40-s gap, and it sees no
    disruption. Ours counts the gap as restart or stall."""
    def productive(events: list[dict]) -> tuple[float, float]:
        ours, lib = goodput.account(events, "run"), goodput_reference.compute(events)
        assert "error" not in lib and lib["disruptions"] == 0
        return ours["productive_s"], lib["goodput_pct"] * ours["wall_s"] / 100
    ours0, lib0 = productive(_steps_run([], 0.0))
    ours1, lib1 = productive(_steps_run(gap, 40.0))
    # The gap, and a second more: the library's start-up badput is the first
    # step's time less the mean step's, and the mean grows by 40/38 s.
    assert lib1 - lib0 == pytest.approx(40.0 + 40 / 38, abs=0.1)
    assert ours1 - ours0 == pytest.approx(0.0, abs=1.0)


@pytest.mark.parametrize("tz,want", [("UTC", "2026-12-03 12:35:36 UTC"),
                                     ("Asia/Kolkata", "2026-12-03 18:05:36 IST (UTC+05:30)"),
                                     ("America/Sao_Paulo", "2026-12-03 09:35:36 UTC-03:00")])
def test_a_runs_times_say_their_date_and_zone_and_json_keeps_seconds_since_the_epoch(tz, want, monkeypatch):
    """A run lasts days: an incident's time without its date or zone is no
    time. The report's lines say both; its data keeps the epoch's seconds."""
    import time
    monkeypatch.setenv("TZ", tz)
    time.tzset()
    try:
        report = goodput.account(timeline.ordered(timeline.parse(RECORDED.read_text())), "r")
        text = goodput.lines(report)
    finally:
        monkeypatch.undo()
        time.tzset()
    assert any(line.startswith(f"    {want} worker_lost (chaos") for line in text), text
    assert text[1].startswith("  from 2026-12-03 ") and text[1].count(want.split(" ", 2)[2]) == 2, text
    assert report["incidents"][0]["at"] == 1796301336.366


def test_the_metrics_picture_leaves_out_the_compile_steps_and_clips_a_spike(tmp_path):
    """`invoke metrics` on the recorded run (a log's records, a 40-s step
    30): each worker group's first 2 steps left out as the summary leaves
    them out, the step-time panel clipped to the other steps with the spike
    marked at its top."""
    from playbooks.runs import metrics
    from playbooks.runs.train_summary import COMPILE_STEPS, Summary
    evs = timeline.ordered(timeline.parse(RECORDED.read_text()))
    s = Summary()
    for e in evs:
        s.add(e)
    records = [{"step": n, "loss": 8 - n / 20, "step_seconds": 40.0 if n == 30 else 0.3 + n / 1000,
                "tokens_per_s_per_device": 1000.0, "tflops_per_device": 1.0, "worker_group": g, "source": "log"}
               for g, n, *_ in s.records]
    (tmp_path / timeline.FILE).write_text("".join(json.dumps(e) + "\n" for e in evs))
    kept = tmp_path / metrics.FILE
    kept.write_text("".join(json.dumps(r) + "\n" for r in [{"run": "r", "job": "j", "source": "log"}, *records]))
    _, fig = metrics.plot(kept)
    firsts = {g: min(n for h, n, *_ in s.records if h == g) for g, *_ in s.records}
    compiled = {(g, n) for g, n, *_ in s.records if n - firsts[g] < COMPILE_STEPS}
    assert len(compiled) == 2 * len(firsts) == 4, compiled
    drawn = list(zip(*fig.axes[0].lines[0].get_data()))
    assert drawn == [(r["step"], r["loss"]) for r in sorted(records, key=lambda r: r["step"])
                     if (r["worker_group"], r["step"]) not in compiled]
    assert "4 compile step(s) left out" in fig.texts[0].get_text()
    times = fig.axes[2]
    bottom, top = times.get_ylim()
    assert top < 1 and bottom > 0.2, (bottom, top)
    [off] = [ln for ln in times.lines if ln.get_marker() == "^"]
    assert list(zip(*off.get_data())) == [(30, top)]
    assert "1 point(s) off the scale" in " ".join(t.get_text() for t in times.texts)
    assert [t.get_text() for t in fig.axes[-1].texts] == ["worker_lost at step 16"]


def test_a_band_mark_of_an_incident_before_any_step_says_so():
    """A host lost while the first worker group compiles: no step was lost."""
    from playbooks.runs import metrics
    job = {"source": "x", "job": "r-1"}
    evs = [{"t": 100.0, "kind": "submitted", "step": None, "run": "r", "n": 1, **job},
           {"t": 110.0, "kind": "workers_started", "step": None, "workers": 2, "n": 1, **job},
           {"t": 120.0, "kind": "worker_lost", "step": None, "by": "chaos", "host": "h", **job},
           {"t": 130.0, "kind": "job_end", "step": None, "status": "FAILED", "n": 1, **job}]
    _, marks = metrics.band(evs)
    assert marks == [(20.0, "worker_lost before any step")]


def test_a_panels_range_leaves_out_only_a_few_far_points():
    from playbooks.runs import metrics
    steady = [0.3 + i / 1000 for i in range(100)]
    assert metrics.robust_range(steady) is None
    assert metrics.robust_range(steady + [40.0]) == (min(steady), max(steady))
    # A loss that falls fast is the curve, not a spike: more than 2% of the points, so none is left out.
    assert metrics.robust_range([10.0 - i for i in range(8)] + [2.0] * 92) is None
