"""The quick-start tests: the README's commands, run as a new user runs them."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``quickstart`` marker (deselect with ``-m "not quickstart"``)."""
    config.addinivalue_line(
        "markers",
        "quickstart: the README's quick start in a fresh virtual environment (a few minutes)",
    )
