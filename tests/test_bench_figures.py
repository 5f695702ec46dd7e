"""The arithmetic of the benchmarks' figures (bench/): what each figure the
docs state is computed from, on made-up measurements."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench import local_train as L

ROOT = Path(__file__).resolve().parent.parent

BARE = {"tok": 1400.0, "step_s": 0.090, "first": 19.5, "wall": 24.0}
WARM = {"tok": 1330.0, "step_s": 0.095, "first": 27.7, "wall": 41.0, "job_first": 15.0}
COLD = {"tok": 1300.0, "step_s": 0.097, "first": 43.0, "wall": 55.0, "job_first": 27.0}


def test_the_trainer_is_measured_against_maxtext_with_nothing_else_initialized():
    """The ratio divides the warm run's tokens/s/device by bare MaxText's
    (no jax.distributed), and the fixed costs are differences, in seconds:
    per step of the median step times, per start of the cold run's job
    start to its first step against MaxText's process start to its first
    step (an empty compilation cache in both; the warm run found a full one)."""
    c = L.fixed_costs(BARE, WARM, COLD)
    assert c["ratio"] == pytest.approx(0.95)
    assert c["per_step_s"] == pytest.approx(0.005)
    assert c["per_start_s"] == pytest.approx(7.5)
    text = "\n".join(L.fixed_cost_lines(BARE, WARM, COLD))
    assert "**0.95**" in text and "no jax.distributed" in text
    assert "per step **0.005 s**" in text and "**7.5 s**" in text and "27.0 s" in text and "19.5 s" in text
    assert "A second start, with the compilation cache the first filled: 15.0 s" in text
    unmeasured = {**COLD, "job_first": None}
    assert L.fixed_costs(BARE, WARM, unmeasured)["per_start_s"] is None
    assert "not measured" in "\n".join(L.fixed_cost_lines(BARE, WARM, unmeasured))


def test_the_job_start_to_its_first_step_is_read_from_the_runs_timeline():
    events = [{"kind": "submitted", "t": 10.0, "job": "j-1"}, {"kind": "step", "t": 40.0, "step": 0, "job": "j-1"},
              {"kind": "submitted", "t": 100.0, "job": "j-2"}, {"kind": "worker_started", "t": 104.0, "job": "j-2"},
              {"kind": "step", "t": 131.5, "step": 0, "job": "j-2"}, {"kind": "step", "t": 131.6, "step": 1, "job": "j-2"}]
    assert L.job_to_first_step(events) == pytest.approx(31.5)          # the newest job's, not the run's first
    assert L.job_to_first_step([e for e in events if e["kind"] != "submitted"]) is None
    assert L.job_to_first_step(events[:1] + events[2:4]) is None        # its job has no step yet


def hbm_error_rows() -> list[tuple[str, float, float]]:
    """(case, estimate GiB, compile GiB) of each measured row of the
    out-of-sample table in docs/preflight.md (bench/fit_compiles.py
    --out-of-sample --write)."""
    text = (ROOT / "docs" / "preflight.md").read_text()
    table = text.split("<!-- bench:hbm-error -->", 1)[1].split("<!-- /bench:hbm-error -->", 1)[0]
    rows = []
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and (m := re.match(r"([\d.]+) of [\d.]+$", cells[3])):
            rows.append((cells[0], float(cells[2].split()[0]), float(m.group(1))))
    return rows


def test_the_too_close_to_call_band_covers_the_largest_error_measured_out_of_sample():
    """The estimate's band between "likely fits" and "does not fit" is the
    largest error of the out-of-sample compiles, and its margin, either way:
    a job that fits is never called a misfit for an error already seen."""
    from bench.fit_compiles import OUT_OF_SAMPLE, error
    from playbooks.job import memory
    rows = hbm_error_rows()
    assert {name for name, _, _ in rows} == set(OUT_OF_SAMPLE), rows       # every case measured
    worst = max(abs(error(est, got)) for _, est, got in rows)
    assert round(worst, 3) <= memory.OUT_OF_SAMPLE_ERROR, (worst, rows)
    assert worst + memory.BAND_MARGIN - 1e-9 <= memory.MISFIT - 1
    assert worst + memory.BAND_MARGIN - 1e-9 <= 1 - memory.FITS
    assert memory.BAND_MARGIN > 0
