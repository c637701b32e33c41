"""Install the workspace's distributions (editable) and the dev tools; quick when done."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

PACKAGES = ["sdk", "core_runtime", "connectors/map"]
DEV = ["pytest>=8", "pytest-timeout>=2.3", "ruff>=0.6"]


def _installed() -> bool:
    wanted = ("epochal_sdk", "epochal", "epochal_map", "pytest", "pytest_timeout", "pyspark")
    return all(importlib.util.find_spec(name) for name in wanted)


def main() -> None:
    if _installed() and "--force" not in sys.argv:
        print("install: epochal packages already installed (use --force to reinstall)")
        return
    args = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    for package in PACKAGES:
        args += ["-e", package]
    subprocess.run([*args, *DEV], check=True)
    print("install: done")


if __name__ == "__main__":
    main()
