"""The documentation's text by heading, for the tests that keep it true: README.md and the pages in docs/.

A section moves between pages (the README is a quick tour, the reference is in docs/); a test names the heading it
checks, not the file, and fails clearly when the heading is gone or is in more than one place.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def pages() -> list[Path]:
    """README.md and every Markdown page of the docs site."""
    return [README, *sorted(DOCS.glob("*.md"))]


@dataclass(frozen=True)
class Heading:
    level: int
    title: str
    line: int  # index of the heading's line in its page


def headings(text: str) -> list[Heading]:
    """The Markdown headings of `text`, skipping lines inside fenced code blocks (a `# comment` in a bash block)."""
    found, fence = [], ""
    for number, line in enumerate(text.splitlines()):
        marker = re.match(r"(`{3,}|~{3,})", line)
        if marker:
            if not fence:
                fence = marker.group(1)
            elif line.strip() == fence:
                fence = ""
        elif not fence and (heading := re.match(r"(#{1,6}) (.+?)\s*$", line)):
            found.append(Heading(len(heading.group(1)), heading.group(2), number))
    return found


def section(title: str, *, page: str | None = None) -> str:
    """The text under the heading `title` (as written, without the #s), down to the next heading of the same or a
    higher level, from the one page that has it (or only from `page`, a path relative to the repository)."""
    hits = []
    for path in [ROOT / page] if page else pages():
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        marks = headings("".join(lines))
        for index, heading in enumerate(marks):
            if heading.title == title:
                end = next((h.line for h in marks[index + 1 :] if h.level <= heading.level), len(lines))
                hits.append((path.relative_to(ROOT), "".join(lines[heading.line : end])))
    where = page or "README.md or docs/*.md"
    assert hits, f"no heading {title!r} in {where}"
    assert len(hits) == 1, f"heading {title!r} is in more than one place: {[str(path) for path, _ in hits]}"
    return hits[0][1]
