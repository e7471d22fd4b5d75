"""The layout is the architecture: layers import only downwards, no module imports itself back in
a cycle, modules stay small, and each fact has one owner (metric keys, the λ label).

Layers, bottom up (docs/DESIGN.md, "Layout"): the shared vocabulary (top-level modules) and the
estimators; the agent; runs; insight and the lab; the CLI. Pages and app.py sit on top and are
the only code that imports Streamlit.
"""

from __future__ import annotations

import ast
import itertools
from collections import defaultdict
from pathlib import Path

import pytest

import gae_core
from gae_core import metrics as M

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gae_core"

VOCABULARY = {"errors", "metrics", "outcome", "labels", "trajectory", "inert", "version",
              "env_modules"}  # fmt: skip
#: What each part may import from gae_core (besides itself and the vocabulary).
ALLOWED = {
    "vocabulary": set(),
    "estimators": set(),
    "agent": {"estimators"},
    "storage": set(),
    "runs": {"estimators", "agent", "storage"},
    "insight": {"estimators", "agent", "runs", "storage"},
    "lab": {"estimators", "agent", "runs", "insight", "storage"},
    "cli": {"estimators", "agent", "runs", "insight", "lab", "storage"},
    "package": {"estimators"},  # gae_core/__init__.py re-exports the estimators
}
#: Storage modules never import the agent (they keep bytes and records, not trainers): the whole
#: storage package, which imports nothing but the vocabulary (``ALLOWED["storage"]``).
STORAGE = {
    "database", "store", "schema", "records", "ownership", "table", "sweep_table", "lab_table",
    "retention",
}  # fmt: skip
MAX_LINES = 500
#: The dashboard's own files outside pages/: the server with its export routes, the main script.
APP_FILES = (ROOT / "app.py", ROOT / "dashboard.py")


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def part(module: str) -> str:
    pieces = module.split(".")
    if len(pieces) == 1 or pieces[1] == "__main__":
        return "package"
    if pieces[1] in VOCABULARY:
        return "vocabulary"
    return pieces[1]


def imports(path: Path) -> set[str]:
    """gae_core modules imported by the file (top level and inside functions)."""
    known = modules()
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("gae_core")}
        elif (
            isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gae_core")
        ):
            for alias in node.names:
                # `from gae_core.x import y`: the module y if it is one, else the package x
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in known else node.module)
    return {name for name in found if name in known}


def test_layers_import_only_downwards():
    problems = []
    for module, path in modules().items():
        mine = part(module)
        for target in imports(path):
            theirs = part(target)
            if theirs in (mine, "vocabulary") or theirs in ALLOWED[mine]:
                continue
            if mine == "package" and module == "gae_core.__main__" and theirs == "cli":
                continue
            problems.append(f"{module} ({mine}) imports {target} ({theirs})")
    assert problems == []


def test_storage_never_imports_the_agent_and_vocabulary_imports_no_layer():
    stored = {m for m in modules() if part(m) == "storage" and m != "gae_core.storage"}
    assert stored == {f"gae_core.storage.{name}" for name in STORAGE}  # the folder is the layer
    for module in stored:
        assert not [t for t in imports(modules()[module]) if part(t) == "agent"], module
    for module, path in modules().items():
        if part(module) == "vocabulary":
            assert {part(t) for t in imports(path)} <= {"vocabulary"}, module


def test_no_import_cycles():
    graph = defaultdict(set)
    for module, path in modules().items():
        graph[module] = {t for t in imports(path) if t != module}

    def visit(node, stack, done):
        if node in stack:
            cycle = [*stack[stack.index(node) :], node]
            # a package importing its own submodule is not a cycle of modules
            if not all(b.startswith(a + ".") for a, b in itertools.pairwise(cycle)):
                pytest.fail(f"import cycle: {' -> '.join(cycle)}")
            return
        if node in done:
            return
        for target in graph[node]:
            visit(target, [*stack, node], done)
        done.add(node)

    done: set[str] = set()
    for module in graph:
        visit(module, [], done)


def test_no_library_module_over_500_lines():
    long = {
        str(path.relative_to(ROOT)): n
        for path in PACKAGE.rglob("*.py")
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def _string_constants(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        and id(node) not in docstrings
    ]  # fmt: skip


def test_each_metric_key_is_written_once_in_the_package_and_pages():
    sources = [*PACKAGE.rglob("*.py"), *(ROOT / "pages").glob("*.py"), *APP_FILES]
    counts = {m.key: 0 for m in M.REGISTRY.values()}
    for path in sources:
        for value in _string_constants(path):
            if value in counts:
                counts[value] += 1
    assert counts == dict.fromkeys(counts, 1)


#: Modules whose prose still spells λ itself (not labels of a value): the field help texts and
#: the preset notes. Empty this once they take the symbol from gae_core.labels.
LAMBDA_PROSE = {"gae_core/agent/config.py", "gae_core/agent/presets.py"}


def test_the_lambda_label_has_one_owner():
    # Any string the package, the pages or the app show (f-string pieces included, docstrings
    # and comments not) that spells λ: names, assignments (λ = 0.95) and prose alike come from
    # gae_core.labels, so the symbol is written once.
    sources = [*PACKAGE.rglob("*.py"), *(ROOT / "pages").glob("*.py"), *APP_FILES]
    spelled = {
        f"{path.relative_to(ROOT)}: {value!r}"
        for path in sources
        if str(path.relative_to(ROOT)) not in {"gae_core/labels.py", *LAMBDA_PROSE}
        for value in _string_constants(path)
        if "λ" in value
    }
    assert spelled == set()
    assert "λ" in _string_constants(PACKAGE / "labels.py")


def test_metric_keys_follow_cleanrl_namespaces():
    # The one place the tests spell keys out: the names users see in CSV files and charts.
    assert M.EPISODIC_RETURN.key == "charts/episodic_return"
    assert M.VALUE_LOSS.key == "losses/value_loss"
    assert {m.namespace for m in M.REGISTRY.values()} == {
        "charts",
        "eval",
        "losses",
        "advantages",
        "perf",
    }
    assert len({m.column for m in M.REGISTRY.values()}) == len(M.REGISTRY)  # CSV columns


def test_the_version_has_one_owner_and_pyproject_agrees():
    import tomllib

    from gae_core.version import __version__

    with (ROOT / "pyproject.toml").open("rb") as handle:
        assert tomllib.load(handle)["project"]["version"] == __version__
    assert gae_core.__version__ == __version__


def test_a_runs_report_meets_the_store_in_one_place():
    """What a run reports (flush, checkpoint, finish) is written into the store by
    ``runs/sinks.apply`` alone, whatever carried it (the run's own process, a worker's pipe, a
    Ray inbox): a second call that flushes rows or saves a checkpoint would be a second
    mapping of the message onto the store."""
    calls = defaultdict(list)
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                on_store = "store" in ast.unparse(node.func.value)  # not a sink's own method
                if node.func.attr in ("save_checkpoint", "flush") and on_store:
                    calls[node.func.attr].append(str(path.relative_to(ROOT)))
    assert calls == {"save_checkpoint": ["gae_core/runs/sinks.py"],
                     "flush": ["gae_core/runs/sinks.py"]}  # fmt: skip
