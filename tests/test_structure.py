"""The shape of the code: plays import the engine and the support modules,
never another play; the engine knows nothing of the project; the modules
import each other without a cycle (imports inside functions count; imports
for type checking only do not)."""
from __future__ import annotations

import ast
import os
import re
from pathlib import Path

from playbooks.config.choices import MODES, OPTIONS, PLATFORMS
from playbooks.config.tpu import GENERATIONS
from tests.conftest import ROOT

PACKAGE = ROOT / "playbooks"


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py") if "data" not in p.parts}


def _type_checking_only(tree: ast.AST) -> set[ast.AST]:
    """Every node under an ``if TYPE_CHECKING:`` (its test, body and else)."""
    return {inner for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for inner in ast.walk(node) if inner is not node}


def imports(name: str) -> set[str]:
    """The project modules ``name`` imports (resolved, package-relative)."""
    path = MODULES[name]
    tree = ast.parse(path.read_text())
    guarded = _type_checking_only(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if node in guarded:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            mod = (f"{base}.{node.module}" if node.module else base) if node.level else node.module or ""
            # `from . import x` names a module x when there is one
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in MODULES else mod for a in node.names]
        else:
            continue
        out |= {t for t in targets if t in MODULES and t != name}
    return out


GRAPH = {m: imports(m) for m in MODULES}
PLAYS = {m for m in MODULES if m.startswith("playbooks.plays.") }


# The layers, bottom up, and what each package may import (besides itself).
LAYERS = {
    "core": set(),
    "config": {"core"},
    "access": {"core", "config"},
    "cloud": {"core", "config", "access"},
    "job": {"core", "config", "access", "cloud"},
    "runs": {"core", "config", "access", "cloud", "job"},
    "twin": {"core", "config", "access", "cloud"},
    "plays": {"core", "config", "access", "cloud", "job", "runs", "twin"},
    "cli": {"core", "config", "access", "cloud", "job", "runs", "twin", "plays"},
}


def package_of(module: str) -> str:
    return module.split(".")[1]


def layering(graph: dict[str, set[str]]) -> list[str]:
    """Each import that goes to a package the importer may not use."""
    return sorted(f"{m} imports {o}" for m, deps in graph.items() for o in deps
                  if package_of(o) != package_of(m) and package_of(o) not in LAYERS[package_of(m)])


def test_every_module_is_in_a_package_of_the_layers_and_its_docstring_says_what_it_may_import():
    assert {package_of(m) for m in MODULES if m != "playbooks"} == set(LAYERS)
    assert [m for m in MODULES if m.count(".") == 1 and m.split(".")[1] not in LAYERS] == []  # no loose module
    for pkg, allowed in LAYERS.items():
        doc = ast.get_docstring(ast.parse((PACKAGE / pkg / "__init__.py").read_text())) or ""
        assert doc, pkg
        said = set(re.findall(r"``playbooks\.(\w+)``", doc))
        assert said == allowed or (pkg == "cli" and "every other package" in doc), (pkg, said, allowed)


def test_each_packages_docstring_names_each_of_its_modules():
    """What a package knows is said in its __init__.py, module by module:
    a module added without a word there fails."""
    for pkg in LAYERS:
        doc = ast.get_docstring(ast.parse((PACKAGE / pkg / "__init__.py").read_text())) or ""
        modules = {f.stem for f in (PACKAGE / pkg).glob("*.py") if f.name != "__init__.py"}
        assert {m for m in modules if f"``{m}``" not in doc and f"``{m}.py``" not in doc} == set(), pkg


def test_each_package_imports_only_the_packages_below_it():
    assert layering(GRAPH) == []


def test_no_two_modules_of_the_tree_share_a_name():
    names: dict[str, list[str]] = {}
    for top, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
        for f in files:
            if f.endswith(".py") and f != "__init__.py":
                names.setdefault(f, []).append(str(Path(top, f).relative_to(ROOT)))
    assert {n: ps for n, ps in names.items() if len(ps) > 1} == {}


def test_no_play_imports_a_play():
    found = sorted(f"{m} imports {o}" for m in PLAYS for o in GRAPH[m] if o in PLAYS)
    assert found == []


def test_the_engine_imports_nothing_of_the_project():
    core = {m for m in MODULES if m.startswith("playbooks.core")}
    found = sorted(f"{m} imports {o}" for m in core for o in GRAPH[m] if o not in core)
    assert found == []


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle():
    assert cycles(GRAPH) == []


# A TPU generation is one record (playbooks/config/tpu.py): no value of the
# code outside config/ names one (a string compare, a label, a machine type,
# Ray's accelerator type); docstrings may.
GENERATION_WORDS = re.compile(r"\b(v4|v5e|v5p|v6e|tpu7x|v7x|v5litepod)\b|\bct\d\w*-|\btpu-v\d|TPU-V\d", re.I)


def generation_literals(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and ast.get_docstring(n, clean=False) is not None}
    return [f"{path.relative_to(ROOT)}:{n.lineno}: {n.value[:60]!r}" for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
            and GENERATION_WORDS.search(n.value)]


def test_no_code_outside_config_names_a_tpu_generation():
    found = [hit for p in PACKAGE.rglob("*.py") if "config" not in p.relative_to(PACKAGE).parts[:1]
             for hit in generation_literals(p)]
    assert found == []
    assert GENERATION_WORDS.search("tpu-v6e-slice") and GENERATION_WORDS.search("ct5p-hightpu-4t")


# The inventory's choices are records, chosen once (playbooks/config/choices.py:
# the environment's kind, a cluster's mode, a capacity option; the TPU
# generation: config/tpu.py): no code outside config/ compares their strings
# (==, !=, in, not in, a match case); it reads the record's fields. The
# trainer (shipped as it is, without playbooks/) holds none either.
CHOICE_WORDS = frozenset({*PLATFORMS, *MODES, *OPTIONS, *GENERATIONS})
CHOICE_CODE = ("playbooks", "tasks.py", "bench", "trainer")
_COMPARES = (ast.Eq, ast.NotEq, ast.In, ast.NotIn)


def _choice_words(node: ast.AST) -> list[str]:
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [e.value for e in items if isinstance(e, ast.Constant) and e.value in CHOICE_WORDS]


def choice_compares(source: str, where: str) -> list[str]:
    """Each compare of a choice's string in ``source``: a side of ==, !=,
    in or not in that is one (or a tuple, list or set holding one), or a
    match case on one."""
    out = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.Compare) and any(isinstance(op, _COMPARES) for op in n.ops):
            hit = any(_choice_words(side) for side in (n.left, *n.comparators))
        elif isinstance(n, ast.MatchValue):
            hit = bool(_choice_words(n.value))
        else:
            continue
        if hit:
            out.append(f"{where}:{n.lineno}: {ast.unparse(n)[:80]}")
    return out


def test_no_code_outside_config_compares_a_choice_of_the_inventory():
    paths = [p for top in CHOICE_CODE for p in ([ROOT / top] if top.endswith(".py") else (ROOT / top).rglob("*.py"))
             if p.relative_to(ROOT).parts[:2] != ("playbooks", "config")]
    found = [hit for p in paths for hit in choice_compares(p.read_text(), str(p.relative_to(ROOT)))]
    assert found == []
    assert any(p.relative_to(ROOT).parts[:2] == ("playbooks", "cli") for p in paths)
    assert not any(p.relative_to(ROOT).parts[:2] == ("playbooks", "config") for p in paths)


def test_the_choice_check_sees_a_compare_reintroduced():
    """Each form a string compare of a choice takes fails the check; a
    record's field, and a string of another meaning, do not."""
    for snippet in ('if env.kind == "local": pass', 'x = env.mode != "autopilot"', 'x = "standard" == mode',
                    'x = o in ("spot", "flex-start")', 'x = "reservation" not in capacities(env)',
                    'x = option == "on-demand"', 'x = env.tpu == "v6e"', 'x = kind in {"gke"}',
                    'match env.kind:\n    case "local": pass'):
        assert choice_compares(snippet, "t.py"), snippet
    for snippet in ('if env.platform.simulated: pass', 'x = env.cluster_mode.our_node_pools',
                    'x = status == "RUNNING"', 'x = {"spot": True}', 'f(capacity="on-demand")',
                    'x = kind not in tuple(PLATFORMS)'):
        assert choice_compares(snippet, "t.py") == [], snippet


def trainer_graph() -> dict[str, set[str]]:
    """The trainer's scripts (shipped flat, as the job's working directory):
    which of them each imports, inside functions too."""
    mods = {p.stem: p for p in (ROOT / "trainer").glob("*.py")}
    out: dict[str, set[str]] = {}
    for name, path in mods.items():
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names.add(node.module.split(".")[0])
        out[name] = {n for n in names if n in mods and n != name}
    return out


def test_the_trainer_scripts_import_each_other_without_a_cycle():
    """elastic_control uses maxtext_ray; maxtext_ray is given the elastic
    callbacks by the elastic trainer instead of importing them back."""
    graph = trainer_graph()
    assert "maxtext_ray" in graph["elastic_control"]
    assert cycles(graph) == []


def test_the_checks_see_a_cycle_a_play_importing_a_play_and_a_layer_broken():
    """The rules above can fail."""
    assert layering({"playbooks.config.schema": {"playbooks.cloud.gke"},
                     "playbooks.cloud.gke": {"playbooks.config.tpu"}}) == [
        "playbooks.config.schema imports playbooks.cloud.gke"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]
    assert "playbooks.plays.train" in PLAYS and "playbooks.job" not in PLAYS
    assert "playbooks.core.step" in GRAPH["playbooks.core.play"]


# No function longer than a screen, anywhere in the project's code.
LONGEST = 60
CODE = ("playbooks", "trainer", "tests", "bench", "scripts", "tasks.py")


def long_functions(root: Path) -> list[str]:
    out = []
    for top in CODE:
        paths = [root / top] if top.endswith(".py") else sorted((root / top).rglob("*.py"))
        for p in paths:
            for node in ast.walk(ast.parse(p.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None \
                        and node.end_lineno - node.lineno + 1 > LONGEST:
                    out.append(f"{p.relative_to(root)}:{node.lineno} {node.name} "
                               f"({node.end_lineno - node.lineno + 1} lines)")
    return out


def test_no_function_is_longer_than_a_screen(tmp_path):
    assert long_functions(ROOT) == []
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "long.py").write_text("def f():\n" + "    x = 1\n" * LONGEST)
    for top in CODE:
        if not (tmp_path / top).exists():
            (tmp_path / top).mkdir() if not top.endswith(".py") else (tmp_path / top).write_text("")
    assert long_functions(tmp_path) == [f"tests/long.py:1 f ({LONGEST + 1} lines)"]


def test_every_trainer_variable_the_job_sets_is_one_the_trainer_reads():
    """The trainer is shipped alone to the Ray cluster and cannot import
    the plays: each TRAINER_* name lives in both (spec.py sets it, a
    trainer module reads it). A name set and never read, or misspelt on one
    side, fails here. Read only by the trainer: its own knobs, unset by the
    job (a default of the trainer's)."""
    import re
    names = re.compile(r'"(TRAINER_[A-Z0-9_]+)"')
    trainer = {n for f in (ROOT / "trainer").glob("*.py") for n in names.findall(f.read_text())}
    job = set(names.findall((ROOT / "playbooks" / "job" / "spec.py").read_text()))
    assert job and job <= trainer, f"set by the job, read by no trainer module: {sorted(job - trainer)}"
    assert trainer - job == {"TRAINER_EXPECTED_MODEL", "TRAINER_LOSS_SETTLE_S", "TRAINER_PREIMPORT",
                             "TRAINER_NOTICE_POLL_S"}, \
        sorted(trainer - job)
