"""`invoke --dry <task>` for every environment of inventory.yaml, compared
line by line with tests/goldens/<env>/<task>.txt. A dry run starts no
process at all: the child runs with process creation disabled.

After an intended change of commands: `make goldens`, then review the diff."""
import difflib

import pytest

from tests.goldens import TASKS, cases, dry_run, golden_path

CASES = cases()


@pytest.mark.parametrize("env,task,inventory", CASES, ids=[f"{e}-{t}" for e, t, _ in CASES])
def test_dry_run_matches_golden(env, task, inventory):
    rc, out, err = dry_run(env, TASKS[task], inventory)
    assert "PROCESSES STARTED" not in err, err
    assert rc == 0, err
    want = golden_path(env, task).read_text()
    if out != want:
        diff = "\n".join(difflib.unified_diff(want.splitlines(), out.splitlines(), "golden", "now", lineterm=""))
        pytest.fail(f"dry run of {task} on {env} differs from {golden_path(env, task)} "
                    f"(`make goldens` if intended):\n{diff}")
