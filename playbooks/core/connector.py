"""Connectors: where effects happen. Every process, file, HTTP read and kill
of a run goes through one, so the same plays run on this machine or on a
controller host over SSH, unchanged (pyinfra's connectors, Ansible's
connection plugins).

- ``LocalConnector``: this machine, through ``subprocess`` (the only user of
  it in the project) and the local filesystem.
- ``SshConnector``: a controller host, through one ``fabric.Connection``
  (Paramiko): commands through ``exec_command``, files through SFTP.

Both take argv lists; a connector that needs a shell string (SSH's
``exec_command`` always goes through the remote user's shell) quotes every
argument with ``shlex.quote`` itself, and the contract tests prove that every
byte arrives. Relative paths are relative to the connector's ``root`` (this
project locally, ``remote_dir`` on a controller).
"""
from __future__ import annotations

import io
import json
import os
import shlex
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterable

from .errors import PlaybookError, ProbeFailed
from .procs import alive_from


class Unreachable(PlaybookError):
    """The host that should run the commands cannot be reached, or is not
    the host it claims to be (Ansible's ``unreachable``)."""

    exit_code = 4


class Ran:
    """What a process did: exit code, output, time taken."""

    __slots__ = ("rc", "stdout", "stderr", "seconds")

    def __init__(self, rc: int, stdout: str, stderr: str, seconds: float):
        self.rc, self.stdout, self.stderr, self.seconds = rc, stdout, stderr, seconds


NOT_FOUND = 127
TIMED_OUT = 124


class Connector:
    """The interface. ``env`` is a sequence of (name, value) added to the
    connector's stated base environment; ``cwd`` is relative to ``root``."""

    name = "this machine"
    remote = False
    root: str = "."

    def run(self, argv: Iterable[str], env: Iterable[tuple[str, str]] = (), input: str | None = None,
            cwd: str | None = None, timeout: float | None = None) -> Ran:
        raise NotImplementedError

    def stream(self, argv: Iterable[str], on_line: Callable[[str], None], env: Iterable[tuple[str, str]] = (),
               cwd: str | None = None) -> Ran:
        raise NotImplementedError

    def spawn(self, argv: Iterable[str], env: Iterable[tuple[str, str]] = (), cwd: str | None = None,
              log: str | None = None) -> int:
        raise NotImplementedError

    def read(self, path: str) -> bytes | None:
        """A file's bytes; None when it does not exist."""
        raise NotImplementedError

    def write(self, path: str, data: bytes) -> None:
        raise NotImplementedError

    def remove(self, path: str) -> None:
        raise NotImplementedError

    def make_dirs(self, path: str) -> None:
        """A folder and its parents (nothing when it exists)."""
        raise NotImplementedError

    def remove_tree(self, path: str) -> None:
        """A folder and everything in it (nothing when it does not exist)."""
        raise NotImplementedError

    def alive(self, pid: int, marker: str = "") -> bool:
        """The process exists, is not a zombie, and its command line holds
        ``marker`` (a recycled pid is not ours): /proc read where this
        connector runs."""
        return alive_from(self.read, pid, marker)

    def terminate(self, pid: int, grace: float = 10.0) -> None:
        """SIGTERM a process and its descendants; SIGKILL what is left after
        ``grace`` seconds."""
        raise NotImplementedError

    def kill(self, pid: int) -> None:
        """SIGKILL a process and its descendants at once: a host lost
        without warning."""
        raise NotImplementedError

    def get_json(self, url: str, timeout: float = 10.0) -> Any:
        """GET a JSON document where this connector runs. ``ABSENT`` when a
        loopback port refuses (nothing listens) or the answer is 404."""
        raise NotImplementedError

    def getenv(self, name: str) -> str | None:
        raise NotImplementedError

    def path(self, rel: str) -> str:
        """A project-relative path where this connector runs."""
        return rel if rel.startswith("/") else str(PurePosixPath(self.root) / rel)

    def close(self) -> None:
        pass


def _http_absent_or_fail(url: str, status: int | None, why: str) -> Any:
    from .facts import ABSENT
    if status == 404 or status == 0:
        return ABSENT
    raise ProbeFailed("http", f"curl -fsS {url}", None, "", why, why=f"could not look: {why}")


class LocalConnector(Connector):
    """This machine. ``base_env`` is the environment every child starts
    from (stated by the session); ``root`` is this project."""

    def __init__(self, root: str | Path, base_env: dict[str, str] | None = None):
        self.root = str(root)
        self.base_env = dict(base_env if base_env is not None else os.environ)

    def _env(self, env: Iterable[tuple[str, str]]) -> dict[str, str]:
        out = dict(self.base_env)
        out.update(dict(env))
        return out

    def _cwd(self, cwd: str | None) -> str:
        return self.path(cwd) if cwd else self.root

    def run(self, argv, env=(), input=None, cwd=None, timeout=None) -> Ran:
        start = time.monotonic()
        argv = list(argv)
        try:
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

    def stream(self, argv, on_line, env=(), cwd=None) -> Ran:
        start = time.monotonic()
        argv = list(argv)
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

    def spawn(self, argv, env=(), cwd=None, log=None) -> int:
        argv = list(argv)
        path = Path(self.path(log)) if log else None
        if path:
            path.parent.mkdir(parents=True, exist_ok=True)
        out = open(path, "ab") if path else subprocess.DEVNULL
        try:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=self._env(env), cwd=self._cwd(cwd), start_new_session=True)
        except FileNotFoundError as e:
            from .errors import CommandFailed
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

    def remove(self, path: str) -> None:
        try:
            Path(self.path(path)).unlink()
        except FileNotFoundError:
            pass

    def make_dirs(self, path: str) -> None:
        Path(self.path(path)).mkdir(parents=True, exist_ok=True)

    def remove_tree(self, path: str) -> None:
        import shutil
        shutil.rmtree(self.path(path), ignore_errors=False, onexc=_missing_is_fine)

    def terminate(self, pid: int, grace: float = 10.0) -> None:
        from .procs import terminate, tree
        terminate(tree(pid), grace=grace)

    def kill(self, pid: int) -> None:
        from .procs import kill_now, tree
        if pid > 0:
            kill_now(tree(pid))

    def port_open(self, host: str, port: int) -> bool:
        """Something listens on host:port here (local clusters only)."""
        from .http import port_open
        return port_open(host, port)

    def get_json(self, url: str, timeout: float = 10.0) -> Any:
        from .http import get_json
        return get_json(url, timeout=timeout)

    def getenv(self, name: str) -> str | None:
        return self.base_env.get(name)


def _missing_is_fine(function, path, exc) -> None:
    if not isinstance(exc, FileNotFoundError):
        raise exc


# -- SSH -----------------------------------------------------------------------------
def parse_target(text: str) -> tuple[str, str, int]:
    """``user@host[:port]`` -> (user, host, port); the inventory checked the form."""
    user, _, rest = text.rpartition("@")
    host, _, port = rest.partition(":")
    return user, host, int(port or 22)


_PID_MARK = "@playbook-pid "


class _Lines(io.TextIOBase):
    """A writable stream handing whole lines to ``on_line``."""

    def __init__(self, on_line: Callable[[str], None]):
        self.on_line = on_line
        self.buf = ""
        self.lines: list[str] = []
        self.lock = threading.Lock()

    def write(self, s: str) -> int:
        with self.lock:
            self.buf += s
            while "\n" in self.buf:
                line, self.buf = self.buf.split("\n", 1)
                self._take(line)
        return len(s)

    def _take(self, line: str) -> None:
        self.lines.append(line)
        self.on_line(line)

    def flush_rest(self) -> None:
        if self.buf:
            line, self.buf = self.buf, ""
            self._take(line)


class SshConnector(Connector):
    """A controller host over SSH, with one ``fabric.Connection`` opened on
    first use (a dry run never connects). Host keys are checked against
    ``known_hosts`` and an unknown key is refused (Fabric's own default,
    Paramiko's AutoAddPolicy, would trust any host on first sight). The
    remote commands get the controller's login environment plus the
    command's own variables, never a copy of this machine's."""

    remote = True

    def __init__(self, target: str, root: str, gateway: str | None = None, identity_file: str | None = None,
                 known_hosts: str | None = None, connect_timeout: float = 10.0):
        self.target = target
        self.user, self.host, self.port = parse_target(target)
        self.gateway = gateway
        self.identity_file = identity_file
        self.known_hosts = known_hosts
        self.connect_timeout = connect_timeout
        self.root = root
        self.name = f"controller {target}"
        self._conn = None
        self._lock = threading.Lock()
        self._env_cache: dict[str, str] | None = None
        self._broken: Unreachable | None = None
        self._sftp_client = None
        self._sftp_lock = threading.Lock()
        self._made: set[str] = set()  # directories made on the controller

    # -- the connection -----------------------------------------------------------
    def _connection(self, target: str, gateway=None):
        import fabric
        import paramiko

        user, host, port = parse_target(target)
        kwargs: dict[str, Any] = {"allow_agent": False, "look_for_keys": self.identity_file is None}
        if self.identity_file:
            kwargs["key_filename"] = [os.path.expanduser(self.identity_file)]
        c = fabric.Connection(host, user=user or None, port=port, gateway=gateway,
                              connect_timeout=self.connect_timeout, connect_kwargs=kwargs)
        c.client.set_missing_host_key_policy(paramiko.RejectPolicy())
        hosts = os.path.expanduser(self.known_hosts or "~/.ssh/known_hosts")
        if os.path.exists(hosts):
            c.client.load_host_keys(hosts)
        return c

    def connection(self):
        with self._lock:
            if self._broken is not None:  # said once; not tried again in this run
                raise Unreachable(str(self._broken))
            if self._conn is None:
                gw = self._connection(self.gateway) if self.gateway else None
                conn = self._connection(self.target, gw)
                try:
                    self._open(conn, gw)
                except Unreachable as e:
                    self._broken = e
                    raise
                self._conn = conn
            return self._conn

    def _open(self, conn, gw) -> None:
        import paramiko

        where = self.target + (f" (through {self.gateway})" if self.gateway else "")
        try:
            conn.open()
        except paramiko.BadHostKeyException as e:
            raise Unreachable(f"controller {where} is unreachable: its host key "
                              f"{e.key.get_name()} {e.key.get_fingerprint().hex()} does not match "
                              f"{self.known_hosts or '~/.ssh/known_hosts'} (a rebuilt host, or someone in "
                              f"between): check it, then update known_hosts") from None
        except paramiko.AuthenticationException as e:
            raise Unreachable(f"controller {where} is unreachable: it refused the key "
                              f"({self.identity_file or 'the default keys'}): {e}") from None
        except paramiko.SSHException as e:
            text = str(e)
            if "not found in known_hosts" in text:
                raise Unreachable(f"controller {where} is unreachable: its host key is unknown ({text}); "
                                  f"after checking its fingerprint, add it: ssh-keyscan -p {self.port} "
                                  f"{self.host} >> {self.known_hosts or '~/.ssh/known_hosts'}") from None
            raise Unreachable(f"controller {where} is unreachable: {text}") from None
        except (OSError, socket.timeout, EOFError) as e:
            why = getattr(e, "strerror", None) or str(e) or type(e).__name__
            if type(e).__name__ == "NoValidConnectionsError":
                why = "connection refused"
            raise Unreachable(f"controller {where} is unreachable: {why}") from None

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                try:
                    self._conn.close()
                finally:
                    self._conn = None
                    self._sftp_client = None
                    self._made.clear()

    # -- commands -------------------------------------------------------------------
    def _program(self, argv: Iterable[str], env: Iterable[tuple[str, str]], cwd: str | None) -> tuple[str, str]:
        """(the directory, the program with its variables) for a remote
        shell line: every value quoted here (Fabric's own ``env=`` would be
        an unquoted ``export``)."""
        assigns = " ".join(shlex.quote(f"{k}={v}") for k, v in env)
        prog = shlex.join(list(argv))
        return shlex.quote(self.path(cwd) if cwd else self.root), (f"env {assigns} {prog}" if assigns else prog)

    def _line(self, argv: Iterable[str], env: Iterable[tuple[str, str]], cwd: str | None) -> str:
        where, prog = self._program(argv, env, cwd)
        # The pid first (so Ctrl-C can stop it), then the program in its
        # place; a missing program exits 127 as locally.
        return f"cd {where} && echo {_PID_MARK}$$ >&2 && exec {prog}"

    def _exec(self, argv, env, input, cwd, timeout, out_stream=None, err_stream=None) -> Ran:
        from invoke.exceptions import CommandTimedOut

        conn = self.connection()
        line = self._line(argv, env, cwd)
        fed = None
        if input is None:
            line += " < /dev/null"
        else:
            # Fed from a file put over SFTP: Invoke copies an in_stream one
            # byte per 10 ms (a 5 KB manifest took 50 s).
            import uuid
            fed = f".state/stdin/{uuid.uuid4().hex}"
            self.write(fed, input.encode())
            line += f" < {shlex.quote(self.path(fed))}"
        err = err_stream if err_stream is not None else _PidStripper()
        start = time.monotonic()
        try:
            # Not hidden: Invoke writes to these streams only when shown; the
            # result captures both either way.
            r = conn.run(line, hide=False, warn=True, timeout=timeout, in_stream=False,
                         out_stream=out_stream if out_stream is not None else _Lines(lambda _l: None),
                         err_stream=err)
            rc, out, errtext = r.exited, r.stdout, r.stderr
            if rc is None or rc < 0:  # the channel closed without an exit status
                if timeout is not None and time.monotonic() - start >= timeout:
                    # Invoke's timer closed it (a race with its CommandTimedOut)
                    self._kill(err.pid, signal.SIGTERM)
                    rc, errtext = TIMED_OUT, errtext + f"\ntimed out after {timeout:.0f}s"
                else:
                    rc, errtext = 255, errtext + "\nthe remote command ended without an exit status"
        except CommandTimedOut as e:
            self._kill(err.pid, signal.SIGTERM)
            rc, out, errtext = TIMED_OUT, e.result.stdout, e.result.stderr + f"\ntimed out after {timeout:.0f}s"
        except KeyboardInterrupt:
            self._kill(err.pid, signal.SIGINT)  # the remote command stops too
            raise
        except (OSError, EOFError) as e:
            raise Unreachable(f"controller {self.target} is unreachable: the connection broke "
                              f"({type(e).__name__}: {e})") from None
        finally:
            if fed is not None:
                self.remove(fed)
        errtext = "\n".join(l for l in errtext.split("\n") if not l.startswith(_PID_MARK))
        return Ran(rc, out, errtext, time.monotonic() - start)

    def _kill(self, pid: int | None, sig: int) -> None:
        if pid:
            try:
                self.connection().run(f"kill -{int(sig)} {int(pid)}", hide=True, warn=True, in_stream=False)
            except Exception:
                pass

    def run(self, argv, env=(), input=None, cwd=None, timeout=None) -> Ran:
        return self._exec(argv, env, input, cwd, timeout)

    def stream(self, argv, on_line, env=(), cwd=None) -> Ran:
        lines = _Lines(on_line)
        err = _PidStripper(on_line)
        r = self._exec(argv, env, None, cwd, None, out_stream=lines, err_stream=err)
        lines.flush_rest()
        err.flush_rest()
        return Ran(r.rc, "\n".join(lines.lines), "", r.seconds)

    def spawn(self, argv, env=(), cwd=None, log=None) -> int:
        argv = list(argv)
        where, prog = self._program(argv, env, cwd)
        out = shlex.quote(log) if log else "/dev/null"
        mk = f"mkdir -p {shlex.quote(str(PurePosixPath(log).parent))} && " if log else ""
        # setsid: its own session, so it outlives this connection and can be
        # found (pid file) and stopped by a later run.
        line = f"cd {where} && {mk}(setsid {prog} > {out} 2>&1 < /dev/null & echo $!)"
        r = self.connection().run(line, hide=True, warn=True, in_stream=False)
        if r.exited != 0 or not r.stdout.strip().isdigit():
            from .errors import CommandFailed
            raise CommandFailed("spawn", shlex.join(argv), r.exited or 1, r.stdout, r.stderr)
        return int(r.stdout.strip())

    # -- files ------------------------------------------------------------------------
    def _sftp(self):
        """One SFTP session per connection, used by one thread at a time
        (Paramiko's SFTPClient hangs when threads share it)."""
        conn = self.connection()
        with self._lock:
            if self._sftp_client is None:
                self._sftp_client = conn.client.open_sftp()
            return self._sftp_client

    def read(self, path: str) -> bytes | None:
        sftp = self._sftp()
        with self._sftp_lock:
            try:
                with sftp.open(self.path(path), "rb") as f:
                    return f.read()
            except FileNotFoundError:
                return None
            except OSError as e:
                if getattr(e, "errno", None) == 2 or "No such file" in str(e):
                    return None
                raise

    def write(self, path: str, data: bytes) -> None:
        full = self.path(path)
        parent = str(PurePosixPath(full).parent)
        if parent not in self._made:  # once per directory and connection (a sync writes ~90 files)
            r = self.run(["mkdir", "-p", parent], cwd="/")
            if r.rc != 0:
                raise OSError(f"cannot make {parent} on {self.target}: {r.stderr.strip()}")
            self._made.add(parent)
        sftp = self._sftp()
        with self._sftp_lock:
            with sftp.open(full, "wb") as f:
                f.write(data)

    def remove(self, path: str) -> None:
        sftp = self._sftp()
        with self._sftp_lock:
            try:
                sftp.remove(self.path(path))
            except OSError:
                pass

    def make_dirs(self, path: str) -> None:
        full = self.path(path)
        if full in self._made:
            return
        r = self.run(["mkdir", "-p", "--", full])
        if r.rc != 0:
            raise OSError(f"cannot make {path} on {self.target}: {r.stderr.strip()}")
        self._made.add(full)

    def remove_tree(self, path: str) -> None:
        r = self.run(["rm", "-rf", "--", self.path(path)])
        if r.rc != 0:
            raise OSError(f"cannot remove {path} on {self.target}: {r.stderr.strip()}")

    @staticmethod
    def _tree(pid: int) -> str:
        """A shell word list: the pid and its children (listed by ps)."""
        return f"pids=\"{pid} $(ps -o pid= --ppid {pid} 2>/dev/null | tr '\\n' ' ')\"; "

    def kill(self, pid: int) -> None:
        pid = int(pid)
        if pid > 0:
            self.connection().run(self._tree(pid) + "kill -KILL $pids 2>/dev/null; true", hide=True, warn=True,
                                  in_stream=False)

    def terminate(self, pid: int, grace: float = 10.0) -> None:
        pid = int(pid)
        if pid <= 0:
            return
        # The tree (children first listed by ps), TERM, wait, KILL.
        script = (self._tree(pid) +
                  f"kill -TERM $pids 2>/dev/null; i=0; "
                  f"while [ $i -lt {int(grace * 5)} ] && kill -0 $pids 2>/dev/null; do sleep 0.2; i=$((i+1)); done; "
                  f"kill -KILL $pids 2>/dev/null; true")
        self.connection().run(script, hide=True, warn=True, in_stream=False)

    def get_json(self, url: str, timeout: float = 10.0) -> Any:
        """curl on the controller (where the port-forward listens): the HTTP
        status on the last line; 000 with curl's exit 7 is a refused port."""
        r = self.run(["curl", "-sS", "--max-time", str(int(max(1, timeout))), "-w", "\n%{http_code}", url],
                     timeout=timeout + 5)
        body, _, code = r.stdout.rpartition("\n")
        if r.rc == 7:
            return _http_absent_or_fail(url, 0, "connection refused")
        if r.rc != 0:
            return _http_absent_or_fail(url, None, (r.stderr.strip() or f"curl exited {r.rc}")[:300])
        status = int(code) if code.isdigit() else None
        if status != 200:
            return _http_absent_or_fail(url, status, f"HTTP {code}")
        try:
            return json.loads(body or "null")
        except json.JSONDecodeError:
            return _http_absent_or_fail(url, None, "the answer is not JSON")

    def getenv(self, name: str) -> str | None:
        if self._env_cache is None:
            r = self.run(["env", "-0"], cwd="/")  # before remote_dir exists, too
            if r.rc != 0:
                raise ProbeFailed("env", "env -0", r.rc, r.stdout, r.stderr,
                                  why=f"could not read the controller's environment: {r.stderr.strip()[:200]}")
            self._env_cache = dict(item.split("=", 1) for item in r.stdout.split("\0") if "=" in item)
        return self._env_cache.get(name)


class _PidStripper(_Lines):
    """stderr of a remote command: its first line is the shell's pid."""

    def __init__(self, on_line: Callable[[str], None] | None = None):
        super().__init__(on_line or (lambda _l: None))
        self.pid: int | None = None

    def _take(self, line: str) -> None:
        if self.pid is None and line.startswith(_PID_MARK):
            rest = line[len(_PID_MARK):]
            self.pid = int(rest) if rest.isdigit() else None
            return
        super()._take(line)
