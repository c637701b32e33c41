"""The runtime's package layout holds: its packages stand in one order and every import goes
down it (or stays in its package), no module imports one that imports it back, nothing outside
the kit imports the kit, state and protocols stay free of Spark, connectors use the SDK only
and none of their modules imports one that imports it back; the reference connectors import
without pyarrow.

Every import counts: at module level, inside functions, under ``TYPE_CHECKING``, ``import x``,
``from x import y`` and relative imports."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ROOT / "core_runtime"

LAYERS = [
    "base",
    "config",
    "state",
    "protocols",
    "parts",
    "metrics",
    "spark",
    "pipelines",
    "startup",
    "control",
    "driver",
    "api",
    "ops",
    "testing",
    "__main__",
    "__init__",
]
"""The runtime's packages and top-level modules (``epochal/<name>``), lowest first: a module
imports only from its own package and the ones before it. ``__init__`` is the package
``epochal`` itself (its lazy names)."""


def _modules(root: Path, package: str) -> dict[str, Path]:
    """Module name → file, for every module of ``package`` under ``root``."""
    out = {}
    for path in (root / package).rglob("*.py"):
        name = ".".join(path.relative_to(root).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _imports(name: str, path: Path, names: set[str]) -> set[str]:
    """The modules of ``names`` that module ``name`` (at ``path``) imports, anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*parts, base] if base else parts)
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
            child = next((t for t in targets[:-1] if t in names), None)
            targets = [child] if child else [base]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        for target in targets:
            while target and target not in names:  # ``import a.b.c``: the module a.b.c or above
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _graph(root: Path, package: str) -> dict[str, set[str]]:
    modules = _modules(root, package)
    return {m: _imports(m, p, set(modules)) for m, p in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_package_of_the_runtime_has_its_place_in_the_order() -> None:
    layers = {_layer(m) for m in _modules(RUNTIME, "epochal")}
    assert layers == set(LAYERS), (
        f"not in LAYERS: {sorted(layers - set(LAYERS))}; gone: {sorted(set(LAYERS) - layers)}"
    )


def test_the_architecture_document_states_the_same_order() -> None:
    text = (ROOT / "docs" / "explanation" / "architecture.md").read_text()
    start = text.index("`base` <")
    stated = text[start : text.index("\n\n", start)].replace("\n", " ")
    assert [name.strip().strip("`") for name in stated.split("<")] == LAYERS


def test_every_import_of_the_runtime_goes_down_the_order() -> None:
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    upward = sorted(
        f"{module} imports {target}"
        for module, targets in _graph(RUNTIME, "epochal").items()
        for target in targets
        if rank[_layer(target)] > rank[_layer(module)]
    )
    assert not upward, f"imports against the order {LAYERS}: {upward}"


def test_no_module_of_the_runtime_imports_one_that_imports_it_back() -> None:
    cycles = _cycles(_graph(RUNTIME, "epochal"))
    assert not cycles, f"import cycles: {cycles}"


def test_no_module_of_a_connector_imports_one_that_imports_it_back() -> None:
    packages = [
        (path.parent.parent, path.parent.name)
        for path in sorted((ROOT / "connectors").glob("*/*/__init__.py"))
    ]
    assert len(packages) >= 8, packages  # epochal_<name> and pyspark_epochal_<name>, each
    cycles = {
        package: found for root, package in packages if (found := _cycles(_graph(root, package)))
    }
    assert not cycles, f"import cycles: {cycles}"


def test_the_import_graph_sees_imports_inside_functions_and_relative_ones(tmp_path: Path) -> None:
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "sub" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("def f():\n    from pkg.sub import b\n")
    (tmp_path / "pkg" / "sub" / "b.py").write_text("from .. import a\nimport pkg.sub.c as c\n")
    (tmp_path / "pkg" / "sub" / "c.py").write_text("from . import b\n")
    graph = _graph(tmp_path, "pkg")
    assert graph["pkg.a"] == {"pkg.sub.b"}
    assert graph["pkg.sub.b"] == {"pkg.a", "pkg.sub.c"}
    assert _cycles(graph) == [["pkg.a", "pkg.sub.b", "pkg.sub.c"]]


def test_only_the_kit_imports_the_kit() -> None:
    offenders = {
        module: sorted(t for t in targets if _layer(t) == "testing")
        for module, targets in _graph(RUNTIME, "epochal").items()
        if _layer(module) != "testing"
    }
    assert not {k: v for k, v in offenders.items() if v}


def test_state_and_protocols_know_nothing_of_spark() -> None:
    for package in ("state", "protocols"):
        for path in (RUNTIME / "epochal" / package).rglob("*.py"):
            text = path.read_text()
            assert "pyspark" not in text.replace("PySpark", ""), path


def test_connectors_use_the_sdk_and_no_runtime_module_names_their_options() -> None:
    for path in (ROOT / "connectors").glob("*/epochal_*/*.py"):
        if path.name == "testing.py":  # the connector's kit fixtures use the kit
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not (node.module == "epochal" or node.module.startswith("epochal.")), (
                    f"{path}: imports the runtime ({node.module})"
                )
    for path in (RUNTIME / "epochal").rglob("*.py"):
        text = path.read_text()
        for option in ("markerTable", "--dsn", "kafka.bootstrap.servers"):
            assert option not in text, f"{path} knows a connector's option ({option})"


ROWS_ONLY = {"epochal_jdbc.copy"}
"""Connector modules that only a task writing rows imports, and that import pyarrow."""


def test_the_reference_connectors_import_without_pyarrow() -> None:
    """Every module of the four reference connectors (but their kits and :data:`ROWS_ONLY`)
    imports without pyarrow: Spark's short-lived Python processes of a query (the data source
    lookup, create and commit workers) load them, and pyarrow costs each 0.1 s of CPU
    (docs/authors/connectors.md, "Where the code runs")."""
    script = f"""
import importlib, pkgutil, sys
loaded = []
for package in ("epochal_map", "epochal_kafka", "epochal_jdbc", "epochal_jms"):
    module = importlib.import_module(package)
    for found in pkgutil.walk_packages(module.__path__, package + "."):
        if found.name.endswith(".testing") or found.name in {sorted(ROWS_ONLY)!r}:
            continue
        importlib.import_module(found.name)
        loaded.append(found.name)
assert len(loaded) > 20, loaded
print("pyarrow" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.stdout.strip() == "False", done.stdout + done.stderr
