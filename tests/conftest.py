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


# The longest files first (pytest-xdist hands out whole files in collection
# order, with --no-loadscope-reorder): two workers then end near together.
# The second line is `make check`'s longest files (its selection runs them first).
FIRST = ("test_local_e2e.py", "test_controller_train.py", "test_local_e2e_generations.py", "test_preflight.py", "test_clients_faults.py",
         "test_clients_journeys.py", "test_clients_capacity.py", "test_clients_slices.py", "test_clients_controller.py",
         "test_goodput_report.py", "test_connectors.py", "test_bad_inputs.py", "test_goldens.py", "test_health_check.py",
         "test_cost.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(FIRST)))


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
