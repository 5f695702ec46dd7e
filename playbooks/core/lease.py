"""A lease across machines: one holder at a time of a record that every
machine can reach, written only with a precondition on its version.

The record (``Record``) says who holds it, since when, when it was last
renewed and for how long a renewal keeps it. Taking it is a create that
fails when it exists; then it is read, and when it is free (released: no
holder) or expired (not renewed within its duration), taken over by a
write that names the version read: if another machine wrote first, the
write is refused (a conflict) and the record is read again. While it is
held, a waiter says who holds it and since when, every ``every`` seconds,
and past ``wait`` seconds is refused (``Busy``, as the machine's lock).
The holder renews it (a write that names its own last version) every
``every`` seconds; a conflict there means another took it: ``on_lost``.

Where the record lives and how it is read and written is the ``Store``'s
(a Kubernetes Lease, for the project); its times are seconds since the
epoch. Expiry is judged on the record's renew time and, whatever the
clocks of two machines say, on the waiter's own: a record whose version
has not changed for its duration, as the waiter watched, has expired.
"""
from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from .errors import PlaybookError
from .lock import Busy, Holder, _ago, me


@dataclass(frozen=True)
class Record:
    """The lease as read: its holder ("" once released), since when it is
    held, when it was last renewed, for how long a renewal keeps it, and
    its version (the precondition of every write)."""

    holder: str
    acquired: float | None
    renewed: float | None
    duration: float
    version: str


# Store answers: the write was made (with the record as it now is), or not.
OK, EXISTS, CONFLICT, GONE = "ok", "exists", "conflict", "gone"


class Store(Protocol):
    """Where the lease lives: ``where`` names it in what is said."""

    @property
    def where(self) -> str: ...

    def read(self) -> Record | None:
        """The record, None when there is none; PlaybookError: could not look."""

    def create(self, holder: str, now: float) -> tuple[str, Record | None]:
        """Create it held by ``holder``: (OK, record) or (EXISTS, None)."""

    def replace(self, holder: str, acquired: float | None, now: float, version: str) -> tuple[str, Record | None]:
        """Write it, if its version is still ``version``: (OK, record),
        (CONFLICT, None) when another wrote it since, (GONE, None) when it
        was deleted."""


def identity(doing: str) -> str:
    """This process as a lease's holder: `user@host pid N: `invoke ...``."""
    rec = me(doing)
    return f"{rec['who']} pid {rec['pid']}" + (f": `{doing}`" if doing else "")


_IDENTITY = re.compile(r"^(?P<who>\S+) pid (?P<pid>\d+)(?:: `(?P<doing>.*)`)?$")


def holder_of(rec: Record) -> Holder:
    """Who a record says holds it, as the machine's lock says it (a holder
    written otherwise: its words as they are)."""
    m = _IDENTITY.match(rec.holder)
    if m is None:
        return Holder("?", rec.holder, "", rec.acquired)
    return Holder(m["pid"], m["who"], m["doing"] or "", rec.acquired)


def free(rec: Record, now: float, unchanged_for: float = 0.0) -> str | None:
    """Why the lease may be taken (released, or expired), None while held.
    ``unchanged_for``: how long the waiter has seen this very version."""
    if not rec.holder:
        return "released"
    if rec.renewed is not None and now > rec.renewed + rec.duration:
        return f"expired: not renewed for {_ago(now - rec.renewed)} (it lapses after {rec.duration:.0f}s)"
    if unchanged_for > rec.duration:
        return f"expired: unchanged for {_ago(unchanged_for)} (it lapses after {rec.duration:.0f}s)"
    return None


def state_of(rec: Record, now: float) -> str:
    """What a waiter is told of a held record besides its holder."""
    if rec.renewed is None:
        return f"lapses after {rec.duration:.0f}s without renewal"
    left = rec.renewed + rec.duration - now
    return f"renewed {_ago(now - rec.renewed)} ago, lapses in {_ago(left)} unless renewed"


@dataclass
class Wait:
    """How a taker waits: ``on_wait`` told every ``every`` seconds, a look
    every ``poll`` seconds, refused past ``limit`` (None: no limit)."""

    what: str
    on_wait: Callable[[str], None]
    every: float = 30.0
    poll: float = 5.0
    limit: float | None = None
    clock: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


def take(store: Store, holder: str, w: Wait) -> tuple[Record, str]:
    """Take the lease: (the record as written, how: "created" or why it
    was free). Raises Busy past the wait's limit."""
    start: float | None = None  # when it was first found held (monotonic)
    told: float | None = None
    seen: tuple[str, float] | None = None  # a version, and since when (monotonic) it is the one seen
    while True:
        status, got = store.create(holder, w.clock())
        if status == OK and got is not None:
            return got, "created"
        rec = store.read()
        if rec is None:
            continue  # deleted since: create it again
        if seen is None or seen[0] != rec.version:
            seen = (rec.version, w.monotonic())
        why = free(rec, w.clock(), w.monotonic() - seen[1])
        if why is not None:
            status, got = store.replace(holder, w.clock(), w.clock(), rec.version)
            if status == OK and got is not None:
                return got, why
            continue  # another took it first (or deleted it): look again
        start = w.monotonic() if start is None else start
        waited = w.monotonic() - start
        if w.limit is not None and waited >= w.limit:
            raise Busy(w.what, holder_of(rec), store.where, waited)
        if told is None or waited - told >= w.every:
            limit = f" of at most {w.limit:.0f}s" if w.limit is not None else ""
            w.on_wait(f"waiting for {holder_of(rec)}, which holds {store.where} ({w.what}; "
                      f"{state_of(rec, w.clock())}): {waited:.0f}s{limit}")
            told = waited
        w.sleep(w.poll)


class Keeper:
    """Renews a taken lease every ``every`` seconds, in a thread of its own,
    until ``release``. A renewal refused for a conflict (another wrote it)
    calls ``on_lost`` with one line and stops; one that could not reach
    the store is tried again at the next beat (the lease lapses only after
    its duration); one that finds it deleted stops quietly."""

    def __init__(self, store: Store, holder: str, rec: Record, every: float, on_lost: Callable[[str], None],
                 clock: Callable[[], float] = time.time):
        self.store, self.holder, self.rec, self.every = store, holder, rec, every
        self.on_lost, self.clock = on_lost, clock
        self.lost: str | None = None
        self.gone = False
        self._stop = threading.Event()
        self._mutex = threading.Lock()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="lease-renewal")

    def start(self) -> Keeper:
        self._thread.start()
        return self

    def renew(self) -> None:
        """One renewal (the thread's beat)."""
        with self._mutex:
            if self.lost or self.gone or self._stop.is_set():
                return
            try:
                status, got = self.store.replace(self.holder, self.rec.acquired, self.clock(), self.rec.version)
            except PlaybookError:
                return
            if status == OK and got is not None:
                self.rec = got
            elif status == GONE:
                self.gone = True
            else:
                self.lost = self._lost_line()
        if self.lost:
            self.on_lost(self.lost)

    def _lost_line(self) -> str:
        try:
            rec = self.store.read()
        except PlaybookError:
            rec = None
        who = f"{holder_of(rec)} holds it now" if rec is not None and rec.holder else "another run wrote it"
        return f"{self.store.where} was taken from this run while it ran ({who}): this run stopped"

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            self.renew()

    def release(self, let_go: Callable[[Record], None]) -> None:
        """Stop renewing; unless lost or gone, ``let_go`` the record as last written."""
        self._stop.set()
        with self._mutex:
            if not (self.lost or self.gone):
                let_go(self.rec)
