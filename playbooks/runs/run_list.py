"""`invoke runs`: every run an environment knows (one timeline each),
newest first: its model, state (with the stops and failures it was
resumed after), jobs, steps (of the steps asked), wall time, goodput,
final loss, MFU, saves (finalized of those due: ``saves.py``), chip-hours
and cost. Pure: the rows are made from
each run's events, goodput report and cost part (``goodput.py``,
``cost.py``, the summary of ``train_summary.py``)."""
from __future__ import annotations

import math
from typing import Any

from playbooks.runs import events as E
from playbooks.runs.cost import money_text
from playbooks.runs.train_summary import Summary, percent

COLUMNS = ("run", "model", "state", "jobs", "steps", "of", "wall", "goodput", "loss", "MFU", "saves", "chip-hours",
           "cost", "last event")
UNKNOWN = "-"


def jobs(events: list[dict]) -> list[dict]:
    """Each job of the run, in the order submitted: its id, its end as the
    follower saw it (seconds since the epoch) and its status (None: no end
    seen, a job running or not followed to its end)."""
    out: dict[str, dict] = {}
    for e in events:
        sid = e.get("job")
        if not sid:
            continue
        j = out.setdefault(str(sid), {"job": str(sid), "end": None, "status": None})
        if e.get("kind") == E.JOB_END:
            j.update(end=float(e["t"]), status=str(e.get("status") or "UNKNOWN"))
    return list(out.values())


def state(events: list[dict]) -> str:
    """The last job's end as the follower saw it (SUCCEEDED, FAILED,
    STOPPED), or that no end was seen (a job running, or not followed to
    its end); a run resumed after jobs that were stopped or failed is not
    a plain end: "SUCCEEDED after 1 stop", "... after 2 stops, 1 failure"."""
    js = jobs(events)
    if not js:
        return "no end seen"
    last = js[-1]["status"] or "no end seen"
    before = [j["status"] for j in js[:-1]]
    stops, failures = before.count("STOPPED"), sum(1 for st in before if st in ("FAILED", "UNKNOWN"))
    said = [f"{n} {word}{'s' if n > 1 else ''}" for n, word in ((stops, "stop"), (failures, "failure")) if n]
    return f"{last} after {', '.join(said)}" if said else last


def target_steps(events: list[dict]) -> int | None:
    """The steps the run's last worker group was asked for (the trainer's
    ``jax_initialized``: the job's steps)."""
    for e in reversed(events):
        if e.get("kind") == E.JAX_INITIALIZED and (n := E.number(e.get("steps"))) is not None and n > 0:
            return int(n)
    return None


def _known(v: float | None) -> float | None:
    return None if v is None or math.isnan(v) else v


def row(name: str, events: list[dict], report: dict[str, Any], s: Summary) -> dict[str, Any]:
    """The run's row; ``s``: an empty summary of the environment's chip (a
    local run's MFU is simulated: no percent of a TPU peak)."""
    c = report.get("cost") or {}
    for e in events:
        s.add(e)
    return {"run": name, "model": s.model, "state": state(events), "jobs": jobs(events),
            "steps": report["steps"]["counted"], "target_steps": target_steps(events),
            "final_loss": _known(s.final_loss), "mfu": _known(s.mfu()),
            "wall_s": report["wall_s"], "goodput_pct": report["goodput_pct"], "saves": _saves(report.get("saves")),
            "chip_hours": c.get("chip_hours"), "chips_simulated": c.get("chips_simulated", False),
            "cost": c.get("cost"), "per_chip_hour": c.get("per_chip_hour"), "price": c.get("price"),
            "last_event": float(events[-1]["t"]) if events else None,
            **({"skipped_lines": report["skipped_lines"]} if report.get("skipped_lines") else {})}


def _saves(s: dict | None) -> dict | None:
    """Of the goodput report's saves: how many due, finalized, and its line."""
    return {k: s.get(k) for k in ("known", "due", "finalized", "off", "line")} if s else None


def saves_cell(s: dict | None) -> str:
    """A run's saves in its row: finalized/due ("-": its schedule unknown;
    "off": checkpointing off); `invoke goodput` names the missing ones."""
    if not s or not s.get("known"):
        return UNKNOWN
    return "off" if s.get("off") and not s["due"] else f"{s['finalized']}/{s['due']}"


def newest_first(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: r["last_event"] or 0.0, reverse=True)


def _wall(s: float) -> str:
    if s >= 3600:
        return f"{s / 3600:.1f} h"
    return f"{s / 60:.1f} min" if s >= 60 else f"{s:.0f} s"


def cells(r: dict) -> list[str]:
    def known(v: Any, fmt: str = "") -> str:
        return UNKNOWN if v is None else format(v, fmt)

    ch = "" if r["chip_hours"] is None else f"{r['chip_hours']:.4g}" + (" (sim.)" if r["chips_simulated"] else "")
    cost = money_text(r["cost"]) if r["cost"] is not None else "no price"
    when = E.when(r["last_event"]) if r["last_event"] else UNKNOWN
    return [r["run"], known(r.get("model")), r["state"], str(len(r["jobs"])), str(r["steps"]),
            known(r.get("target_steps")),
            _wall(r["wall_s"]), f"{r['goodput_pct']:.1f}%", known(r.get("final_loss"), ".3f"),
            f"{percent(r['mfu'])}%" if r.get("mfu") is not None else UNKNOWN, saves_cell(r.get("saves")), ch, cost,
            when]


def no_timeline(env: str) -> str:
    """What `invoke runs`, and `invoke goodput` without ``--run``, say where no
    run has a timeline yet: a look that finds nothing, exit 0 (a run named
    that has none is an error: exit 1)."""
    return f"no run of environment {env} has a timeline yet: `invoke train` keeps one"


def table(rows: list[dict], env: str) -> list[str]:
    if not rows:
        return [no_timeline(env)]
    body = [list(COLUMNS)] + [cells(r) for r in rows]
    widths = [max(len(line[i]) for line in body) for i in range(len(COLUMNS))]
    out = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in body]
    # Why a run has no price: its price text says it ("no price (why)"), once per text, naming its runs.
    unpriced: dict[str, list[str]] = {}
    for r in rows:
        if r["cost"] is None and r["price"]:
            unpriced.setdefault(r["price"], []).append(r["run"])
    return out + [f"{', '.join(runs)}: {price}" for price, runs in sorted(unpriced.items())]
