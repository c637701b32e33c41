"""Pages for users state the present: no issue numbers, no references to the seeds the
project started from, no test paths offered as proof, no dated runs on a development
machine. Evidence pages (docs/evidence) and contributor pages (docs/contributing) may name
the tests and commands that reproduce a result; connector authors' pages (docs/authors)
show a package's own test files, so only the first two rules hold there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

ISSUE = re.compile(r"\bissues? #?\d+", re.I)
SEED = re.compile(r"\bseeds?\b", re.I)
TEST_PATH = re.compile(r"\b(?:tests|integration)/[\w./-]*\.py\b")
DATED_RUN = re.compile(r"\b20\d\d-\d\d-\d\d\b|\b\d+-core (?:development )?machine\b")


def user_pages() -> list[Path]:
    """README, the connectors' READMEs, and every docs page but evidence, contributing
    and the authors' section."""
    docs = ROOT / "docs"
    skipped = {docs / "evidence", docs / "contributing", docs / "authors"}
    pages = [ROOT / "README.md", *sorted((ROOT / "connectors").glob("*/README.md"))]
    for page in sorted(docs.rglob("*.md")):
        if not any(part in page.parents for part in skipped):
            pages.append(page)
    return pages


def author_pages() -> list[Path]:
    return sorted((ROOT / "docs" / "authors").rglob("*.md"))


def findings(page: Path, rules: dict[str, re.Pattern[str]]) -> list[str]:
    """``page:line: rule: text`` for every line of ``page`` that breaks a rule."""
    found = []
    for number, line in enumerate(page.read_text().splitlines(), 1):
        for name, pattern in rules.items():
            if match := pattern.search(line):
                found.append(f"{page.name}:{number}: {name}: {match.group(0)}")
    return found


RULES = {"issue": ISSUE, "seed": SEED, "test path": TEST_PATH, "dated run": DATED_RUN}


def test_user_pages_read_as_documentation_not_as_a_lab_notebook() -> None:
    problems = [
        f"{page.parent.relative_to(ROOT)}/{f}"
        for page in user_pages()
        for f in findings(page, RULES)
    ]
    assert problems == [], "\n".join(problems)


def test_author_pages_name_no_issue_or_seed() -> None:
    rules = {"issue": ISSUE, "seed": SEED}
    problems = [
        f"{page.parent.relative_to(ROOT)}/{f}"
        for page in author_pages()
        for f in findings(page, rules)
    ]
    assert problems == [], "\n".join(problems)


def test_the_rules_see_what_they_forbid(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "issue 12's targets\n(seed: ack after snapshot)\nsee `tests/unit/test_x.py`\n"
        "measured 2026-11-23\non this project's 2-core machine\nthe lease and its epoch\n"
    )
    found = [hit.split(": ")[1] for hit in findings(page, RULES)]
    assert found == ["issue", "seed", "test path", "dated run", "dated run"]
