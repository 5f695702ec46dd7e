"""`invoke status` for a GKE environment with gcloud and no account (a
fresh CLOUDSDK_CONFIG: gcloud refuses every command before any API call, so
nothing leaves this machine; the real `gcloud config config-helper` refuses
once, and each gcloud read is answered in-process with that refusal in the
words its process prints, compared in tests/test_gcp_api.py, while a command
the connector does not answer runs as the real gcloud): the cause is said once, with its
fix (`gcloud auth login`), by the diagnosis; the rows it left unknown say
so briefly, without gcloud's message twenty times."""
from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from tests.conftest import INVOKE, ROOT

pytestmark = [pytest.mark.clients,
              pytest.mark.skipif(shutil.which("gcloud") is None, reason="gcloud is not installed here")]


def status(hermetic: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([INVOKE, "status", "--env", "dev", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=hermetic, stdin=subprocess.DEVNULL)


def test_status_without_a_gcloud_account_names_gcloud_auth_login_once(hermetic):
    r = status(hermetic)
    out = r.stdout + r.stderr
    assert r.returncode == 1 and "Traceback" not in out, out
    assert out.count("gcloud auth login") == 1, out
    assert "do not currently have an active account" not in out, out  # gcloud's words, said by no row
    [diagnosis] = [line for line in r.stdout.splitlines() if line.startswith("diagnosis: ")]
    assert diagnosis.startswith("diagnosis: status : gcloud account: no active account") and \
        diagnosis.endswith("run `gcloud auth login` (`invoke doctor` checks it)"), diagnosis
    brief = [line for line in r.stdout.splitlines() if "unknown because gcloud has no account" in line]
    assert len(brief) >= 15, r.stdout
    assert r.stderr.strip() == "status: not as the inventory asks", r.stderr


def test_status_json_without_a_gcloud_account_has_the_fix_in_its_diagnosis(hermetic):
    r = status(hermetic, "--json")
    doc = json.loads(r.stdout[r.stdout.index("{\n"):r.stdout.rindex("\n}") + 2])
    assert doc["as_asked"] is False and doc["diagnosis"].endswith("run `gcloud auth login` (`invoke doctor` checks it)")
    assert doc["items"][0]["what"] == "status : gcloud account" and doc["items"][0]["verdict"] == "not as asked"
    assert not [i["what"] for i in doc["items"] if "currently have an active account" in i["reason"]], doc["items"]
