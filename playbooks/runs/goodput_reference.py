"""A second opinion on a run's goodput: what Google's ml-goodput-measurement
(the library MaxText records goodput with, pinned in requirements.lock)
computes from the same run, beside ``goodput.py``'s own accounting.

Its ``GoodputCalculator`` reads a job's records from Cloud Logging; here its
reader is given the run's records from memory, as MaxText's
``GoodputRecorder`` would have written them:

- ``job_start_time``: the run's first submission, then each worker group
  that starts after it (MaxText records a job start each time its main runs,
  so a restart is one; the library counts the time from a disruption to it as
  infrastructure recovery);
- ``step_start_time`` of each step, each time a worker group runs it (when
  its previous step ended; a group's first step, its own seconds back from
  its end): a step recorded again is, to the library, a restart from it;
- ``job_end_time``: the last job's end (a running job has none: the library
  counts until now).

No checkpoint, TPU-initialisation or data-loading records: the run's
timeline has none in the library's form, so those parts of its badput are 0
and the time falls into what the first step after each start took
(``PROGRAM_STARTUP``) or ``OTHER``.

``LIBRARY_TYPE`` names the library's ``BadputType`` each of our causes falls
under, for a user setting one report beside the other.

Importing the library costs more than the rest of `invoke goodput`
(scipy.stats, Google Cloud's logging and storage clients: ~1.4 CPU-seconds
of its ~2 here). An ended run's figure depends only on its records and the
library's version, so ``compute(..., keep=PATH)`` keeps it there with a
digest of both, and gives it back while both are the same; a running job's
(no end: the library counts until now) is computed each time.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import tempfile
from collections.abc import Iterable
from typing import Any

from playbooks.access import connectors
from playbooks.runs import events as E

LIBRARY = "ml-goodput-measurement"
LIBRARY_TYPE = {
    "scheduling": "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION",
    "startup": "TRAINING_PREP",
    "compile": "PROGRAM_STARTUP",
    "checkpoint": "UNPRODUCTIVE_CHECKPOINT_SAVE_TIME",
    "detection": "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION",
    "restart": "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION",
    "restore": "UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME",
    "replayed": "WASTED_PROGRESS_FROM_DISRUPTION",
    "stall": "OTHER",
    "between_jobs": "OTHER",
    "other": "OTHER",
}
GROUP_START = E.JAX_INITIALIZED


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def records(events: Iterable[dict], job: str = "run") -> list[dict]:
    """The library's records of a run, from its timeline's events, in time order."""
    evs = sorted((e for e in events if _num(e.get("t")) is not None), key=lambda e: float(e["t"]))
    if not evs:
        return []
    start = next((float(e["t"]) for e in evs if e.get("kind") == E.SUBMITTED), float(evs[0]["t"]))
    out: list[dict] = [{"job_name": job, "job_start_time": start}]
    groups = 0
    said: set[int] = set()
    last_end: float | None = None
    end: float | None = None
    for e in evs:
        t, kind = float(e["t"]), e.get("kind")
        if kind == GROUP_START:  # rank 0's, once per worker group
            groups += 1
            said, last_end = set(), None
            if groups > 1:
                out.append({"job_name": job, "job_start_time": t})
        elif kind in E.STEPS and isinstance(e.get("step"), int) and not isinstance(e["step"], bool):
            n = e["step"]
            if n in said:
                continue
            said.add(n)
            begin = last_end if last_end is not None else t - (_num(e.get("seconds")) or 0.0)
            out.append({"job_name": job, "step_count": n, "step_start_time": begin})
            last_end = t
        elif kind == E.JOB_END:
            end = t
    if end is not None:
        out.append({"job_name": job, "job_end_time": end})
    return sorted(out, key=_when)


def _when(r: dict) -> float:
    return next(float(v) for k, v in r.items() if k.endswith("_time"))


class _Logs:
    """The library's Cloud Logging reader (``_CloudLogger``'s two methods the
    calculator calls), answered from memory: every record at once, then
    none new."""

    def __init__(self, job: str, entries: list[dict]):
        self.job_name = job
        self.entries = entries
        self.job_start_time = None
        self.read = False

    def write_cloud_logging_entry(self, entry: dict) -> None:
        self.entries.append(entry)

    def read_cloud_logging_entries(self, start_time=None, end_time=None, last_entry_info=None):
        if self.read or not self.entries:
            return [], last_entry_info
        self.read = True
        last = datetime.datetime.fromtimestamp(_when(self.entries[-1]), datetime.UTC)
        return list(self.entries), (last, str(len(self.entries)))


def compute(events: Iterable[dict], keep: str | None = None) -> dict:
    """The library's goodput of a run: ``goodput_pct``, ``badput_pct`` (its
    BadputType names -> percent), ``max_productive_step``, ``disruptions``;
    or ``error`` (what it raised, or no step to go on). ``keep``: a file
    (this machine's) where an ended run's figure is kept, and read back
    while its records and the library's version are the same."""
    entries = records(events)
    if not any("step_count" in r for r in entries):
        return {"library": LIBRARY, "error": "no step recorded"}
    from importlib.metadata import PackageNotFoundError, version
    try:
        installed = version("ml-goodput-measurement")
    except PackageNotFoundError as e:
        return {"library": LIBRARY, "error": f"not installed: {e}"}
    if not keep or not any("job_end_time" in r for r in entries):  # a running job's: until now
        return _computed(entries, installed)
    key = digest(installed, entries)
    kept = _kept(keep, key)
    if kept is not None:
        return kept
    result = _computed(entries, installed)
    if "not installed" not in str(result.get("error", "")):
        connectors.this_machine().write(keep, json.dumps({"key": key, "result": result}).encode())
    return result


def digest(installed: str, entries: list[dict]) -> str:
    """What an ended run's figure depends on: the library's version and its records."""
    return hashlib.sha256(json.dumps([installed, entries], sort_keys=True).encode()).hexdigest()


def _kept(path: str, key: str) -> dict | None:
    raw = connectors.this_machine().read(path)
    try:
        doc = json.loads(raw) if raw else None
    except ValueError:
        return None
    if isinstance(doc, dict) and doc.get("key") == key and isinstance(doc.get("result"), dict):
        return doc["result"]
    return None


def _computed(entries: list[dict], installed: str) -> dict:
    try:
        from ml_goodput_measurement.src import goodput as lib
    except ImportError as e:
        return {"library": LIBRARY, "error": f"not installed: {e}"}
    with tempfile.TemporaryDirectory(prefix="goodput-reference-") as scratch:  # the library's own cache files
        try:
            calc = lib.GoodputCalculator(job_name="run", logger_name="memory",
                                         cloud_logger=_Logs("run", entries),
                                         cache_dir=scratch)
            pct, breakdown, max_step = calc.get_job_goodput(include_badput_breakdown=True)
        except Exception as e:  # the library's own refusal (its ValueErrors), said, never a traceback
            return {"library": LIBRARY, "error": f"{type(e).__name__}: {e}"[:300]}
    badput = {}
    for k, v in (breakdown or {}).items():
        name = getattr(k, "name", str(k))
        if isinstance(v, dict):
            v = sum(x for x in v.values() if isinstance(x, (int, float)))
        badput[name] = round(float(v), 2)
    return {"library": LIBRARY, "version": installed, "goodput_pct": round(float(pct), 2),
            "badput_pct": badput, "max_productive_step": max_step,
            "disruptions": getattr(calc, "_number_of_interruptions", None)}
