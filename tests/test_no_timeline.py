"""`invoke runs` and `invoke goodput` where no run has a timeline yet: the
same one line and the same exit code, 0 (a look that finds nothing is not an
error); `invoke goodput --run NAME` of a run that has none is an error, exit 1
(docs/watching.md#goodput). A local environment of its own: neither reads
Ray nor a cloud."""
from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import yaml

from tests.conftest import INVOKE, ROOT

NAME = "no-timeline-test"
NONE = f"no run of environment {NAME} has a timeline yet: `invoke train` keeps one"


@pytest.fixture
def cli(tmp_path, hermetic):
    base = yaml.safe_load((ROOT / "inventory.yaml").read_text())["environments"]["local"]
    inv = tmp_path / "inventory.yaml"
    inv.write_text(yaml.safe_dump({"default": NAME, "environments": {NAME: base}}))

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([INVOKE, *args], cwd=ROOT, env={**hermetic, "INVOKE_PLAYBOOK_INVENTORY": str(inv)},
                              capture_output=True, text=True, timeout=120)
    yield run
    shutil.rmtree(ROOT / ".state" / NAME, ignore_errors=True)


def test_runs_and_goodput_say_no_timeline_yet_alike_and_exit_0_a_named_run_without_one_exits_1(cli):
    runs, good = cli("runs"), cli("goodput")
    assert (runs.returncode, runs.stdout.splitlines()[0]) == (0, NONE), runs.stdout + runs.stderr
    assert (good.returncode, good.stdout.strip()) == (0, NONE), good.stdout + good.stderr
    assert json.loads(cli("runs", "--json").stdout)["runs"] == []
    assert json.loads(cli("goodput", "--json").stdout) == {"run": None, "none": NONE}
    named = cli("goodput", "--run=nosuch")
    assert named.returncode == 1, named.stdout + named.stderr
    assert "run nosuch has no events" in named.stderr, named.stderr
