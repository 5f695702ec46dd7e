"""A job's log lines as the console shows them: without colour codes, and
only those that matter (all of them go to the run's log file)."""
from __future__ import annotations

import re

ANSI = re.compile(r"\x1b\[[0-9;]*m")
SHOW = re.compile(
    r"(completed step:|TrainController|restoring from|number parameters|model check|simulated TPU|"
    r"Training complete|Job '|Error|error:|Traceback|Exception|FAILED|SUCCEEDED|failed|succeeded|"
    r"Tailing logs|Running entrypoint|No existing checkpoints|trainer argv:)")
HIDE = re.compile(r"(Config param |Created BasePyTreeCheckpointHandler|trainer event: |^\s*$)")
# MaxText's step line and the worker that printed it, as the log shows them
# (the timeline reads the trainer's own events instead: events.py); for a
# benchmark that runs MaxText without the trainer.
STEP_LINE = re.compile(r"completed step: (\d+), seconds: ([\d.]+), TFLOP/s/device: ([\d.]+), "
                       r"Tokens/s/device: ([\d.]+), total_weights: (\d+), loss: ([\d.]+|nan|inf)")
WORKER = re.compile(r"\((?:RayTrainWorker|pid=)[^)]*?pid=(\d+)[^)]*\)|\(RayTrainWorker pid=(\d+)")


def clean(line: str) -> str:
    return ANSI.sub("", line)


def shown(line: str) -> bool:
    """A line the console shows of a followed job (the rest: the log file)."""
    return bool(SHOW.search(line)) and not HIDE.search(line)
