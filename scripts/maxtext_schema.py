"""Write playbooks/data/maxtext_schema.json: the JSON schema of the pinned
MaxText's config (its pydantic MaxTextConfig), so that `--set key=value` and
the inventory's train_overrides are checked against MaxText's own rules in
milliseconds, without importing maxtext or jax. Run with the project's venv;
tests/test_maxtext_args.py fails when the file and the installed maxtext
disagree.
  .venv/bin/python scripts/maxtext_schema.py"""
from __future__ import annotations

import json
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "playbooks" / "data" / "maxtext_schema.json"


def _strip(node):
    """Drop the titles (noise); keep types, bounds, enums and descriptions."""
    if isinstance(node, dict):
        return {k: _strip(v) for k, v in node.items() if k != "title"}
    if isinstance(node, list):
        return [_strip(v) for v in node]
    return node


def schema() -> dict:
    from maxtext.configs.types import MaxTextConfig
    out = _strip(MaxTextConfig.model_json_schema())
    out["x-maxtext-version"] = metadata.version("maxtext")
    return out


def render() -> str:
    return json.dumps(schema(), indent=0, sort_keys=True) + "\n"


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT.relative_to(ROOT)} (maxtext {metadata.version('maxtext')})", file=sys.stderr)
