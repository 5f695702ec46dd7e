"""A stalled job's hang, named by its evidence: the culprit host(s) and a
cause class, in one line. Pure: it is given, per training worker, its
Python stack (a py-spy dump, as Ray's dashboard returns it; or that it gave
no answer, or why it could not be read) and its last heartbeat (the
trainer's ``heartbeat`` event: its time, interval and the last step the
worker finished), and ``now``. The collector (``access/worker_stacks.py``)
gathers them.

The causes, as the evidence shows them:

- ``missing_from_collective``: a worker is silent (its heartbeat stopped,
  or its stack gave no answer) or behind (its last step before the
  others') while the others are alive, waiting in a collective or a
  blocking wait for the devices;
- ``input_pipeline``: a worker's training thread is in data loading (grain,
  MaxText's input iterator, tf.data);
- ``compile``: in JAX's tracing, lowering or XLA compile;
- ``checkpoint_io``: in an Orbax save or restore (MaxText's checkpointing);
- ``unknown``: no evidence, or none that tells one host from the others.

What it reads is what exists on GKE too: never what a chaos task recorded,
never a process state only a local SIGSTOP makes."""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from playbooks.runs import stall

MISSING = "missing_from_collective"
INPUT = "input_pipeline"
COMPILE = "compile"
CHECKPOINT = "checkpoint_io"
UNKNOWN = "unknown"
CAUSES = (MISSING, INPUT, COMPILE, CHECKPOINT, UNKNOWN)

# A heartbeat older than this many of its intervals has stopped.
STALE_BEATS = 3.0

# What a training thread is in, by its frames (py-spy's "    name (file:line)").
CONTEXTS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (CHECKPOINT, re.compile(r"\(orbax/|[(/]checkpointing\.py:|\b(save_checkpoint|load_state_if_possible)\b")),
    (COMPILE, re.compile(r"\b(backend_compile|compile_or_get_cached|_cached_compilation|lower_sharding_computation|"
                         r"_cached_lowering_to_hlo|lower_jaxpr_to_module|trace_to_jaxpr_dynamic|_create_pjit_jaxpr)"
                         r" \((jax|jaxlib)/|\b(compile|lower) \(jax/_src/stages\.py:")),
    (INPUT, re.compile(r"\(grain/|[(/]multihost_dataloading\.py:|[(/]input_pipeline|tensorflow/python/data/|"
                       r"\b(load_next_batch|get_next_batch)\b")),
)
# Waiting on the devices or on other hosts: a collective's result, a barrier.
BLOCKED = re.compile(r"\b(block_until_ready|device_get|_single_device_array_to_np_array|_value|__array__|"
                     r"sync_global_devices|process_allgather|broadcast_one_to_all|wait_at_barrier|"
                     r"blocking_key_value_get|_check_if_deleted)\b.*\((jax|jaxlib)/")
# The training function's frames: the thread that runs MaxText.
TRAINING = re.compile(r"\((?:[\w/.-]*/)?(maxtext_ray|train|train_utils)\.py:|train_loop|train_fn")
THREAD = re.compile(r'^Thread \S+(?: \(\S+\))? \(([\w+]+)\)(?:: "(.*)")?')


@dataclass(frozen=True)
class Worker:
    """One training worker's evidence. ``stack``: its py-spy dump (None:
    none read); ``no_answer``: the request for it timed out (the process did
    not answer); ``unread``: why it could not be read otherwise (profiling
    off, py-spy refused: no evidence about the worker). ``beat``: its last
    heartbeat's time (None: none heard), ``every``: its interval, ``step``:
    the last step it finished."""

    name: str
    rank: int | None = None
    slice: str | None = None
    stack: str | None = None
    no_answer: bool = False
    unread: str | None = None
    beat: float | None = None
    every: float | None = None
    step: int | None = None

    def stale(self, now: float) -> bool:
        return self.beat is not None and now - self.beat > STALE_BEATS * (self.every or 30.0)

    def silent(self, now: float) -> bool:
        return self.no_answer or self.stale(now)

    def alive(self, now: float) -> bool:
        return (self.stack is not None) or (self.beat is not None and not self.stale(now))

    def where(self) -> str:
        return f"host {self.name}" + (f" (slice {self.slice})" if self.slice else "")


@dataclass(frozen=True)
class Diagnosis:
    cause: str
    culprits: tuple[str, ...]
    line: str
    workers: int
    evidence: dict = field(default_factory=dict)


def training_thread(stack: str) -> list[str]:
    """The frames (innermost first) of the thread that runs the training
    function; every frame of the dump when none does."""
    threads: list[list[str]] = []
    for raw in stack.splitlines():
        if THREAD.match(raw):
            threads.append([])
        elif raw.startswith("    ") and threads and not raw.startswith("        "):
            threads[-1].append(raw.strip())
    training = [t for t in threads if any(TRAINING.search(f) for f in t)]
    return [f for t in (training or threads) for f in t]


def context(stack: str | None) -> str | None:
    """What the training thread is in: checkpoint, compile, input, or None."""
    if not stack:
        return None
    frames = training_thread(stack)
    for cause, pattern in CONTEXTS:
        if any(pattern.search(f) for f in frames):
            return cause
    return None


def blocked(stack: str | None) -> bool:
    """The training thread waits on the devices or other hosts."""
    return bool(stack) and any(BLOCKED.search(f) for f in training_thread(stack or ""))


WHAT = {INPUT: "in the input pipeline", COMPILE: "compiling", CHECKPOINT: "in a checkpoint's I/O"}


def _names(ws: Sequence[Worker]) -> str:
    if len(ws) == 1:
        return ws[0].where()
    return "hosts " + ", ".join(w.name for w in ws)


def _others_at(ws: Sequence[Worker]) -> str:
    steps = sorted({w.step for w in ws if w.step is not None})
    if not steps:
        return "no step yet"
    return f"at step {steps[-1]}" if len(steps) == 1 else f"at steps {steps[0]}-{steps[-1]}"


def _why_silent(w: Worker, now: float) -> str:
    parts = []
    if w.stale(now) and w.beat is not None:
        parts.append(f"its heartbeat stopped {stall.clock(w.beat)}")
    if w.no_answer:
        parts.append("its stack gave no answer")
    if w.step is not None:
        parts.append(f"last step {w.step}")
    return "; ".join(parts)


def _found(ws: Sequence[Worker], cause: str, culprits: Sequence[Worker], line: str) -> Diagnosis:
    evidence = {"stacks": sum(w.stack is not None for w in ws), "no_answer": sum(w.no_answer for w in ws),
                "heartbeats": sum(w.beat is not None for w in ws)}
    return Diagnosis(cause, tuple(w.name for w in culprits), "hang: " + line, len(ws), evidence)


def _silent(ws: list[Worker], now: float) -> Diagnosis | None:
    """Silent while others are alive: the one the others wait for."""
    silent = [w for w in ws if w.silent(now)]
    alive = [w for w in ws if w not in silent and w.alive(now)]
    if not silent:
        return None
    if not alive:
        return _found(ws, UNKNOWN, [], f"cause unknown: none of the {len(ws)} workers is alive (every heartbeat "
                                       f"stopped or stack gave no answer): the whole group, not one host")
    ctx = {c for w in alive if (c := context(w.stack)) is not None}
    inside = f" ({WHAT[next(iter(ctx))]})" if len(ctx) == 1 else ""
    how = (f"missing from the collective the other {len(alive)} wait in{inside}"
           if any(blocked(w.stack) for w in alive) else
           f"silent while the other {len(alive)} beat on, no step coming{inside}")
    why = _why_silent(silent[0], now) if len(silent) == 1 else "their heartbeats stopped or stacks gave no answer"
    return _found(ws, MISSING, silent, f"{_names(silent)} {how} ({why}; others {_others_at(alive)})")


def _behind(ws: list[Worker]) -> Diagnosis | None:
    """A worker whose last step is before the others': what its stack shows
    it in, else missing from the collective."""
    stepped = [w for w in ws if w.step is not None]
    top = max((w.step for w in stepped if w.step is not None), default=None)
    behind = [w for w in stepped if top is not None and w.step is not None and w.step < top]
    if not behind or len(behind) == len(stepped):
        return None
    ahead = [w for w in ws if w not in behind]
    ctx = {c for w in behind if (c := context(w.stack)) is not None}
    cause = next(iter(ctx)) if len(ctx) == 1 else MISSING
    what = WHAT.get(cause, "missing from the collective the others wait in")
    first = min(w.step for w in behind if w.step is not None)
    return _found(ws, cause, behind, f"{_names(behind)} {what} (last step {first}; the other {len(ahead)} "
                                     f"{_others_at(ahead)})")


def _in_context(ws: list[Worker]) -> Diagnosis | None:
    """Training threads in a checkpoint, input or compile: the ones that
    are (all of them: every host)."""
    read = [w for w in ws if w.stack is not None]
    for cause in (CHECKPOINT, INPUT, COMPILE):
        some = [w for w in read if context(w.stack) == cause]
        if some and len(some) < len(read):
            rest = [w for w in read if w not in some]
            others = "wait in a collective" if any(blocked(w.stack) for w in rest) else "are not"
            return _found(ws, cause, some, f"{_names(some)} {WHAT[cause]} while the other {len(rest)} {others} "
                                           f"({_others_at(ws)})")
        if some:
            return _found(ws, cause, some, f"every host {WHAT[cause]} ({len(some)} of {len(ws)} stacks read; "
                                           f"{_others_at(ws)})")
    return None


def diagnose(workers: Iterable[Worker], now: float) -> Diagnosis:
    """The culprit host(s) and the cause, in one line ("hang: ..."): a
    silent worker, else one behind, else what the stacks are in, else
    unknown (saying what was seen)."""
    ws = list(workers)
    if not any(w.stack is not None or w.no_answer or w.beat is not None for w in ws):
        unread = sorted({w.unread for w in ws if w.unread})
        why = f" (stacks: {unread[0]})" if unread else ""
        return _found(ws, UNKNOWN, [], f"cause unknown: no evidence from {len(ws)} worker(s): no stack read, no "
                                       f"heartbeat{why}")
    found = _silent(ws, now) or _behind(ws) or _in_context(ws)
    if found is not None:
        return found
    read = [w for w in ws if w.stack is not None]
    told = (f"{sum(blocked(w.stack) for w in read)} of {len(read)} stacks read wait in a collective" if read
            else "no stack read")
    beats = "fresh" if any(w.beat is not None for w in ws) else "none"
    return _found(ws, UNKNOWN, [], f"cause unknown: {told}; heartbeats {beats}; every worker {_others_at(ws)}")
