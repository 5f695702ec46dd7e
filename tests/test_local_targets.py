"""`make clean-local` and `make train` act on the shipped inventory's local
environment, whatever the user selected: with a GKE environment selected
(INVOKE_PLAYBOOK_ENV, a GKE-only inventory whose `default:` is GKE, a
runtime config file), recording `gcloud`, `gsutil`, `kubectl` and `ray`
first on PATH record nothing. A copy of the project runs them (its own
`.state/`: the local cluster of this checkout is left alone). `make
clean-local` runs as it is (no local cluster runs in the copy: nothing to
stop); the train target's invoke line runs in check mode with
--skip-preflight (a real local training run is `make test`'s e2e). With the
old Makefile (`invoke teardown --yes`, `invoke train --fresh`) the shims
record the GKE environment's probes, and these tests fail."""
from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, hermetic_environ

SHIMS = ("gcloud", "gsutil", "kubectl", "ray", "gke-gcloud-auth-plugin")
COPIED = ("playbooks", "trainer", "manifests", "scripts", "Makefile", "inventory.yaml", "invoke.yaml", "tasks.py",
          "requirements.lock", "pyproject.toml")
GKE_ONLY = """default: prod
environments:
  prod:
    kind: gke
    mode: standard
    project_id: my-prod-project
    region: us-east5
    zone: us-east5-b
    cluster_name: prod-cluster
    cluster_version: 1.35.2-gke.1842000
    gs_bucket: my-prod-project-ckpt
    ksa_name: maxtext-ksa
    namespace: default
    user_identifier: me@example.com
"""


def project_copy(tmp: Path) -> Path:
    root = tmp / "project"
    root.mkdir()
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, root / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, root / name)
    (root / ".venv").symlink_to((ROOT / ".venv").resolve())
    return root


def shims(tmp: Path) -> tuple[Path, Path]:
    """Fake cloud clients that record their argv (and fail, as with no
    account): what a GKE environment's probe or delete would run."""
    bin_dir, record = tmp / "shims", tmp / "recorded.txt"
    bin_dir.mkdir()
    for name in SHIMS:
        shim = bin_dir / name
        shim.write_text(f'#!/bin/sh\necho "{name} $*" >> {shlex.quote(str(record))}\n'
                        f'echo "ERROR: ({name}) a recording shim" >&2\nexit 1\n')
        shim.chmod(0o755)
    return bin_dir, record


@pytest.fixture(params=["env-var", "gke-default", "runtime-config"])
def selected_gke(request, tmp_path) -> tuple[Path, dict[str, str], Path]:
    """A copy of the project, an environment that selects a GKE environment
    (three ways), the recording shims first on PATH."""
    root = project_copy(tmp_path)
    environ = hermetic_environ(tmp_path)
    bin_dir, record = shims(tmp_path)
    environ["PATH"] = f"{bin_dir}:{environ['PATH']}"
    if request.param == "env-var":
        environ["INVOKE_PLAYBOOK_ENV"] = "dev"
    elif request.param == "gke-default":
        (tmp_path / "my-inventory.yaml").write_text(GKE_ONLY)
        environ["INVOKE_PLAYBOOK_INVENTORY"] = str(tmp_path / "my-inventory.yaml")
    else:
        (tmp_path / "runtime.yaml").write_text("playbook:\n  env: dev\n")
        environ["INVOKE_RUNTIME_CONFIG"] = str(tmp_path / "runtime.yaml")
    return root, environ, record


def make(root: Path, environ: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    # -o venv: the shared .venv is there already (scripts/bootstrap is make test's own business)
    return subprocess.run(["make", "--no-print-directory", "-o", "venv", *args], cwd=root, env=environ,
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)


def test_make_clean_local_stops_only_the_local_cluster_whatever_is_selected(selected_gke):
    root, environ, record = selected_gke
    r = make(root, environ, "clean-local")
    out = r.stdout + r.stderr
    assert not record.exists(), f"clean-local ran the cloud clients: {record.read_text()}\n{out}"
    assert r.returncode == 0, out
    assert "PLAY [teardown | env local (local) | apply]" in out, out


def test_the_train_targets_line_acts_on_the_local_environment_whatever_is_selected(selected_gke):
    root, environ, record = selected_gke
    line = make(root, environ, "-n", "train").stdout.strip().splitlines()[-1]
    assert ".venv/bin/invoke train --fresh" in line, line
    r = subprocess.run(["sh", "-c", f"{line} --skip-preflight"], cwd=root, capture_output=True, text=True,
                       timeout=300, stdin=subprocess.DEVNULL, env={**environ, "INVOKE_PLAYBOOK_MODE": "check"})
    out = r.stdout + r.stderr
    assert not record.exists(), f"train ran the cloud clients: {record.read_text()}\n{out}"
    assert "PLAY [train | env local (local) | check]" in out, out
    assert "Traceback" not in out and "confirm with --yes" not in out, out


def test_the_local_targets_refuse_a_pinned_environment_that_is_not_local(tmp_path):
    """The shipped inventory's `local` edited into a GKE environment: one
    line, exit 2, nothing run."""
    root = project_copy(tmp_path)
    (root / "inventory.yaml").write_text(GKE_ONLY.replace("prod", "local"))
    environ = hermetic_environ(tmp_path)
    bin_dir, record = shims(tmp_path)
    environ["PATH"] = f"{bin_dir}:{environ['PATH']}"
    r = make(root, environ, "clean-local")
    assert r.returncode != 0 and not record.exists(), r.stdout + r.stderr
    [line] = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert "environment 'local'" in line and "is kind gke" in line and "INVOKE_PLAYBOOK_KIND" in line, line
    assert "PLAY [" not in r.stdout, r.stdout
