"""This machine's connector: processes through ``subprocess`` (the only user
of it in the project), files in the local filesystem, kills through this
machine's /proc (``procs``)."""
from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .. import procs
from ..errors import CommandFailed
from ..http import get_json, get_text, port_open
from .base import NOT_FOUND, TIMED_OUT, Connector, Ran, Shortcut, under


class LocalConnector(Connector):
    """This machine. ``base_env`` is the environment every child starts
    from (stated by the session); ``root`` is this project; ``shortcuts``
    answer some commands in-process (``base.Shortcut``), tried in order."""

    name = "this machine"
    remote = False

    def __init__(self, root: str | Path, base_env: dict[str, str] | None = None,
                 shortcuts: Sequence[Shortcut] = ()):
        self.root = str(root)
        self.base_env = dict(base_env if base_env is not None else os.environ)
        self.shortcuts = tuple(shortcuts)

    def path(self, rel: str) -> str:
        return under(self.root, rel)

    def _env(self, env: Iterable[tuple[str, str]]) -> dict[str, str]:
        out = dict(self.base_env)
        out.update(dict(env))
        return out

    def _cwd(self, cwd: str | None) -> str:
        return self.path(cwd) if cwd else self.root

    def run(self, argv: Iterable[str], env: Iterable[tuple[str, str]] = (), input: str | None = None,
            cwd: str | None = None, timeout: float | None = None) -> Ran:
        start = time.monotonic()
        argv = list(argv)
        if input is None and cwd is None:
            for shortcut in self.shortcuts:
                answer = shortcut.run(argv, self._env(env), timeout)
                if answer is not None:
                    answer.by = shortcut.name
                    return answer
        try:
            # On any exception (KeyboardInterrupt too) subprocess.run kills the child.
            p = subprocess.run(argv, input=input, stdin=None if input is not None else subprocess.DEVNULL,
                               capture_output=True, text=True, env=self._env(env), cwd=self._cwd(cwd),
                               timeout=timeout)
            return Ran(p.returncode, p.stdout, p.stderr, time.monotonic() - start)
        except FileNotFoundError as e:
            return Ran(NOT_FOUND, "", f"{argv[0]}: command not found ({e})", 0.0)
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
            return Ran(TIMED_OUT, out, err + f"\ntimed out after {timeout:.0f}s", time.monotonic() - start)

    def stream(self, argv: Iterable[str], on_line: Callable[[str], None], env: Iterable[tuple[str, str]] = (),
               cwd: str | None = None) -> Ran:
        start = time.monotonic()
        argv = list(argv)
        if cwd is None:
            for shortcut in self.shortcuts:
                answer = shortcut.stream(argv, self._env(env), on_line)
                if answer is not None:
                    answer.by = shortcut.name
                    return answer
        lines: list[str] = []
        try:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, text=True, bufsize=1, env=self._env(env),
                                    cwd=self._cwd(cwd))
        except FileNotFoundError as e:
            return Ran(NOT_FOUND, "", f"{argv[0]}: command not found ({e})", 0.0)
        try:
            assert proc.stdout is not None
            for raw in proc.stdout:
                line = raw.rstrip("\n")
                lines.append(line)
                on_line(line)
            rc = proc.wait()
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)
            proc.wait()
            raise
        return Ran(rc, "\n".join(lines), "", time.monotonic() - start)

    def in_process(self, argv: Iterable[str], env: Iterable[tuple[str, str]] = (),
                   streamed: bool = False) -> str | None:
        argv, stated = list(argv), self._env(env)
        for shortcut in self.shortcuts:
            words = shortcut.answers(argv, stated, streamed)
            if words is not None:
                return words
        return None

    def spawn(self, argv: Iterable[str], env: Iterable[tuple[str, str]] = (), cwd: str | None = None,
              log: str | None = None) -> int:
        argv = list(argv)
        path = Path(self.path(log)) if log else None
        if path:
            path.parent.mkdir(parents=True, exist_ok=True)
        out = open(path, "ab") if path else subprocess.DEVNULL  # noqa: SIM115 - the child keeps it; closed below
        try:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=self._env(env), cwd=self._cwd(cwd), start_new_session=True)
        except FileNotFoundError as e:
            raise CommandFailed("spawn", shlex.join(argv), NOT_FOUND, "",
                                f"{argv[0]}: command not found ({e})") from None
        finally:
            if path:
                out.close()  # type: ignore[union-attr]
        return proc.pid

    def read(self, path: str) -> bytes | None:
        try:
            return Path(self.path(path)).read_bytes()
        except (FileNotFoundError, NotADirectoryError, ProcessLookupError):
            return None

    def write(self, path: str, data: bytes) -> None:
        p = Path(self.path(path))
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)

    def append(self, path: str, data: bytes) -> None:
        """Add ``data`` at the end of a file (made, with its folders, when
        missing) in one write: lines appended by several processes at once
        (a job's follower, a chaos task) never interleave. This machine only:
        a run's records are kept here."""
        p = Path(self.path(path))
        p.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    def remove(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            Path(self.path(path)).unlink()

    def make_dirs(self, path: str) -> None:
        Path(self.path(path)).mkdir(parents=True, exist_ok=True)

    def remove_tree(self, path: str) -> None:
        shutil.rmtree(self.path(path), ignore_errors=False, onexc=_missing_is_fine)

    def list_dir(self, path: str) -> list[tuple[str, bool]] | None:
        try:
            with os.scandir(self.path(path)) as entries:
                return sorted((e.name, e.is_dir()) for e in entries)
        except FileNotFoundError:
            return None

    def alive(self, pid: int, marker: str = "") -> bool:
        return procs.alive_from(self.read, pid, marker)

    def terminate(self, pid: int, grace: float = 10.0) -> None:
        procs.terminate(procs.tree(pid), grace=grace)

    def kill(self, pid: int) -> None:
        if pid > 0:
            pids = procs.tree(pid)
            procs.kill_now(pids)
            procs.wait_gone(pids)

    def port_open(self, host: str, port: int) -> bool:
        """Something listens on host:port here (local clusters only)."""
        return port_open(host, port)

    def get_json(self, url: str, timeout: float = 10.0, headers: Mapping[str, str] | None = None,
                 ca_file: str | None = None) -> Any:
        return get_json(url, timeout=timeout, headers=headers, ca_file=ca_file)

    def get_text(self, url: str, timeout: float = 10.0) -> tuple[int, str]:
        return get_text(url, timeout=timeout)

    def getenv(self, name: str) -> str | None:
        return self.base_env.get(name)

    def close(self) -> None:
        pass


def _missing_is_fine(function: Any, path: str, exc: BaseException) -> None:
    if not isinstance(exc, FileNotFoundError):
        raise exc
