"""Sphinx configuration of the SDK's API reference, built from the docstrings of
``sdk/epochal_sdk`` (autodoc, Google-style sections read by napoleon).

Build it (seconds; a warning, a broken cross-reference included, fails the build)::

    python -m sphinx -W --keep-going -b html docs/authors/api docs/authors/api/_build

``tests/unit/test_api_reference.py`` builds it the same way and checks that every public
name has a docstring.
"""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "sdk"))  # this checkout's SDK, not an installed copy

project = "epochal SDK"
author = "the epochal authors"
release = "0.1.0"

extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]
exclude_patterns = ["_build"]
html_theme = "alabaster"
html_static_path: list[str] = []

# Google-style docstrings (Args:, Returns:, Raises:, Attributes:); attributes listed in a
# class docstring become attribute entries of the class (``:attr:`` references find them).
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = False
napoleon_use_rtype = False
napoleon_attr_annotations = False  # types are in the signatures

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
# full names in annotations (they parse and link), shown without their modules
autodoc_typehints_format = "fully-qualified"
python_use_unqualified_type_names = True
autodoc_default_options = {"members": True, "show-inheritance": True}
# Type aliases stay names in signatures (and link to their entries) instead of expanding.
autodoc_type_aliases = {
    "JSON": "epochal_sdk.sinks.JSON",
    "Offset": "epochal_sdk.sources.Offset",
    "Offsets": "epochal_sdk.sources.Offsets",
    "Rows": "epochal_sdk.sources.Rows",
    "Schema": "epochal_sdk.schema.Schema",
}

# Every cross-reference must resolve: a broken one is a warning, and -W makes it an error.
# Only what lies outside this reference is exempt (Python's own types and pyarrow's: the
# build is offline, without intersphinx).
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(abc|builtins|collections\.abc|typing|contextlib|enum|re|pyarrow)\..*"),
    (r"py:.*", r"pyarrow\.RecordBatch|RecordBatch"),
    (
        r"py:.*",
        r"str|int|float|bool|bytes|dict|list|tuple|set|frozenset|object|type|None|Any"
        r"|Exception|ValueError|TypeError|KeyError|ConnectionError|TimeoutError"
        r"|Iterator|Iterable|Mapping|Sequence|Callable|ClassVar|Literal|TypeVar|T",
    ),
]


def _prose_attribute_docstring(app, what, name, obj, options, lines):
    """The docstrings of attributes and properties here are prose ("Where this object runs:
    ..."); napoleon would read a first line "text: more" as "type: description". An empty
    type in front keeps the line whole."""
    if what in ("attribute", "property", "data") and lines:
        lines[0] = f": {lines[0]}"


def _factory_defaults(app, what, name, obj, options, signature, return_annotation):
    """A dataclass field with a default factory shows as ``<factory>``, which does not parse
    as Python: the signature would lose its links. ``...`` stands for it."""
    if signature and "<factory>" in signature:
        return signature.replace("<factory>", "..."), return_annotation
    return None


def setup(app):
    """The prose hook runs before napoleon (priority 500) reads the docstrings."""
    app.connect("autodoc-process-docstring", _prose_attribute_docstring, priority=400)
    app.connect("autodoc-process-signature", _factory_defaults)
