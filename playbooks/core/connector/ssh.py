"""A controller host's connector, over one SSH connection (Fabric opens it,
with its gateway; Paramiko carries it): every command a shell line on an
exec channel of its own (``channel.call``), files through SFTP, or, when the
controller's sshd offers no SFTP subsystem (a hardened bastion), through
``cat`` on an exec channel (Ansible's piped transfer)."""
from __future__ import annotations

import codecs
import contextlib
import json
import logging
import os
import shlex
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import PurePosixPath
from typing import Any

from .. import procs
from ..errors import CommandFailed, ProbeFailed, Unreachable, first_line
from ..facts import ABSENT
from ..http import plain_http_refused, redirect_refused, server_message
from . import channel
from .base import TIMED_OUT, Connector, Ran, under
from .lines import PID_MARK, Lines, PidStripper, without_pid_lines

log = logging.getLogger(__name__)
_importing = threading.Lock()


def _libs() -> tuple[Any, Any]:
    """(fabric, paramiko), imported on first use (a local run never needs
    them) by one thread at a time: the plays' threads that meet a controller
    at once would otherwise get a half-imported paramiko (its modules import
    each other)."""
    with _importing:
        import fabric
        import paramiko
    return fabric, paramiko


def parse_target(text: str) -> tuple[str, str, int]:
    """``user@host[:port]`` -> (user, host, port); the inventory checked the form."""
    user, _, rest = text.rpartition("@")
    host, _, port = rest.partition(":")
    return user, host, int(port or 22)


def _http_absent_or_fail(url: str, status: int | None, why: str) -> Any:
    if status == 404 or status == 0:
        return ABSENT
    raise ProbeFailed("http", f"curl -fsS {url}", None, "", why, why=f"could not look: {why}")


def _no_delay(conn: Any) -> None:
    """TCP_NODELAY on the connection's socket (and its gateway's), as
    OpenSSH's ssh sets it: each command is a few small messages (open a
    channel, exec, close), which Nagle's algorithm would otherwise hold
    back until the previous ones are acknowledged (40 ms of delayed ACK per
    command on Linux)."""
    for c in (conn, getattr(conn, "gateway", None)):
        client = getattr(c, "client", None)    # a gateway may be a ProxyCommand string
        sock = getattr(client.get_transport() if client is not None else None, "sock", None)
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _Text:
    """A byte stream decoded as UTF-8 as it comes (a character may be cut
    between chunks), all of it kept, each piece handed on to ``to``."""

    def __init__(self, to: Lines | None = None):
        self.to = to
        self.raw = bytearray()
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def __call__(self, data: bytes) -> None:
        self.raw += data
        if self.to is not None:
            self.to.write(self.decoder.decode(data))

    def end(self) -> str:
        if self.to is not None:
            self.to.write(self.decoder.decode(b"", final=True))
            self.to.flush_rest()
        return self.raw.decode("utf-8", "replace")


class SshConnector(Connector):
    """A controller host over SSH, with one ``fabric.Connection`` opened on
    first use (a dry run never connects). Host keys are checked against
    ``known_hosts`` and an unknown key is refused (Fabric's own default,
    Paramiko's AutoAddPolicy, would trust any host on first sight). The
    remote commands get the controller's login environment plus the
    command's own variables, never a copy of this machine's.

    Files go through the connection's SFTP session; when the controller
    refuses the SFTP subsystem, that is remembered for the connection and
    files go through ``cat`` on exec channels from then on (``files`` says
    which)."""

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
        self._conn: Any = None
        self._lock = threading.Lock()
        self._env_cache: dict[str, str] | None = None
        self._broken: Unreachable | None = None
        self._sftp_client: Any = None
        self._sftp_refused = False
        self._sftp_lock = threading.Lock()
        self._made: set[str] = set()  # directories made on the controller

    @property
    def files(self) -> str:
        """How files move: "sftp", or "cat" (the controller refused SFTP)."""
        return "cat" if self._sftp_refused else "sftp"

    def path(self, rel: str) -> str:
        return under(self.root, rel)

    # -- the connection -----------------------------------------------------------
    def _connection(self, target: str, gateway: Any = None) -> Any:
        fabric, paramiko = _libs()
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

    def connection(self) -> Any:
        """The open ``fabric.Connection`` (opened on first use, and again
        when it dropped since, as Fabric's own ``run`` would)."""
        with self._lock:
            if self._broken is not None:  # said once; not tried again in this run
                raise Unreachable(str(self._broken))
            if self._conn is None or not self._conn.is_connected:
                if self._conn is None:
                    gw = self._connection(self.gateway) if self.gateway else None
                    conn = self._connection(self.target, gw)
                else:
                    conn = self._conn
                    self._sftp_client = None  # of the lost connection
                try:
                    self._open(conn)
                except Unreachable as e:
                    self._broken = e
                    raise
                self._conn = conn
            return self._conn

    def _open(self, conn: Any) -> None:
        _, paramiko = _libs()
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
        except (TimeoutError, OSError, EOFError) as e:
            why = getattr(e, "strerror", None) or str(e) or type(e).__name__
            if type(e).__name__ == "NoValidConnectionsError":
                why = "connection refused"
            raise Unreachable(f"controller {where} is unreachable: {why}") from None
        _no_delay(conn)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                try:
                    self._conn.close()
                finally:
                    self._conn = None
                    self._sftp_client = None
                    self._sftp_refused = False
                    self._made.clear()

    def _call(self, line: str, stdin: bytes | None, on_out: Callable[[bytes], None],
              on_err: Callable[[bytes], None], timeout: float | None = None) -> int | None:
        """``channel.call`` on this connection; a channel that cannot be had
        is the controller unreachable."""
        transport = self.connection().client.get_transport()
        try:
            return channel.call(transport, line, stdin, on_out, on_err, timeout)
        except channel.ChannelFailed as e:
            lost = transport is None or not transport.is_active()
            why = f"the connection broke ({e})" if lost else f"it refused a session ({e})"
            raise Unreachable(f"controller {self.target} is unreachable: {why}") from None

    def _shell(self, line: str, stdin: bytes | None = None) -> tuple[int, bytes, str]:
        """A shell line run to its end: (exit status, stdout, stderr); -1
        when it ended without a status."""
        out, err = bytearray(), _Text()
        status = self._call(line, stdin, out.extend, err)
        return (-1 if status is None else status), bytes(out), err.end()

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
        return f"cd {where} && echo {PID_MARK}$$ >&2 && exec {prog}"

    def _exec(self, argv: Iterable[str], env: Iterable[tuple[str, str]], input: str | None, cwd: str | None,
              timeout: float | None, out_lines: Lines | None = None,
              err_lines: PidStripper | None = None) -> Ran:
        line = self._line(argv, env, cwd)
        if input is None:
            line += " < /dev/null"
        # else: the input is the channel's stdin (then EOF)
        err_lines = err_lines if err_lines is not None else PidStripper()
        out, err = _Text(out_lines), _Text(err_lines)
        start = time.monotonic()
        try:
            status = self._call(line, input.encode() if input is not None else None, out, err, timeout)
        except KeyboardInterrupt:
            self._kill(err_lines.pid, signal.SIGINT)  # the remote command stops too
            raise
        outtext, errtext = out.end(), without_pid_lines(err.end())
        if status is None:
            self._kill(err_lines.pid, signal.SIGTERM)
            rc, errtext = TIMED_OUT, errtext + f"\ntimed out after {timeout:.0f}s"
        elif status < 0:  # the channel closed without an exit status
            rc, errtext = 255, errtext + "\nthe remote command ended without an exit status"
        else:
            rc = status
        return Ran(rc, outtext, errtext, time.monotonic() - start)

    def _kill(self, pid: int | None, sig: int) -> None:
        if pid:
            with contextlib.suppress(Exception):
                self._shell(f"kill -{int(sig)} {int(pid)}")

    def in_process(self, argv: Iterable[str], env: Iterable[tuple[str, str]] = (),
                   streamed: bool = False) -> str | None:
        """None: on a controller every command runs as its process (no shortcut there)."""
        return None

    def run(self, argv: Iterable[str], env: Iterable[tuple[str, str]] = (), input: str | None = None,
            cwd: str | None = None, timeout: float | None = None) -> Ran:
        return self._exec(argv, env, input, cwd, timeout)

    def stream(self, argv: Iterable[str], on_line: Callable[[str], None], env: Iterable[tuple[str, str]] = (),
               cwd: str | None = None) -> Ran:
        lines = Lines(on_line)
        r = self._exec(argv, env, None, cwd, None, out_lines=lines, err_lines=PidStripper(on_line))
        return Ran(r.rc, "\n".join(lines.lines), "", r.seconds)

    def spawn(self, argv: Iterable[str], env: Iterable[tuple[str, str]] = (), cwd: str | None = None,
              log: str | None = None) -> int:
        argv = list(argv)
        where, prog = self._program(argv, env, cwd)
        out = shlex.quote(log) if log else "/dev/null"
        mk = f"mkdir -p {shlex.quote(str(PurePosixPath(log).parent))} && " if log else ""
        # setsid: its own session, so it outlives this connection and can be
        # found (pid file) and stopped by a later run.
        line = f"cd {where} && {mk}(setsid {prog} > {out} 2>&1 < /dev/null & echo $!)"
        status, raw, err = self._shell(line)
        text = raw.decode("utf-8", "replace")
        if status != 0 or not text.strip().isdigit():
            raise CommandFailed("spawn", shlex.join(argv), status if status > 0 else 1, text, err)
        return int(text.strip())

    # -- files ------------------------------------------------------------------------
    def _sftp(self) -> Any:
        """One SFTP session per connection, used by one thread at a time
        (Paramiko's SFTPClient hangs when threads share it); None when the
        controller refuses the SFTP subsystem (found once per connection)."""
        _, paramiko = _libs()
        conn = self.connection()
        with self._lock:
            if self._sftp_refused:
                return None
            if self._sftp_client is None:
                transport = conn.client.get_transport()
                try:
                    chan = transport.open_session()
                except Exception as e:  # the connection's failure, not SFTP's
                    raise Unreachable(f"controller {self.target} is unreachable: no session for SFTP "
                                      f"({type(e).__name__}: {e})") from None
                try:
                    chan.invoke_subsystem("sftp")
                    self._sftp_client = paramiko.SFTPClient(chan)
                except (paramiko.SSHException, EOFError, OSError) as e:
                    chan.close()
                    if not transport.is_active():
                        raise Unreachable(f"controller {self.target} is unreachable: the connection broke "
                                          f"({type(e).__name__}: {e})") from None
                    # No "Subsystem sftp" in its sshd_config, or a server that
                    # does not run it: files go through cat from now on.
                    self._sftp_refused = True
                    log.info("controller %s refused SFTP (%s: %s): files go through cat over ssh",
                             self.target, type(e).__name__, e)
                    return None
            return self._sftp_client

    def _with_sftp[T](self, sftp: Any, do: Callable[[Any], T]) -> T:
        """``do(sftp)`` by one thread at a time. An SFTP session that
        dropped (its channel closed under it: Paramiko's SSHException,
        EOFError, or "Socket is closed") is opened again once; a second drop, or a connection that
        is gone, is the controller unreachable (never an internal error)."""
        _, paramiko = _libs()
        for attempt in (1, 2):
            try:
                with self._sftp_lock:
                    return do(sftp)
            except (paramiko.SSHException, EOFError, OSError) as e:
                if isinstance(e, OSError) and not getattr(sftp.get_channel(), "closed", False):
                    raise  # the server's answer about the file (a permission, a missing folder)
                with self._lock:
                    if self._sftp_client is sftp:
                        self._sftp_client = None
                transport = self._conn.client.get_transport() if self._conn is not None else None
                if attempt == 2 or transport is None or not transport.is_active():
                    raise Unreachable(f"controller {self.target} is unreachable: its SFTP session dropped "
                                      f"({type(e).__name__}: {e})") from None
                log.info("controller %s: the SFTP session dropped (%s: %s); opening another",
                         self.target, type(e).__name__, e)
                again = self._sftp()
                if again is None:
                    raise Unreachable(f"controller {self.target} is unreachable: its SFTP session dropped and "
                                      f"another was refused ({type(e).__name__}: {e})") from None
                sftp = again
        raise AssertionError("unreachable")  # pragma: no cover

    def _no_cat(self, status: int, err: str) -> Unreachable:
        why = (first_line(err) or f"exit {status}")[:200]
        return Unreachable(
            f"controller {self.target} cannot take files: it offers neither SFTP nor a working `cat` (its sshd "
            f"refused the sftp subsystem; {why}): add `Subsystem sftp internal-sftp` to its sshd_config, or put "
            f"cat and mkdir on its login PATH")

    def _cat_read(self, full: str) -> bytes | None:
        status, data, err = self._shell(f"LC_ALL=C cat -- {shlex.quote(full)} < /dev/null")
        if status == 0:
            return data
        if status in (126, 127):  # the shell's: no cat to run (cat itself exits 1)
            raise self._no_cat(status, err)
        if "No such file or directory" in err or "Not a directory" in err:
            return None
        raise OSError(f"cannot read {full} on {self.target}: {first_line(err) or f'cat exited {status}'}")

    def _cat_write(self, full: str, data: bytes) -> None:
        # Beside the file under a temporary name, then renamed over it: a
        # reader never sees half a file.
        p = PurePosixPath(full)
        q, tmp = shlex.quote(full), shlex.quote(str(p.parent / f".{p.name}.{uuid.uuid4().hex[:12]}.tmp"))
        line = (f"mkdir -p -- {shlex.quote(str(p.parent))} && cat > {tmp} && mv -f -- {tmp} {q}"
                f" || {{ rc=$?; rm -f -- {tmp}; exit $rc; }}")
        status, _, err = self._shell(line, data)
        if status in (126, 127):
            raise self._no_cat(status, err)
        if status != 0:
            raise OSError(f"cannot write {full} on {self.target}: {first_line(err) or f'exit status {status}'}")

    def read(self, path: str) -> bytes | None:
        full = self.path(path)
        sftp = self._sftp()
        if sftp is None:
            return self._cat_read(full)

        def get(sftp: Any) -> bytes | None:
            try:
                with sftp.open(full, "rb") as f:
                    return bytes(f.read())
            except FileNotFoundError:
                return None
            except OSError as e:
                if getattr(e, "errno", None) == 2 or "No such file" in str(e):
                    return None
                raise

        return self._with_sftp(sftp, get)

    def write(self, path: str, data: bytes) -> None:
        full = self.path(path)
        sftp = self._sftp()
        if sftp is None:
            self._cat_write(full, data)
            return
        parent = str(PurePosixPath(full).parent)
        if parent not in self._made:  # once per directory and connection (a sync writes ~90 files)
            r = self.run(["mkdir", "-p", parent], cwd="/")
            if r.rc != 0:
                raise OSError(f"cannot make {parent} on {self.target}: {r.stderr.strip()}")
            self._made.add(parent)

        def put(sftp: Any) -> None:
            with sftp.open(full, "wb") as f:
                f.write(data)

        self._with_sftp(sftp, put)

    def remove(self, path: str) -> None:
        full = self.path(path)
        sftp = self._sftp()
        if sftp is None:
            self._shell(f"rm -f -- {shlex.quote(full)}")
            return

        def rm(sftp: Any) -> None:
            with contextlib.suppress(OSError):
                sftp.remove(full)

        self._with_sftp(sftp, rm)

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

    def list_dir(self, path: str) -> list[tuple[str, bool]] | None:
        # One shell line (POSIX sh, with or without SFTP): each entry as
        # "d/name" or "f/name", NUL-ended; exit 3 when the folder is not there.
        full = shlex.quote(self.path(path))
        line = (f"[ -e {full} ] || exit 3; cd -- {full} || exit 4; "
                f"for f in * .[!.]* ..?*; do [ -e \"$f\" ] || [ -L \"$f\" ] || continue; "
                f"if [ -d \"$f\" ]; then printf 'd/%s\\0' \"$f\"; else printf 'f/%s\\0' \"$f\"; fi; done")
        status, out, err = self._shell(line)
        if status == 3:
            return None
        if status != 0:
            raise OSError(f"cannot list {path} on {self.target}: {first_line(err) or f'exit status {status}'}")
        items = [e.decode("utf-8", "surrogateescape") for e in out.split(b"\0") if e]
        return sorted((e[2:], e[0] == "d") for e in items)

    # -- processes --------------------------------------------------------------------
    def alive(self, pid: int, marker: str = "") -> bool:
        return procs.alive_from(self.read, pid, marker)

    @staticmethod
    def _tree(pid: int) -> str:
        """A shell word list: the pid and its children (listed by ps)."""
        return f"pids=\"{pid} $(ps -o pid= --ppid {pid} 2>/dev/null | tr '\\n' ' ')\"; "

    def kill(self, pid: int) -> None:
        pid = int(pid)
        if pid <= 0:
            return
        _, out, _ = self._shell(self._tree(pid) + "kill -KILL $pids 2>/dev/null; echo $pids")
        # Then, as locally, until none runs (looked at as alive() looks).
        procs.wait_gone([int(p) for p in out.split() if p.isdigit()], self.alive, poll=0.2)

    def terminate(self, pid: int, grace: float = 10.0) -> None:
        pid = int(pid)
        if pid <= 0:
            return
        # The tree (children listed by ps), as procs.terminate does here: TERM
        # to the root, the rest once it has gone (or after half the grace),
        # KILL to what is left after the grace.
        script = (self._tree(pid) +
                  "live() { for p in \"$@\"; do kill -0 $p 2>/dev/null && return 0; done; return 1; }; "
                  f"kill -TERM {pid} 2>/dev/null; i=0; "
                  f"while [ $i -lt {int(grace * 5 / 2)} ] && live {pid}; do sleep 0.2; i=$((i+1)); done; "
                  "kill -TERM $pids 2>/dev/null; "
                  f"while [ $i -lt {int(grace * 5)} ] && live $pids; do sleep 0.2; i=$((i+1)); done; "
                  "kill -KILL $pids 2>/dev/null; true")
        self._shell(script)

    def get_json(self, url: str, timeout: float = 10.0, headers: Mapping[str, str] | None = None,
                 ca_file: str | None = None) -> Any:
        """curl on the controller (where the port-forward listens): the HTTP
        status on the last line; 000 with curl's exit 7 is a refused port.
        Headers go on curl's stdin (``-H @-``), never on its command line;
        with headers, only over https:// and no redirect followed (curl
        without -L; ``http.plain_http_refused``, ``http.redirect_refused``)."""
        if headers and (refused := plain_http_refused(url)):
            return _http_absent_or_fail(url, None, refused)
        argv = ["curl", "-sS", "--max-time", str(int(max(1, timeout))), "-w", "\n%{http_code}\n%{redirect_url}"]
        argv += ["--cacert", ca_file] if ca_file else []
        argv += ["-H", "@-"] if headers else []
        stdin = "".join(f"{k}: {v}\n" for k, v in (headers or {}).items()) or None
        r = self.run([*argv, url], input=stdin, timeout=timeout + 5)
        rest, _, location = r.stdout.rpartition("\n")
        body, _, code = rest.rpartition("\n")
        if r.rc == 7:
            return _http_absent_or_fail(url, 0, "connection refused")
        if r.rc != 0:
            return _http_absent_or_fail(url, None, (r.stderr.strip() or f"curl exited {r.rc}")[:300])
        status = int(code) if code.isdigit() else None
        if headers and status is not None and 300 <= status < 400:
            return _http_absent_or_fail(url, status, redirect_refused(status, location or None))
        if status != 200:
            said = server_message(body)
            return _http_absent_or_fail(url, status, f"HTTP {code}" + (f": {said}" if said else ""))
        try:
            return json.loads(body or "null")
        except json.JSONDecodeError:
            return _http_absent_or_fail(url, None, "the answer is not JSON")

    def get_text(self, url: str, timeout: float = 10.0) -> tuple[int, str]:
        """curl on the controller: the HTTP status on the last line; curl's
        exit 28 is a timeout, any other failure no answer."""
        argv = ["curl", "-sS", "--max-time", str(int(max(1, timeout))), "-w", "\n%{http_code}", url]
        r = self.run(argv, timeout=timeout + 5)
        body, _, code = r.stdout.rpartition("\n")
        if r.rc != 0 or not code.isdigit():
            why = "timed out" if r.rc == 28 else (r.stderr.strip() or f"curl exited {r.rc}")[:300]
            raise ProbeFailed("http", f"curl -sS {url}", r.rc, "", why, why=f"could not look: {why}")
        return int(code), body

    def getenv(self, name: str) -> str | None:
        if self._env_cache is None:
            r = self.run(["env", "-0"], cwd="/")  # before remote_dir exists, too
            if r.rc != 0:
                raise ProbeFailed("env", "env -0", r.rc, r.stdout, r.stderr,
                                  why=f"could not read the controller's environment: {r.stderr.strip()[:200]}")
            self._env_cache = dict(item.split("=", 1) for item in r.stdout.split("\0") if "=" in item)
        return self._env_cache.get(name)
