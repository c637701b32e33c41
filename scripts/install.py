"""Install the workspace's distributions (editable) and the dev tools; quick when done.

    python3 scripts/install.py            # install (skipped when everything is there)
    python3 scripts/install.py --force    # reinstall
    python3 scripts/install.py --python   # print the interpreter that has the packages
    python3 scripts/install.py --check    # exit 1 and say what is missing, install nothing

Where: into the interpreter that runs this script (a virtual environment, a pyenv or conda
Python, any Python pip may change). A system Python that pip must not change (PEP 668
"externally managed", e.g. Debian's /usr/bin/python3) gets a virtual environment ``.venv``
in the repository instead, made once; ``--python`` names it, and the Makefile and
``scripts/test.sh`` run everything with it.

Nothing here or in the Makefile relies on console scripts being on PATH (pip puts them in
the interpreter's ``bin`` directory, where pyenv sees them only after ``pyenv rehash`` and
an inactive virtual environment not at all): the tools run as ``python -m epochal``,
``python -m ruff``, ``python -m pytest``.

The packages are installed in setuptools' ``compat`` editable mode (their directories on
``sys.path``), because PySpark finds the ``pyspark_epochal_*`` packages, which make
``format("epochal.<name>")`` work without ``epochal.register(spark)``, by listing
``sys.path`` (``pkgutil.iter_modules``); the default editable mode hides them behind an
import hook.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import pkgutil
import subprocess
import sys
import sysconfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, ".venv")
PACKAGES = [
    "sdk",
    "core_runtime",
    *sorted(
        os.path.relpath(os.path.dirname(p), ROOT)
        for p in glob.glob(os.path.join(ROOT, "connectors", "*", "pyproject.toml"))
    ),
]
DEV_MODULES = (
    "pytest",
    "pytest_timeout",
    "xdist",
    "ruff",
    "grpc",
    "grpc_status",
    "zstandard",
    "sphinx",
    "mypy",
    "wheel",
)
"""Modules of the dev tools (the workspace's dev extras) that ``--check`` looks for."""


def dev_requirements() -> list[str]:
    """The dev tools: the workspace's dev extras (``pyproject.toml``,
    ``[project.optional-dependencies] dev``), the one list of them."""
    import tomllib  # Python 3.11+, checked in main() before this runs

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as fh:
        return list(tomllib.load(fh)["project"]["optional-dependencies"]["dev"])


def _externally_managed() -> bool:
    """Whether this is a system Python that pip must not install into (PEP 668)."""
    if sys.prefix != sys.base_prefix:  # a virtual environment is never externally managed
        return False
    marker = os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")
    return os.path.isfile(marker)


def _venv_python() -> str:
    return os.path.join(VENV, "bin", "python")


def target_python() -> str:
    """The interpreter that gets (or has) the packages: this one, or ``.venv``'s."""
    return _venv_python() if _externally_managed() else sys.executable


def _make_venv() -> None:
    """Create ``.venv`` with this (system) Python; a clear error when it cannot."""
    print(
        f"install: {sys.executable} is an externally managed system Python (PEP 668); "
        f"installing into a virtual environment {VENV} instead",
        flush=True,
    )
    result = subprocess.run(
        [sys.executable, "-m", "venv", VENV], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        sys.exit(
            f"install: could not create the virtual environment {VENV}:\n"
            f"{(result.stdout + result.stderr).strip()}\n"
            "Install the venv module (Debian/Ubuntu: apt-get install python3-venv) and run "
            "again, or choose a Python you manage: make demo PYTHON=/path/to/python3"
        )
    with open(os.path.join(VENV, ".gitignore"), "w") as fh:
        fh.write("# made by scripts/install.py\n*\n")


def _connectors() -> list[str]:
    return [os.path.basename(p) for p in PACKAGES if p.startswith("connectors")]


def _unmet_dev_versions() -> list[str]:
    """The dev tools installed at a version their requirement excludes (a tool found by its
    module can still be the wrong release: pytest 9.2 breaks the suite's grouping)."""
    from importlib import metadata

    try:
        from packaging.requirements import Requirement
    except ImportError:  # pip always carries it
        from pip._vendor.packaging.requirements import Requirement  # type: ignore[no-redef]

    unmet = []
    for line in dev_requirements():
        requirement = Requirement(line)
        if not requirement.specifier:
            continue
        try:
            installed = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            continue  # reported by its module
        if not requirement.specifier.contains(installed, prereleases=True):
            unmet.append(f"{requirement.name} {requirement.specifier} (has {installed})")
    return unmet


def _missing() -> list[str]:
    """What this interpreter lacks: modules, or checkout-foreign or hidden epochal packages."""
    connectors = _connectors()
    wanted = (
        "epochal_sdk",
        "epochal",
        "pyspark",
        *(f"epochal_{name}" for name in connectors),
        *DEV_MODULES,
    )
    missing = []
    for name in wanted:
        spec = importlib.util.find_spec(name)
        if spec is None:
            missing.append(name)
        elif name.startswith("epochal") and not (spec.origin or "").startswith(ROOT + os.sep):
            missing.append(f"{name} (installed from another checkout)")
    missing.extend(_unmet_dev_versions())
    # what Spark's data source lookup sees: top-level modules found on sys.path
    visible = {module.name for module in pkgutil.iter_modules()}
    for name in connectors:
        native = f"pyspark_epochal_{name}"
        if os.path.isdir(os.path.join(ROOT, "connectors", name, native)) and native not in visible:
            missing.append(f"{native} (not visible to Spark's data source lookup)")
    return missing


def main() -> None:
    """Install what is missing (everything with ``--force``) into :func:`target_python`."""
    if sys.version_info < (3, 11):  # noqa: UP036 - run by whatever python3 a user has
        sys.exit(
            f"install: epochal needs Python 3.11 or newer; {sys.executable} is "
            f"{sys.version.split()[0]}. Run with a newer one: make demo PYTHON=python3.11"
        )
    target = target_python()
    if "--python" in sys.argv:
        print(target)
        return
    if "--check" in sys.argv:
        missing = _missing()
        if missing:
            sys.exit(f"install: {sys.executable} lacks {', '.join(missing)}")
        return
    if target != sys.executable:
        if not os.path.exists(target):
            _make_venv()
        os.execv(target, [target, os.path.abspath(__file__), *sys.argv[1:]])
    missing = _missing()
    if not missing and "--force" not in sys.argv:
        print(f"install: epochal packages already installed in {sys.executable}")
        return
    if importlib.util.find_spec("pip") is None:
        sys.exit(
            f"install: {sys.executable} has no pip. Install it ({sys.executable} -m ensurepip, "
            "or Debian/Ubuntu: apt-get install python3-pip), or use a virtual environment."
        )
    if "epochal" in missing:
        print("install: the epochal packages are not installed in this interpreter yet")
    elif missing:
        print(f"install: missing {', '.join(missing)}")
    print(
        f"install: pip install (editable) {', '.join(PACKAGES)} and the dev tools into "
        f"{sys.executable}; the first time this downloads pyspark (about 450 MB)",
        flush=True,
    )
    args = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    args += ["--config-settings", "editable_mode=compat"]
    for package in PACKAGES:
        args += ["-e", os.path.join(ROOT, package)]
    result = subprocess.run([*args, *dev_requirements()], check=False)
    if result.returncode != 0:
        sys.exit(f"install: pip failed (exit {result.returncode}); see its message above")
    # a new interpreter: this one read its .pth files (sys.path) before pip wrote them
    check = subprocess.run([sys.executable, os.path.abspath(__file__), "--check"], check=False)
    if check.returncode != 0:
        sys.exit("install: pip finished, but the packages above are still not usable")
    print(f"install: done; the command line is `{sys.executable} -m epochal --help`")


if __name__ == "__main__":
    main()
