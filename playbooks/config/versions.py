"""Versions without importing the packages: pinned in requirements.lock, or
installed in this Python."""
from __future__ import annotations

from collections.abc import Mapping
from importlib import metadata

from playbooks.config.project import ROOT


def pinned(package: str) -> str | None:
    """A package's version as pinned in requirements.lock (no import of it)."""
    prefix = f"{package.lower()}=="
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if line.lower().startswith(prefix):
            return line.split("==", 1)[1].strip()
    return None


def installed(package: str) -> str:
    """A package's version as installed in this Python (no import of it)."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def ray_version() -> str:
    """Ray's version, as pinned in the lock (no import of ray)."""
    v = pinned("ray")
    if v is None:
        raise RuntimeError("requirements.lock pins no ray version")
    return v


def default_ray_image(env: Mapping) -> str:
    return f"rayproject/ray:{ray_version()}-py312-tpu"
