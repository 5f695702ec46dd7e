"""The environment is a typed object: its annotations are the schema's keys,
a type checker (mypy, as `make test` runs it over playbooks/) refuses a
misspelt attribute, and at run time one is an AttributeError."""
from __future__ import annotations

import subprocess
import sys

import pytest

from playbooks.config.schema import SCHEMA, Environment
from playbooks.core.inventory import Env
from tests.conftest import ROOT, env


def test_the_typed_environment_has_exactly_the_schemas_keys():
    keys = {k.name for kind in SCHEMA.kinds.values() for k in kind}
    declared = {k for c in Environment.__mro__ if c not in (Env, object) for k in getattr(c, "__annotations__", {})}
    assert declared - {"name", "_values"} == keys


def test_a_misspelt_attribute_fails_at_run_time_and_an_environment_is_read_only():
    dev = env("dev")
    assert isinstance(dev, Environment) and dev.slices == dev["slices"]
    with pytest.raises(AttributeError):
        dev.slcies  # noqa: B018
    with pytest.raises(AttributeError, match="read-only"):
        dev.slices = 3
    with pytest.raises(AttributeError):
        env("local").gs_bucket  # noqa: B018  (a key of the other kind)


def test_the_type_checker_refuses_a_misspelt_attribute(tmp_path):
    mod = tmp_path / "uses_env.py"
    mod.write_text("from playbooks.config.schema import Environment\n\n\n"
                   "def slices(env: Environment) -> int:\n    return env.slcies\n")
    r = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--config-file", str(ROOT / "pyproject.toml"),
                        str(mod)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and '"Environment" has no attribute "slcies"' in r.stdout, r.stdout + r.stderr
