"""The docs site holds together where `mkdocs build --strict` (run by .ci/run) cannot see: every page is in the nav,
and the README, which is not part of the site, links only to pages and headings that exist, and to every page."""

from __future__ import annotations

import re
import unicodedata

import yaml
from doc_text import DOCS, README, ROOT, headings


class _MkdocsLoader(yaml.SafeLoader):
    """Reads mkdocs.yml, whose own tags (`!relative`, `!!python/name:`) only mkdocs can construct."""


_MkdocsLoader.add_multi_constructor("", lambda loader, suffix, node: None)


def nav_pages() -> list[str]:
    config = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=_MkdocsLoader)
    found: list[str] = []

    def walk(entry: object) -> None:
        if isinstance(entry, str):
            found.append(entry)
        elif isinstance(entry, list):
            for item in entry:
                walk(item)
        elif isinstance(entry, dict):
            for value in entry.values():
                walk(value)

    walk(config["nav"])
    return found


def anchor(title: str) -> str:
    """The id mkdocs gives a heading (Python-Markdown's toc `slugify`, applied to the heading's text)."""
    text = unicodedata.normalize("NFKD", title.replace("`", "")).encode("ascii", "ignore").decode("ascii")
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", text).strip().lower())


def readme_links() -> list[str]:
    return re.findall(r"\]\((docs/[^)\s]+)\)", README.read_text(encoding="utf-8"))


def test_every_docs_page_is_in_the_nav_once_and_every_nav_entry_exists():
    nav = nav_pages()
    pages = sorted(path.name for path in DOCS.glob("*.md"))
    assert sorted(nav) == pages, f"in the nav only: {set(nav) - set(pages)}; not in the nav: {set(pages) - set(nav)}"


def test_every_readme_link_into_docs_names_a_page_and_a_heading_that_exist():
    links = readme_links()
    assert len(links) > 10, "the README lost its list of docs pages"
    for link in links:
        path, _, fragment = link.partition("#")
        page = ROOT / path
        assert page.is_file(), f"README links to {link}: no such page"
        if fragment:
            ids = [anchor(h.title) for h in headings(page.read_text(encoding="utf-8"))]
            assert fragment in ids, f"README links to {link}: {path} has no heading with that anchor"


def test_the_readme_links_every_docs_page_it_does_not_hold():
    """Pages that show the README's own text (`--8<-- "README.md:..."`: index.md, glossary.md) need no link."""
    linked = {link.partition("#")[0] for link in readme_links()}
    shown = {p for p in nav_pages() if '--8<-- "README.md' in (DOCS / p).read_text(encoding="utf-8")}
    assert shown >= {"index.md", "glossary.md"}
    assert not [p for p in nav_pages() if f"docs/{p}" not in linked and p not in shown], linked


def test_anchor_matches_the_ids_mkdocs_gives_headings():
    assert anchor("What ends a request (`status`)") == "what-ends-a-request-status"
    porting = "Porting from `create_agent`, argument by argument"
    assert anchor(porting) == "porting-from-create_agent-argument-by-argument"


def test_every_option_the_cli_takes_before_or_after_a_command_is_in_docs_cli_md():
    """docs/cli.md's synopsis lists the options every command shares (the top-level parser's); `--context` was
    missing from it (issue 51)."""
    from gatedloop.cli.main import parser

    text = (DOCS / "cli.md").read_text(encoding="utf-8")
    shared = [a.option_strings for a in parser()._actions if a.option_strings and a.dest != "help"]
    assert [names[0] for names in shared if not any(re.search(rf"{n}\b", text) for n in names)] == []
