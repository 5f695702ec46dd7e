"""One task run: which environment and mode, the runner, the output, the
per-run log folder, and the one place expected errors become clean exits."""
from __future__ import annotations

import os
import sys
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .clients import is_transient
from .core.errors import InputError, PlaybookError
from .core.inventory import Env
from .core.play import Playbook
from .core.recap import Recap, Reporter, banner
from .core.runner import Executor, Mode, RetryPolicy, Runner
from .core.step import Step
from .settings import ROOT, load_inventory

MODES = ("apply", "check")


class Failed(Exception):
    """The run failed; its message was already printed."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


@dataclass
class Session:
    env: Env
    mode: Mode
    runner: Runner
    book: Playbook
    logdir: Path | None

    def run(self, name: str, steps: list[Step], parallel: bool = True) -> Recap:
        """Run a play. ``parallel=False`` for plays whose output streams live
        (a training job's log) or whose order is the point (chaos)."""
        self.book.reporter.line(banner("PLAY", f"{name} | env {self.env.name} ({_what(self.env)}) | {self.mode.value}"))
        recap = self.book.run(f"{name} {self.env.name}", steps, workers=None if parallel else 1)
        if self.logdir:
            self.book.reporter.line(f"logs: {self.logdir.relative_to(ROOT)}")
        if recap.failed:
            raise Failed(f"{name}: {recap.count('failed')} step(s) failed")
        return recap


def _what(env: Env) -> str:
    return "local" if env.kind == "local" else f"gke {env.mode}"


def whole_number(flag: str, text: str, minimum: int) -> int:
    """A task flag that must be a whole number (Invoke's own int() would
    end in a traceback)."""
    try:
        value = int(str(text).strip())
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise InputError(f"{flag} {text!r} must be a whole number >= {minimum}")
    return value


def seconds(flag: str, text: str) -> float:
    try:
        value = float(str(text).strip())
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise InputError(f"{flag} {text!r} must be a number of seconds >= 0")
    return value


def config_value(config, key: str, default=None):
    pb = config.get("playbook", {}) if hasattr(config, "get") else {}
    v = pb.get(key, default) if hasattr(pb, "get") else default
    return default if v is None else v


def tool_env() -> dict[str, str]:
    """Subprocess environment: this interpreter's bin folder first on PATH, so
    ``ray`` is the locked Ray even when the venv is not activated."""
    env = dict(os.environ)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    return env


def open_session(config, task: str, reporter: Reporter | None = None) -> Session:
    os.chdir(ROOT)
    inv = load_inventory(config_value(config, "inventory"))
    env = inv.env(config_value(config, "env"))
    dry = bool(config.get("run", {}).get("dry", False)) if hasattr(config, "get") else False
    mode_name = config_value(config, "mode", "apply")
    if mode_name not in MODES:
        raise InputError(f"playbook.mode = {mode_name!r} is not allowed (allowed: apply, check; "
                         f"a dry run is Invoke's own --dry)")
    mode = Mode.DRY if dry else Mode(mode_name)
    try:
        parallel = int(config_value(config, "parallel", 1))
    except (TypeError, ValueError):
        raise InputError(f"playbook.parallel = {config_value(config, 'parallel')!r} must be an integer") from None
    if parallel < 1:
        raise InputError(f"playbook.parallel = {parallel} must be at least 1")
    logdir = None
    executor = None
    if mode is not Mode.DRY:
        logdir = ROOT / ".state" / env.name / "runs" / f"{time.strftime('%Y%m%d-%H%M%S')}-{task}"
        logdir.mkdir(parents=True, exist_ok=True)
        executor = Executor(tool_env(), logdir)
    runner = Runner(mode, executor, RetryPolicy(is_transient=is_transient))
    book = Playbook(runner, reporter or Reporter(), workers=parallel)
    return Session(env, mode, runner, book, logdir)


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
        raise Exit(f"error: {e}", code=2) from None
    except Failed as e:
        raise Exit(str(e), code=e.code) from None
    except PlaybookError as e:
        raise Exit(f"error: {e}", code=getattr(e, "exit_code", 1)) from None
    except KeyboardInterrupt:
        raise Exit("interrupted", code=130) from None
    except Exception as e:  # pragma: no cover - the unexpected
        path = ROOT / ".state" / "last-error.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(traceback.format_exc())
        raise Exit(f"internal error: {type(e).__name__}: {e} (traceback in {path.relative_to(ROOT)})", code=3) from None
