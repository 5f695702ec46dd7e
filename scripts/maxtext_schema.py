"""Write playbooks/data/maxtext_schema.json: the JSON schema of the pinned
MaxText's config (its pydantic MaxTextConfig), so that `--set key=value` and
the inventory's train_overrides are checked against MaxText's own rules in
milliseconds, without importing maxtext or jax. Run with the project's venv;
tests/test_maxtext_args.py fails when the file and the installed maxtext
disagree.
  .venv/bin/python scripts/maxtext_schema.py

Besides the pydantic schema it records, under "x-maxtext-enums", the string
fields that MaxText types as a plain `str` but declares with one of its own
enums (`remat_policy: str | None = Field(RematPolicy.FULL.value, ...)`):
pydantic takes any string there, MaxText runs only the enum's values (a
`remat_policy=fulll` would otherwise fail inside the TPU job). Both the
fields and their values are read from the installed maxtext, none is copied
by hand."""
from __future__ import annotations

import ast
import enum
import importlib.util
import inspect
import json
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "playbooks" / "data" / "maxtext_schema.json"

# Where MaxText dispatches on a field's value by name, beyond its enum: the
# values compared there are values it runs too. remat_policy: the decoder's
# get_remat_policy also runs minimal_with_context (base.yml's first choice),
# minimal_flash, the *_quantization policies and none, which RematPolicy does
# not name. (module, class, function, the local name compared)
ALSO_RUN = {"remat_policy": ("maxtext.layers.nnx_decoders", "NNXDecoder", "get_remat_policy", "remat_policy")}


def _strip(node):
    """Drop the titles (noise); keep types, bounds, enums and descriptions."""
    if isinstance(node, dict):
        return {k: _strip(v) for k, v in node.items() if k != "title"}
    if isinstance(node, list):
        return [_strip(v) for v in node]
    return node


def _enum_default(call: ast.expr) -> str | None:
    """`Field(SomeEnum.MEMBER.value, ...)` -> "SomeEnum"."""
    if not isinstance(call, ast.Call):
        return None
    default = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "default"), None)
    if (isinstance(default, ast.Attribute) and default.attr == "value" and isinstance(default.value, ast.Attribute)
            and isinstance(default.value.value, ast.Name)):
        return default.value.value.id
    return None


def _compared_names(module: str, cls: str, func: str, local: str) -> list[str]:
    """The string constants `local` is compared with (==, !=, in, not in) in
    module.cls.func, read from its source without importing it (the module
    imports jax and flax)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise SystemExit(f"{module} is not installed")
    tree = ast.parse(Path(spec.origin).read_text())
    body = next((f for c in tree.body if isinstance(c, ast.ClassDef) and c.name == cls
                 for f in c.body if isinstance(f, ast.FunctionDef) and f.name == func), None)
    if body is None:
        raise SystemExit(f"{module}.{cls}.{func} not found: MaxText changed; update ALSO_RUN")
    out: list[str] = []
    for node in ast.walk(body):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and node.left.id == local:
            for right in node.comparators:
                items = right.elts if isinstance(right, (ast.Set, ast.Tuple, ast.List)) else [right]
                for item in items:
                    if isinstance(item, ast.Constant) and isinstance(item.value, str) and item.value not in out:
                        out.append(item.value)
    if not out:
        raise SystemExit(f"{module}.{cls}.{func} compares {local} with no name: MaxText changed; update ALSO_RUN")
    return out


def enum_backed() -> dict:
    """The fields of MaxTextConfig typed `str` whose default is a member of
    one of MaxText's enums, with the enum's values (and what else MaxText
    runs for them, ALSO_RUN)."""
    from maxtext.configs import types

    fields = types.MaxTextConfig.model_fields
    out: dict[str, dict] = {}
    for node in ast.walk(ast.parse(inspect.getsource(types))):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None):
            continue
        name, cls_name = node.target.id, _enum_default(node.value)
        cls = getattr(types, cls_name, None) if cls_name else None
        if name not in fields or not (isinstance(cls, type) and issubclass(cls, enum.Enum)):
            continue
        if fields[name].annotation not in (str, str | None):
            continue  # typed as the enum itself: pydantic's schema already holds its values
        values = [m.value for m in cls]
        record: dict = {"enum": f"{types.__name__}.{cls.__name__}", "values": values}
        if name in ALSO_RUN:
            module, klass, func, local = ALSO_RUN[name]
            record["also"] = [v for v in _compared_names(module, klass, func, local) if v not in values]
            record["also_from"] = f"{module}.{klass}.{func}"
        out[name] = record
    missing = set(ALSO_RUN) - set(out)
    if missing:
        raise SystemExit(f"no longer enum-backed in MaxText: {', '.join(sorted(missing))}; update ALSO_RUN")
    return out


def schema() -> dict:
    from maxtext.configs.types import MaxTextConfig
    out = _strip(MaxTextConfig.model_json_schema())
    out["x-maxtext-version"] = metadata.version("maxtext")
    out["x-maxtext-enums"] = enum_backed()
    return out


def render() -> str:
    return json.dumps(schema(), indent=0, sort_keys=True) + "\n"


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT.relative_to(ROOT)} (maxtext {metadata.version('maxtext')})", file=sys.stderr)
