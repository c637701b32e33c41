"""Every relative link in README.md, docs/ and the connectors' READMEs names a file that
exists, and a ``#fragment`` names a heading of that page (GitHub's heading anchors), so a
page moved or a section renamed cannot leave a reader at a dead link."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def pages() -> list[Path]:
    """The Markdown pages a reader follows links through."""
    found = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found += sorted((ROOT / "connectors").glob("*/README.md"))
    return [page for page in found if "_build" not in page.parts]


def prose(text: str) -> str:
    """``text`` without its fenced code blocks (code shows brackets that are not links)."""
    kept, inside = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            inside = not inside
            continue
        if not inside:
            kept.append(line)
    return "\n".join(kept)


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading)
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of ``page``, numbered as GitHub numbers repeats (``-1``, ...)."""
    seen: dict[str, int] = {}
    result = set()
    for line in prose(page.read_text()).splitlines():
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        base = anchor(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    return result


def broken_links(page: Path) -> list[str]:
    """The links of ``page`` that name no file, or a heading its target does not have."""
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target} (no such file)")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            broken.append(f"{target} (no heading #{fragment})")
    return broken


def test_every_relative_link_resolves() -> None:
    problems = {
        str(page.relative_to(ROOT)): found for page in pages() if (found := broken_links(page))
    }
    assert not problems, problems


def test_the_check_sees_a_broken_link(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# A heading, with `code`\n")
    page.write_text(
        "[ok](other.md#a-heading-with-code) [gone](missing.md) [bad](other.md#nope)\n"
        "```\n[in code](not-checked.md)\n```\n"
    )
    assert broken_links(page) == ["missing.md (no such file)", "other.md#nope (no heading #nope)"]
