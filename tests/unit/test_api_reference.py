"""The SDK's API reference (``docs/authors/api``, Sphinx autodoc + napoleon) is the whole API: it
builds without a warning (``nitpicky``: a broken cross-reference is one), every name of
``epochal_sdk.__all__`` and every public method and attribute of its classes has a docstring,
and every argument of a public method or function is named in its docstring.

Build it by hand:
``python -m sphinx -W --keep-going -b html docs/authors/api docs/authors/api/_build``.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import epochal_sdk

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "authors" / "api"
SDK_MODULES = tuple(
    f"epochal_sdk.{path.stem}"
    for path in sorted((ROOT / "sdk" / "epochal_sdk").glob("*.py"))
    if path.stem != "__init__"
)
SECTION = re.compile(r"^(\s*)(Args|Arguments|Attributes|Parameters):\s*$")

# Sphinx's own napoleon uses an autodoc interface that Sphinx itself deprecates
pytestmark = pytest.mark.filterwarnings("ignore:The mapping interface for autodoc options")


def _sphinx() -> Any:
    try:
        from sphinx.cmd.build import build_main
    except ImportError:  # a clear failure, never a skip: CI must build the reference
        pytest.fail(
            "Sphinx is not installed: it is a dev extra of the workspace (pyproject.toml); "
            "run `python3 scripts/install.py --force`",
            pytrace=False,
        )
    return build_main


def test_the_reference_builds_without_a_warning(tmp_path: Path) -> None:
    build_main = _sphinx()
    warnings = tmp_path / "warnings.txt"
    args = ["-E", "-W", "--keep-going", "-q", "-w", str(warnings), "-b", "html"]
    code = build_main([*args, str(REFERENCE), str(tmp_path / "html")])
    text = warnings.read_text() if warnings.exists() else ""
    assert code == 0, f"the API reference does not build cleanly:\n{text}"
    assert not text.strip(), text
    page = (tmp_path / "html" / "sources.html").read_text()
    for name in ("ReplayableSource", "AcknowledgingSource", "receive", "max_unacknowledged"):
        assert name in page, f"{name} is missing from the reference's sources page"


# -- the docstring check ---------------------------------------------------------------------
def _own_doc(obj: Any) -> str:
    """An object's own docstring ('' when it has none, or only the one a dataclass or a
    base class makes up)."""
    if isinstance(obj, staticmethod | classmethod):
        obj = obj.__func__
    if isinstance(obj, property):
        return (obj.fget.__doc__ if obj.fget else "") or obj.__doc__ or ""
    doc = getattr(obj, "__doc__", None) or ""
    if inspect.isclass(obj) and doc.startswith(f"{obj.__name__}("):  # dataclass's own
        return ""
    return doc.strip()


def _attribute_docs() -> dict[tuple[str, str], str]:
    """Attribute docstrings (the string after an assignment) of every SDK module, by
    (class name or '', attribute name), as Sphinx finds them."""
    from sphinx.pycode import ModuleAnalyzer

    found: dict[tuple[str, str], str] = {}
    for module in SDK_MODULES:
        for key, lines in ModuleAnalyzer.for_module(module).find_attr_docs().items():
            if "".join(lines).strip():
                found[key] = "".join(lines)
    return found


def _listed(doc: str) -> set[str]:
    """The names a docstring's ``Args:``/``Attributes:`` sections describe."""
    names: set[str] = set()
    indent: str | None = None
    for line in doc.splitlines():
        match = SECTION.match(line)
        if match:
            indent = match.group(1)
            continue
        if indent is None:
            continue
        if line.strip() and not line.startswith(indent + " "):
            indent = None  # the section ended
            continue
        entry = re.match(r"^\s+(\*{0,2}\w+)\s*(\([^)]*\))?:", line)
        if entry and len(line) - len(line.lstrip()) <= len(indent) + 4:
            names.add(entry.group(1).lstrip("*"))
    return names


def _sdk_classes(cls: type) -> Iterator[type]:
    """``cls`` and its bases defined in the SDK."""
    for klass in cls.__mro__:
        if klass.__module__.startswith("epochal_sdk"):
            yield klass


def _public_names() -> list[tuple[str, Any]]:
    return [(name, getattr(epochal_sdk, name)) for name in epochal_sdk.__all__]


def test_every_public_name_and_member_has_a_docstring() -> None:
    _sphinx()
    attribute_docs = _attribute_docs()
    missing = []
    for name, obj in _public_names():
        if inspect.isclass(obj) or inspect.isfunction(obj):
            if not _own_doc(obj):
                missing.append(f"epochal_sdk.{name}")
        elif not any(key == ("", name) for key in attribute_docs):  # a type alias
            missing.append(f"epochal_sdk.{name} (an alias: document it with a string below it)")
        if not inspect.isclass(obj):
            continue
        for klass in _sdk_classes(obj):
            listed = _listed(_own_doc(klass))
            for member, value in vars(klass).items():
                if member.startswith("_"):
                    continue
                where = f"epochal_sdk.{name}.{member} (in {klass.__name__})"
                if callable(value) or isinstance(value, property | staticmethod | classmethod):
                    if not _own_doc(value):
                        missing.append(where)
                elif (klass.__name__, member) not in attribute_docs and member not in listed:
                    missing.append(f"{where}: an attribute, in no Attributes: section")
            for field in getattr(klass, "__annotations__", {}):
                if field.startswith("_") or field in vars(klass):  # checked above
                    continue
                documented = (klass.__name__, field) in attribute_docs or field in listed
                if not documented and not isinstance(getattr(klass, field, None), enum.Enum):
                    missing.append(f"epochal_sdk.{name}.{field} (a field of {klass.__name__})")
    assert not missing, "public names without a docstring:\n" + "\n".join(sorted(set(missing)))


def _parameters(function: Any) -> list[str]:
    names = []
    for parameter in inspect.signature(function).parameters.values():
        if parameter.name in ("self", "cls") or parameter.kind in (
            parameter.VAR_POSITIONAL,
            parameter.VAR_KEYWORD,
        ):
            continue
        names.append(parameter.name)
    return names


def _names(doc: str, name: str) -> bool:
    """Whether a docstring describes argument ``name`` (an ``Args:`` entry, or ``name`` in
    double backquotes in its text)."""
    return name in _listed(doc) or f"``{name}``" in doc


def test_every_argument_is_described() -> None:
    undescribed = []
    for name, obj in _public_names():
        if inspect.isfunction(obj):
            undescribed += [
                f"epochal_sdk.{name}({p})" for p in _parameters(obj) if not _names(obj.__doc__, p)
            ]
        if not inspect.isclass(obj):
            continue
        for klass in _sdk_classes(obj):
            init = vars(klass).get("__init__")
            if init is not None and not issubclass(klass, enum.Enum):
                doc = _own_doc(klass)
                undescribed += [
                    f"epochal_sdk.{name}({p}) (the constructor of {klass.__name__})"
                    for p in _parameters(init)
                    if not _names(doc, p) and p not in getattr(klass, "__annotations__", {})
                ]
            for member, value in vars(klass).items():
                if member.startswith("_"):
                    continue
                bound = isinstance(value, staticmethod | classmethod)
                function = value.__func__ if bound else value
                if not inspect.isfunction(function):
                    continue
                doc = function.__doc__ or ""
                undescribed += [
                    f"epochal_sdk.{name}.{member}({p}) (in {klass.__name__})"
                    for p in _parameters(function)
                    if not _names(doc, p)
                ]
    assert not undescribed, "arguments no docstring describes:\n" + "\n".join(
        sorted(set(undescribed))
    )


def test_the_check_sees_a_missing_docstring() -> None:
    """The checks above can fail: a class without a docstring, an attribute in no section
    and an argument nobody describes are all found."""

    class Bare:
        size: int = 0

        def method(self, amount: int) -> None:
            """Does something."""

    assert _own_doc(Bare) == ""
    assert "size" not in _listed(_own_doc(Bare))
    assert not _names(Bare.method.__doc__ or "", "amount")
    described = """Summary.

    Args:
        amount: how much.
        other (int): typed.
    """
    assert _listed(described) == {"amount", "other"}
    assert importlib.import_module("epochal_sdk.sources").__doc__
