"""Where this project is: its root folder and the default inventory."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
DEFAULT_INVENTORY = ROOT / "inventory.yaml"
