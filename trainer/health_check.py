"""A host's health gate: before MaxText starts, every training worker checks
its own TPU host, each check with its own time limit, then all of them
gather every host's verdict in one collective. Every worker then knows which
hosts are sick and the whole worker group fails at once, naming them
(``HostUnhealthy``), instead of rank 0 hanging in MaxText's first collective.

The checks, each run in a daemon thread and waited for with a deadline (a
check that does not return in time is a failure, "did not answer in N s";
the worker never hangs on it):

1. ``devices``: ``jax.local_devices()`` is as many as the host has
   (``TRAINER_DEVICES_PER_HOST``: its chips x JAX devices per chip on GKE,
   the twin's CPU devices per simulated host);
2. ``matmul``: on every local device a float32 matmul at "highest"
   precision agrees with numpy's (relative error bound ``MATMUL_RTOL``;
   4.6e-7 was measured on a TPU v5e);
3. ``memory``: a fraction of each device's ``bytes_limit`` written, in
   chunks far under 2**31 elements (one larger array halted a v5e chip),
   and read back; where the device gives no ``bytes_limit`` (CPU) a small
   fixed size, and the result says so;
4. ``collective``: after jax.distributed is up (Ray Train's JAX backend
   starts it before the training function), an all-gather over every
   process's devices, within and across slices, of each host's verdict.

Shipped with the trainer (the job's working directory); imports JAX only
inside functions. ``python health_check.py`` runs checks 1-3 on this
machine alone (no Ray, no jax.distributed), prints the result as JSON and
exits 1 when the host is unhealthy.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

# Set by the playbook in the job's runtime environment (playbooks/job/spec.py
# writes these names; tests/test_health_check.py holds the two to one list).
ENV_ENABLED = "TRAINER_HEALTH_CHECK"                 # "on" or "off"
ENV_TIMEOUT = "TRAINER_HEALTH_CHECK_TIMEOUT_S"       # seconds, each check
ENV_HBM_FRACTION = "TRAINER_HEALTH_CHECK_HBM_FRACTION"
ENV_DEVICES = "TRAINER_DEVICES_PER_HOST"             # JAX devices a host must show
ENV_NAMES = (ENV_ENABLED, ENV_TIMEOUT, ENV_HBM_FRACTION, ENV_DEVICES)

TIMEOUT_S = 120.0
HBM_FRACTION = 0.85
HBM_FRACTION_MAX = 0.95
MATMUL_SIZE = 512
MATMUL_RTOL = 1e-5
# uint32 elements of one buffer of the memory check: 1 GiB, far under the
# 2**31 elements of the one array that halted a v5e chip
# (shared/reference/tpu_health_measured.md).
CHUNK_ELEMENTS = 2**28
# Where a device gives no bytes_limit (CPU): this much per device.
NO_LIMIT_BYTES = 64 * 2**20
# One host's verdict in the all-gather: a JSON text of at most this many bytes.
VERDICT_BYTES = 1024
DETAIL_MAX = 160
# A collective that JAX itself timed out (its distributed runtime's words).
DEADLINE = re.compile(r"DEADLINE_EXCEEDED|timed out with key")


class HostUnhealthy(RuntimeError):
    """A host of the worker group failed its health check (or the hosts
    could not gather their verdicts): the group stops before MaxText."""


@dataclass(frozen=True)
class Settings:
    enabled: bool = True
    timeout_s: float = TIMEOUT_S
    hbm_fraction: float = HBM_FRACTION
    devices: int | None = None  # None: not given (only "at least one" is checked)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Settings:
        """The job's settings; a malformed value is a one-line ValueError
        naming the variable (the playbook checks the inventory's first)."""
        enabled = environ.get(ENV_ENABLED, "on")
        if enabled not in ("on", "off"):
            raise ValueError(f"{ENV_ENABLED}={enabled!r} must be on or off")
        return cls(enabled=enabled == "on",
                   timeout_s=_number(environ, ENV_TIMEOUT, TIMEOUT_S, 1, 24 * 3600),
                   hbm_fraction=_number(environ, ENV_HBM_FRACTION, HBM_FRACTION, 0, HBM_FRACTION_MAX, open_low=True),
                   devices=int(_number(environ, ENV_DEVICES, 0, 1, 4096, whole=True)) or None)


def _number(environ: Mapping[str, str], name: str, default: float, lo: float, hi: float,
            open_low: bool = False, whole: bool = False) -> float:
    raw = environ.get(name, "")
    if raw == "":
        return default
    try:
        v = int(raw) if whole else float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a {'whole ' if whole else ''}number") from None
    if not ((lo < v if open_low else lo <= v) and v <= hi):
        raise ValueError(f"{name}={raw!r} must be {'above' if open_low else 'at least'} {lo:g} and at most {hi:g}")
    return v


@dataclass
class Check:
    name: str
    ok: bool
    seconds: float
    detail: str


def bounded(name: str, fn: Callable[[], tuple[bool, str]], timeout_s: float) -> Check:
    """``fn`` in a daemon thread, waited for ``timeout_s``: its (ok, detail);
    an exception, or no answer in time, is a failure."""
    out: dict[str, tuple[bool, str]] = {}
    start = time.monotonic()

    def run() -> None:
        try:
            out["r"] = fn()
        except BaseException as e:  # any failure of a check is the host's verdict
            out["r"] = (False, f"{type(e).__name__}: {one_line(str(e))}")

    t = threading.Thread(target=run, name=f"health-{name}", daemon=True)
    t.start()
    t.join(timeout_s)
    seconds = round(time.monotonic() - start, 3)
    if "r" not in out:
        return Check(name, False, seconds, f"did not answer in {timeout_s:g} s")
    ok, detail = out["r"]
    return Check(name, bool(ok), seconds, one_line(detail))


def one_line(text: str, limit: int = 300) -> str:
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[:limit - 3] + "..."


# -- the local checks ---------------------------------------------------------
def devices_check(expected: int | None) -> tuple[bool, str]:
    import jax

    devs = jax.local_devices()
    kinds = ", ".join(sorted({d.device_kind for d in devs})) or "none"
    if expected is None:
        return bool(devs), f"{len(devs)} device(s) ({kinds}); no expected count given ({ENV_DEVICES})"
    return len(devs) == expected, f"devices {len(devs)} of {expected} ({kinds})"


def reference_matmul(a: Any, b: Any) -> Any:
    """numpy's product, in float64."""
    import numpy as np

    return np.asarray(a, np.float64) @ np.asarray(b, np.float64)


def device_matmul(device: Any, a: Any, b: Any) -> Any:
    """The same product on ``device``, float32 at "highest" precision."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    x, y = jax.device_put(a, device), jax.device_put(b, device)
    with jax.default_matmul_precision("highest"):
        return np.asarray(jax.jit(jnp.matmul)(x, y))


def matmul_check() -> tuple[bool, str]:
    import jax
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.standard_normal((MATMUL_SIZE, MATMUL_SIZE), dtype=np.float32)
    b = rng.standard_normal((MATMUL_SIZE, MATMUL_SIZE), dtype=np.float32)
    ref = reference_matmul(a, b)
    scale = float(np.max(np.abs(ref)))
    worst, bad = 0.0, []
    for d in jax.local_devices():
        got = np.asarray(device_matmul(d, a, b), np.float64)
        err = float(np.max(np.abs(got - ref))) / scale if got.shape == ref.shape else float("inf")
        if not err <= MATMUL_RTOL:  # NaN too
            bad.append(f"device {d.id}: relative error {err:.1e}")
        worst = max(worst, err)
    if bad:
        return False, f"{'; '.join(bad)} (bound {MATMUL_RTOL:g}, {MATMUL_SIZE}x{MATMUL_SIZE} float32)"
    n = len(jax.local_devices())
    return True, f"{n} device(s) agree with numpy: max relative error {worst:.1e} (bound {MATMUL_RTOL:g})"


def memory_plan(device: Any, fraction: float) -> tuple[int, str]:
    """The bytes to write on ``device`` and how they were chosen."""
    stats = device.memory_stats() or {}
    limit = stats.get("bytes_limit")
    if not limit:
        return NO_LIMIT_BYTES, f"{device.platform} gives no bytes_limit: a fixed size, not the device's memory"
    want = int(limit * fraction) - int(stats.get("bytes_in_use", 0))
    return max(want, 0), f"{fraction:g} of bytes_limit {limit / 2**30:.2f} GiB"


@functools.cache  # one compile per buffer size, whichever device
def _fill_and_verify() -> tuple[Callable, Callable]:
    import jax
    import jax.numpy as jnp
    from jax import lax

    mul = 2654435761  # every address a different value, every bit flipping somewhere

    def pattern(n: int, seed: Any) -> Any:
        return lax.iota(jnp.uint32, n) * jnp.uint32(mul) + seed

    fill = jax.jit(pattern, static_argnums=0)
    verify = jax.jit(lambda x, seed: jnp.all(x == pattern(x.shape[0], seed)))
    return fill, verify


def write_and_read(device: Any, nbytes: int) -> str | None:
    """Fill ``nbytes`` of ``device`` in chunks, hold them all, read each
    back: None when every one is right, else which was not."""
    import jax
    import numpy as np

    fill, verify = _fill_and_verify()
    elements, sizes = nbytes // 4, []
    while elements > 0:
        sizes.append(min(CHUNK_ELEMENTS, elements))
        elements -= sizes[-1]
    held = []
    try:
        for k, n in enumerate(sizes):
            held.append(fill(n, jax.device_put(np.uint32(k), device)))
        for k, x in enumerate(held):
            if not bool(verify(x, jax.device_put(np.uint32(k), device))):
                return f"device {device.id}: buffer {k} of {len(sizes)} read back wrong"
        return None
    finally:
        for x in held:
            x.delete()


def memory_check(fraction: float) -> tuple[bool, str]:
    import jax

    devs, how, written = jax.local_devices(), "", []
    for d in devs:
        nbytes, how = memory_plan(d, fraction)
        wrong = write_and_read(d, nbytes)
        if wrong:
            return False, wrong
        written.append(nbytes)
    if not written:
        return False, "no device to write"
    each = size(min(written)) + ("" if min(written) == max(written) else f" to {size(max(written))}")
    return True, f"{each} written and read back on each of {len(devs)} device(s) ({how})"


def size(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.0f} MiB"


NO_BACKEND = "not run: JAX's devices did not answer"


def local_checks(settings: Settings) -> list[Check]:
    """The host's own checks. When its devices do not answer, the others
    (which would wait on the same devices) are not run."""
    t = settings.timeout_s
    devices = bounded("devices", lambda: devices_check(settings.devices), t)
    if not devices.ok and devices.detail.startswith("did not answer"):
        n = group_size()
        if n and n > 1:
            # jax.distributed: every process's backend starts with the others'
            # (they exchange their devices), so a peer stuck before it holds this one too.
            devices.detail += (f": JAX's devices start only when all {n} processes of the group start theirs "
                               "(a host hung before its health check, or this host's chips did not open)")
        return [devices, Check("matmul", False, 0.0, NO_BACKEND), Check("memory", False, 0.0, NO_BACKEND)]
    return [devices, bounded("matmul", matmul_check, t),
            bounded("memory", lambda: memory_check(settings.hbm_fraction), t)]


def group_size() -> int | None:
    """The processes jax.distributed was started with (None: not started)."""
    try:
        from jax._src import distributed

        return getattr(distributed.global_state, "num_processes", None)
    except Exception:  # a JAX without it: unknown
        return None


# -- every host's verdict, to every host ---------------------------------------
def whoami(rank: int | None = None) -> dict:
    """This host, as its verdict and its event name it (worker_started's fields)."""
    return {"rank": rank, "hostname": socket.gethostname(), "slice": os.environ.get("TPU_NAME"),
            "host": os.environ.get("TPU_WORKER_ID")}


def verdict(me: dict, checks: list[Check]) -> dict:
    """This host and its failed checks, short enough for one row of the all-gather."""
    failed = [f"{c.name}: {c.detail[:DETAIL_MAX * 2]}" for c in checks if not c.ok and c.detail != NO_BACKEND]
    v = {**me, "hostname": str(me["hostname"])[:100], "slice": (me["slice"] or "")[:100] or None, "failed": failed}
    if len(encode(v)) > VERDICT_BYTES:
        v["failed"] = [c.name for c in checks if not c.ok and c.detail != NO_BACKEND]
    return v


def encode(v: dict) -> bytes:
    return json.dumps(v, separators=(",", ":")).encode()


def decode(row: Any) -> dict | None:
    try:
        v = json.loads(bytes(row).rstrip(b"\0").decode())
    except (ValueError, UnicodeDecodeError):
        return None
    return v if isinstance(v, dict) and isinstance(v.get("failed"), list) else None


def gather(mine: dict) -> list[dict | None]:
    """Every process's verdict, in process order: one all-gather over every
    device of every process (within each slice and across slices)."""
    import numpy as np
    from jax.experimental import multihost_utils

    row = np.zeros(VERDICT_BYTES, np.uint8)
    raw = encode(mine)[:VERDICT_BYTES]
    row[:len(raw)] = np.frombuffer(raw, np.uint8)
    return [decode(r) for r in np.asarray(multihost_utils.process_allgather(row))]


def collective(mine: dict, timeout_s: float) -> tuple[Check, list[dict | None]]:
    got: list[list[dict | None]] = []

    def run() -> tuple[bool, str]:
        import jax

        got.append(gather(mine))
        rows = got[-1]
        unread = [i for i, v in enumerate(rows) if v is None]
        if len(rows) != jax.process_count() or unread:
            return False, f"{len(rows)} verdicts of {jax.process_count()} processes, unreadable: {unread}"
        return True, f"the verdicts of {len(rows)} host(s) gathered over {jax.device_count()} devices"

    c = bounded("collective", run, timeout_s)
    if not c.ok and DEADLINE.search(c.detail):
        # JAX's own collective gave up first (Gloo's 30 s key-value wait on
        # CPU; a barrier's deadline on TPU): the same cause as our limit.
        c.detail = f"JAX's all-gather timed out (DEADLINE_EXCEEDED) within {timeout_s:g} s"
    if not c.ok and (c.detail.startswith("did not answer") or c.detail.startswith("JAX's all-gather timed out")):
        c.detail += ": a host did not join the all-gather (hung, gone, or its interconnect is down)"
    return c, (got[-1] if got else [])


def message(sick: list[dict], coll: Check | None) -> str:
    """HostUnhealthy's one line: every failed host (hostname, slice, worker)
    and its failed checks."""
    parts = [f"{v.get('hostname')} (slice {v.get('slice')}, worker {v.get('host')}, rank {v.get('rank')}): "
             + "; ".join(v["failed"]) for v in sick]
    if coll is not None and not coll.ok and coll.detail != NO_BACKEND:
        parts.append(f"the hosts' verdicts could not be gathered: {coll.detail}")
    return one_line("health check failed, the worker group stops before MaxText: " + " | ".join(parts), 2000)


Emit = Callable[..., Any]


def gate(rank: int, settings: Settings, emit: Emit) -> dict:
    """The worker's health gate, on every host of the group: its checks, its
    event (``health_checked``), every host's verdict; rank 0 says the
    group's (``health_gate``). Raises HostUnhealthy on every host when any
    host failed, or when the verdicts could not be gathered."""
    start = time.monotonic()
    me = whoami(rank)
    checks = local_checks(settings)
    mine = verdict(me, checks)
    # The all-gather waits until the slowest host could have ended its
    # checks (each bounded) and joined, then its own limit: a host with a
    # hung check still joins, and every host names it.
    wait = (len(checks) + 1) * settings.timeout_s - (time.monotonic() - start)
    if checks[-1].detail == NO_BACKEND:  # the all-gather would wait on the same devices
        coll, verdicts = Check("collective", False, 0.0, NO_BACKEND), []
    else:
        coll, verdicts = collective(mine, round(max(wait, settings.timeout_s), 1))
    checks.append(coll)
    ok = all(c.ok for c in checks)
    emit("health_checked", **me, ok=ok, seconds=round(time.monotonic() - start, 3),
         checks={c.name: {k: v for k, v in asdict(c).items() if k != "name"} for c in checks})
    sick = [v for v in verdicts if v and v["failed"]] if coll.ok else ([mine] if mine["failed"] else [])
    if rank == 0:
        emit("health_gate", ok=coll.ok and not sick, hosts=len(verdicts) or None,
             unhealthy=[{k: v.get(k) for k in ("hostname", "slice", "host", "rank", "failed")} for v in sick],
             seconds=round(time.monotonic() - start, 3))
    if sick or not coll.ok:
        raise HostUnhealthy(message(sick, coll))
    return {"ok": True, "hosts": len(verdicts)}


# -- alone on a machine: python health_check.py --------------------------------
class _Args(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"health_check.py: {message}", file=sys.stderr)
        raise SystemExit(2)


def standalone(argv: list[str], environ: Mapping[str, str] = os.environ) -> int:
    """Checks 1-3 on this machine (no Ray, no jax.distributed): the result
    as JSON on stdout; 0 healthy, 1 not, 2 a bad argument."""
    p = _Args(prog="health_check.py", description="this host's TPU health checks (not the collective)")
    p.add_argument("--devices", type=int, help=f"the JAX devices this host must have (default: {ENV_DEVICES})")
    p.add_argument("--timeout", type=float, help=f"seconds per check (default: {ENV_TIMEOUT}, else {TIMEOUT_S:g})")
    p.add_argument("--hbm-fraction", type=float, help=f"of each device's bytes_limit (default {HBM_FRACTION:g})")
    a = p.parse_args(argv)
    given = {ENV_DEVICES: a.devices, ENV_TIMEOUT: a.timeout, ENV_HBM_FRACTION: a.hbm_fraction}
    try:
        settings = Settings.from_env({**environ, **{k: str(v) for k, v in given.items() if v is not None}})
    except ValueError as e:
        print(f"health_check.py: {e}", file=sys.stderr)
        return 2
    start = time.monotonic()
    checks = local_checks(settings)
    ok = all(c.ok for c in checks)
    print(json.dumps({**whoami(), "ok": ok, "seconds": round(time.monotonic() - start, 3),
                      "checks": {c.name: {k: v for k, v in asdict(c).items() if k != "name"} for c in checks},
                      "not_run": "collective (needs jax.distributed: the worker group's gate runs it)"}, indent=1),
          flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    # A check that did not answer leaves its thread running: leave without it.
    code = standalone(sys.argv[1:])
    sys.stdout.flush()
    os._exit(code)
