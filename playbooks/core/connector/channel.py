"""One shell line over one SSH channel (Paramiko), with nothing of Invoke in
between: its stdin fed from bytes (``sendall``, then EOF with
``shutdown_write``; none for a line that reads no stdin), its stdout and stderr handed over as bytes as they
come, its exit status. No pty and no decoding, so it is binary safe (a file
read with ``cat``, a file written through ``cat >``), and fast (Invoke
copies an ``in_stream`` one byte per 10 ms).

The waiting is done in the calling thread, in short slices, so a deadline
and Ctrl-C (KeyboardInterrupt, which only the main thread gets) end it; the
channel is closed whatever ends it."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

CHUNK = 65536
SLICE = 0.1  # seconds between looks at the deadline


class ChannelFailed(Exception):
    """The channel could not be opened or the command not started (the
    connection broke, or the server refused a session)."""


def call(transport: Any, line: str, stdin: bytes | None, on_out: Callable[[bytes], None],
         on_err: Callable[[bytes], None], timeout: float | None = None) -> int | None:
    """Run ``line`` through the remote user's shell on ``transport`` (a
    Paramiko ``Transport``). Returns its exit status, -1 when the channel
    closed without one (killed by a signal, the connection lost), or None
    when ``timeout`` seconds passed first (stopping the remote process is
    the caller's part: the channel's end does not). ``on_out`` and
    ``on_err`` are called from reader threads, each from its own; an
    exception of theirs ends the call and is raised here."""
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        chan = transport.open_session()
    except Exception as e:  # SSHException, ChannelException, EOFError, OSError
        raise ChannelFailed(f"{type(e).__name__}: {e}") from None
    try:
        try:
            chan.exec_command(line)
        except Exception as e:
            raise ChannelFailed(f"{type(e).__name__}: {e}") from None
        failed: list[BaseException] = []
        readers = [_thread(_pump, chan.recv, on_out, failed), _thread(_pump, chan.recv_stderr, on_err, failed)]
        if stdin is not None:
            _thread(_feed, chan, stdin)   # beside the readers: a full window must not stop them
        # No stdin: no EOF either. The line reads none (the connector gives
        # it /dev/null), and an EOF can cross the server's CLOSE of a command
        # that already ended: Paramiko makes it under the channel's lock but
        # sends it after, so the transport thread's reply to that CLOSE may
        # go first, and OpenSSH then drops the whole connection ("ieof packet
        # referred to nonexistent channel"), every other channel with it.

        def waited() -> bool:
            if failed:
                raise failed[0]
            return deadline is not None and time.monotonic() >= deadline

        for t in readers:
            while t.is_alive():
                if waited():
                    return None
                t.join(SLICE)
        # Both streams at EOF: the exit status follows (or the channel closes).
        while not chan.status_event.wait(SLICE):
            if waited():
                return None
        if failed:
            raise failed[0]
        return int(chan.recv_exit_status())
    finally:
        chan.close()


def _thread(target: Callable[..., None], *args: Any) -> threading.Thread:
    t = threading.Thread(target=target, args=args, daemon=True)
    t.start()
    return t


def _pump(recv: Callable[[int], bytes], on: Callable[[bytes], None], failed: list[BaseException]) -> None:
    """Hand over what arrives until EOF (a closed channel reads as EOF)."""
    try:
        while data := recv(CHUNK):
            on(data)
    except BaseException as e:  # handed to the calling thread
        failed.append(e)


def _feed(chan: Any, data: bytes) -> None:
    """All of stdin, then EOF. A command that ends without reading it all
    closes the channel, which ends this too."""
    try:
        chan.sendall(data)
        chan.shutdown_write()
    except Exception:  # the channel closed (the command ended, or the connection)
        pass
