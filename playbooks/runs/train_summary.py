"""Reading a training job's log: MaxText's step lines, Ray Train's resizes
and MaxText's checkpoint restores, into a summary."""
from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field

STEP = re.compile(r"completed step: (\d+), seconds: ([\d.]+), TFLOP/s/device: ([\d.]+), "
                  r"Tokens/s/device: ([\d.]+), total_weights: (\d+), loss: ([\d.]+|nan|inf)")
WORKER = re.compile(r"\((?:RayTrainWorker|pid=)[^)]*?pid=(\d+)[^)]*\)|\(RayTrainWorker pid=(\d+)")
GROUP = re.compile(r"Started training worker group of size (\d+)")
RESTORE = re.compile(r"restoring from this run's directory step (\d+)")
# A checkpoint saved at step N: step N ran, also when its line never came
# (a save on a preemption notice stops MaxText before it logs that step).
SAVED = re.compile(r"(?:Started an asynchronous checkpoint save for step|Saved a checkpoint at step) (\d+)")
PARAMS = re.compile(r"number parameters: ([\d.]+) billion")
EXPECTED = re.compile(r"model check: (\S+) applied, ([\d.]+) billion parameters expected")
ANSI = re.compile(r"\x1b\[[0-9;]*m")

# What the console shows of a job's log (all of it goes to the run's log file).
SHOW = re.compile(
    r"(completed step:|TrainController|restoring from|number parameters|model check|simulated TPU|"
    r"Training complete|Job '|Error|error:|Traceback|Exception|FAILED|SUCCEEDED|failed|succeeded|"
    r"Tailing logs|Running entrypoint|No existing checkpoints|trainer argv:)")
HIDE = re.compile(r"(Config param |Created BasePyTreeCheckpointHandler|trainer event: |^\s*$)")


def clean(line: str) -> str:
    return ANSI.sub("", line)


# Peak bf16 TFLOP/s per chip, for MFU = TFLOP/s/device (MaxText's log) / peak.
# v6e (Trillium): "Peak compute per chip (bf16) 918 TFLOPs"
# (https://cloud.google.com/tpu/docs/v6e); the others from Google's TPU pages,
# as MaxText's own benchmarks/upload_metrics_to_bq.py has them.
PEAK_TFLOPS = {"v4": 275.0, "v5e": 197.0, "v5p": 459.0, "v6e": 918.0}


@dataclass
class Summary:
    # group, step, seconds, tokens/s/device, loss, TFLOP/s/device
    records: list[tuple[int, int, float, float, float, float]] = field(default_factory=list)
    groups: list[int] = field(default_factory=list)
    resizes: list[tuple[int, int]] = field(default_factory=list)
    resize_steps: list[int | None] = field(default_factory=list)  # the last step of the group each resize ended
    _restores: dict[int, int] = field(default_factory=dict)  # worker group -> step restored
    _saved: dict[int, set[int]] = field(default_factory=dict)  # worker group -> steps it saved
    params: float | None = None
    expected_params: float | None = None
    model: str | None = None
    _seen: set = field(default_factory=set)
    _first: dict[int, int] = field(default_factory=dict)

    def feed(self, raw: str) -> None:
        line = clean(raw)
        m = STEP.search(line)
        if m:
            w = WORKER.search(line)
            who = (w.group(1) or w.group(2)) if w else "0"
            step = int(m.group(1))
            if (who, step, len(self.groups)) in self._seen:
                return
            self._seen.add((who, step, len(self.groups)))
            group = len(self.groups)
            self._first.setdefault(group, step)
            self.records.append((group, step, float(m.group(2)), float(m.group(4)), float(m.group(6)),
                                 float(m.group(3))))
            return
        if (m := GROUP.search(line)):
            # A resize is a worker group of another size than the one before:
            # Ray Train logs "resize the worker group" only when it grows one
            # that runs; after a lost host it starts a smaller one.
            size = int(m.group(1))
            if self.groups and self.groups[-1] != size:
                self.resizes.append((self.groups[-1], size))
                self.resize_steps.append(self.group_last_step)
            self.groups.append(size)
        elif (m := SAVED.search(line)):
            self._saved.setdefault(len(self.groups), set()).add(int(m.group(1)))
        elif (m := RESTORE.search(line)):
            self._restores.setdefault(len(self.groups), int(m.group(1)))
        elif (m := PARAMS.search(line)):
            self.params = float(m.group(1))
        elif (m := EXPECTED.search(line)):
            self.model, self.expected_params = m.group(1), float(m.group(2))

    @property
    def restores(self) -> list[int]:
        """The checkpoint step each (re)started worker group restored from."""
        return [self._restores[g] for g in sorted(self._restores)]

    @property
    def steps(self) -> set[int]:
        return {r[1] for r in self.records}

    @property
    def done_steps(self) -> set[int]:
        """The steps that ran: those logged, and those saved (a save on a
        preemption notice comes before its step's line)."""
        return self.steps | {s for saved in self._saved.values() for s in saved}

    @property
    def group_last_step(self) -> int | None:
        """The highest step of the latest worker group that logged one (by
        any worker) or saved it: where a resize found it, also when an
        earlier group had gone further before a restore from an older
        checkpoint."""
        if not self.records:
            return None
        group = self.records[-1][0]
        return max([r[1] for r in self.records if r[0] == group] + list(self._saved.get(group, ())))

    @property
    def last_step(self) -> int | None:
        return max(self.steps) if self.records else None

    @property
    def final_loss(self) -> float | None:
        if not self.records:
            return None
        return [r for r in self.records if r[1] == self.last_step][-1][4]

    def _warm(self) -> list[tuple]:
        """Step records past the first two of each worker group (those include compilation)."""
        return [r for r in self.records if r[1] - self._first[r[0]] >= 2]

    @property
    def median_step_seconds(self) -> float | None:
        vals = [r[2] for r in self._warm()]
        return statistics.median(vals) if vals else None

    @property
    def median_tokens_per_device(self) -> float | None:
        vals = [r[3] for r in self._warm()]
        return statistics.median(vals) if vals else None

    def step_seconds_quantile(self, q: float) -> float | None:
        vals = sorted(r[2] for r in self._warm())
        if not vals:
            return None
        return vals[min(len(vals) - 1, int(q * len(vals)))] if q < 1 else vals[-1]

    @property
    def median_tflops_per_device(self) -> float | None:
        vals = [r[5] for r in self._warm()]
        return statistics.median(vals) if vals else None

    def mfu(self, chip: str = "v6e") -> float | None:
        """Model FLOPs utilisation: the median TFLOP/s per device after the
        first steps, over the chip's bf16 peak."""
        t = self.median_tflops_per_device
        return None if t is None else t / PEAK_TFLOPS[chip]

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

        def pct(v):  # a TPU's tens of percent, or a CPU's small fraction of a TPU's peak
            return "n/a" if v is None else format(100 * v, ".2f" if 100 * v >= 1 else ".2g")
        mfu = self.mfu()
        out = [
            f"steps: {len(self.done_steps)} (last step {f(self.last_step, 'd')})",
            f"final loss: {f(self.final_loss, '.3f')}",
            f"median step time: {f(self.median_step_seconds, '.3f')} s "
            f"(p50 {f(self.step_seconds_quantile(0.5), '.3f')}, "
            f"p90 {f(self.step_seconds_quantile(0.9), '.3f')}, after each group's first 2 steps)",
            f"tokens/s/device (median): {f(self.median_tokens_per_device, '.1f')}",
            f"MFU: {pct(mfu)}% ({f(self.median_tflops_per_device, '.3g')} "
            f"TFLOP/s/device of a v6e chip's {PEAK_TFLOPS['v6e']:.0f} bf16 peak)",
        ]
        if self.params is not None:
            out.append(f"parameters: {self.params:.3f} billion"
                       + (f" ({self.model}: {self.expected_params:.3f} expected)" if self.expected_params else ""))
        if len(self.world_sizes) > 1 or self.resizes:
            out.append("worker group sizes: " + " -> ".join(map(str, self.world_sizes)))
        for (a, b), at in zip(self.resizes, self.resize_steps):
            out.append(f"resize {a} -> {b} workers after step {f(at, 'd')}")
        if self.restores:
            out.append("restored from checkpoint step(s): " + ", ".join(map(str, self.restores)))
        return out

    def events(self) -> list[dict]:
        """Resizes and restores, for the metrics file and its plot."""
        out: list[dict] = [{"event": "resize", "from": a, "to": b, "after_step": at}
                           for (a, b), at in zip(self.resizes, self.resize_steps)]
        out += [{"event": "restore", "step": s} for s in self.restores]
        return out
