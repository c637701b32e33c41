"""The command-line reference (docs/reference/cli.md) is the parser's own help, command by
command, at a fixed width: an option added, renamed or described anew fails here until the
page is written again: ``python tests/unit/test_cli_reference.py``."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from unittest import mock

from epochal.ops.cli import parser

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "cli.md"

INTRO = """# Command line

`python -m epochal` (or `epochal`, the console script). Each section below is the
command's `--help`, as the installed version prints it. What to do with a job in each
state, and on each error: the [runbook](../how-to/runbook.md); a sample `jobs status`:
[monitoring](../how-to/monitor.md#jobs-status).
"""


def commands(top: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The sub-commands of ``top``, by name, in the order of its help."""
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("the parser has no sub-commands")


def render_page() -> str:
    """The page as the parser describes it, 100 columns wide."""
    # the defaults as an unconfigured machine has them ($EPOCHAL_SNAPSHOT_DIR sets another)
    with (
        mock.patch.dict(os.environ, {"COLUMNS": "100"}),
        mock.patch("epochal.ops.cli.DEFAULT_SNAPSHOT_DIR", "./epochal-snapshots"),
    ):
        top = parser()
        blocks = [INTRO, "## `epochal`\n", "```\n" + top.format_help() + "```\n"]
        for name, command in commands(top).items():
            blocks += [f"## `epochal {name}`\n", "```\n" + command.format_help() + "```\n"]
    return "\n".join(blocks)


def test_the_page_is_the_parsers_help() -> None:
    assert PAGE.read_text() == render_page(), (
        "docs/reference/cli.md differs from the parser's help: write it again with "
        "python tests/unit/test_cli_reference.py"
    )


if __name__ == "__main__":  # python tests/unit/test_cli_reference.py: write the page again
    PAGE.write_text(render_page())
