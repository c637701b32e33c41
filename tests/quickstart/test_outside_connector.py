"""docs/testing-your-connector.md, followed as written by a connector author outside this
repository: the page's files are written out as they stand, a new virtual environment gets
the packages from a clean clone (the page's "from a clone" line), and the page's commands
run: ``epochal connectors`` lists the new connector, ``--collect-only`` lists the cases the
page lists, and the case the page picks with ``-k`` passes with the ``-v`` summary the page
shows (its faults fired, nothing lost or duplicated).

Cost: about 40 s for the environment (pip's cache) and one crash-test case (about a minute).
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

PAGE = ROOT / "docs" / "testing-your-connector.md"
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


def test_the_page_for_outside_connector_authors_works_as_written(tmp_path: Path) -> None:
    text = PAGE.read_text()
    files = page_files(text)
    assert {"pyproject.toml", "tests/test_conformance.py"} <= set(files), files.keys()
    package = tmp_path / "epochal-jsonl"
    for name, body in files.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(body)
    clone = clean_clone(tmp_path / "epochal")
    env = user_env(_clean_path())
    subprocess.run([sys.executable, "-m", "venv", str(package / ".venv")], check=True)

    commands = page_commands(text)
    assert commands[0] == "python3 -m venv .venv", commands  # done above, with this Python
    venv_python = ".venv/bin/python"
    from_clone = (
        f"{venv_python} -m pip install {clone}/sdk {clone}/core_runtime "
        f"{clone}/connectors/map pytest"
    )
    assert from_clone.replace(str(clone), "<epochal>") in text
    outputs = {}
    for command in [from_clone, *commands[2:]]:
        args = command.split()
        if args[:3] == [venv_python, "-m", "pytest"] and "-k" in args:
            at = args.index("-k")
            args = [*args[:at], "-k", command.split("-k", 1)[1].strip().strip('"')]
        outputs[command] = run(
            [str(package / args[0]), *args[1:]],
            package,
            env,
            tmp_path / f"command-{len(outputs)}.log",
            timeout=900,
        )

    listing = outputs[f"{venv_python} -m epochal connectors"]
    assert "jsonl" in listing, listing
    collected = outputs[f"{venv_python} -m pytest --collect-only -q"]
    assert sorted(listed_cases(text)) == sorted(listed_cases(collected)), collected
    ran = outputs[commands[-1]]
    assert re.search(r"1 passed", ran), ran[-3000:]
    summary = re.search(r"fired (\d+) fault\(s\);.*lost 0; duplicated 0", ran)
    assert summary and int(summary.group(1)) > 0, ran[-3000:]
