"""What users install: every distribution's wheel, built from the tree, carries its type hints
(``py.typed``) and every file its code opens at run time.

The files opened at run time are found in the code, not listed here: every path the code
builds relative to its own module (``os.path.join(os.path.dirname(__file__), "jvm", ...)``,
``Path(__file__).parent / "x"``, ``importlib.resources.files(...) / "x"``), and every file that
is not Python in a package's directory.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path, PurePosixPath

import pytest

from tests.wheels import DISTRIBUTIONS, ROOT


def _packages(dist: str) -> list[Path]:
    """The top-level packages of distribution ``dist`` (directories with an ``__init__.py``)."""
    return sorted(p.parent for p in (ROOT / dist).glob("*/__init__.py"))


@pytest.fixture(scope="module")
def wheels(built_wheels: dict[str, Path]) -> dict[str, set[str]]:
    """The files of each distribution's wheel (built by the session's ``built_wheels``,
    tests/conftest.py)."""
    return {dist: set(zipfile.ZipFile(w).namelist()) for dist, w in built_wheels.items()}


# -- the paths a module resolves relative to itself --------------------------------------------


def _resolved(
    node: ast.AST, module: Path, package_dirs: dict[str, Path], names: dict[str, Path]
) -> Path | None:
    """The path ``node`` evaluates to when it is built from the module's own location (its
    ``__file__``, its package's resources or a module-level name bound to such a path) with
    constant parts; None for anything else."""
    if isinstance(node, ast.Name):
        return module if node.id == "__file__" else names.get(node.id)
    if isinstance(node, ast.Attribute) and node.attr == "parent":
        base = _resolved(node.value, module, package_dirs, names)
        return base.parent if base is not None else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        base = _resolved(node.left, module, package_dirs, names)
        part = _constant(node.right)
        return base / part if base is not None and part is not None else None
    if not isinstance(node, ast.Call):
        return None
    func = _dotted(node.func)
    last = func.rsplit(".", 1)[-1]
    if last in {"abspath", "realpath", "Path", "resolve", "normpath"}:
        inner = node.args[0] if node.args else getattr(node.func, "value", None)
        return _resolved(inner, module, package_dirs, names) if inner is not None else None
    if last == "dirname" and node.args:
        base = _resolved(node.args[0], module, package_dirs, names)
        return base.parent if base is not None else None
    if last in {"join", "joinpath"}:
        pieces = list(node.args)
        if last == "joinpath" and isinstance(node.func, ast.Attribute):
            pieces.insert(0, node.func.value)
        if not pieces:
            return None
        base = _resolved(pieces[0], module, package_dirs, names)
        parts = [_constant(a) for a in pieces[1:]]
        if base is None or not all(parts):
            return None
        return base.joinpath(*(p for p in parts if p))
    if last == "files" and "resources" in func and node.args:
        name = _constant(node.args[0])
        if isinstance(node.args[0], ast.Name) and node.args[0].id in {"__name__", "__package__"}:
            return module.parent
        return package_dirs.get(name or "")
    return None


def _constant(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def opened_at_run_time(dist: str) -> set[Path]:
    """The files below distribution ``dist``'s packages that its code names relative to its
    own modules (the outermost such paths only: ``jvm/X.java``, not ``jvm``)."""
    packages = _packages(dist)
    package_dirs = {p.name: p for p in packages}
    found: set[Path] = set()
    for package in packages:
        for module in package.rglob("*.py"):
            tree = ast.parse(module.read_text())
            names: dict[str, Path] = {}
            for statement in tree.body:  # module-level names bound to a path, in order
                if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
                    target = statement.targets[0]
                    bound = _resolved(statement.value, module, package_dirs, names)
                    if isinstance(target, ast.Name) and bound is not None:
                        names[target.id] = bound
            for node in ast.walk(tree):
                path = _resolved(node, module, package_dirs, names)
                if path is not None and path != module and not path.is_dir():
                    found.add(Path(os.path.normpath(path)))
    return found


def _in_wheel(path: Path, dist: str) -> str:
    return PurePosixPath(*path.relative_to(ROOT / dist).parts).as_posix()


# -- the checks --------------------------------------------------------------------------------


def test_the_scan_finds_what_the_runtime_opens_relative_to_itself() -> None:
    """The scan below is not blind: it finds the Java sources of the local file system the
    runtime compiles (``epochal.startup.statefiles.SOURCES``)."""
    from epochal.startup import statefiles

    opened = opened_at_run_time("core_runtime")
    assert {Path(source).resolve() for source in statefiles.SOURCES} <= opened


@pytest.mark.parametrize("dist", DISTRIBUTIONS)
def test_every_package_of_the_wheel_says_it_is_typed(
    dist: str, wheels: dict[str, set[str]]
) -> None:
    for package in _packages(dist):
        assert (package / "py.typed").is_file(), f"{package} has no py.typed"
        assert f"{package.name}/py.typed" in wheels[dist], f"the {dist} wheel lacks it"


@pytest.mark.parametrize("dist", DISTRIBUTIONS)
def test_the_wheel_carries_every_file_the_code_opens(
    dist: str, wheels: dict[str, set[str]]
) -> None:
    opened = opened_at_run_time(dist)
    missing_in_tree = sorted(str(p) for p in opened if not p.is_file())
    assert not missing_in_tree, f"the code opens files that are not in the tree: {missing_in_tree}"
    missing = sorted(_in_wheel(p, dist) for p in opened if _in_wheel(p, dist) not in wheels[dist])
    assert not missing, f"the {dist} wheel lacks files its code opens: {missing}"


@pytest.mark.parametrize("dist", DISTRIBUTIONS)
def test_the_wheel_carries_every_file_of_its_packages(
    dist: str, wheels: dict[str, set[str]]
) -> None:
    """Every file in a package's directory (Python or not) is in the wheel: a data file the
    code finds in another way than the scan above still ships."""
    tree = {
        _in_wheel(p, dist)
        for package in _packages(dist)
        for p in package.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }
    missing = sorted(tree - wheels[dist])
    assert not missing, f"the {dist} wheel lacks files of its packages: {missing}"


INSTALLED_CHECK = """
import os, sys
import epochal, epochal_sdk, epochal_map, pyspark_epochal_map
from epochal.startup import statefiles

for module in (epochal, epochal_sdk, epochal_map, pyspark_epochal_map):
    assert module.__file__.startswith(sys.prefix), module.__file__
assert all(os.path.isfile(source) for source in statefiles.SOURCES), statefiles.SOURCES
assert pyspark_epochal_map.DefaultSource.name() == "epochal.map"
"""


def test_the_installed_wheels_work_without_the_checkout(
    built_wheels: dict[str, Path], tmp_path: Path
) -> None:
    """The wheels installed into a new virtual environment: the runtime finds the files it
    opens, Spark's ``pyspark_epochal_map`` defines its source, and ``epochal connectors``
    loads every connector, all from the installed wheels, not from the checkout. The
    dependencies (pyspark, pyarrow, ...) come from this interpreter's site-packages, added to
    the environment's path after its own (a ``.pth`` file), without the ``.pth`` files there
    that put checkouts on the path."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ours = sysconfig.get_paths()
    (Path(purelib) / "dependencies.pth").write_text(f"{ours['purelib']}\n{ours['platlib']}\n")
    # nothing of the checkout on the path: pip would take it for the installed packages
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "EPOCHAL_PLUGINS"}}
    install = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "-q"),
            *("--disable-pip-version-check", *map(str, built_wheels.values())),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    for args in (["-c", INSTALLED_CHECK], ["-m", "epochal", "connectors"]):
        done = subprocess.run(
            [python, *args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120
        )
        assert done.returncode == 0, done.stdout + done.stderr
    for name in ("map", "kafka", "jdbc", "jms"):
        assert f"format: epochal.{name}" in done.stdout, done.stdout
