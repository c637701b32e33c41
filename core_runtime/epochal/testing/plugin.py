"""The pytest plugin of the conformance kit (loaded through the ``pytest11`` entry point).

It parametrizes :class:`~epochal.testing.kit.ConformanceSuite` subclasses with their crash
cases and marks them ``conformance`` and ``spark``.
"""

from __future__ import annotations

from typing import Any

import pytest

from epochal.testing.kit import ConformanceSuite


def pytest_configure(config: Any) -> None:
    config.addinivalue_line("markers", "conformance: crash tests of the epochal conformance kit")
    config.addinivalue_line("markers", "spark: starts Spark")


def pytest_generate_tests(metafunc: Any) -> None:
    if "conformance_case" not in metafunc.fixturenames:
        return
    cls = metafunc.cls
    if cls is None or not issubclass(cls, ConformanceSuite):
        return
    cases = cls.cases()
    metafunc.parametrize("conformance_case", cases, ids=[c.id for c in cases])


def pytest_collection_modifyitems(items: list[Any]) -> None:
    for item in items:
        if "conformance_case" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.conformance)
            item.add_marker(pytest.mark.spark)
