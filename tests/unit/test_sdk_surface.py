"""The SDK's top-level names are what connector authors import, and no more: every name of
``epochal_sdk.__all__`` is imported by a connector of this repository, a guide or a test
plugin, there are at most 30 of them, and none is a second name for another."""

from __future__ import annotations

import ast
import inspect
import re
import types
from pathlib import Path

import epochal_sdk

ROOT = Path(__file__).resolve().parents[2]
MOST_NAMES = 30
_IMPORT = re.compile(r"from epochal_sdk import \(([^)]*)\)|from epochal_sdk import ([^\n(]+)")


def _imported_by_authors() -> set[str]:
    """The names imported ``from epochal_sdk`` by the connectors, the guides and
    docs/authors/connectors.md, and the test plugins."""
    found: set[str] = set()
    code = [
        *(ROOT / "connectors").glob("*/*/**/*.py"),
        *(ROOT / "tests" / "unit" / "plugins").glob("**/*.py"),
        *(ROOT / "tests" / "spark" / "plugins").glob("**/*.py"),
    ]
    for path in code:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "epochal_sdk":
                found |= {alias.name for alias in node.names}
    authors = ROOT / "docs" / "authors"
    for page in [*(authors / "guides").glob("*.md"), authors / "connectors.md"]:
        for match in _IMPORT.finditer(page.read_text()):
            names = (match.group(1) or match.group(2)).replace("\n", " ").split(",")
            found |= {n.split()[0] for n in names if n.strip()}
    return found


def test_every_exported_name_is_one_authors_import() -> None:
    unused = sorted(set(epochal_sdk.__all__) - _imported_by_authors())
    assert not unused, f"exported but imported by no connector, guide or plugin: {unused}"


def test_at_most_thirty_names_and_no_aliases() -> None:
    assert len(epochal_sdk.__all__) <= MOST_NAMES, len(epochal_sdk.__all__)
    objects = [getattr(epochal_sdk, name) for name in epochal_sdk.__all__]
    named = [
        (n, o)
        for n, o in zip(epochal_sdk.__all__, objects, strict=True)
        if not isinstance(o, types.GenericAlias) and (inspect.isclass(o) or inspect.isfunction(o))
    ]
    aliases = [n for n, o in named if o.__name__ != n]
    assert not aliases, f"exported under another name than their own: {aliases}"
    assert len(named) >= len(objects) - 2  # the type aliases Offsets and Schema
    assert len({id(o) for o in objects}) == len(objects)
