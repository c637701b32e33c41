"""The runtime's package layout holds: no import cycles between modules, nothing outside the
kit imports the kit, state and protocols stay free of Spark, connectors use the SDK only."""

from __future__ import annotations

import ast
import collections
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ROOT / "core_runtime"


def _modules() -> dict[str, Path]:
    out = {}
    for path in (RUNTIME / "epochal").rglob("*.py"):
        name = ".".join(path.relative_to(RUNTIME).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _imports(path: Path, names: set[str], top_level: bool) -> set[str]:
    """The epochal modules ``path`` imports (at module level only, or anywhere)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("epochal"):
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                found.add(child if child in names else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("epochal")}
    return {f for f in found if f in names}


def test_no_module_of_the_runtime_imports_one_that_imports_it_back() -> None:
    modules = _modules()
    graph = {m: _imports(p, set(modules), top_level=True) - {m} for m, p in modules.items()}
    cycles = []
    for start in graph:  # a path back to ``start``, if any
        seen, todo = set(), collections.deque([(start, (start,))])
        while todo:
            node, path = todo.popleft()
            for nxt in graph[node]:
                if nxt == start:
                    cycles.append(" -> ".join((*path, start)))
                elif nxt not in seen:
                    seen.add(nxt)
                    todo.append((nxt, (*path, nxt)))
    assert not cycles, f"import cycles: {sorted(set(cycles))[:5]}"


def test_only_the_kit_imports_the_kit() -> None:
    modules = _modules()
    offenders = {
        name: sorted(i for i in _imports(path, set(modules), top_level=False) if ".testing" in i)
        for name, path in modules.items()
        if not name.startswith("epochal.testing")
    }
    assert not {k: v for k, v in offenders.items() if v}


def test_state_and_protocols_know_nothing_of_spark() -> None:
    for package in ("state", "protocols"):
        for path in (RUNTIME / "epochal" / package).glob("*.py"):
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
