"""Every gcloud command the playbooks can emit (every task, every environment
of the inventory, both cluster modes) is accepted by the installed gcloud's
own argument parser; the parser agrees with the gcloud CLI."""
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from playbooks.cli.doctor import BAD, GOOD, gcloud_lines
from playbooks.config.schema import load_inventory
from tests.conftest import INVOKE, ROOT, env
from tests.goldens import CAPACITY_INVENTORY, GENERATIONS_INVENTORY


def sdk_root() -> Path | None:
    """This machine's Cloud SDK (where gcloud's bundled Python is)."""
    exe = shutil.which("gcloud")
    root = Path(os.path.realpath(exe)).parent.parent if exe else None
    return root if root and (root / "lib" / "googlecloudsdk").is_dir() else None


ROOT_SDK = sdk_root()
pytestmark = pytest.mark.skipif(ROOT_SDK is None, reason="gcloud is not installed here")


def parse(lines, hermetic):
    py = ROOT_SDK / "platform" / "bundledpythonunix" / "bin" / "python3"
    r = subprocess.run([str(py), str(ROOT / "playbooks" / "access" / "gcloud_parse.py"), str(ROOT_SDK)],
                       input="".join(json.dumps(ln) + "\n" for ln in lines), capture_output=True, text=True,
                       env=hermetic, timeout=300)
    assert r.returncode == 0, r.stderr
    return [json.loads(ln) for ln in r.stdout.splitlines()]


def all_lines():
    inv = load_inventory()
    lines = []
    for name in inv.names:
        lines += gcloud_lines(inv.env(name))
    # Both modes, more slices, another namespace, every capacity option, a
    # single-host slice: every branch of the plays.
    lines += gcloud_lines(env("dev", slices=3, namespace="ml"))
    lines += gcloud_lines(env("dev-autopilot", namespace="default"))
    cap = load_inventory(CAPACITY_INVENTORY)
    for name in cap.names:
        lines += gcloud_lines(cap.env(name))
    lines += gcloud_lines(env("dev", capacity="reservation", reservation="v6e-local"))
    # Every TPU generation: v5e, v5p, TPU7x (its workload policy, and its
    # pools placed by it), and each one's single-host slice.
    gens = load_inventory(GENERATIONS_INVENTORY)
    for name in gens.names:
        lines += gcloud_lines(gens.env(name))
    lines += gcloud_lines(env("dev", slices=1, machine_type="tpu7x-standard-4t", topology="2x2x1"))
    lines += gcloud_lines(env("dev", slices=1, machine_type="ct5p-hightpu-4t", topology="2x2x1",
                              capacity="reservation", reservation="v5p-local"))
    lines += gcloud_lines(env("dev", slices=1, topology="2x2"))
    seen, out = set(), []
    for ln in lines:
        if json.dumps(ln) not in seen:
            seen.add(json.dumps(ln))
            out.append(ln)
    return out


def test_every_gcloud_command_of_every_plan_parses(hermetic):
    lines = all_lines()
    assert len(lines) > 40
    results = parse([GOOD, BAD] + lines, hermetic)
    assert len(results) == len(lines) + 2, "a line's parse read the lines after it (a flag's '-': stdin)"
    assert results[0]["ok"] and not results[1]["ok"], "canaries: gcloud's parser is not usable as assumed"
    assert "Invalid choice: 'nonsense'" in results[1]["error"]
    rejected = [f"gcloud {' '.join(r['argv'])}: {r['error']}" for r in results[2:] if not r["ok"]]
    assert rejected == []
    kinds = {" ".join(ln[:3]) for ln in lines}
    for must in ("container clusters create", "container clusters create-auto", "container node-pools create",
                 "compute networks create", "storage buckets add-iam-policy-binding", "container clusters delete",
                 "compute machine-types list", "container get-server-config", "beta quotas info",
                 "compute reservations describe", "container clusters update", "compute resource-policies create",
                 "compute resource-policies delete", "compute resource-policies list"):
        assert any(k.startswith(must) for k in kinds), must
    flags = {a.split("=")[0] for ln in lines if ln[:3] == ["container", "node-pools", "create"] for a in ln}
    assert {"--spot", "--flex-start", "--reservation-affinity", "--reservation", "--enable-autoscaling",
            "--location-policy", "--no-enable-autorepair", "--max-nodes", "--min-nodes", "--placement-policy",
            "--system-config-from-file"} <= flags  # its "-" reads stdin as it is parsed: the lines after still parse
    policy = {a.split("=")[0] for ln in lines if ln[:4] == ["compute", "resource-policies", "create", "workload-policy"]
              for a in ln}
    assert {"--type", "--accelerator-topology", "--region"} <= policy
    # The maintenance hold of a run and its release (train, teardown).
    updates = {a.split("=")[0] for ln in lines if ln[:3] == ["container", "clusters", "update"] for a in ln}
    assert {"--add-maintenance-exclusion-name", "--add-maintenance-exclusion-start", "--add-maintenance-exclusion-end",
            "--add-maintenance-exclusion-scope", "--remove-maintenance-exclusion"} <= updates


@pytest.mark.clients
def test_parser_agrees_with_the_cli(hermetic):
    """Known-good and known-bad lines through both: the CLI exits 2 on a parse
    error and 1 ("no active account") once parsed."""
    sample = [ln for ln in all_lines() if ln[:2] in (["container", "node-pools"], ["container", "clusters"])][:4]
    sample += [
        ["container", "clusters", "create-auto", "c", "--enable-ray-operator", "--machine-type=n1-standard-16",
         "--location=us-east5", "--cluster-version=1.35.2-gke.1842000"],  # why the tutorial's flag is left out
        ["compute", "networks", "create", "n", "--subnet-mode=custom", "--mtu=lots"],
        BAD,
    ]
    parsed = parse(sample, hermetic)
    for line, p in zip(sample, parsed):
        r = subprocess.run(["gcloud", *line], capture_output=True, text=True, env=hermetic, timeout=120)
        assert (r.returncode != 2) == p["ok"], (line, r.returncode, r.stderr[:300], p)
        if p["ok"]:
            assert r.returncode == 1 and "do not currently have an active account" in r.stderr
        else:
            assert r.stderr.splitlines()[0].startswith("ERROR: (gcloud.")
    assert [p["ok"] for p in parsed[-3:]] == [False, False, False]
    assert "unrecognized arguments: --machine-type=n1-standard-16" in parsed[-3]["error"]


@pytest.mark.clients
def test_invoke_doctor_checks_the_plan_and_lists_every_problem(hermetic):
    """No gcloud account here: doctor says so with its fix, `gcloud auth
    login`, in the account's step alone (its line, and the recap's); the two
    checks it stops say so in one line each with the one line of gcloud's
    stderr that matters, never its whole message (which names the fix
    again); every other check still runs (the parse of the whole plan
    among them)."""
    r = subprocess.run([INVOKE, "doctor"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**hermetic, "INVOKE_PLAYBOOK_ENV": "dev"})
    out = r.stdout
    assert r.returncode == 1, out + r.stderr
    assert "gcloud command lines of the plan parse with this gcloud" in out
    assert "maxtext 0.2.5" in out
    assert re.search(r"doctor : gcloud account +failed .* gcloud has no active account: run `gcloud auth login`", out)
    assert [line for line in out.splitlines() if "gcloud auth login" in line] == [
        "  gcloud has no active account: run `gcloud auth login` (every gcloud command would fail)",
        "  doctor : gcloud account" + re.search(r"doctor : gcloud account( +failed .*)", out)[1]], out
    for step, command in (("project my-tpu-project", "projects.describe"), (r"kubectl context \S+", "container.clusters"
                                                                                                  ".list")):
        assert re.search(rf"doctor : {step} +failed +\S+ +not checked: gcloud has no account \(`doctor : gcloud "
                         rf"account` says the fix\); gcloud: ERROR: \(gcloud\.{command}\) You do not currently have "
                         rf"an active account selected\.$", out, re.M), out
    assert "to obtain new credentials" not in out and "stderr:" not in out, out     # gcloud's long message: never
    assert "doctor dev: ok=8 changed=0 failed=3 skipped=0" in out
