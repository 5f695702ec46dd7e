"""The README and docs/ say true things a reader can follow: every relative
link and anchor resolves, every `invoke` task and `make` target they name
exists, the README stays a front door, each benchmark's table has its place,
the recorded examples are what the commands print today, and every test file
is described."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests import doc_examples
from tests.conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to '-'."""
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    out: set[str] = set()
    for h in re.findall(r"^#{1,6} (.+)$", text, re.M):
        s, n = slug(h), 1
        while s in out:  # GitHub numbers repeats: -1, -2, ...
            s, n = f"{slug(h)}-{n}", n + 1
        out.add(s)
    return out


def links() -> list[tuple[Path, str]]:
    return [(p, target) for p in PAGES for target in LINK.findall(FENCE.sub("", p.read_text()))
            if not re.match(r"[a-z]+:", target)]


def test_every_relative_link_and_anchor_resolves():
    broken = []
    for page, target in links():
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{rel(page)}: {target} (no {path})")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{rel(page)}: {target} (no heading #{anchor} in {rel(dest)})")
    assert not broken, "\n".join(broken)
    assert len(links()) > 40  # the check reads the links at all


def test_every_page_of_docs_is_in_its_index_and_reachable_from_the_readme():
    index = (ROOT / "docs" / "README.md").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "docs/README.md" in readme
    for page in PAGES[1:]:
        if page.name != "README.md":
            assert f"]({page.name})" in index, f"docs/README.md does not link {page.name}"
            assert f"](docs/{page.name})" in readme, f"README.md does not link docs/{page.name}"


def commands(text: str, tool: str) -> list[list[str]]:
    """Each command line of the pages that runs `tool`: an inline code span
    that starts with it, or a line of a fenced block that does (after a
    `$ ` prompt, `VAR=value` settings or `.venv/bin/`), split as a shell
    would, from the tool's first argument."""
    lines = [ln for b in FENCE.findall(text) for ln in b.splitlines()[1:-1]]
    lines += re.findall(r"`([^`]+)`", FENCE.sub("", text))
    start = re.compile(rf"^\s*(?:\$\s+)?(?:[A-Z_]+=\S*\s+)*(?:\.venv/bin/)?{tool}\s+(.*)$")
    out = []
    for line in lines:
        m = start.match(line.replace("\n", " "))
        if m:
            rest = re.split(r"\s(?:#|&&|\|\||;|\|)\s", " " + m.group(1) + " ")[0]
            try:
                out.append(shlex.split(rest))
            except ValueError:
                out.append(rest.split())
    return out


def named(tool: str) -> list[tuple[Path, str]]:
    """The task (or target) words of each `tool ...`: the words before its
    first flag, placeholder or argument."""
    out = []
    for page in PAGES:
        for argv in commands(page.read_text(), tool):
            for word in argv:
                if not re.fullmatch(r"[a-z][a-z0-9.-]*", word):
                    break
                out.append((page, word))
    return out


def test_every_invoke_task_the_docs_name_exists():
    from invoke import Collection

    import tasks
    ns = getattr(tasks, "ns", None) or Collection.from_module(tasks)
    # A namespace's default task answers to the namespace's name (`invoke hosts`).
    have = set(ns.task_names) | {alias for aliases in ns.task_names.values() for alias in aliases}
    seen = named("invoke")
    missing = [f"{rel(p)}: invoke {w}" for p, w in seen if w not in have]
    assert not missing, "\n".join(missing)
    # Read at all: the tasks table and the pages name most of the tasks.
    assert {"up", "train", "teardown", "chaos.delete-worker", "chaos.hang-worker", "goodput"} <= {w for _, w in seen}


def test_every_make_target_the_docs_name_exists():
    targets = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))
    seen = named("make")
    missing = [f"{rel(p)}: make {w}" for p, w in seen if w not in targets]
    assert not missing, "\n".join(missing)
    assert {"train", "test", "check"} <= {w for _, w in seen}


def test_the_readme_is_a_front_door():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 250
    for part in ("## Quick start", "make train", "make test", "## Tasks", "## Read on"):
        assert part in text


def test_the_readmes_path_to_gke_makes_the_venv_before_any_task():
    """Every task of the path is `invoke` from the `.venv`: its step 1 says
    `scripts/bootstrap` before `gcloud auth login` and before any `invoke`."""
    text = (ROOT / "README.md").read_text().split("## The path to GKE", 1)[1]
    first = text.split("\n1. ", 1)[1].split("\n2. ", 1)[0]
    assert "scripts/bootstrap" in first and ".venv" in first, first
    assert first.index("scripts/bootstrap") < first.index("gcloud auth login"), first
    assert text.index("scripts/bootstrap") < text.index("`invoke "), text[:600]


def test_each_benchmark_has_its_table_in_its_page():
    """Every `doc_table.write(page, name, ...)` in bench/ has its markers."""
    calls = []
    for script in sorted((ROOT / "bench").glob("*.py")):
        for page, name in re.findall(r"doc_table\.write\(\s*\"([\w./-]+)\",\s*\"([\w-]+)\"", script.read_text()):
            calls.append((script.name, page, name))
            text = (ROOT / "docs" / page).read_text()
            assert f"<!-- bench:{name} -->" in text and f"<!-- /bench:{name} -->" in text, (script.name, page)
    assert {c[0] for c in calls} >= {"soak.py", "recovery.py", "fit_compiles.py", "local_train.py",
                                     "provision.py", "test_times.py"}, calls


def test_no_page_carries_a_test_time_or_figure_by_commit_outside_a_script_table():
    """A figure headed by a commit is a script's (between bench markers);
    prose that names a commit goes stale the day after."""
    for page in PAGES:
        text = re.sub(r"<!-- bench:([\w-]+) -->.*?<!-- /bench:\1 -->", "", page.read_text(), flags=re.S)
        stale = re.findall(r"(?:at|commit) `?[0-9a-f]{7,40}\b", text)
        assert not stale, (rel(page), stale)


@pytest.mark.parametrize("example", doc_examples.EXAMPLES, ids=lambda e: e.name)
def test_each_recorded_example_is_what_the_command_prints_today(example):
    assert doc_examples.shown(example) == doc_examples.render(example), (
        f"docs/{example.page}: example {example.name} is stale: python -m tests.doc_examples")


def test_every_test_file_is_described_in_the_tests_page():
    page = (ROOT / "docs" / "tests.md").read_text()
    missing = [p.name for p in sorted((ROOT / "tests").glob("test_*.py")) if f"`{p.name}`" not in page]
    assert not missing, f"docs/tests.md does not describe {missing}"
