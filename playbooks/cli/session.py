"""One task run: which environment and mode, the runner, the output, the
per-run log folder, and the one place expected errors become clean exits."""
from __future__ import annotations

import difflib
import os
import re
import select
import sys
import time
import traceback
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from playbooks.access import connectors, staleness
from playbooks.access.cli_clients import already_exists, is_transient
from playbooks.config import paths
from playbooks.config.choices import PLATFORMS
from playbooks.config.project import ROOT
from playbooks.config.schema import Environment, load_inventory
from playbooks.core.errors import InputError, PlaybookError, shown_value
from playbooks.core.inventory import name_problem
from playbooks.core.lock import Busy, machine_lock
from playbooks.core.play import Playbook
from playbooks.core.recap import Recap, Reporter, banner
from playbooks.core.runlog import RunLog, prune
from playbooks.core.runner import Mode, RetryPolicy, Runner
from playbooks.core.step import Step

MODES = ("apply", "check")
# The Invoke config keys under `playbook:` (INVOKE_PLAYBOOK_<KEY>), each with
# what it is. Anything else there is a typo, refused: a misspelt
# INVOKE_PLAYBOOK_ENVIRONMENT=dev would otherwise run against the default
# environment, and `teardown --yes` would tear down the wrong one.
CONFIG_KEYS = {
    "env": "the environment of the inventory",
    "inventory": "the inventory file",
    "mode": "apply or check",
    "parallel": "steps run at once",
    "heartbeat": "seconds between signs of life in a long wait",
    "kind": "the kind the environment must be (local or gke; the Makefile's local targets set local)",
    "lock_wait": "seconds a changing task waits for another run's lock on its environment (0: refused at once)",
}
ENV_PREFIX = "INVOKE_PLAYBOOK_"
MAX_PARALLEL = 32  # each running step is one CLI process; more only queue at the APIs' rate limits
DEFAULT_PARALLEL = 4
DEFAULT_HEARTBEAT = 30
DEFAULT_LOCK_WAIT = 1800.0  # a cluster's create, and some
MAX_LOCK_WAIT = 24 * 3600.0

# The tasks that make, change or delete what the environment owns: in apply
# mode each takes the environment's lock on this machine for its chain (one
# command line), so a second such run waits for the first (at most
# playbook.lock_wait seconds), saying who holds it and since when, or is
# refused. `hosts.quarantine` and `hosts.release` (tasks "quarantine" and
# "release") cordon, taint and untaint a slice's nodes, move its pods, and
# may delete and make again its node pool (quarantine_replace_pool): `up`
# beside them would make the same pool; `hosts.maintenance` starts a slice's
# host maintenance.
CHANGING = ("prereqs", "network", "cluster", "nodepools", "storage", "raycluster", "dashboard", "up", "teardown",
            "stop-tpus", "quarantine", "release", "maintenance")
# Tasks that change the environment only in part of their run: they hold the
# lock from their start until the step named here has ended, not for the
# hours the rest takes. `train --fresh` (the one that asks for it: ``open_session(changing=True)``) deletes the run's
# checkpoints (and timeline): held until that step ends, then released, as
# its follow runs for hours while `invoke up` may bring a lost slice back.
LOCKED_UNTIL = {"train": "train:checkpoints"}
# The tasks that change the environment and take no lock, and why.
UNLOCKED = {
    "train": "without --fresh it deletes nothing: it submits a job and follows it for hours, while `invoke up` may "
             "bring a lost slice back",
    "chaos": "a fault on purpose: a real preemption takes no lock, and every task must bear it whenever it comes; "
             "two chaos acts overlap by design (a second host lost while the first is down)",
    "watch": "the watch's own quarantine (stall_action: restart, a notice) never makes or deletes a node pool "
             "(only cordons, taints, moves pods: what `up` does not touch) and must act in seconds, not after an "
             "`up` of 30 minutes; in a GKE head pod this machine's lock cannot be seen at all",
}


# Tasks whose effects are all on this machine, with or without a controller
# (Ansible's delegate_to: localhost): the AOT compile and its static checks.
LOCAL_ONLY = ("preflight",)


class Failed(Exception):
    """The run failed; its message was already printed."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


@dataclass
class Session:
    env: Environment
    mode: Mode
    runner: Runner
    book: Playbook
    logdir: Path | None
    release_after: str | None = None  # the step after which the environment's lock is released (LOCKED_UNTIL)

    def run(self, name: str, steps: list[Step], parallel: bool = True, keep_going: bool = False) -> Recap:
        """Run a play. ``parallel=False`` for plays whose output streams live
        (a training job's log) or whose order is the point (chaos);
        ``keep_going`` for independent checks (every problem is listed)."""
        until = self.release_after

        def ended(step_id: str) -> None:
            if step_id == until:
                release_env_lock(self.env.name)

        self.book.reporter.line(banner("PLAY", f"{name} | env {self.env.name} ({_what(self.env)}) | {self.mode.value}"))
        if self.logdir:
            self.book.reporter.line(f"logs: {paths.shown(self.logdir)}")
        if name not in LOCAL_ONLY:
            from playbooks.plays.controller import on_controller
            steps = on_controller(self.env, steps)
        recap = self.book.run(f"{name} {self.env.name}", steps, workers=None if parallel else 1,
                              keep_going=keep_going, ended=ended if until else None)
        if self.logdir:
            self.book.reporter.line(f"logs: {paths.shown(self.logdir)}")
        if recap.failed:
            gone = recap.count("unreachable")
            if gone:  # Ansible's exit code for an unreachable host
                raise Failed(f"{name}: the controller {connectors.controller(self.env)} is unreachable", code=4)
            raise Failed(f"{name}: {recap.count('failed')} step(s) failed")
        return recap


def _what(env: Environment) -> str:
    if env.platform.simulated:
        return env.platform.name
    where = connectors.controller(env)
    return f"gke {env.mode}" + (f", on controller {where}" if where else "")


def whole_number(flag: str, text: Any, minimum: int, maximum: int | None = None, why: str = "") -> int:
    """A flag or setting that must be a whole number (Invoke's own int()
    would end in a traceback)."""
    value = None
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    elif isinstance(text, str) and re.fullmatch(r"[0-9]{1,19}", text.strip()):
        value = int(text.strip())
    if value is None or value < minimum:
        raise InputError(f"{flag} {shown_value(text)} must be a whole number >= {minimum}")
    if maximum is not None and value > maximum:
        raise InputError(f"{flag} {shown_value(text)} must be at most {maximum}" + (f" ({why})" if why else ""))
    return value


MAX_WAIT = 3600.0


def seconds(flag: str, text: Any, maximum: float = MAX_WAIT) -> float:
    try:
        value = float(str(text).strip()) if len(str(text)) < 40 else -1.0
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise InputError(f"{flag} {shown_value(text)} must be a number of seconds >= 0")
    if value > maximum:
        raise InputError(f"{flag} {shown_value(text)} must be at most {maximum:g} seconds")
    return value


WHY_MAX = 200


def one_line(flag: str, text: Any) -> str:
    """A reason given on the command line: one printable line, 1-200 characters."""
    t = str(text or "").strip()
    if not t:
        raise InputError(f"{flag} is required: why, in one line (it is kept in the record)")
    if len(t) > WHY_MAX or not t.isprintable():
        raise InputError(f"{flag} {shown_value(t)} must be one printable line of at most {WHY_MAX} characters")
    return t


def bare_flag(*spellings: str) -> None:
    """Refuse a value flag given with no value (Invoke drops a bare
    iterable flag silently)."""
    argv = sys.argv[1:]
    for i, tok in enumerate(argv):
        if tok in spellings and (i + 1 == len(argv) or argv[i + 1].startswith("-")):
            raise InputError(f"{tok} needs key=value after it (a MaxText config key and its value)")


def suggest(word: str, options: list[str]) -> str | None:
    """The option a typo most likely meant: one that starts the word or that
    the word starts ("environment" -> env), else the closest spelling."""
    for o in options:
        if word and (word.startswith(o) or o.startswith(word)):
            return o
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.5)
    return close[0] if close else None


def _place(key: str) -> str:
    return f"playbook.{key} ({ENV_PREFIX}{key.upper()})"


# The config files Invoke reads, by level (invoke.Config keeps each file's
# data in _<level> and its path in _<level>_path).
CONFIG_LEVELS = ("system", "user", "project", "runtime")


def _near_playbook(key: str) -> bool:
    """playbok, play_book, Playbook, PLAYBOOKS, plabook: not `playbook`, but
    meant for it. Separators and case aside, a close spelling of about its
    length only (playback, playbook_dir, my_playbook or playground are words
    of their own)."""
    norm = re.sub(r"[\W_]+", "", key.lower())
    return abs(len(norm) - len("playbook")) <= 1 and difflib.SequenceMatcher(None, norm, "playbook").ratio() >= 0.85


def misspelt_playbook(config) -> None:
    """Refuse a top-level key of an Invoke config file that is a near miss of
    `playbook:`. Invoke keeps any top-level key without a word, so a
    `playbok: {env: dev}` would never apply (and `teardown --yes` would run
    against the default environment). Invoke's own keys (run, tasks, sudo,
    timeouts, runners, ...) and other words are left alone: config files,
    ~/.invoke.yaml above all, may hold settings for other projects' tasks."""
    sources: list[tuple[str | None, Mapping]] = []
    for level in CONFIG_LEVELS:
        data = getattr(config, f"_{level}", None)
        if isinstance(data, Mapping):
            sources.append((getattr(config, f"_{level}_path", None), data))
    if not sources and isinstance(config, Mapping):  # a plain mapping (no files): its own keys
        sources = [(None, config)]
    _refuse_misspelt(sources)


def _refuse_misspelt(sources: list[tuple[str | None, Mapping]]) -> None:
    from invoke.config import Config

    own = set(Config.global_defaults())
    for path, data in sources:
        for key in data:
            if isinstance(key, str) and key != "playbook" and key not in own and _near_playbook(key):
                where = f"Invoke config file {path}" if path else "Invoke config"
                raise InputError(f"{where}: unknown top-level key {shown_value(key)} (nothing reads it, so its "
                                 f"settings would not apply); did you mean playbook?")


def _misspelt_in_files() -> str | None:
    """The refusal of a near miss of `playbook:` in a YAML or JSON config
    file, for when Invoke fails on it before any task runs (`Playbook:
    {env: dev}` makes its env-var loader find two sources for
    PLAYBOOK_ENV)."""
    import json

    import yaml

    for path in config_files():
        if not path.endswith((".yaml", ".yml", ".json")):
            continue
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f) if path.endswith(".json") else yaml.safe_load(f)
            if isinstance(data, Mapping):
                _refuse_misspelt([(path, data)])
        except InputError as e:
            return str(e)
        except Exception:
            continue
    return None


def playbook_config(config) -> dict[str, Any]:
    """The `playbook:` settings, every key known and every value checked;
    INVOKE_PLAYBOOK_* variables Invoke does not map to a key (a typo) and a
    misspelt top-level `playbook:` in a config file are refused too."""
    misspelt_playbook(config)
    pb = config.get("playbook", None) if hasattr(config, "get") else None
    if pb is None:
        pb = {}
    if not isinstance(pb, Mapping):
        raise InputError(f"Invoke config key 'playbook' = {shown_value(pb)} must be a mapping of "
                         f"{', '.join(CONFIG_KEYS)}")
    for k in pb:
        if k not in CONFIG_KEYS:
            close = suggest(str(k), list(CONFIG_KEYS))
            hint = f"; did you mean playbook.{close}?" if close else f" (known: {', '.join(CONFIG_KEYS)})"
            raise InputError(f"unknown Invoke config key playbook.{shown_value(k)[1:-1] if isinstance(k, str) else k}"
                             f"{hint}")
    known = {ENV_PREFIX + k.upper() for k in CONFIG_KEYS}
    for var in sorted(os.environ):
        if var in known:
            continue
        near = difflib.get_close_matches(var, sorted(known), n=1, cutoff=0.85)
        if var.startswith(ENV_PREFIX) or near:
            close = near[0] if near else suggest(var[len(ENV_PREFIX):].lower(), list(CONFIG_KEYS))
            if close and not close.startswith(ENV_PREFIX):
                close = ENV_PREFIX + close.upper()
            hint = f"; did you mean {close}?" if close else f" (known: {', '.join(sorted(known))})"
            raise InputError(f"unknown environment variable {var}={shown_value(os.environ[var])}{hint}")
    out: dict[str, Any] = {}
    for key in ("env", "inventory"):
        v = pb.get(key)
        if v is not None and not isinstance(v, str):
            raise InputError(f"{_place(key)} = {shown_value(v)} must be text: {CONFIG_KEYS[key]}")
        if v is not None and not v.strip():
            raise InputError(f"{_place(key)} = {shown_value(v)} is empty: give {CONFIG_KEYS[key]}, or unset it")
        out[key] = v
    if out["env"] is not None and name_problem(out["env"]):
        raise InputError(f"{_place('env')} = {shown_value(out['env'])}: an environment name "
                         f"{name_problem(out['env'])}")
    mode = pb.get("mode") if pb.get("mode") is not None else "apply"
    if mode not in MODES:
        raise InputError(f"{_place('mode')} = {shown_value(mode)} is not allowed (allowed: apply, check; "
                         f"a dry run is Invoke's own --dry)")
    out["mode"] = mode
    kind = pb.get("kind")
    if kind is not None and kind not in tuple(PLATFORMS):
        raise InputError(f"{_place('kind')} = {shown_value(kind)} is not allowed (allowed: local, gke)")
    out["kind"] = kind
    par = pb.get("parallel")
    out["parallel"] = DEFAULT_PARALLEL if par is None else whole_number(
        _place("parallel"), par, 1, MAX_PARALLEL, "each running step is one CLI process")
    beat = pb.get("heartbeat")
    out["heartbeat"] = DEFAULT_HEARTBEAT if beat is None else whole_number(
        _place("heartbeat"), beat, 1, 3600, "a long wait says what it waits for at least this often")
    wait = pb.get("lock_wait")
    out["lock_wait"] = DEFAULT_LOCK_WAIT if wait is None else seconds(_place("lock_wait"), wait, MAX_LOCK_WAIT)
    return out


def inventory_path(value: str | None) -> Path | None:
    """The inventory file named by playbook.inventory: a relative path is
    relative to where the user ran the command, not to this project."""
    if value is None:
        return None
    p = Path(os.path.expanduser(value))
    return p if p.is_absolute() else Path(os.getcwd()) / p


READ_ONLY_ATTEMPTS = 1
# The tasks that only look: a `watch invoke status` makes a log folder every
# few seconds. Of each, the newest KEEP_LOGS folders are kept per environment
# (a folder holding a driver log, job.log, always); a task that changes
# anything keeps every one, and a run's timeline is not under runs/.
READ_ONLY_TASKS = ("status", "goodput", "runs", "logs", "metrics", "doctor")
KEEP_LOGS = 20


def open_session(config, task: str, reporter: Reporter | None = None, read_only: bool = False,
                 env_flag: str | None = None, changing: bool = False) -> Session:
    """``read_only``: a task that only looks (status) runs in check mode
    whatever playbook.mode says (its --dry still prints the probes).
    ``env_flag``: the task's --env, which wins over playbook.env.
    ``changing``: this run of a task of LOCKED_UNTIL changes the environment
    (train --fresh): it holds the lock until that step has ended."""
    settings = playbook_config(config)
    dry = bool(config.get("run", {}).get("dry", False)) if hasattr(config, "get") else False
    if dry and settings["mode"] == "check":
        raise InputError(f"{_place('mode')} = 'check' and Invoke's --dry are two modes at once: choose one")
    path = inventory_path(settings["inventory"])
    if env_flag is not None and name_problem(env_flag):
        raise InputError(f"--env {shown_value(env_flag)}: an environment name {name_problem(env_flag)}")
    inv = load_inventory(path)
    env = inv.env(env_flag or settings["env"])
    assert isinstance(env, Environment)  # SCHEMA's env_type
    if settings["kind"] and env.kind != settings["kind"]:
        raise InputError(f"environment {env.name!r} of {inv.path} is kind {env.kind}, but {_place('kind')} = "
                         f"{settings['kind']!r} allows only a {settings['kind']} one")
    mode = Mode.DRY if dry else Mode.CHECK if read_only else Mode(settings["mode"])
    parallel = settings["parallel"]
    logdir = None
    # A read-only task (status) does not try again a look that failed on a
    # transient fault: gcloud has already retried it (apitools: 5 times, ~30 s
    # under a 503), and a status reports what it could not read (unknown,
    # and why) instead of waiting on one API while the others have answered.
    retry = RetryPolicy(attempts=READ_ONLY_ATTEMPTS if read_only else RetryPolicy.attempts, is_transient=is_transient,
                        already_exists=already_exists)
    if mode is Mode.DRY:
        # no connector: nothing can start; its lines say which commands would be answered in-process
        runner = Runner(mode, retry=retry, in_process=connectors.in_process(env))
    else:
        logdir = paths.here(paths.run_logs(env.name, time.strftime('%Y%m%d-%H%M%S'), task))
        connectors.this_machine().make_dirs(str(logdir))
        if task in READ_ONLY_TASKS:
            prune(connectors.this_machine(), str(logdir.parent), task, KEEP_LOGS, paths.JOB_LOG)
        runner = Runner(mode, connectors.connector(env), retry, here=connectors.this_machine(), log=RunLog(logdir),
                        stale=staleness.stale)
    book = Playbook(runner, reporter or Reporter(), workers=parallel, heartbeat=settings["heartbeat"])
    release_after = None
    if mode is Mode.APPLY and (task in CHANGING or (changing and task in LOCKED_UNTIL)):
        # held by an earlier task of the chain: kept for the chain, not released early
        release_after = LOCKED_UNTIL.get(task) if task not in CHANGING and env.name not in _HELD else None
        hold_env_lock(env.name, task, settings, book.reporter)
    return Session(env, mode, runner, book, logdir, release_after)


_HELD: dict[str, ExitStack] = {}  # environment -> the lock this process holds on it (until its chain ends)


def hold_env_lock(name: str, task: str, settings: dict[str, Any], reporter: Reporter) -> None:
    """Take the environment's lock on this machine for the rest of the chain
    (held already by an earlier task of it: nothing to do). While another
    run holds it, say who and since when, every heartbeat; past
    playbook.lock_wait, refused in one line (exit 75)."""
    from playbooks.cli import chain

    if name in _HELD:
        return
    doing = "invoke " + " ".join(chain.current() or (task,))
    stack = ExitStack()
    try:
        stack.enter_context(machine_lock(paths.here(paths.env_lock(name)), f"one changing run at a time on "
                                         f"environment {name}", lambda line: reporter.line(line),
                                         every=settings["heartbeat"], wait=settings["lock_wait"], doing=doing,
                                         shown=paths.env_lock(name)))
    except Busy as e:
        hint = "run again when it ends" + (f" (waited playbook.lock_wait = {settings['lock_wait']:g}s)"
                                           if settings["lock_wait"] else " (playbook.lock_wait is 0: not waited for)")
        raise Busy(e.what, e.holder, e.path, 0.0, hint) from None
    _HELD[name] = stack
    chain.at_end(lambda: release_env_lock(name))


def release_env_lock(name: str) -> None:
    stack = _HELD.pop(name, None)
    if stack is not None:
        stack.close()


def _config_error(kind: type) -> bool:
    """Invoke's own errors of reading its config (a file that is not YAML,
    a `playbook:` that is not a mapping, an env var it cannot convert)."""
    mod = getattr(kind, "__module__", "")
    return (mod.startswith(("invoke.vendor.yaml", "yaml")) or kind.__name__ in (
        "AmbiguousMergeError", "UncastableEnvVar", "AmbiguousEnvVar", "UnknownFileType"))


def last_resort_line(kind, value, tb) -> tuple[str, int]:
    """The one line and the exit code for what is raised outside every task
    (a config error: 2; anything else: 3, its traceback kept in a file)."""
    text = " ".join(str(value).split())
    if _config_error(kind):
        misspelt = _misspelt_in_files()
        if misspelt:
            return f"error: {misspelt}", 2
        files = ", ".join(config_files()) or "none found"
        return f"error: Invoke's config files ({files}): {kind.__name__}: {shown_value(text, 300)[1:-1]}", 2
    path = paths.last_error()
    try:
        keep_traceback(path, "".join(traceback.format_exception(kind, value, tb)))
        where = f" (traceback in {path.relative_to(ROOT)})"
    except OSError:
        where = ""
    return f"internal error: {kind.__name__}: {shown_value(text, 300)[1:-1]}{where}", 3


def _last_resort(kind, value, tb) -> None:
    """What is raised outside every task (Invoke reading its config files,
    after tasks.py is imported): one line, the traceback kept in a file."""
    if issubclass(kind, KeyboardInterrupt):
        sys.stderr.write("interrupted\n")
        os._exit(130)
    if issubclass(kind, BrokenPipeError) and stdout_gone():
        os._exit(STDOUT_GONE)
    line, code = last_resort_line(kind, value, tb)
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
    os._exit(code)


def config_files() -> list[str]:
    """The config files Invoke reads here, that exist (system, user,
    project, runtime)."""
    out = []
    for base in ("/etc/invoke", os.path.expanduser("~/.invoke"), str(ROOT / "invoke")):
        out += [f"{base}.{ext}" for ext in ("yaml", "yml", "json", "py") if os.path.exists(f"{base}.{ext}")]
    runtime = os.environ.get("INVOKE_RUNTIME_CONFIG")
    if runtime:
        out.append(runtime)
    return out


# The exit status of a command whose output's reader went away, as a shell
# reports one that SIGPIPE ended (128 + 13).
STDOUT_GONE = 141


def stdout_gone() -> bool:
    """Whether this process's stdout is a pipe whose reader went away
    (`invoke status | head`); then stdout is pointed at /dev/null, so that
    what is still buffered, and Python's flush at exit, end quietly.

    SIGPIPE stays ignored (Python's default) rather than set back to the
    default action: that action would also end the run, silently and with
    no record, on a write to any socket or pipe whose other end closed
    (an SSH controller that drops the connection, a client that exits)."""
    try:
        poll = select.poll()
        poll.register(1, 0)
        gone = any(events & (select.POLLERR | select.POLLHUP) for _, events in poll.poll(0))
        if gone:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.close(null)
        return gone
    except (OSError, ValueError):
        return False


def install_last_resort() -> None:
    sys.excepthook = _last_resort


@contextmanager
def clean_errors() -> Iterator[None]:
    """Expected errors: one clean message and an exit code; anything else: a
    short message, the traceback in a file."""
    from invoke.exceptions import Exit

    try:
        yield
    except Exit:
        raise
    except InputError as e:
        # One line, whatever the message holds.
        raise Exit("error: " + " ".join(str(e).split()), code=2) from None
    except Failed as e:
        raise Exit(str(e), code=e.code) from None
    except PlaybookError as e:
        raise Exit(f"error: {e}", code=getattr(e, "exit_code", 1)) from None
    except KeyboardInterrupt:
        raise Exit("interrupted", code=130) from None
    except Exception as e:  # pragma: no cover - the unexpected
        if isinstance(e, BrokenPipeError) and stdout_gone():  # `invoke status | head`: not an error
            raise Exit(code=STDOUT_GONE) from None
        path = paths.last_error()
        keep_traceback(path, traceback.format_exc())
        raise Exit(f"internal error: {type(e).__name__}: {e} (traceback in {path.relative_to(ROOT)})", code=3) from None


def keep_traceback(path: Path, text: str) -> None:
    """An internal error's traceback, kept in .state/last-error.txt (through
    this machine's connector, as every file of the project's)."""
    here = connectors.this_machine()
    here.make_dirs(str(path.parent))
    here.write(str(path), text.encode())
