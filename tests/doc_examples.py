"""Transcripts in docs/ that are the real output of a command on a recorded
run, kept between `<!-- example:NAME -->` and `<!-- /example:NAME -->`.

`python -m tests.doc_examples` rewrites them; `tests/test_docs.py` fails when
one differs from what the command prints today. Each runs as a user would
(`invoke ...` in a throwaway environment of its own, with a hermetic HOME and
gcloud config), on a timeline kept in `tests/data/timelines/`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.conftest import INVOKE, ROOT, hermetic_environ

ENV = "doc-examples"


@dataclass(frozen=True)
class Example:
    name: str
    page: str             # under docs/
    timeline: str         # under tests/data/timelines/
    run: str              # the run name the timeline is put under
    args: tuple[str, ...]  # after `invoke`
    base: str = "local"    # the environment of inventory.yaml it is a copy of

    @property
    def shown(self) -> str:
        return "invoke " + " ".join(self.args)


EXAMPLES = (
    Example("goodput", "watching.md", "lost-host-recovered.jsonl", "rayjob-elastic-8b",
            ("goodput", "--run=rayjob-elastic-8b")),
    Example("goodput-cost", "cost.md", "priced-run.jsonl", "rayjob-elastic-8b", ("goodput", "--run=rayjob-elastic-8b"),
            base="dev"),
    Example("runs", "cost.md", "priced-run.jsonl", "rayjob-elastic-8b", ("runs",), base="dev"),
)


def _environ(tmp: Path, ex: Example) -> dict[str, str]:
    e = hermetic_environ(tmp)
    base = yaml.safe_load((ROOT / "inventory.yaml").read_text())["environments"][ex.base]
    ports = {"gcs_port": 7720, "dashboard_port": 8330} if base.get("kind") == "local" else {}
    inv = tmp / "inventory.yaml"
    inv.write_text(yaml.safe_dump({"default": ENV, "environments": {ENV: {**base, **ports}}}))
    e.update({"INVOKE_PLAYBOOK_INVENTORY": str(inv), "TZ": "UTC", "NO_COLOR": "1", "COLUMNS": "120"})
    return e


def render(ex: Example) -> str:
    """What the command prints on the recorded run, as the page shows it."""
    state = ROOT / ".state" / ENV
    run_dir = state / "training" / ex.run
    with tempfile.TemporaryDirectory() as tmp:
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / "tests" / "data" / "timelines" / ex.timeline, run_dir / "events.jsonl")
            r = subprocess.run([INVOKE, *ex.args], cwd=ROOT, env=_environ(Path(tmp), ex), capture_output=True,
                               text=True, timeout=120)
        finally:
            shutil.rmtree(state, ignore_errors=True)
    if r.returncode != 0:
        raise RuntimeError(f"`{ex.shown}` exited {r.returncode}: {(r.stderr or r.stdout).strip()[-300:]}")
    return f"```\n$ {ex.shown}\n{r.stdout.rstrip()}\n```\n"


def _markers(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- example:{re.escape(name)} -->\n)(.*?)(<!-- /example:{re.escape(name)} -->)", re.S)


def shown(ex: Example) -> str | None:
    """What the page holds between the example's markers, or None."""
    m = _markers(ex.name).search((ROOT / "docs" / ex.page).read_text())
    return m.group(2) if m else None


def write(ex: Example) -> bool:
    """Put the command's output into its page; True if the page changed."""
    page = ROOT / "docs" / ex.page
    text = page.read_text()
    pattern = _markers(ex.name)
    if not pattern.search(text):
        raise RuntimeError(f"docs/{ex.page}: no <!-- example:{ex.name} --> ... <!-- /example:{ex.name} --> markers")
    out = render(ex)
    new = pattern.sub(lambda m: m.group(1) + out + m.group(3), text)
    if new != text:
        page.write_text(new)
    return new != text


if __name__ == "__main__":
    for example in EXAMPLES:
        changed = write(example)
        print(f"docs/{example.page}: example {example.name} {'rewritten' if changed else 'current'}")
