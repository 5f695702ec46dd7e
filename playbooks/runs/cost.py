"""What a run costs: chip-hours always, dollars where a price is known.
Pure functions of a run's events and its price basis: no I/O.

- The chips a run holds: its slices x the chips per slice, as recorded when
  it was submitted (the ``priced`` event), fewer while it ran on fewer
  slices: from each worker group's start (Ray Train's "Started training
  worker group of size N": N hosts x the chips per host) until the next.
  Between a loss and the next group the chips of the group that was
  running are counted (GKE bills a node while its pod is recreated).
- Each second of the goodput report (``goodput.py``'s segments: productive
  or one cause of badput) costs the chips held then: chip-hours per cause.
- Dollars: chip-hours x the run's price per chip-hour, the mean of its
  slices' (each slice's capacity option priced by ``cloud/prices.py``; every
  slice has as many chips). A slice without a price leaves the run without
  one: chip-hours only, never a made-up figure.
- The estimate before a submit: the steps left x the step time measured
  (the run's own last job, else the newest run of the same model here) x
  the chips x the price.
"""
from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from playbooks.cloud import prices
from playbooks.config.schema import Environment, capacities
from playbooks.runs import events as E

PRICED = E.PRICED


@dataclass
class Basis:
    """What a run holds and what a chip-hour of it costs. ``rates``: per
    slice, USD per chip-hour or None; ``options``: per slice, its capacity
    option; ``simulated``: a local twin's chips."""

    slices: int
    hosts_per_slice: int
    chips_per_host: int
    options: list[str] = field(default_factory=list)
    rates: list[float | None] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    why: str = ""        # why there is no price, when there is none
    simulated: bool = False

    @property
    def chips(self) -> int:
        return self.slices * self.hosts_per_slice * self.chips_per_host

    @property
    def per_chip_hour(self) -> float | None:
        """The mean of the slices' prices (one price for all when they share
        an option); None when a slice has none."""
        if not self.rates or any(r is None for r in self.rates):
            return None
        return statistics.fmean(r for r in self.rates if r is not None)

    def price_text(self) -> str:
        p = self.per_chip_hour
        if self.simulated:
            return "no price: a local run's chips are simulated"
        if p is None:
            return f"no price ({self.why or 'no price known for its capacity'})"
        kinds = dict.fromkeys(f"{o} ${r:.4g}" for o, r in zip(self.options, self.rates))
        src = ", ".join(dict.fromkeys(self.sources))
        return f"${p:.4g}/chip-hour ({', '.join(kinds)}; {src})"

    def event_fields(self) -> dict[str, Any]:
        return {"slices": self.slices, "hosts_per_slice": self.hosts_per_slice, "chips_per_host": self.chips_per_host,
                "options": self.options, "rates": self.rates, "sources": self.sources, "why": self.why,
                "simulated": self.simulated}


def env_basis(env: Environment, options: list[str] | None, catalog: prices.Catalog | str | None) -> Basis:
    """The environment's slices, each on its option (``options``, one per
    slice; by default the first of ``capacity:``), priced; a local twin's
    chips are simulated and have no price."""
    if env.platform.simulated:
        return Basis(env.slices, env.hosts_per_slice, env.chips_per_host, simulated=True,
                     why="a local run's chips are simulated")
    options = options or [capacities(env)[0]] * env.slices
    got = [prices.price(env, o, catalog) for o in options]
    return Basis(env.slices, env.hosts_per_slice, env.chips_per_host, list(options), [p.per_chip_hour for p in got],
                 [p.source for p in got if p.source], next((p.why for p in got if p.why), ""))


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def _rate(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1e6 else None


def basis_of(e: dict) -> Basis | None:
    """A ``priced`` event's basis, or None when it is not whole."""
    s, h, c = _int(e.get("slices")), _int(e.get("hosts_per_slice")), _int(e.get("chips_per_host"))
    if s is None or h is None or c is None:
        return None
    def listed(k: str) -> list:
        v = e.get(k)
        return v if isinstance(v, list) else []

    rates = [_rate(r) for r in listed("rates")]
    opts, srcs = [str(o) for o in listed("options")], [str(x) for x in listed("sources")]
    return Basis(s, h, c, opts, rates, srcs, str(e.get("why") or ""), bool(e.get("simulated")))


def recorded_basis(events: Iterable[dict]) -> Basis | None:
    """The basis recorded with the run's last submission, if any."""
    found = None
    for e in events:
        if e.get("kind") == PRICED:
            found = basis_of(e) or found
    return found


def chips_held(events: list[dict], basis: Basis) -> list[tuple[float, int]]:
    """(from, chips) steps, in time order: every slice until the first
    worker group starts, then each group's hosts x chips per host."""
    out: list[tuple[float, int]] = [(float("-inf"), basis.chips)]
    for e in events:
        if e.get("kind") in E.GROUP_LINES and (n := _int(e.get("workers"))) is not None:
            out.append((float(e["t"]), min(n * basis.chips_per_host, basis.chips)))
    return out


def chip_seconds(a: float, b: float, held: list[tuple[float, int]]) -> float:
    """The chip-seconds of [a, b] under the ``held`` steps."""
    total = 0.0
    for i, (t0, chips) in enumerate(held):
        t1 = held[i + 1][0] if i + 1 < len(held) else float("inf")
        lo, hi = max(a, t0), min(b, t1)
        if hi > lo:
            total += (hi - lo) * chips
    return total


def chip_hours(segments: list[tuple[float, float, str]], held: list[tuple[float, int]]) -> dict[str, float]:
    """Chip-hours per cause (``productive`` and each badput)."""
    out: dict[str, float] = {}
    for a, b, cause in segments:
        out[cause] = out.get(cause, 0.0) + chip_seconds(a, b, held) / 3600
    return out


def report(events: list[dict], segments: list[tuple[float, float, str]], causes: Iterable[str],
           basis: Basis, recorded: bool) -> dict[str, Any]:
    """The goodput report's cost part: chip-hours of the run, of its
    productive time and of each cause; and dollars when a price is known."""
    by = chip_hours(segments, chips_held(events, basis))
    productive = by.pop("productive", 0.0)
    badput = {c: round(by.get(c, 0.0), 4) for c in causes}
    total = productive + sum(by.values())
    out: dict[str, Any] = {
        "chips": basis.chips, "chips_simulated": basis.simulated,
        "chip_hours": round(total, 4), "productive_chip_hours": round(productive, 4), "badput_chip_hours": badput,
        "basis": "recorded when the run was submitted" if recorded else
                 "not recorded with the run: the environment's slices and prices now",
        "per_chip_hour": basis.per_chip_hour if not basis.simulated else None, "currency": "USD",
        "price": basis.price_text(),
    }
    rate = out["per_chip_hour"]
    if rate is not None:
        out["cost"] = round(total * rate, 2)
        out["productive_cost"] = round(productive * rate, 2)
        out["badput_cost"] = {c: round(h * rate, 2) for c, h in badput.items()}
    return out


def cost_text(c: dict[str, Any]) -> str:
    """'12.3 chip-hours, $33.21' or '12.3 chip-hours (no price ...)'."""
    sim = " (simulated chips)" if c.get("chips_simulated") else ""
    if c.get("cost") is None:
        return f"{c['chip_hours']:.4g} chip-hours{sim}"
    return f"{c['chip_hours']:.4g} chip-hours, ${c['cost']:,.2f}"


# -- before a submit ---------------------------------------------------------------
def group_step_seconds(events: list[dict], hosts: int | None = None) -> list[float]:
    """MaxText's step times past each worker group's first two steps (they
    compile), of the groups of ``hosts`` hosts (all groups when None)."""
    vals: list[float] = []
    seen, size = 0, None
    for e in events:
        kind = e.get("kind")
        if kind in E.GROUP_LINES:
            seen, size = 0, _int(e.get("workers"))
        elif kind in E.STARTS:
            seen = 0
        elif kind == E.STEP and isinstance(e.get("seconds"), (int, float)) and not isinstance(e["seconds"], bool):
            seen += 1
            if seen > 2 and (hosts is None or size in (None, hosts)):
                vals.append(float(e["seconds"]))
    return vals


def model_of(events: list[dict]) -> str | None:
    return next((str(e["model"]) for e in reversed(events) if e.get("kind") == E.MODEL_CHECK and e.get("model")),
                None)


@dataclass(frozen=True)
class StepTime:
    seconds: float
    basis: str  # "median of 57 steps of run X"


def measured(runs: list[tuple[str, list[dict]]], run: str, model: str, hosts: int) -> StepTime | None:
    """The step time to estimate with: the run's own (its groups of every
    host, else any of its groups), else the newest run of the same model
    here. ``runs``: (name, events), newest first."""
    ordered = sorted(runs, key=lambda r: r[0] != run)  # the run itself first, then newest first
    for name, evs in ordered:
        if name != run and model_of(evs) != model:
            continue
        for want, what in ((hosts, f"{hosts} hosts"), (None, "any size")):
            vals = group_step_seconds(evs, want)
            if vals:
                return StepTime(statistics.median(vals), f"median of {len(vals)} steps of run {name}"
                                + ("" if want is not None else f", worker groups of {what}"))
    return None


def estimate(steps_left: int, step: StepTime | None, basis: Basis, why: str | None = None) -> str:
    """The one line `train` prints before it submits."""
    rate = basis.per_chip_hour if not basis.simulated else None
    hourly = f"${basis.chips * rate:,.2f}/h" if rate is not None else None
    price = basis.price_text()
    if steps_left <= 0:
        return "cost estimate: no step left to train"
    if step is None:
        per = f" ({hourly} while it runs)" if hourly else ""
        return (f"cost estimate: {steps_left} steps x unknown step time ({why or 'none measured'}) x "
                f"{basis.chips} chips: unknown{per}; {price}")
    hours = steps_left * step.seconds / 3600
    ch = hours * basis.chips
    head = (f"cost estimate: {steps_left} steps x {step.seconds:.3g} s ({step.basis}) x {basis.chips} chips = "
            f"{ch:.4g} chip-hours")
    if rate is None:
        return f"{head}; {price}"
    return f"{head} x ${rate:.4g} = ${ch * rate:,.2f} ({hours * 60:.3g} min at {hourly}); {price}"
