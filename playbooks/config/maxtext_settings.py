"""MaxText's own rules for `key=value` overrides, checked before anything runs.

A typo in `--set` (an unknown key, `per_device_batch_size=abc`, a value
outside an enum) would otherwise surface minutes later, inside a TPU job or
an ahead-of-time compile. The rules are the pinned MaxText's pydantic config
(MaxTextConfig) as JSON schema, written by scripts/maxtext_schema.py into
data/maxtext_schema.json, so a check needs no import of maxtext or jax.

Values are read as MaxText reads its command line (OmegaConf.from_cli), then
validated against the key's schema. A test compares the verdicts with
MaxText's own pydantic validation. Two rules go further than pydantic: a
string field MaxText declares with one of its enums takes only the values
MaxText runs (remat_policy, te_comm_gemm_overlap; recorded in the schema
file, "x-maxtext-enums"), and a few counts and sizes have a sign (SIGNS)."""
from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable, Iterable
from functools import cache
from pathlib import Path
from typing import Any

SCHEMA = Path(__file__).resolve().parent.parent / "data" / "maxtext_schema.json"
MODELS_DIR = Path(__file__).resolve().parent.parent.parent / "trainer" / "models"


@cache
def schema() -> dict:
    return json.loads(SCHEMA.read_text())


def version() -> str:
    return schema().get("x-maxtext-version", "?")


def parse(text: str) -> Any:
    """A command-line value as MaxText sees it (OmegaConf.from_cli)."""
    from omegaconf import OmegaConf
    cfg = OmegaConf.from_cli([f"v={text}"])
    container: Any = OmegaConf.to_container(cfg, resolve=False)
    return container["v"]


def _resolve(node: dict) -> dict:
    ref = node.get("$ref")
    if ref:
        return schema()["$defs"][ref.rsplit("/", 1)[1]]
    return node


def expected(node: dict) -> str:
    """What a schema node accepts, in words: 'an integer >= -1', 'one of: a, b'."""
    node = _resolve(node)
    if "anyOf" in node:
        parts = []
        for sub in node["anyOf"]:
            words = expected(sub)
            if words not in parts:
                parts.append(words)
        return " or ".join(parts)
    if "enum" in node:
        return "one of: " + ", ".join(str(v) for v in node["enum"])
    if "const" in node:
        return repr(node["const"])
    kind = node.get("type")
    words = {"integer": "an integer", "number": "a number", "boolean": "true or false",
             "string": "a string", "null": "null", "array": "a list", "object": "a mapping"}.get(str(kind), "a value")
    bounds = [f"{op} {node[key]}" for key, op in (("minimum", ">="), ("exclusiveMinimum", ">"),
                                                  ("maximum", "<="), ("exclusiveMaximum", "<"))
              if key in node]
    return " ".join([words, *bounds]) if bounds else words


# MaxText's own conversions before pydantic sees a value (pyconfig._prepare_for_pydantic).
LIST_KEYS = ("train_data_columns", "eval_data_columns", "trainable_parameters_mask", "adamw_mask")


def _as_maxtext_sees(key: str, value: Any) -> Any:
    if isinstance(value, str) and value.lower() == "none":
        return None
    if key in LIST_KEYS and isinstance(value, str):
        return [value]
    return value


def _valid(node: dict, value: Any) -> bool:
    from jsonschema import Draft202012Validator
    sub = dict(node)
    sub["$defs"] = schema()["$defs"]
    valid = Draft202012Validator(sub).is_valid
    # pydantic's lax mode also takes 0/1 for a boolean
    return valid(value) or (type(value) is int and value in (0, 1) and valid(bool(value)))


@cache
def nested_keys() -> frozenset[str]:
    """Keys of MaxText's nested config models (dpo, lora, ...): MaxText takes
    them at the top level too; their values are not checked here."""
    defs = schema()["$defs"]
    return frozenset(k for d in defs.values() if d.get("type") == "object" for k in d.get("properties", {}))


def unknown_key(key: str) -> str | None:
    """Why MaxText would refuse `key` (one phrase), None if it knows it."""
    props = schema()["properties"]
    if key in props or key in nested_keys():
        return None
    close = difflib.get_close_matches(key, list(props), n=3, cutoff=0.75)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    return f"is not a MaxText {version()} config key{hint}"


def schema_problem(key: str, text: str) -> str | None:
    """Why MaxText's pydantic config would refuse the value `text` for a
    known `key` (one phrase), None if it takes it."""
    node = schema()["properties"].get(key)
    if node is None:
        return None
    try:
        value = parse(text)
    except Exception as e:  # omegaconf's grammar errors
        return f"cannot be read as a value ({type(e).__name__}: {str(e).splitlines()[0]})"
    if _valid(node, _as_maxtext_sees(key, value)):
        return None
    what = node.get("description", "").strip()
    wants = f"as MaxText {version()} wants for {key}" + (f" ({what})" if what else "")
    if not isinstance(value, str) and _valid(node, text):
        return f"reads as {type(value).__name__} {value!r}, not {expected(node)}, {wants}"
    return f"is not {expected(node)}, {wants}"


def runs(key: str) -> list[str] | None:
    """The values MaxText runs for a string field it types as a plain `str`
    but declares with one of its enums (remat_policy: RematPolicy, and the
    names its decoder also dispatches on), None for any other key."""
    record = schema().get("x-maxtext-enums", {}).get(key)
    return None if record is None else [*record["values"], *record.get("also", [])]


def enum_problem(key: str, value: Any) -> str | None:
    """Pydantic takes any string for such a field; MaxText then fails inside
    the job (remat_policy: an assert in its decoder) or quietly does
    something else (te_comm_gemm_overlap: anything but 'disabled' turns the
    overlap on)."""
    allowed = runs(key)
    if allowed is None or not isinstance(value, str) or value in allowed:
        return None
    record = schema()["x-maxtext-enums"][key]
    close = difflib.get_close_matches(value, allowed, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else ""
    also = f"; its {'.'.join(record['also_from'].split('.')[-2:])} also runs: {', '.join(record['also'])}" \
        if record.get("also") else ""
    return (f"is not a {key} MaxText {version()} runs (its {record['enum'].rsplit('.', 1)[-1]}: "
            f"{', '.join(record['values'])}{also}){hint}")


# Our own sign rules, for numbers MaxText's schema leaves unbounded: each is
# a count or a size whose sign has one meaning, and a wrong sign fails late
# (inside the job) or not at all (a silently wrong job). key -> (accepts the
# number, the rule in words).
SIGNS: dict[str, tuple[Callable[[float], bool], str]] = {
    # A batch size is positive; MaxText takes fractions (0.5: fewer sequences
    # than devices), so only the sign is ruled.
    "per_device_batch_size": (lambda v: v > 0, "must be > 0: a batch size is positive (a fraction below 1 "
                                               "feeds fewer sequences than devices)"),
    # 0 means "as per_device_batch_size" (MaxText's default); below 0 is no size.
    "eval_per_device_batch_size": (lambda v: v >= 0, "must be >= 0: a batch size is never negative (0: "
                                                     "per_device_batch_size)"),
    # A sequence length in tokens.
    "max_target_length": (lambda v: v > 0, "must be > 0: it is the sequence length in tokens"),
    # MaxText's schema also takes 0 (trains nothing) and -1 (as many as
    # learning_rate_schedule_steps); `invoke train` tells a finished run by
    # its checkpoints reaching steps - 1 (with -1 any checkpoint would look
    # final), and its --steps flag takes >= 1 alone.
    "steps": (lambda v: v >= 1, "must be >= 1: invoke train tells a finished run by its last step (as --steps; "
                                "0 trains nothing, -1 leaves the last step to learning_rate_schedule_steps)"),
    # Periods in steps: MaxText computes step % period (0 divides by zero
    # inside the job; a negative period never fires as meant).
    "checkpoint_period": (lambda v: v > 0, "must be > 0: MaxText saves a checkpoint when step % "
                                           "checkpoint_period == 0"),
    "log_period": (lambda v: v > 0, "must be > 0: MaxText logs when step % log_period == 0"),
}


def sign_problem(key: str, value: Any) -> str | None:
    rule = SIGNS.get(key)
    if rule is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    accepts, words = rule
    return None if accepts(value) else words


def bad_value(key: str, text: str) -> str | None:
    """Why the value `text` for a known `key` would be refused (one phrase):
    by MaxText's pydantic config, by the enum MaxText runs it from, or by our
    sign rules; None if it is taken."""
    why = schema_problem(key, text)
    if why or key not in schema()["properties"]:
        return why
    value = _as_maxtext_sees(key, parse(text))
    return enum_problem(key, value) or sign_problem(key, value)


# run_name becomes a folder, a GCS prefix and a Ray submission id; the
# checkpoints that --fresh deletes are <base_output_directory>/<run_name>/.
RUN_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
RUN_NAME_RULE = ("must be 1-63 characters: lowercase letters, digits, '.', '_', '-', starting with a letter or "
                 "digit, without '..' (it names a folder, a GCS prefix and a Ray job)")
WILDCARDS = re.compile(r"[*?\[\]]")


def run_name_problem(name: str) -> str | None:
    if not RUN_NAME.match(name) or ".." in name:
        return RUN_NAME_RULE
    return None


def path_problem(key: str, text: str) -> str | None:
    """Our own rules for the keys that become paths we delete under."""
    if key == "run_name":
        return run_name_problem(text)
    if key == "base_output_directory" and (WILDCARDS.search(text) or ".." in text.split("/") or "\n" in text):
        return ("holds a wildcard ('*', '?', '['), a '..' or a newline; it is where --fresh deletes a run's "
                "checkpoints, so it must name one folder")
    return None


def problem(key: str, text: str) -> str | None:
    return unknown_key(key) or bad_value(key, text) or path_problem(key, text)


def as_text(value: Any) -> str:
    """An inventory value as it goes on the job's command line."""
    return str(value).lower() if isinstance(value, bool) else str(value)


@cache
def model_config(model: str) -> dict:
    """The model's config, as MaxText loads it (OmegaConf)."""
    from omegaconf import OmegaConf
    path = MODELS_DIR / f"{model}.yml"
    if not path.is_file():
        return {}
    loaded = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    return loaded if isinstance(loaded, dict) else {}


def overrides_model(args: Iterable[tuple[str, str]]) -> bool:
    """Whether the job says override_model_config=true (its settings then
    win over the model's own config)."""
    return any(k == "override_model_config" and parse(v) is True for k, v in args)


def overridden_model_keys(model: str, args: Iterable[tuple[str, str]]) -> list[str]:
    """Keys of the model's config that the job sets to another value. MaxText
    refuses them unless override_model_config=true."""
    args = list(args)
    if overrides_model(args):
        return []
    cfg = model_config(model)
    out = []
    for k, v in args:
        if k in cfg and parse(v) != cfg[k]:
            out.append(f"{k}={v} (the model sets {cfg[k]})")
    return out
