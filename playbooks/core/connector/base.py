"""The connector interface: where effects happen. Every process, file, HTTP
read and kill of a run goes through a ``Connector``, so the same plays run on
this machine or on a controller host over SSH, unchanged (pyinfra's
connectors, Ansible's connection plugins).

Commands are argv lists, never shell strings: a connector that needs one (SSH
runs every command through the remote user's shell) quotes each argument
itself, and every byte arrives. Relative paths (of files, ``cwd``, ``log``)
are relative to the connector's ``root``; absolute ones are taken as they are.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import PurePosixPath
from typing import Any, Protocol

NOT_FOUND = 127   # the program does not exist (a shell's exit code for it)
TIMED_OUT = 124   # the command ran past its timeout (coreutils ``timeout``'s code)


class Ran:
    """What a process did: exit code, output, time taken. ``by``: what
    answered the command in-process instead of its process (a shortcut's
    ``name``: "kubernetes client"), set by the connector; empty when the
    process ran."""

    __slots__ = ("by", "rc", "seconds", "stderr", "stdout")

    def __init__(self, rc: int, stdout: str, stderr: str, seconds: float, by: str = ""):
        self.rc, self.stdout, self.stderr, self.seconds, self.by = rc, stdout, stderr, seconds, by


class Shortcut(Protocol):
    """An in-process answer to a command a local connector would otherwise
    start: a client library instead of its CLI (the ``kubernetes`` client
    for ``kubectl get -o json``, the Ray Jobs SDK for ``ray job logs``),
    giving what the command would print, with no process. ``None``: not a
    command it answers; the command runs. A shortcut is a speed-up only: the
    fact, its command line and its parse are the same either way, and the
    project's tests compare both answers.

    ``name`` says what answers (the run's log: "answered in-process by the
    kubernetes client"); ``answers`` says, from the command line's form
    alone (nothing asked, nothing started: a dry run asks it), whether
    ``run`` (``streamed``: ``stream``) would take it, and in what words a
    dry run says so ("kubernetes client, no kubectl process"); None: its
    process runs."""

    name: str

    def answers(self, argv: list[str], env: dict[str, str], streamed: bool) -> str | None:
        ...

    def run(self, argv: list[str], env: dict[str, str], timeout: float | None) -> Ran | None:
        ...

    def stream(self, argv: list[str], env: dict[str, str], on_line: Callable[[str], None]) -> Ran | None:
        ...


def under(root: str, rel: str) -> str:
    """``rel`` where a connector rooted at ``root`` finds it: an absolute
    path as it is, a relative one joined to ``root``."""
    return rel if rel.startswith("/") else str(PurePosixPath(root) / rel)


class Connector(Protocol):
    """Where effects happen: this machine, or a controller host.

    ``name`` says where, in logs and messages ("this machine", "controller
    user@host"); ``remote`` is true when that is not this machine; ``root``
    is the folder relative paths are relative to (this project here,
    ``remote_dir`` on a controller). ``env`` is a sequence of (name, value)
    added to the environment the connector states for its children (never a
    copy of this process's); ``cwd`` is a folder relative to ``root``
    (``root`` itself when None).

    Failures of the connection itself (the host cannot be reached, its key
    is wrong, it cannot take files) raise ``errors.Unreachable``; a command
    that fails is a ``Ran`` with its exit code, never an exception.
    """

    name: str
    remote: bool
    root: str

    def run(self, argv: Iterable[str], env: Iterable[tuple[str, str]] = (), input: str | None = None,
            cwd: str | None = None, timeout: float | None = None) -> Ran:
        """Run a program to its end and return what it did. Its stdin is
        ``input`` (then EOF), or empty. A program that does not exist is exit
        127 (``NOT_FOUND``); one still running after ``timeout`` seconds is
        stopped and is exit 124 (``TIMED_OUT``), with what it wrote so far.
        Ctrl-C (KeyboardInterrupt) here stops the program there too."""
        ...

    def stream(self, argv: Iterable[str], on_line: Callable[[str], None], env: Iterable[tuple[str, str]] = (),
               cwd: str | None = None) -> Ran:
        """Run a program, handing each line of its output (stdout and stderr
        merged, without the newline) to ``on_line`` as it comes; the result's
        stdout is all those lines. Ctrl-C stops the program."""
        ...

    def in_process(self, argv: Iterable[str], env: Iterable[tuple[str, str]] = (),
                   streamed: bool = False) -> str | None:
        """What would answer ``argv`` in-process here instead of its process,
        as ``run`` (``streamed``: ``stream``) offers it given no stdin and no
        working folder: a shortcut's words for it (``Shortcut.answers``), by
        the command line's form alone (nothing starts, nothing is asked: a
        dry run marks its lines with it); None: its process would run."""
        ...

    def spawn(self, argv: Iterable[str], env: Iterable[tuple[str, str]] = (), cwd: str | None = None,
              log: str | None = None) -> int:
        """Start a program in the background, in its own session (it outlives
        this run and this connection), stdin empty, stdout and stderr
        appended to ``log`` (its folder made) or discarded. Returns its pid;
        raises ``CommandFailed`` when it could not start."""
        ...

    def read(self, path: str) -> bytes | None:
        """A file's bytes, exactly; None when it does not exist (nor its
        folder). Any other failure raises ``OSError``."""
        ...

    def write(self, path: str, data: bytes) -> None:
        """Make a file hold exactly ``data`` (its folders made as needed)."""
        ...

    def remove(self, path: str) -> None:
        """Remove a file (nothing when it does not exist)."""
        ...

    def make_dirs(self, path: str) -> None:
        """A folder and its parents (nothing when it exists)."""
        ...

    def remove_tree(self, path: str) -> None:
        """A folder and everything in it (nothing when it does not exist)."""
        ...

    def list_dir(self, path: str) -> list[tuple[str, bool]] | None:
        """A folder's entries as (name, is a folder), sorted by name (a
        symbolic link counts as what it points to); None when the folder does
        not exist. Any other failure (not a folder, no permission) raises
        ``OSError``."""
        ...

    def alive(self, pid: int, marker: str = "") -> bool:
        """The process exists, is not a zombie, and its command line holds
        ``marker`` (a recycled pid is not ours): /proc read where this
        connector runs (``procs.alive_from`` over ``read``)."""
        ...

    def terminate(self, pid: int, grace: float = 10.0) -> None:
        """SIGTERM a process and its descendants; SIGKILL what is left after
        ``grace`` seconds."""
        ...

    def kill(self, pid: int) -> None:
        """SIGKILL a process and its descendants at once: a host lost
        without warning. Returns once they are gone (procs.KILL_WAIT at
        most: then OSError), so that what looks next sees them gone."""
        ...

    def get_json(self, url: str, timeout: float = 10.0, headers: Mapping[str, str] | None = None,
                 ca_file: str | None = None) -> Any:
        """GET a JSON document where this connector runs. ``ABSENT`` when a
        loopback port refuses (nothing listens) or the answer is 404; any
        other failure raises ``ProbeFailed``. ``headers`` (a bearer token)
        never appear in a command line or a message; ``ca_file``, a path
        where the connector runs, is the CA bundle to trust."""
        ...

    def get_text(self, url: str, timeout: float = 10.0) -> tuple[int, str]:
        """GET a text answer where this connector runs: its HTTP status and
        body, whatever the status; no answer within ``timeout`` (or none at
        all) raises ``ProbeFailed`` ("timed out" when it timed out)."""
        ...

    def getenv(self, name: str) -> str | None:
        """A variable of the environment the connector's children start
        from (None when it is not set)."""
        ...

    def path(self, rel: str) -> str:
        """A path relative to ``root`` as a path where this connector runs
        (``under(root, rel)``)."""
        ...

    def close(self) -> None:
        """Let go of what the connector holds open (a connection); it opens
        again on the next use."""
        ...
