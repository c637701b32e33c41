"""Install the workspace's distributions (editable) and the dev tools; quick when done."""

from __future__ import annotations

import glob
import importlib.util
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = [
    "sdk",
    "core_runtime",
    *sorted(
        os.path.relpath(os.path.dirname(p), ROOT)
        for p in glob.glob(os.path.join(ROOT, "connectors", "*", "pyproject.toml"))
    ),
]
DEV = ["pytest>=8", "pytest-timeout>=2.3", "ruff>=0.6"]


def _installed() -> bool:
    connectors = [f"epochal_{os.path.basename(p)}" for p in PACKAGES if p.startswith("connectors")]
    wanted = ("epochal_sdk", "epochal", "pytest", "pytest_timeout", "pyspark", *connectors)
    for name in wanted:
        spec = importlib.util.find_spec(name)
        if spec is None:
            return False
        origin = spec.origin or ""
        if name.startswith("epochal") and not origin.startswith(ROOT + os.sep):
            return False  # installed from another checkout: reinstall from this one
    return True


def main() -> None:
    if _installed() and "--force" not in sys.argv:
        print("install: epochal packages already installed (use --force to reinstall)")
        return
    args = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    for package in PACKAGES:
        args += ["-e", os.path.join(ROOT, package)]
    subprocess.run([*args, *DEV], check=True)
    print("install: done")


if __name__ == "__main__":
    main()
