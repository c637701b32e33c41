"""The pages for connector authors, followed as written by an author outside this repository,
in one fresh virtual environment that gets the packages from a clean clone (the pages' "from a
clone" line).

docs/authors/testing-your-connector.md: the page's files are written out as they stand, and its
commands run: ``epochal connectors`` lists the new connector, ``--collect-only`` lists the
cases the page lists, and the case the page picks with ``-k`` passes with the ``-v`` summary
the page shows (its faults fired, nothing lost or duplicated).

docs/authors/guides/: the guides' files (one connector per contract, and their kit suites) make the
package ``epochal-examples``; the guides' "Run it" commands install it in the same
environment, list its five connectors and the formats Spark's lookup finds (``epochal.lines``
from its ``pyspark_epochal_lines`` package), and run
one crash-test case per contract (replayable source, acknowledging source over a log with
pending lists, transactional sink, idempotent sink), each with its faults fired and nothing
lost or duplicated, and the kit's in-process contract checks of every suite (the redelivering
broker's included). tests/unit/test_guides.py drives the same files through the runtime's
protocols without installing them.

Cost, on 2 cores: about 30 s for the environment (pip's cache, shared by both tests), a
minute for the page (its one crash-test case), two minutes for the guides (14 contract checks,
about 15 s, and four crash-test cases).
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest


def _quick_start_helpers() -> object:
    """The quick-start test's helpers (a clean clone, a new user's environment, a logged
    command), loaded from its file: with pytest's importlib mode test modules are not
    importable by name."""
    spec = importlib.util.spec_from_file_location(
        "epochal_quickstart_helpers", Path(__file__).with_name("test_quickstart.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_helpers: Any = _quick_start_helpers()
ROOT, clean_clone, run, user_env = (
    _helpers.ROOT,
    _helpers.clean_clone,
    _helpers.run,
    _helpers.user_env,
)
_clean_path = _helpers._clean_path

pytestmark = [pytest.mark.quickstart, pytest.mark.spark, pytest.mark.timeout(900)]

PAGE = ROOT / "docs" / "authors" / "testing-your-connector.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def page_files(text: str) -> dict[str, str]:
    """The files the page shows: code blocks whose first line is ``# file: <path>``."""
    files = {}
    for _, body in FENCE.findall(text):
        first = body.partition("\n")[0]
        if first.startswith("# file: "):
            files[first.removeprefix("# file: ").strip()] = body
    return files


def page_commands(text: str) -> list[str]:
    """The commands of the page's "Run it" section (its ``sh`` block)."""
    section = text.split("## Run it", 1)[1]
    block = next(body for lang, body in FENCE.findall(section) if lang == "sh")
    return [line for line in block.splitlines() if line.strip()]


def listed_cases(text: str) -> list[str]:
    """The case ids the page says ``--collect-only`` lists."""
    return re.findall(r"^(tests/test_conformance\.py::\S+)$", text, re.MULTILINE)


@pytest.fixture(scope="module")
def author_env(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, str]]:
    """A clean clone, and a new virtual environment with the three packages installed from
    it, as both pages say (their first command is ``python3 -m venv .venv``, the second the
    "from a clone" line): the clone, the environment, a new user's shell environment."""
    root = tmp_path_factory.mktemp("author")
    clone = clean_clone(root / "epochal")
    env = user_env(_clean_path())
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    from_clone = (
        f"{python} -m pip install {clone}/sdk {clone}/core_runtime[pyspark] {clone}/connectors/map"
        " pytest"
    )
    run(from_clone.split(), root, env, root / "install.log", timeout=900)
    return clone, venv, env


def write_package(files: dict[str, str], directory: Path, venv: Path) -> Path:
    """The files, as the page shows them, in ``directory``, with the author's ``.venv``."""
    for name, body in files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_text(body)
    (directory / ".venv").symlink_to(venv)
    return directory


def run_commands(
    commands: list[str], package: Path, env: dict[str, str], logs: Path
) -> dict[str, str]:
    """Each command as the page writes it (a ``-k`` expression stays one argument); its
    output by command."""
    outputs: dict[str, str] = {}
    for command in commands:
        args = command.split()
        if args[:3] == [".venv/bin/python", "-m", "pytest"] and "-k" in args:
            at = args.index("-k")
            args = [*args[:at], "-k", command.split("-k", 1)[1].strip().strip('"')]
        if args[:2] == [".venv/bin/python", "-c"]:
            args = [*args[:2], command.split("-c", 1)[1].strip().strip('"')]
        outputs[command] = run(
            [str(package / args[0]), *args[1:]],
            package,
            env,
            logs / f"command-{len(outputs)}.log",
            timeout=900,
        )
    return outputs


def the_clone_line(text: str) -> None:
    """The page gives the "from a clone" install line the environment was made with."""
    line = "-m pip install <epochal>/sdk '<epochal>/core_runtime[pyspark]' <epochal>/connectors/map"
    assert line in text, "the page no longer gives the install line from a clone"


def test_the_page_for_outside_connector_authors_works_as_written(
    tmp_path: Path, author_env: tuple[Path, Path, dict[str, str]]
) -> None:
    _, venv, env = author_env
    text = PAGE.read_text()
    files = page_files(text)
    assert {"pyproject.toml", "tests/test_conformance.py"} <= set(files), files.keys()
    package = write_package(files, tmp_path / "epochal-jsonl", venv)
    commands = page_commands(text)
    assert commands[0] == "python3 -m venv .venv", commands  # done once, for both pages
    the_clone_line(text)
    outputs = run_commands(commands[2:], package, env, tmp_path)

    listing = outputs[".venv/bin/python -m epochal connectors"]
    assert "jsonl" in listing, listing
    collected = outputs[".venv/bin/python -m pytest --collect-only -q"]
    assert sorted(listed_cases(text)) == sorted(listed_cases(collected)), collected
    ran = outputs[commands[-1]]
    assert re.search(r"1 passed", ran), ran[-3000:]
    summary = re.search(r"fired (\d+) fault\(s\);.*lost 0; duplicated 0", ran)
    assert summary and int(summary.group(1)) > 0, ran[-3000:]


GUIDES = ROOT / "docs" / "authors" / "guides"
GUIDE_CONNECTORS = ("lines", "brokerqueue", "logstream", "jsonfiles", "upsert")
#: the suite the guides' command crash-tests, per contract
GUIDE_SUITES = ("TestLinesSource", "TestLogStreamSource", "TestJsonFilesSink", "TestUpsertSink")


def guide_files() -> dict[str, str]:
    """The files every guide shows (``# file: <path>`` blocks), as one package."""
    files: dict[str, str] = {}
    for page in sorted(GUIDES.glob("*.md")):
        for name, body in page_files(page.read_text()).items():
            assert name not in files, f"{name} is shown twice in docs/authors/guides"
            files[name] = body
    return files


def test_the_guides_package_installs_and_passes_one_kit_case_per_contract(
    tmp_path: Path, author_env: tuple[Path, Path, dict[str, str]]
) -> None:
    _, venv, env = author_env
    index = (GUIDES / "README.md").read_text()
    files = guide_files()
    assert {"pyproject.toml", "pyspark_epochal_lines/__init__.py"} <= set(files), files.keys()
    package = write_package(files, tmp_path / "epochal-examples", venv)
    commands = page_commands(index)
    assert commands[0] == "python3 -m venv .venv", commands
    assert commands[1].startswith(
        ".venv/bin/python -m pip install 'epochal[pyspark]' epochal-map"
    ), commands
    the_clone_line((ROOT / "docs" / "authors" / "testing-your-connector.md").read_text())
    outputs = run_commands(commands[2:], package, env, tmp_path)

    listing = outputs[".venv/bin/python -m epochal connectors"]
    for name in GUIDE_CONNECTORS:
        assert re.search(rf"\b{name}\b", listing), listing
    lookup = next(out for cmd, out in outputs.items() if "pkgutil" in cmd)  # what Spark finds
    assert "'epochal.lines'" in lookup, lookup
    ran = outputs[commands[-1]]
    cases = kit_cases(ran)
    for suite in GUIDE_SUITES:
        assert any(case.startswith(f"{suite}::") for case in cases), (suite, ran[-3000:])
    assert len(cases) == len(GUIDE_SUITES), cases
    for case, (fired, lost, duplicated) in cases.items():
        assert fired > 0 and lost == 0, (case, cases)
        if case.endswith("-exactly-once]"):
            assert duplicated == 0, (case, cases)
    final = re.findall(r"^=+ (.*) in [\d.]+s", ran, re.MULTILINE)[-1]  # pytest's last line
    assert "failed" not in final and "error" not in final, ran[-3000:]
    contract_checks = len(re.findall(r"::test_contract\[\S+\] PASSED", ran))
    passed = re.search(r"(\d+) passed", final)
    assert passed and int(passed.group(1)) == len(GUIDE_SUITES) + contract_checks, final


def kit_cases(output: str) -> dict[str, tuple[int, int, int]]:
    """The crash-test cases that passed in a ``pytest -v`` run of the kit, with what each
    one's summary line says: faults fired, records lost, records duplicated."""
    found = re.findall(
        r"::(\w+::test_crash_and_recover\[\S+\]) PASSED.*\n\s+fired (\d+) fault\(s\);"
        r".*lost (\d+); duplicated (\d+)",
        output,
    )
    return {case: (int(f), int(lost), int(dup)) for case, f, lost, dup in found}
