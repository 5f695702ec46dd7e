"""`invoke --dry <task>` for every environment of inventory.yaml, compared
line by line with tests/goldens/<env>/<task>.txt. A dry run starts no
process at all: each runs in this process with process creation refused
(tests/inproc.py), and a sample through the real `invoke` executable with
process creation disabled in the child (tests/noproc): the same transcript.

After an intended change of commands: `make goldens`, then review the diff."""
import difflib

import pytest

from tests.goldens import args_of, cases, dry_run, expected_rc, golden_path

CASES = cases()


def assert_golden(env: str, task: str, inventory, real_cli: bool = False) -> None:
    rc, out, err = dry_run(env, args_of(env, task), inventory, real_cli)
    assert "PROCESSES STARTED" not in err, err
    assert rc == expected_rc(env, task, inventory), err
    want = golden_path(env, task).read_text()
    if out != want:
        diff = "\n".join(difflib.unified_diff(want.splitlines(), out.splitlines(), "golden", "now", lineterm=""))
        pytest.fail(f"dry run of {task} on {env}{' (real CLI)' if real_cli else ''} differs from "
                    f"{golden_path(env, task)} (`make goldens` if intended):\n{diff}")


@pytest.mark.parametrize("env,task,inventory", CASES, ids=[f"{e}-{t}" for e, t, _ in CASES])
def test_dry_run_matches_golden(env, task, inventory):
    assert_golden(env, task, inventory)


# Through the real CLI: a Standard, an Autopilot and a local environment, a
# provisioning chain, a job and a teardown (a new interpreter each: ~0.5 s).
CLI_SAMPLE = [("dev", "up", None), ("dev-autopilot", "train-elastic", None), ("local", "train-fresh", None),
              ("dev", "teardown", None)]


@pytest.mark.parametrize("env,task,inventory", CLI_SAMPLE, ids=[f"{e}-{t}" for e, t, _ in CLI_SAMPLE])
def test_the_real_cli_prints_the_same_dry_run(env, task, inventory):
    assert (env, task, inventory) in CASES
    assert_golden(env, task, inventory, real_cli=True)
