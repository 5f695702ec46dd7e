"""`invoke runs`: every run an environment knows (one timeline each),
newest first: its state, steps, wall time, goodput, chip-hours and cost.
Pure: the rows are made from each run's events, goodput report and cost
part (``goodput.py``, ``cost.py``)."""
from __future__ import annotations

import time
from typing import Any

from playbooks.runs import events as E

COLUMNS = ("run", "state", "steps", "wall", "goodput", "chip-hours", "cost", "last event")


def state(events: list[dict]) -> str:
    """The last job's end as the follower saw it (SUCCEEDED, FAILED,
    STOPPED), or that no end was seen (a job running, or not followed to
    its end)."""
    jobs = [e.get("job") for e in events if e.get("job")]
    last = jobs[-1] if jobs else None
    end = next((e for e in reversed(events) if e.get("kind") == E.JOB_END and e.get("job") == last), None)
    if end is None:
        return "no end seen"
    return str(end.get("status") or "UNKNOWN")


def row(name: str, events: list[dict], report: dict[str, Any]) -> dict[str, Any]:
    c = report.get("cost") or {}
    return {"run": name, "state": state(events), "jobs": report["jobs"], "steps": report["steps"]["counted"],
            "wall_s": report["wall_s"], "goodput_pct": report["goodput_pct"],
            "chip_hours": c.get("chip_hours"), "chips_simulated": c.get("chips_simulated", False),
            "cost": c.get("cost"), "per_chip_hour": c.get("per_chip_hour"), "price": c.get("price"),
            "last_event": float(events[-1]["t"]) if events else None,
            **({"skipped_lines": report["skipped_lines"]} if report.get("skipped_lines") else {})}


def newest_first(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: r["last_event"] or 0.0, reverse=True)


def _wall(s: float) -> str:
    if s >= 3600:
        return f"{s / 3600:.1f} h"
    return f"{s / 60:.1f} min" if s >= 60 else f"{s:.0f} s"


def cells(r: dict) -> list[str]:
    ch = "" if r["chip_hours"] is None else f"{r['chip_hours']:.4g}" + (" (sim.)" if r["chips_simulated"] else "")
    cost = f"${r['cost']:,.2f}" if r["cost"] is not None else "no price"
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(r["last_event"])) if r["last_event"] else "-"
    return [r["run"], r["state"], str(r["steps"]), _wall(r["wall_s"]), f"{r['goodput_pct']:.1f}%", ch, cost, when]


def table(rows: list[dict], env: str) -> list[str]:
    if not rows:
        return [f"no run of environment {env} has a timeline yet: `invoke train` keeps one"]
    body = [list(COLUMNS)] + [cells(r) for r in rows]
    widths = [max(len(line[i]) for line in body) for i in range(len(COLUMNS))]
    out = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in body]
    priced = {r["price"] for r in rows if r["cost"] is None and r["price"]}
    return out + [f"no price: {p}" for p in sorted(priced)]
