"""The lease across machines (playbooks/core/lease.py): its decisions,
against an in-memory store that keeps a version and refuses a write that
names another (as the API server's resourceVersion precondition does)."""
from __future__ import annotations

import re
import time

import pytest

from playbooks.core.lease import CONFLICT, EXISTS, GONE, OK, Keeper, Record, Wait, free, holder_of, identity, take
from playbooks.core.lock import Busy


class Mem:
    where = "Lease default/x in cluster c"

    def __init__(self, rec: Record | None = None):
        self.rec, self.n, self.writes = rec, 1, []

    def _put(self, holder, acquired, now) -> Record:
        self.n += 1
        self.rec = Record(holder, acquired, now, 600.0, str(self.n))
        return self.rec

    def read(self):
        return self.rec

    def create(self, holder, now):
        self.writes.append(("create", holder))
        return (EXISTS, None) if self.rec is not None else (OK, self._put(holder, now, now))

    def replace(self, holder, acquired, now, version):
        self.writes.append(("replace", holder))
        if self.rec is None:
            return GONE, None
        if version != self.rec.version:
            return CONFLICT, None
        return OK, self._put(holder, acquired, now)


class Clock:
    def __init__(self):
        self.t = self.start = time.time()   # a holder's "ago" is said from the real clock

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


def wait(clock, told, limit=None):
    return Wait("one changing run at a time on environment e, across machines", told.append, every=10, poll=1,
                limit=limit, clock=clock, monotonic=clock, sleep=clock.sleep)


OTHER = "alice@ws1 pid 4242: `invoke up`"


def test_free_says_why_a_lease_may_be_taken():
    now = 1_000_000.0
    assert free(Record("", None, now, 600, "1"), now) == "released"
    assert free(Record(OTHER, now - 60, now - 30, 600, "1"), now) is None
    assert free(Record(OTHER, now - 900, now - 700, 600, "1"), now) == \
        "expired: not renewed for 11m40s (it lapses after 600s)"
    # The holder's clock may be ahead: what the waiter saw unchanged for the duration has lapsed too.
    assert free(Record(OTHER, now, now + 3600, 600, "1"), now, unchanged_for=601) == \
        "expired: unchanged for 10m01s (it lapses after 600s)"


def test_an_absent_lease_is_created():
    store, clock, told = Mem(), Clock(), []
    rec, how = take(store, "me@here pid 1: `invoke up`", wait(clock, told))
    assert how == "created" and rec.holder == "me@here pid 1: `invoke up`" and told == []


def test_a_released_lease_is_taken_at_once_with_its_version():
    store, clock, told = Mem(Record("", None, 999_000.0, 600, "7")), Clock(), []
    store.n = 7
    rec, how = take(store, "me", wait(clock, told))
    assert how == "released" and rec.holder == "me" and store.writes == [("create", "me"), ("replace", "me")]


def test_an_expired_lease_is_taken_over():
    clock = Clock()
    store, told = Mem(Record(OTHER, clock.t - 2000, clock.t - 900, 600, "7")), []
    store.n = 7
    rec, how = take(store, "me", wait(clock, told))
    assert how.startswith("expired") and rec.holder == "me" and rec.acquired == clock.t


def test_a_held_lease_is_waited_for_then_refused_naming_its_holder_and_since_when():
    clock = Clock()
    store, told = Mem(Record(OTHER, clock.t - 35, clock.t - 5, 600, "7")), []
    store.n = 7
    with pytest.raises(Busy) as e:
        take(store, "me", wait(clock, told, limit=25))
    assert re.fullmatch(r"one changing run at a time on environment e, across machines: pid 4242 \(alice@ws1, "
                        r"`invoke up`, since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \w+, \d+s ago\) holds Lease default/x "
                        r"in cluster c; waited 25s", str(e.value)), str(e.value)
    assert len(told) == 3, told   # at once, then every 10 s
    assert told[0].startswith("waiting for pid 4242 (alice@ws1, `invoke up`, since ") and told[0].endswith(
        "which holds Lease default/x in cluster c (one changing run at a time on environment e, across machines; "
        "renewed 5s ago, lapses in 9m55s unless renewed): 0s of at most 25s"), told[0]
    assert store.rec.holder == OTHER


def test_a_lease_freed_while_waiting_is_taken():
    clock = Clock()
    store, told = Mem(Record(OTHER, clock.t - 35, clock.t - 5, 600, "7")), []
    store.n = 7
    real = clock.sleep

    def sleep(s):
        real(s)
        if clock.t - clock.start >= 3:
            store.rec = Record("", None, clock.t, 600, "8")
    w = wait(clock, told)
    w.sleep = sleep
    rec, how = take(store, "me", w)
    assert how == "released" and rec.holder == "me" and len(told) == 1


def test_another_taking_it_first_is_a_conflict_then_it_looks_again():
    clock = Clock()
    store, told = Mem(Record("", None, clock.t, 600, "7")), []
    store.n = 7
    replace = store.replace

    def first_another(holder, acquired, now, version):
        if holder == "me" and store.rec.holder == "":
            replace(OTHER, now, now, version)   # the other machine's write comes first
        return replace(holder, acquired, now, version)
    store.replace = first_another
    with pytest.raises(Busy):
        take(store, "me", wait(clock, told, limit=5))
    assert store.rec.holder == OTHER


def test_renewal_keeps_the_version_and_a_conflict_stops_with_one_line():
    clock = Clock()
    store = Mem()
    rec, _ = take(store, "me", wait(clock, []))
    lost: list[str] = []
    keeper = Keeper(store, "me", rec, every=3600, on_lost=lost.append, clock=clock)
    clock.t += 30
    keeper.renew()
    assert store.rec.renewed == clock.t and store.rec.acquired == rec.acquired and lost == []
    store._put(OTHER, clock.t, clock.t)        # it lapsed; another machine took it over
    keeper.renew()
    assert lost == [f"{store.where} was taken from this run while it ran (pid 4242 (alice@ws1, `invoke up`, since "
                    + lost[0].split("since ", 1)[1]]
    assert lost[0].endswith("ago) holds it now): this run stopped")
    keeper.renew()
    assert len(lost) == 1
    let_go = []
    keeper.release(let_go.append)
    assert let_go == []                        # not ours any more: left as it is


def test_release_writes_the_last_version():
    store, clock = Mem(), Clock()
    rec, _ = take(store, "me", wait(clock, []))
    keeper = Keeper(store, "me", rec, every=3600, on_lost=lambda line: None, clock=clock)
    keeper.renew()
    keeper.release(lambda r: store.replace("", None, clock.t, r.version))
    assert store.rec.holder == "" and store.writes[-1] == ("replace", "")


def test_identity_reads_back_as_the_machine_locks_holder():
    me = identity("invoke network cluster")
    h = holder_of(Record(me, 1.0, 1.0, 600, "1"))
    assert h.doing == "invoke network cluster" and h.pid.isdigit() and "@" in h.who
    assert str(holder_of(Record("kube-controller", None, None, 600, "1"))) == "pid ? (kube-controller)"
