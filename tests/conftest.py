"""Shared test helpers: environments from the shipped inventory, a hermetic
process environment, and running plays against declared facts."""
from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from playbooks.config.schema import load_inventory  # noqa: E402
from playbooks.core.play import Playbook  # noqa: E402
from playbooks.core.recap import Reporter  # noqa: E402
from playbooks.core.runner import Mode, Runner  # noqa: E402

# The fakes of the real-client tests (tests/test_clients_*.py), as fixtures of
# every test module: one fake cloud per module (its own environment names).
from tests.fakes.cloud import cloud, cloud_session  # noqa: E402

__all__ = ["cloud", "cloud_session"]  # fixtures, used by name

INVOKE = str(Path(sys.executable).parent / "invoke")


# The files that start a local Ray cluster and train on it, and the health
# gate's JAX processes (niced: they starve beside a training cluster), are
# one line of work: one pytest worker runs them one after the other, so that
# never two clusters train at once on this machine's two cores.
LINE = ("test_local_e2e.py", "test_controller_train.py", "test_local_e2e_generations.py", "test_bill_stop_e2e.py",
        "test_health_check.py")

# The order pytest-xdist hands out whole files in (collection order, with
# --no-loadscope-reorder): the line of files that train on a local Ray
# cluster first (LINE), then the longest files, so that the workers end near
# together. `make check`'s selection (no cluster, no clients) runs its
# longest files first: goodput_report, bad_inputs, goldens, cost.
FIRST = (*LINE, "test_clients_status_faults.py", "test_clients_race.py", "test_clients_head_watch.py",
         "test_connectors.py", "test_clients_follow.py",
         "test_clients_faults.py", "test_clients_controller.py", "test_preflight.py", "test_clients_slices.py",
         "test_clients_journeys.py", "test_clients_capacity.py", "test_gcp_api.py", "test_goodput_report.py",
         "test_trainer.py", "test_gcloud_parse.py", "test_bad_inputs.py", "test_clients_quarantine.py",
         "test_goldens.py", "test_cost.py")

# The files that mostly wait (gcloud's own retries of a 503, locks, follows
# and their reconnects, sshd on loopback), measured with
# `bench/test_times.py --timeline` (wall seconds against CPU seconds). With
# three workers (`make test`, `make check`: -n 3) the last one takes only
# these, and the other two the rest: the suite is bound by its CPU on two
# cores, so a third worker pays only where it fills a wait; three that
# compute at once spend more CPU than two (measured on 2026-12-06: `-n 3`
# with any file on any worker, 1,659 CPU-seconds against 1,502 for the same
# tests; the third worker going on to the other files once its own were
# done, 1,479 against 1,298).
WAITING = ("test_clients_status_faults.py", "test_clients_race.py", "test_clients_head_watch.py",
           "test_connectors.py", "test_clients_follow.py", "test_kube_api_writes.py", "test_lock.py",
           "test_parallel.py", "test_hang_evidence.py", "test_notice.py", "test_host_process.py")


@pytest.fixture(scope="session")
def twin_compile_cache(tmp_path_factory) -> str:
    """One JAX compilation cache for the twin's jobs of this pytest worker
    (LINE's files run one after another on one worker). Their jobs train
    the same tiny model on the same mesh, and JAX keys each entry by the
    program, its devices and its flags: a later job reads what an earlier
    one compiled only where it is the same program (the v5e and v5p twins',
    measured: all 57 entries alike)."""
    return str(tmp_path_factory.mktemp("twin-jax-cache"))


def pytest_addoption(parser):
    """``--processes-only``: the real-client tests' fake cloud gives every
    `invoke` run, script and client process it starts
    TPU_PLAYBOOKS_PROCESSES_ONLY=1 (``Cloud.processes_only``): each gcloud and
    kubectl command runs as its process, none is answered in-process. The
    ``both_ways`` files run each test that way too (``[processes]``);
    `make test-processes` runs only that way."""
    parser.addoption("--processes-only", action="store_true", default=False,
                     help="real-client tests: every gcloud and kubectl command as its process "
                          "(TPU_PLAYBOOKS_PROCESSES_ONLY=1 for what they start)")


def pytest_generate_tests(metafunc):
    """Each test of a ``both_ways`` file (the real-client files whose plays
    write what the `kubernetes` client answers in-process: cordon, taint,
    label, pod delete) runs twice, once as a user's run goes (in-process
    answers allowed) and once with every gcloud and kubectl command its
    process (``processes_mode``, as ``--processes-only`` gives every test);
    under ``--processes-only`` only the second. One pytest run holds both,
    so the second way runs beside the local Ray line, not after it."""
    if "cloud" not in metafunc.fixturenames or metafunc.definition.get_closest_marker("both_ways") is None:
        return
    modes = [True] if metafunc.config.getoption("--processes-only") else [False, True]
    metafunc.parametrize("processes_mode", modes, ids=["processes" if m else "in-process" for m in modes],
                         indirect=True)


@pytest.fixture
def processes_mode(request) -> bool:
    """Whether this run of a ``both_ways`` test runs every command as its process."""
    return bool(getattr(request, "param", False))


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(FIRST)))


def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile`, with LINE's files one unit of work (handed to one
    worker, its files in collection order), and with three workers or more,
    the last worker taking only the WAITING files (it ends when they are
    done) and the others the rest first, then any WAITING file left. Every
    other file is its own unit, as loadfile does."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Lines(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return "ray-line" if Path(scope).name in LINE else scope

        def _assign_work_unit(self, node) -> None:
            last = max(self.nodes, key=lambda n: int(n.gateway.id.removeprefix("gw")))
            waits = len(self.nodes) >= 3 and node is last
            mine = [s for s in self.workqueue if (Path(s).name in WAITING) == waits]
            if waits and not mine:  # no wait left to fill: two compute faster than three
                node.shutdown()
                return
            if mine:  # the first unit of this worker's kind goes first in the queue
                self.workqueue.move_to_end(mine[0], last=False)
            super()._assign_work_unit(node)

    return Lines(config, log)


# bench/test_times.py sets this: each test's wall seconds and the CPU
# seconds of its pytest worker and of the processes it started and waited
# for (invoke, gcloud, kubectl, ...; not daemons it left running: the local
# Ray nodes), one JSON line per test, setup and teardown included, with the
# test's name, its pytest-xdist worker and when it started.
CPU_LOG = os.environ.get("PLAYBOOK_TEST_CPU_LOG")


def _cpu() -> tuple[float, float]:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


if CPU_LOG:
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        start, wall, (own, kids) = time.time(), time.monotonic(), _cpu()
        yield
        own2, kids2 = _cpu()
        with open(CPU_LOG, "a") as f:
            f.write(json.dumps({"file": item.path.name, "test": item.name, "start": start,
                                "worker": os.environ.get("PYTEST_XDIST_WORKER", ""), "wall": time.monotonic() - wall,
                                "own": own2 - own, "children": kids2 - kids}) + "\n")


def env(name: str = "dev", **changes):
    """An environment of the shipped inventory, with changed keys."""
    inv = load_inventory()
    if changes:
        raw = dict(inv.raw[name])
        raw.update(changes)
        from playbooks.core.inventory import resolve
        return resolve(inv.path, name, raw, inv.schema)
    return inv.env(name)


class Transcript(list):
    def text(self) -> str:
        return "\n".join(self)


class Clock:
    """Time that passes only when slept: waits end at once, timeouts still end them."""

    def __init__(self):
        self.now = 0.0

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def __call__(self) -> float:
        return self.now


def run_with_facts(steps, facts, mode=Mode.APPLY, keep_going=False):
    """Run steps with every probe answered by ``facts`` (keyed by the probe's
    command line); an undeclared probe fails the step. Nothing starts, and
    no wait takes time."""
    out = Transcript()
    runner = Runner(mode, facts=facts)
    clock = Clock()
    book = Playbook(runner, Reporter(out.append), workers=1, sleep=clock.sleep, clock=clock)
    recap = book.run("test", steps, keep_going=keep_going)
    return recap, out


def hermetic_environ(tmp_path: Path) -> dict[str, str]:
    """Environment for client processes that touches nothing of the user's:
    HOME, gcloud's config and the kubeconfig under ``tmp_path``."""
    e = {k: v for k, v in os.environ.items() if not k.startswith(("CLOUDSDK_", "INVOKE_", "KUBECONFIG"))}
    home = tmp_path / "home"
    home.mkdir()
    e.update({
        "HOME": str(home),
        "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"),
        "CLOUDSDK_METRICS_ENVIRONMENT": "playbook-tests",
        "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
        "KUBECONFIG": str(tmp_path / "kubeconfig"),
    })
    return e


@pytest.fixture
def hermetic(tmp_path):
    """Environment for client processes that touches nothing of the user's."""
    return hermetic_environ(tmp_path)


@pytest.fixture
def here(tmp_path, monkeypatch):
    """This machine's connector rooted in the test's folder: what goes through
    it (the record of hosts set aside) is the test's own, never the
    checkout's `.state/`, which another test or run would read."""
    from playbooks.access import connectors
    from playbooks.core.connector.local import LocalConnector
    monkeypatch.setattr(connectors, "_local", LocalConnector(tmp_path, {}))
    return tmp_path
