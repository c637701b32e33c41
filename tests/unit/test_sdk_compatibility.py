"""An SDK upgrade breaks no connector that worked: every public name the SDK has exported is
in ``tests/unit/sdk_api.json`` with its signature, and stays where it was with that signature.

The snapshot holds, for ``epochal_sdk`` and each public module ``epochal_sdk.<module>``, every
public name (a module's ``__all__``, else the names the module defines; no leading
underscore): for a class, its constructor's signature and its public methods (with their
signatures), properties, fields and attributes, its own and those it inherits from the SDK;
for a function, its signature; for any other value, its type. The names deprecated in
``epochal_sdk._deprecated.MOVED`` are in it too, under the module they left, described by
what they stand for.

A name that goes from its module without an entry in ``MOVED`` fails the test, and so does a
changed signature or a member that goes. A new name only warns; record it with::

    python -m tests.unit.test_sdk_compatibility --write

(from the repository's root, the SDK on the path; without ``--write`` it prints the
differences). Every deprecated name imports from where it was, warns with a
``DeprecationWarning`` that names its new home, and is in no ``__all__``.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import enum
import importlib
import inspect
import json
import sys
import tomllib
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from epochal_sdk._deprecated import MOVED, message

ROOT = Path(__file__).resolve().parents[2]
SDK = ROOT / "sdk" / "epochal_sdk"
SNAPSHOT = Path(__file__).with_name("sdk_api.json")
WRITE = "python -m tests.unit.test_sdk_compatibility --write"

Api = dict[str, dict[str, dict[str, Any]]]
"""Module → public name → its description."""


class NewNames(UserWarning):
    """Public names the snapshot does not hold yet."""


# -- what the SDK exports --------------------------------------------------------------------
def public_modules() -> list[str]:
    """``epochal_sdk`` and each of its modules whose name does not start with ``_``."""
    modules = sorted(f"epochal_sdk.{p.stem}" for p in SDK.glob("*.py") if p.stem[0] != "_")
    return ["epochal_sdk", *modules]


def _bound(statements: list[ast.stmt]) -> list[str]:
    """The names these top-level statements define (imports left out), also inside ``if``
    and ``try``."""
    names: list[str] = []
    for node in statements:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.append(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names += [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
        elif isinstance(node, ast.If):
            names += _bound(node.body) + _bound(node.orelse)
        elif isinstance(node, ast.Try):
            names += _bound(node.body) + _bound(node.orelse) + _bound(node.finalbody)
            for handler in node.handlers:
                names += _bound(handler.body)
    return names


def public_names(module: ModuleType) -> list[str]:
    """A module's public names: its ``__all__``, else the names it defines (not those it
    imports), that exist when it runs and start with no ``_``."""
    listed = getattr(module, "__all__", None)
    if listed is not None:
        return sorted(listed)
    tree = ast.parse(Path(inspect.getfile(module)).read_text())
    return sorted({n for n in _bound(tree.body) if n[0] != "_" and n in vars(module)})


def _annotation(value: Any) -> str:
    if value is inspect.Parameter.empty:
        return "?"
    return value if isinstance(value, str) else inspect.formatannotation(value)


def _signature(function: Any) -> str:
    try:
        return str(inspect.signature(function))
    except (TypeError, ValueError):  # a builtin without one
        return "?"


def _member(value: Any) -> str:
    """How a class attribute reads in the snapshot."""
    if isinstance(value, staticmethod | classmethod):
        return f"{type(value).__name__} {_signature(value.__func__)}"
    if isinstance(value, property):
        settable = " (settable)" if value.fset else ""
        returns = inspect.signature(value.fget).return_annotation if value.fget else "?"
        return f"property{settable} -> {_annotation(returns)}"
    if inspect.isfunction(value):
        abstract = "abstract " if getattr(value, "__isabstractmethod__", False) else ""
        return f"{abstract}method {_signature(value)}"
    if inspect.isclass(value):
        return "class"
    return f"value: {type(value).__name__}"


def describe_class(cls: type) -> dict[str, Any]:
    """A class's constructor and public members: its own and those of its SDK bases."""
    out: dict[str, Any] = {"kind": "class"}
    sdk_classes = [k for k in cls.__mro__ if k.__module__.startswith("epochal_sdk")]
    members: dict[str, str] = {}
    if issubclass(cls, enum.Enum):
        members |= {name: f"member {m.value!r}" for name, m in cls.__members__.items()}
    else:
        init = next((vars(k)["__init__"] for k in sdk_classes if "__init__" in vars(k)), None)
        if init is not None:
            out["signature"] = _signature(init)
    if dataclasses.is_dataclass(cls):
        members |= {f.name: f"field: {_annotation(f.type)}" for f in dataclasses.fields(cls)}
    elif issubclass(cls, tuple) and hasattr(cls, "_fields"):  # a NamedTuple
        hints = getattr(cls, "__annotations__", {})
        members |= {f: f"field: {_annotation(hints.get(f, '?'))}" for f in cls._fields}
    for klass in sdk_classes:
        for name, value in vars(klass).items():
            if name[0] != "_" and name not in members:
                members[name] = _member(value)
    out["members"] = dict(sorted(members.items()))
    return out


def describe(value: Any) -> dict[str, Any]:
    """A public name's description in the snapshot."""
    if inspect.isclass(value):
        return describe_class(value)
    if inspect.isfunction(value) or inspect.isbuiltin(value):
        return {"kind": "function", "signature": _signature(value)}
    return {"kind": "value", "type": type(value).__name__}


def api() -> Api:
    """Every public name of the SDK as it is, and every deprecated one (marked ``moved_to``)."""
    out: Api = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for name in public_modules():
            module = importlib.import_module(name)
            out[name] = {n: describe(getattr(module, n)) for n in public_names(module)}
        for old, new in MOVED.items():
            module_name, _, name = old.rpartition(".")
            entry = describe(getattr(importlib.import_module(module_name), name))
            out.setdefault(module_name, {})[name] = {
                **entry,
                "moved_to": f"{new.module}.{new.name}",
            }
    return {m: dict(sorted(names.items())) for m, names in out.items()}


# -- what changed ----------------------------------------------------------------------------
def _changes(path: str, was: dict[str, Any], now: dict[str, Any]) -> tuple[list[str], list[str]]:
    """What breaks and what is new between two descriptions of one name."""
    broken, added = [], []
    for key in sorted((set(was) | set(now)) - {"members", "moved_to"}):
        if was.get(key) != now.get(key):
            broken.append(f"{path} changed its {key}: was {was.get(key)}, now {now.get(key)}")
    old_members, members = was.get("members", {}), now.get("members", {})
    for name, old in old_members.items():
        if name not in members:
            broken.append(f"{path}.{name} is gone (was {old})")
        elif members[name] != old:
            broken.append(f"{path}.{name} changed: was {old}, now {members[name]}")
    added += [f"{path}.{name}" for name in members if name not in old_members]
    return broken, added


def differences(old: Api, new: Api) -> tuple[list[str], list[str]]:
    """What breaks a connector written against ``old`` (names gone, signatures and members
    changed or gone), and what ``new`` adds."""
    broken: list[str] = []
    added: list[str] = []
    for module, names in old.items():
        current = new.get(module, {})
        for name, was in names.items():
            path = f"{module}.{name}"
            if name not in current:
                broken.append(
                    f"{path} is gone: keep it importable from {module} with an entry in MOVED "
                    "(sdk/epochal_sdk/_deprecated.py) that names its new home"
                )
                continue
            more_broken, more_added = _changes(path, was, current[name])
            broken += more_broken
            added += more_added
        added += [f"{module}.{name}" for name in current if name not in names]
    added += [f"{module}.{name}" for module in new if module not in old for name in new[module]]
    return broken, added


def _snapshot() -> Api:
    loaded: Api = json.loads(SNAPSHOT.read_text())
    return loaded


# -- the tests -------------------------------------------------------------------------------
def test_no_public_name_goes_or_changes() -> None:
    broken, added = differences(_snapshot(), api())
    if added:
        warnings.warn(
            NewNames(f"new names: {', '.join(added)} — add them to {SNAPSHOT.name} with `{WRITE}`"),
            stacklevel=1,
        )
    assert not broken, (
        "a connector written against the SDK the snapshot records breaks (keep the old name "
        f"or signature working; then `{WRITE}`):\n" + "\n".join(broken)
    )


def test_the_check_sees_a_name_go_a_signature_change_and_a_new_name() -> None:
    old: Api = {
        "m": {
            "f": {"kind": "function", "signature": "(a)"},
            "g": {"kind": "function", "signature": "(a)"},
            "C": {"kind": "class", "members": {"x": "method (self)", "y": "property -> 'int'"}},
        }
    }
    new: Api = {
        "m": {
            "f": {"kind": "function", "signature": "(a, b)"},
            "C": {"kind": "class", "members": {"x": "method (self)", "z": "method (self)"}},
            "h": {"kind": "value", "type": "int"},
        }
    }
    broken, added = differences(old, new)
    assert broken == [
        "m.f changed its signature: was (a), now (a, b)",
        "m.g is gone: keep it importable from m with an entry in MOVED "
        "(sdk/epochal_sdk/_deprecated.py) that names its new home",
        "m.C.y is gone (was property -> 'int')",
    ]
    assert added == ["m.C.z", "m.h"]
    assert differences(old, old) == ([], [])


def test_the_snapshot_describes_signatures_and_members() -> None:
    snapshot = _snapshot()
    context = snapshot["epochal_sdk"]["ConnectorContext"]
    assert context["signature"].startswith("(self, job: 'str' = 'default', part_id: 'str' = ''")
    assert context["members"]["txn"] == "property -> TransactionId"
    assert snapshot["epochal_sdk"]["Field"] == snapshot["epochal_sdk.schema"]["Field"] | {
        "moved_to": "epochal_sdk.schema.Field"
    }
    assert "annotations" not in snapshot["epochal_sdk.schema"]  # imported, not defined there


@pytest.mark.parametrize("old", sorted(MOVED))
def test_every_deprecated_name_imports_from_where_it_was_and_warns(old: str) -> None:
    module_name, _, name = old.rpartition(".")
    new = MOVED[old]
    target = getattr(importlib.import_module(new.module), new.name)
    namespace: dict[str, Any] = {}
    with pytest.warns(DeprecationWarning) as caught:
        exec(f"from {module_name} import {name}", namespace)
    assert namespace[name] is target
    assert {str(w.message) for w in caught} == {message(old)}
    text = message(old)
    assert f"{old} is deprecated" in text and new.module in text and new.removed_in in text
    assert f"from {new.module} import {new.name}" in text  # the one-line fix


def test_the_warning_points_at_the_code_that_uses_the_name() -> None:
    import epochal_sdk

    with pytest.warns(DeprecationWarning, match=r"import it from epochal_sdk\.schema") as caught:
        field = epochal_sdk.Field
    assert field.__module__ == "epochal_sdk.schema"
    assert [Path(w.filename).resolve() for w in caught] == [Path(__file__).resolve()]


@pytest.mark.parametrize("old", sorted(MOVED))
def test_a_deprecated_name_is_in_no_all_and_its_new_home_is_not_deprecated(old: str) -> None:
    module_name, _, name = old.rpartition(".")
    module = importlib.import_module(module_name)
    assert name not in getattr(module, "__all__", ()), f"{old} is deprecated: not in __all__"
    assert name not in vars(module), f"{module_name} defines {name}: drop {old} from MOVED"
    namespace: dict[str, Any] = {}
    exec(f"from {module_name} import *", namespace)
    assert name not in namespace
    new = MOVED[old]
    assert f"{new.module}.{new.name}" not in MOVED
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        getattr(importlib.import_module(new.module), new.name)  # no warning from the new home


def test_deprecated_names_go_only_after_the_sdk_version() -> None:
    version = tomllib.loads((ROOT / "sdk" / "pyproject.toml").read_text())["project"]["version"]

    def parts(text: str) -> tuple[int, ...]:
        return tuple(int(p) for p in text.split("."))

    due = sorted(old for old, new in MOVED.items() if parts(new.removed_in) <= parts(version))
    assert not due, f"epochal-sdk is {version}: remove {due} from MOVED, then `{WRITE}`"


def test_an_unknown_name_is_an_attribute_error_without_a_warning() -> None:
    import epochal_sdk
    import epochal_sdk.sinks

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for module in (epochal_sdk, epochal_sdk.sinks):
            assert not hasattr(module, "NoSuchName")
            with pytest.raises(AttributeError, match=f"module '{module.__name__}' has no"):
                module.NoSuchName  # noqa: B018


def test_the_authors_page_states_which_sdk_versions_a_connector_works_with() -> None:
    page = (ROOT / "docs" / "authors" / "connectors.md").read_text()
    assert "## Compatibility" in page
    for new in MOVED.values():
        assert new.removed_in in page, f"connectors.md does not say {new.removed_in}"


# -- python -m tests.unit.test_sdk_compatibility [--write] -----------------------------------
def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description="The SDK's API snapshot (tests/unit/sdk_api.json)."
    )
    parser.add_argument("--write", action="store_true", help="write the snapshot from the tree")
    args = parser.parse_args(argv)
    current = api()
    broken, added = differences(_snapshot(), current) if SNAPSHOT.exists() else ([], [])
    for line in broken:
        print(f"breaks: {line}")
    for line in added:
        print(f"new: {line}")
    if args.write:
        SNAPSHOT.write_text(
            json.dumps(current, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
        )
        print(f"wrote {SNAPSHOT.relative_to(ROOT)}")
        return 0
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
