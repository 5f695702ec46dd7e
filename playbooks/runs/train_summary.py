"""A training job's summary: a fold over the run's timeline events as the
follower reads them (``timeline.Reader``): MaxText's steps (each with its
loss, tokens/s and TFLOP/s per device), Ray Train's worker groups (each
change of size, and what made it), the checkpoints restored, the model's
parameters."""
from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from playbooks.config.tpu import DEFAULT, GENERATIONS
from playbooks.runs import events as E
from playbooks.runs.job_log import STEP_LINE, clean

# MFU = TFLOP/s/device (MaxText's log) / the chip's bf16 peak: each
# generation's peak is its record's (config/tpu.py, with its source). A
# local run's CPU never had that peak: its MFU is "simulated", no percent.
# Each worker group's first steps compile (trace, lower, XLA): the medians,
# MFU and the metrics picture leave them out.
COMPILE_STEPS = 2
# What made a worker group of another size (the event before its start).
WHY = {E.RESIZE: "Ray Train's resize", E.FAILURE: "a restart after a failure", E.WORKER_LOST: "a worker lost"}


def percent(fraction: float | None) -> str | None:
    """An MFU in percent: a TPU's tens of percent, or a CPU's small fraction
    of a TPU's peak (None: not measured)."""
    if fraction is None:
        return None
    return format(100 * fraction, ".2f" if 100 * fraction >= 1 else ".2g")


def _f(v: Any) -> float:
    n = E.number(v)
    return n if n is not None else math.nan


def _measured(vals: Any) -> list[float]:
    """The values a step measured: a step with none (saved on a preemption
    notice before MaxText logged it) is no part of a median (a NaN in
    statistics.median's sort makes its answer depend on where it falls)."""
    return [v for v in vals if not math.isnan(v)]


@dataclass
class Summary:
    # group, step, seconds, tokens/s/device, loss, TFLOP/s/device
    records: list[tuple[int, int, float, float, float, float]] = field(default_factory=list)
    groups: list[int] = field(default_factory=list)
    resizes: list[tuple[int, int]] = field(default_factory=list)
    resize_steps: list[int | None] = field(default_factory=list)  # the last step of the group each resize ended
    resize_causes: list[str] = field(default_factory=list)  # what made each
    _restores: dict[int, int] = field(default_factory=dict)  # worker group -> step restored
    _saved: dict[int, set[int]] = field(default_factory=dict)  # worker group -> steps it saved
    _peer: dict[int, set[int]] = field(default_factory=dict)  # worker group -> steps another slice's host said
    params: float | None = None
    expected_params: float | None = None
    model: str | None = None
    _seen: set = field(default_factory=set)
    _first: dict[int, int] = field(default_factory=dict)
    _disruption: str | None = None  # the last loss since the last group started
    chip: str = DEFAULT      # the TPU generation whose peak MFU divides by
    simulated: bool = False  # a local run: CPU devices standing in for the chips

    def add(self, e: dict) -> None:
        """One event of the timeline."""
        kind = e.get("kind")
        if kind == E.STEP:
            self._step(e)
        elif kind == E.PEER_STEP and E.step_of(e) is not None:
            self._peer.setdefault(len(self.groups), set()).add(int(e["step"]))
        elif kind in E.GROUP_LINES and E.number(e.get("workers")) is not None:
            self._group(int(e["workers"]))
        elif kind in E.LOSSES:
            self._disruption = self._disruption if self._disruption == E.WORKER_LOST else str(kind)
        elif kind == E.CHECKPOINT_SAVED and E.step_of(e) is not None:
            self._saved.setdefault(len(self.groups), set()).add(int(e["step"]))
        elif kind == E.RESTORE_STARTED and E.step_of(e) is not None:
            self._restores.setdefault(len(self.groups), int(e["step"]))
        elif kind == E.PARAMETERS:
            self.params = E.number(e.get("billion"))
        elif kind == E.MODEL_CHECK:
            self.model, self.expected_params = str(e.get("model")), E.number(e.get("expected_billion"))

    def _step(self, e: dict) -> None:
        step, group = E.step_of(e), len(self.groups)
        if step is None or (step, group) in self._seen:
            return
        self._seen.add((step, group))
        self._first.setdefault(group, step)
        self.records.append((group, step, _f(e.get("seconds")), _f(e.get("tokens_per_s_per_device")),
                             _f(e.get("loss")), _f(e.get("tflops_per_device"))))

    def _group(self, size: int) -> None:
        """A worker group started: another size than the one before is a
        resize (Ray Train says "resize the worker group" only when it grows a
        group that runs; after a lost host it starts a smaller one)."""
        if self.groups and self.groups[-1] != size:
            self.resizes.append((self.groups[-1], size))
            self.resize_steps.append(self.group_last_step)
            self.resize_causes.append(WHY.get(self._disruption or "", "a restart"))
        self.groups.append(size)
        self._disruption = None

    @property
    def restores(self) -> list[int]:
        """The checkpoint step each (re)started worker group restored from."""
        return [self._restores[g] for g in sorted(self._restores)]

    @property
    def steps(self) -> set[int]:
        return {r[1] for r in self.records}

    @property
    def done_steps(self) -> set[int]:
        """The steps that ran: those logged, those another slice's host
        finished (a survivor logs the step rank 0 died in), and those saved
        (a save on a preemption notice comes before its step's line)."""
        return self.steps | {s for done in (*self._saved.values(), *self._peer.values()) for s in done}

    @property
    def group_last_step(self) -> int | None:
        """The highest step of the latest worker group that logged one (rank
        0, or another slice's first host: a survivor logs the step rank 0
        died in) or saved it: where a resize found it, also when an earlier
        group had gone further before a restore from an older checkpoint."""
        by_group: dict[int, set[int]] = {}
        for r in self.records:
            by_group.setdefault(r[0], set()).add(r[1])
        for done in (self._peer, self._saved):
            for g, steps in done.items():
                by_group.setdefault(g, set()).update(steps)
        return max(by_group[max(by_group)]) if by_group else None

    @property
    def last_step(self) -> int | None:
        return max(self.steps) if self.records else None

    @property
    def final_loss(self) -> float | None:
        if not self.records:
            return None
        return [r for r in self.records if r[1] == self.last_step][-1][4]

    def _compiling(self, r: tuple) -> bool:
        """A step record among its worker group's first COMPILE_STEPS (it compiles)."""
        return r[1] - self._first[r[0]] < COMPILE_STEPS

    def _warm(self) -> list[tuple]:
        """Step records past the first COMPILE_STEPS of each worker group."""
        return [r for r in self.records if not self._compiling(r)]

    def compiled(self) -> set[tuple[int, int]]:
        """(worker group, step) of each record the medians leave out: it compiled."""
        return {(r[0], r[1]) for r in self.records if self._compiling(r)}

    def last_runs(self) -> dict[int, int]:
        """Each step's last worker group to run it (a step run again after a
        restore counts as its last run, as MaxText's metrics file keeps it)."""
        return {r[1]: r[0] for r in self.records}

    @property
    def median_step_seconds(self) -> float | None:
        vals = _measured(r[2] for r in self._warm())
        return statistics.median(vals) if vals else None

    @property
    def median_tokens_per_device(self) -> float | None:
        vals = _measured(r[3] for r in self._warm())
        return statistics.median(vals) if vals else None

    def step_seconds_quantile(self, q: float) -> float | None:
        vals = sorted(_measured(r[2] for r in self._warm()))
        if not vals:
            return None
        return vals[min(len(vals) - 1, int(q * len(vals)))] if q < 1 else vals[-1]

    @property
    def median_tflops_per_device(self) -> float | None:
        vals = _measured(r[5] for r in self._warm())
        return statistics.median(vals) if vals else None

    @property
    def peak(self) -> float:
        return GENERATIONS[self.chip].peak_bf16_tflops

    def mfu(self) -> float | None:
        """Model FLOPs utilisation: the median TFLOP/s per device after the
        first steps, over the chip's bf16 peak (None for a simulated run:
        its CPU never had that peak)."""
        t = self.median_tflops_per_device
        return None if t is None or self.simulated else t / self.peak

    def mfu_line(self) -> str:
        t = self.median_tflops_per_device
        shown = "n/a" if t is None else format(t, ".3g")
        if self.simulated:
            return (f"MFU: simulated ({shown} TFLOP/s/device on this machine's CPU, standing in for {self.chip} "
                    f"chips: no percent of a TPU peak it never had)")
        m = self.mfu()
        pct = "n/a" if m is None else format(100 * m, ".2f" if 100 * m >= 1 else ".2g")
        return f"MFU: {pct}% ({shown} TFLOP/s/device of a {self.chip} chip's {self.peak:.0f} bf16 peak)"

    @property
    def world_sizes(self) -> list[int]:
        """Worker-group sizes in the order they started, repeats collapsed."""
        out: list[int] = []
        for g in self.groups:
            if not out or out[-1] != g:
                out.append(g)
        return out

    def params_mismatch(self) -> str | None:
        if self.params is None or self.expected_params is None:
            return None
        if abs(self.params - self.expected_params) > 0.0015:
            return (f"MaxText built {self.params:.3f} billion parameters, but {self.model} should have "
                    f"{self.expected_params:.3f} billion: the model config was not applied")
        return None

    def lines(self) -> list[str]:
        def f(v, fmt):
            return format(v, fmt) if v is not None else "n/a"

        out = [
            f"steps: {len(self.done_steps)} (last step {f(self.last_step, 'd')})",
            f"final loss: {f(self.final_loss, '.3f')}",
            f"median step time: {f(self.median_step_seconds, '.3f')} s "
            f"(p50 {f(self.step_seconds_quantile(0.5), '.3f')}, "
            f"p90 {f(self.step_seconds_quantile(0.9), '.3f')}, after each group's first 2 steps)",
            f"tokens/s/device (median): {f(self.median_tokens_per_device, '.1f')}",
            self.mfu_line(),
        ]
        if self.params is not None:
            out.append(f"parameters: {self.params:.3f} billion"
                       + (f" ({self.model}: {self.expected_params:.3f} expected)" if self.expected_params else ""))
        if len(self.world_sizes) > 1 or self.resizes:
            out.append("worker group sizes: " + " -> ".join(map(str, self.world_sizes)))
        for (a, b), at, why in zip(self.resizes, self.resize_steps, self.resize_causes):
            out.append(f"resize {a} -> {b} workers after step {f(at, 'd')} ({why})")
        if self.restores:
            out.append("restored from checkpoint step(s): " + ", ".join(map(str, self.restores)))
        return out

    def events(self) -> list[dict]:
        """Resizes and restores, for the metrics file and its plot."""
        out: list[dict] = [{"event": "resize", "from": a, "to": b, "after_step": at, "cause": why}
                           for (a, b), at, why in zip(self.resizes, self.resize_steps, self.resize_causes)]
        out += [{"event": "restore", "step": s} for s in self.restores]
        return out


def step_line_event(line: str) -> dict | None:
    """A step event of MaxText's own step line, for a log without the
    trainer's events (MaxText run directly: ``bench/local_train.py``)."""
    m = STEP_LINE.search(clean(line))
    if not m:
        return None
    return {"t": 0.0, "kind": E.STEP, "step": int(m.group(1)), "source": "log", "seconds": float(m.group(2)),
            "tflops_per_device": float(m.group(3)), "tokens_per_s_per_device": float(m.group(4)),
            "loss": float(m.group(6)) if m.group(6) not in ("nan", "inf") else None}


def of_log(lines: Iterable[str]) -> Summary:
    """The summary of a job's log read whole (its trainer events, as the
    follower reads them)."""
    from playbooks.runs.timeline import Reader

    s, reader = Summary(), Reader("log")
    for line in lines:
        for e in reader.feed(line):
            s.add(e)
    for e in reader.end():
        s.add(e)
    return s
