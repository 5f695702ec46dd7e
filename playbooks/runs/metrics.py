"""A run's step metrics: kept in .state/<env>/training/<run>/metrics.jsonl
(apart from the per-invocation logs in .state/<env>/runs/), and drawn into
metrics.png next to it.

Where they come from, said in each record's "source":
- "metrics_file": locally, MaxText's own metrics_file (one JSON object per
  step; every process writes one, so the trainer gives each rank its own
  file, and rank 0's is read);
- "log": on GKE, the job's followed log (MaxText's `completed step:` lines);
  the workers' metrics files would be on their disks.
Resizes and restores of elastic runs are records of their own ("event").
"""
from __future__ import annotations

import io
import json
import statistics
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from playbooks.access import connectors
from playbooks.config import paths
from playbooks.config.schema import Environment
from playbooks.runs import goodput, timeline
from playbooks.runs.train_summary import Summary

FILE = "metrics.jsonl"
PNG = "metrics.png"
MAXTEXT_FILE = paths.MAXTEXT_METRICS


def run_dir(env: Environment, run: str) -> Path:
    return paths.here(paths.run_dir(env.name, run))


def maxtext_file(env: Environment, run: str) -> Path:
    return paths.here(paths.maxtext_metrics(env.name, run))


def from_maxtext(path: Path) -> list[dict]:
    """MaxText's metrics_file lines (keys learning/loss, perf/...), as records,
    one per step: the file is appended to across restarts, and steps run
    again after a restore from an older checkpoint count as their last run."""
    out: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            continue
        step = d.get("step") if isinstance(d, dict) else None  # MaxText writes it as a float (0.0)
        if isinstance(step, bool) or not isinstance(step, (int, float)) or not float(step).is_integer():
            continue
        step = int(step)
        out[step] = {"step": step, "loss": d.get("learning/loss"),
                          "step_seconds": d.get("perf/step_time_seconds"),
                          "tokens_per_s_per_device": d.get("perf/per_device_tokens_per_sec"),
                          "tflops_per_device": d.get("perf/per_device_tflops_per_sec"), "source": "metrics_file"}
    return [out[k] for k in sorted(out)]


def from_log(summary: Summary) -> list[dict]:
    return [{"step": step, "loss": loss, "step_seconds": secs, "tokens_per_s_per_device": tok,
             "tflops_per_device": tflops, "worker_group": group, "source": "log"}
            for group, step, secs, tok, loss, tflops in summary.records]


def keep(env: Environment, run: str, summary: Summary, submission_id: str) -> Path:
    """Write the run's metrics.jsonl from the best source there is."""
    rank0 = maxtext_file(env, run).with_name(MAXTEXT_FILE.replace(".jsonl", ".rank0.jsonl"))
    records = from_maxtext(rank0) if rank0.is_file() else []
    if not records:
        records = from_log(summary)
    path = run_dir(env, run) / FILE
    header = {"run": run, "job": submission_id, "written": time.strftime("%Y-%m-%dT%H:%M:%S"),
              "source": records[0]["source"] if records else "none"}
    lines = [header] + records + summary.events()
    connectors.this_machine().write(str(path), "".join(json.dumps(r) + "\n" for r in lines).encode())
    return path


def read(path: Path) -> tuple[dict, list[dict], list[dict]]:
    """(header, step records, events) of a metrics.jsonl."""
    header: dict = {}
    steps, events = [], []
    for line in path.read_text().splitlines():
        d = json.loads(line)
        if "event" in d:
            events.append(d)
        elif "step" in d:
            steps.append(d)
        else:
            header = d
    return header, steps, events


def newest_run(env: Environment) -> str | None:
    runs = [d for d in paths.here(paths.training(env.name)).glob("*") if (d / FILE).is_file()]
    return max(runs, key=lambda d: (d / FILE).stat().st_mtime).name if runs else None


SERIES = (("loss", "loss"), ("tokens_per_s_per_device", "tokens/s per device"), ("step_seconds", "step time (s)"))


def series(steps: Iterable[dict]) -> dict[str, list[tuple[int, float]]]:
    """What each panel plots: (step, value) for the records that have one."""
    steps = sorted(steps, key=lambda r: r["step"])
    return {key: [(r["step"], float(r[key])) for r in steps if r.get(key) is not None] for key, _ in SERIES}


def shown_steps(steps: list[dict], events: list[dict]) -> tuple[list[dict], list[dict]]:
    """(the records the picture plots, those it leaves out): each worker
    group's compile steps, as the summary leaves them out of its medians
    (``train_summary.COMPILE_STEPS``), known from the run's timeline; a
    record of MaxText's metrics file is a step's last run. Without a
    timeline, none is left out."""
    if not events:
        return list(steps), []
    summary = Summary()
    for e in events:
        summary.add(e)
    compiled, last = summary.compiled(), summary.last_runs()

    def compiles(r: dict) -> bool:
        group = r.get("worker_group")
        group = group if isinstance(group, int) and not isinstance(group, bool) else last.get(r["step"])
        return (group, r["step"]) in compiled

    return [r for r in steps if not compiles(r)], [r for r in steps if compiles(r)]


# A panel's y-range leaves out a few points far from the rest (a save or a
# restore in one step's time), so that they do not flatten its curve: beyond
# Tukey's far-out fences (the quartiles widened by 3 interquartile ranges,
# at least 10% of the median), when they are at most this share of its points.
FENCE = 3.0
CLIP_SHARE = 0.02


def robust_range(values: list[float]) -> tuple[float, float] | None:
    """The (low, high) a panel shows, or None when it shows every value."""
    if len(values) < 4:
        return None
    q1, _, q3 = statistics.quantiles(values, n=4)
    reach = max(FENCE * (q3 - q1), 0.1 * abs(statistics.median(values)), 1e-12)
    inside = [v for v in values if q1 - reach <= v <= q3 + reach]
    outside = len(values) - len(inside)
    if not outside or outside > max(1, CLIP_SHARE * len(values)):
        return None
    return min(inside), max(inside)


def _clip(ax: Any, pts: list[tuple[int, float]]) -> None:
    """Clip the panel to its robust range; each point off it marked at the
    edge it is past (a red triangle), and how many, said in the panel."""
    span = robust_range([v for _, v in pts])
    if span is None:
        return
    lo, hi = span
    pad = (hi - lo) * 0.08 or abs(hi) * 0.05 or 1.0
    bottom, top = lo - pad, hi + pad
    ax.set_ylim(bottom, top)
    for edge, marker, off in ((top, "^", [p for p in pts if p[1] > hi]), (bottom, "v", [p for p in pts if p[1] < lo])):
        if off:
            ax.plot([x for x, _ in off], [edge] * len(off), linestyle="none", marker=marker, color="tab:red",
                    clip_on=False, label="off the scale")
    far = [p for p in pts if not lo <= p[1] <= hi]
    ax.annotate(f"{len(far)} point(s) off the scale (red triangles): " + ", ".join(
        f"step {x}: {v:.3g}" for x, v in far[:3]) + (" ..." if len(far) > 3 else ""),
        (0.01, 0.97), xycoords="axes fraction", fontsize=7, va="top", color="tab:red")


# The band's colours: productive green, each badput its own.
COLOURS = {"productive": "tab:green", "scheduling": "tab:gray", "startup": "tab:olive", "compile": "tab:purple",
           "checkpoint": "tab:cyan", "detection": "tab:orange", "restart": "tab:red", "restore": "tab:blue",
           "replayed": "tab:pink", "stall": "black", "between_jobs": "white", "other": "lightgray"}


def band(events: list[dict]) -> tuple[list[tuple[float, float, str]], list[tuple[float, str]]]:
    """The timeline under the curves: (start s, length s, cause) of each part
    of the wall time, from its start; and each incident (at s, label)."""
    segs = goodput.segments(events, now=time.time())
    if not segs:
        return [], []
    t0 = segs[0][0]
    report = goodput.account(events, now=time.time())
    marks = [(i["at"] - t0, f"{i['kind']} " + (f"at step {i['lost_at_step']}" if i["lost_at_step"] is not None
                                               else "before any step")) for i in report["incidents"]]
    return [(a - t0, b - a, c) for a, b, c in segs], marks


def _band(ax: Any, segs: list[tuple[float, float, str]], incidents: list[tuple[float, str]]) -> None:
    """The timeline under the curves: a band of causes, incidents marked."""
    for cause in dict.fromkeys(c for _, _, c in segs):
        ax.broken_barh([(a, w) for a, w, c in segs if c == cause], (0, 1), color=COLOURS.get(cause, "white"),
                       label=cause)
    for at, label in incidents:
        ax.axvline(at, color="tab:red", linewidth=1.5)
        ax.annotate(label, (at, 1.02), fontsize=7, rotation=0, annotation_clip=False)
    ax.set_yticks([])
    ax.set_xlabel("seconds since the job was submitted")
    ax.set_xlim(0, segs[-1][0] + segs[-1][1])
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.55), ncol=6, fontsize=7, frameon=False)


def plot(path: Path) -> tuple[Path, Any]:
    """metrics.png beside metrics.jsonl: loss, tokens/s per device and step
    time against step, resizes and restores marked; under them, when the
    run has a timeline (events.jsonl), the wall time as a band of causes
    (goodput.py), incidents marked. Returns (png, figure)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    header, steps, events = read(path)
    kept = path.with_name(timeline.FILE)
    run_events = timeline.parse_lines(kept.read_bytes().splitlines()).events if kept.is_file() else []
    plotted, compiles = shown_steps(steps, timeline.ordered(run_events))
    data = series(plotted)
    segs, incidents = band(run_events) if run_events else ([], [])
    if segs:
        fig = plt.figure(figsize=(9, 9.5))
        grid = fig.add_gridspec(len(SERIES) + 1, 1, height_ratios=[3] * len(SERIES) + [1.2])
        axes = [fig.add_subplot(grid[0])]
        axes += [fig.add_subplot(grid[i], sharex=axes[0]) for i in range(1, len(SERIES))]
    else:
        fig, axes = plt.subplots(len(SERIES), 1, figsize=(9, 8), sharex=True)
    for ax, (key, label) in zip(axes, SERIES):
        pts = data[key]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", linewidth=1, label=label)
        ax.set_ylabel(label)
        _clip(ax, pts)
        ax.grid(alpha=0.3)
        for e in events:
            if e["event"] == "resize" and e.get("after_step") is not None:
                ax.axvline(e["after_step"], color="tab:red", linestyle="--", linewidth=1)
            elif e["event"] == "restore":
                ax.axvline(e["step"], color="tab:green", linestyle=":", linewidth=1)
    axes[-1].set_xlabel("step")
    marks = []
    if any(e["event"] == "resize" for e in events):
        marks.append("red dashes: resizes")
    if any(e["event"] == "restore" for e in events):
        marks.append("green dots: restores")
    if compiles:
        marks.append(f"{len(compiles)} compile step(s) left out")
    fig.suptitle(f"run {header.get('run', '?')} (job {header.get('job', '?')}; from its {header.get('source', '?')})"
                 + (f" - {', '.join(marks)}" if marks else ""), fontsize=10)
    if segs:
        _band(fig.add_subplot(grid[len(SERIES)]), segs, incidents)
    fig.tight_layout()
    png = path.with_name(PNG)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    connectors.this_machine().write(str(png), buf.getvalue())
    return png, fig
