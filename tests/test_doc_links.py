"""Every relative link in README.md and docs/*.md points at a file that exists and, with a
``#anchor``, at a heading that file has.

Why: the README is a short tour that sends readers into docs/ pages for everything else, and
the pages link to each other's sections. A page renamed or a heading reworded would leave a
link that 404s (or lands at the top of the page) with nothing else noticing. Anchors are
GitHub's: the heading lower-cased, punctuation but ``-`` and ``_`` dropped, spaces turned into
``-``, and ``-1``, ``-2``... appended to repeats. Headings and links inside fenced code blocks
do not count, as they do not render.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
# [text](target) and ![alt](target); the text may hold `code` and nested ![img](...).
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"`[^`]*`")


def rendered_lines(path: Path) -> list[tuple[int, str]]:
    """The lines outside fenced code blocks, with their line numbers."""
    lines, fenced = [], False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for _, line in rendered_lines(path):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def relative_links(path: Path) -> list[tuple[int, str]]:
    links = []
    for number, line in rendered_lines(path):
        for match in LINK.finditer(INLINE_CODE.sub("", line)):
            target = match.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
                continue
            links.append((number, target))
    return links


def test_the_slug_is_githubs() -> None:
    assert slug("Runbook: redriving a DLQ") == "runbook-redriving-a-dlq"
    assert slug("1. The shape") == "1-the-shape"
    assert slug("What a step costs: `bench/checkpoint_cost.py`") == "what-a-step-costs-benchcheckpoint_costpy"
    assert slug("Tool permissions: allow, ask, deny") == "tool-permissions-allow-ask-deny"


def test_code_blocks_hold_no_headings_or_links(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n```yaml\n# agent.yaml\n[x](missing.md)\n```\n\n## Title\n[y](page.md#title-1)\n")
    assert anchors(page) == {"title", "title-1"}
    assert relative_links(page) == [(9, "page.md#title-1")]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for number, target in relative_links(page):
        file_part, _, anchor = target.partition("#")
        linked = (page.parent / unquote(file_part)).resolve() if file_part else page
        where = f"{page.relative_to(ROOT)}:{number}: {target}"
        if not linked.is_relative_to(ROOT):
            broken.append(f"{where} (outside the repository)")
        elif not linked.exists():
            broken.append(f"{where} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{where} (no heading #{anchor} in {linked.relative_to(ROOT)})")
    assert not broken, "broken links:\n" + "\n".join(broken)
