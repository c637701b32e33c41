"""The README's quick start on a "fresh machine": a clean clone, a new virtual environment,
the README's commands, and nothing of this test run's environment on PATH.

``test_make_demo_*`` reproduces issue 14's machine: Python comes from a pyenv-like shim (a
script on PATH that runs the real interpreter), so the console scripts pip installs
(``epochal``, ``ruff``, ``pytest``) land in a directory that is *not* on PATH. ``make demo``
must still install the packages and run the demo to its exactly-once summary, and
``make test`` must lint and test. ``test_make_test_with_the_system_python`` runs
``make test`` with an externally managed system Python (PEP 668, Debian's), which pip must
not change: the scripts make and use ``.venv`` instead.

Cost: pip installs from its cache (``~/.cache/pip``, filled when this checkout's own
packages were installed; pyspark's wheel is built once and cached), about 40 s per fresh
environment; the demo itself takes about a minute (three Spark driver starts); ``make test``
is limited to one unit test module with ``PYTEST_ARGS``. Deselect both with
``-m "not quickstart"``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

pytestmark = [pytest.mark.quickstart, pytest.mark.spark, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
#: Console scripts that must not be found on PATH: the test proves nothing relies on them.
SCRIPTS = ("epochal", "ruff", "pytest")
#: This run's settings that a new user's shell would not have.
# PYTHON and make's own variables come from the CI's `make test` that runs this test; a user's
# shell has neither, and with them the nested `make` would use the CI's interpreter.
FOREIGN_ENV = (
    "PYTHONPATH",
    "PYTHONHOME",
    "VIRTUAL_ENV",
    "PYENV_VERSION",
    "PYSPARK_PYTHON",
    "PYTHON",
    "MAKEFLAGS",
    "MFLAGS",
    "MAKELEVEL",
    "MAKEOVERRIDES",
)
FOREIGN_PREFIXES = ("EPOCHAL_", "PYTEST_", "SPARK_", "PYSPARK_", "PIP_REQUIRE_VIRTUALENV")
SMALL_PYTEST = "tests/unit/test_config.py -q -p no:cacheprovider"
CLASS_DATA_SWITCH = "EPOCHAL_CLASS_DATA"
"""``off``: ``make test`` neither makes nor uses the driver class-data archive
(``epochal.startup.classdata.SWITCH_ENV``)."""


def _git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout


def clean_clone(dest: Path) -> Path:
    """``git clone`` of this checkout, plus its uncommitted changes (modified, deleted and
    new files that are not ignored), so the test sees the tree as it would be committed;
    no build output (egg-info, caches, virtual environments) comes along."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("the quick-start test clones the checkout: needs git and a git checkout")
    subprocess.run(
        ["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(dest)],
        check=True,
        capture_output=True,
    )
    changed = _git("ls-files", "-z", "--modified", "--others", "--exclude-standard")
    for name in filter(None, changed.split("\0")):
        source, target = ROOT / name, dest / name
        if source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
        elif not source.exists():
            target.unlink(missing_ok=True)
    return dest


def _clean_path(extra_first: Path | None = None) -> str:
    """PATH without this run's interpreters' script directories (pyenv shims, venvs): no
    directory that holds an ``epochal``, ``ruff`` or ``pytest`` command."""
    kept = [
        entry
        for entry in os.environ.get("PATH", "").split(os.pathsep)
        if entry and not any(os.access(Path(entry, s), os.X_OK) for s in SCRIPTS)
    ]
    return os.pathsep.join(([str(extra_first)] if extra_first else []) + kept)


def user_env(path: str) -> dict[str, str]:
    """The environment of a new user's shell: this one minus test-run settings, with ``path``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in FOREIGN_ENV and not k.startswith(FOREIGN_PREFIXES)
    }
    env["PATH"] = path
    # pip compiles every module it installs (pyspark, pandas, pyarrow: thousands of files);
    # Python compiles what is imported anyway and keeps it (scripts/test.sh lets it write its
    # bytecode caches), so the commands under test do the same with or without it
    env["PIP_COMPILE"] = "0"
    return env


def pyenv_like_shims(directory: Path, interpreter: Path) -> Path:
    """``python3``/``python`` scripts that exec ``interpreter``, as pyenv's shims do: the
    interpreter's own ``bin`` directory (where pip puts console scripts) is not on PATH."""
    directory.mkdir()
    for name in ("python3", "python"):
        shim = directory / name
        shim.write_text(f'#!/bin/sh\nexec "{interpreter}" "$@"\n')
        shim.chmod(0o755)
    return directory


def run(cmd: list[str], cwd: Path, env: Mapping[str, str], log: Path, timeout: float) -> str:
    """Run a README command; its output goes to ``log`` and is returned; fail with its tail."""
    with log.open("w") as out:
        try:
            code = subprocess.run(
                cmd, cwd=cwd, env=dict(env), stdout=out, stderr=subprocess.STDOUT, timeout=timeout
            ).returncode
        except subprocess.TimeoutExpired:
            code = None
    text = log.read_text()
    if code != 0:
        tail = "\n".join(text.splitlines()[-60:])
        what = "timed out" if code is None else f"exited with {code}"
        pytest.fail(f"`{' '.join(cmd)}` {what} (log {log}):\n{tail}", pytrace=False)
    return text


def test_make_demo_in_a_fresh_venv_whose_scripts_are_not_on_path(tmp_path: Path) -> None:
    clone = clean_clone(tmp_path / "epochal")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    shims = pyenv_like_shims(tmp_path / "shims", venv / "bin" / "python3")
    env = user_env(_clean_path(shims))
    assert shutil.which("epochal", path=env["PATH"]) is None

    demo = run(["make", "demo"], clone, env, tmp_path / "make-demo.log", timeout=600)

    # pip installed the console script where this PATH does not look, as with pyenv
    assert (venv / "bin" / "epochal").exists()
    assert shutil.which("epochal", path=env["PATH"]) is None
    assert "result: exactly-once held" in demo, demo[-3000:]
    summary = demo[demo.index("== epochal demo summary ==") :]
    for line in ("restarts: 2", "lost: 0", "duplicates: 0"):
        assert line in summary.splitlines(), summary
    # progress lines mention re-reads only once a restart happened
    progress = [line for line in demo.splitlines() if " batch " in line and " events (" in line]
    assert progress and all("read again" not in p for p in progress if "] run 1 batch" in p)
    assert any("read again" in p for p in progress if "] run 2 batch" in p), progress

    version = run(
        ["python3", "-m", "epochal", "--version"], clone, env, tmp_path / "version.log", 60
    )
    assert version.startswith("epochal 0.1.0 (") and str(venv) in version, version

    # the driver class-data archive of this environment's Spark home is made by
    # test_make_test_with_the_system_python's `make test` (a JVM with the warm-up query,
    # 15-40 s); the small test run here starts no driver, so it would only cost CPU
    tested = run(
        ["make", "test", f"PYTEST_ARGS={SMALL_PYTEST}"],
        clone,
        {**env, CLASS_DATA_SWITCH: "off"},
        tmp_path / "make-test.log",
        timeout=600,
    )
    assert "=== phase: lint (ruff)" in tested and "All checks passed!" in tested, tested[-3000:]
    assert re.search(r"\b\d+ passed\b", tested), tested[-3000:]


_PEP668_PROBE = (
    "import ensurepip, os, sys, sysconfig; "
    "marker = os.path.join(sysconfig.get_path('stdlib'), 'EXTERNALLY-MANAGED'); "
    "print(os.path.isfile(marker) and sys.prefix == sys.base_prefix "
    "and sys.version_info >= (3, 11))"
)


def _system_python() -> Path | None:
    """An externally managed (PEP 668) system Python 3.11+ with the venv module, if any."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if not os.access(candidate, os.X_OK):
            continue
        probe = subprocess.run(
            [candidate, "-c", _PEP668_PROBE], capture_output=True, text=True, check=False
        )
        if probe.stdout.strip() == "True":
            return Path(candidate)
    return None


def test_make_test_with_the_system_python(tmp_path: Path) -> None:
    system = _system_python()
    if system is None:
        pytest.skip("no externally managed (PEP 668) system Python 3.11+ with venv here")
    clone = clean_clone(tmp_path / "epochal")
    # python3 on PATH is the system's (a shim, in case another python3 comes first on PATH)
    env = user_env(_clean_path(pyenv_like_shims(tmp_path / "shims", system)))

    tested = run(
        ["make", "test", f"PYTEST_ARGS={SMALL_PYTEST}"],
        clone,
        env,
        tmp_path / "make-test.log",
        timeout=600,
    )

    assert "externally managed system Python" in tested, tested[-3000:]
    # the one quick-start run that makes a fresh Spark home's class-data archive
    assert "epochal: class-data archive ready in" in tested, tested[-3000:]
    assert (clone / ".venv" / "bin" / "python").exists()
    assert (clone / ".venv" / ".gitignore").read_text().strip().endswith("*")
    assert "All checks passed!" in tested, tested[-3000:]
    assert re.search(r"\b\d+ passed\b", tested), tested[-3000:]
    assert _git("status", "--porcelain", "--ignored", ".venv", cwd=clone).startswith("!!")
