"""The docs' file includes are pymdownx.snippets includes that expand (issue 54): a formatter once rewrote
docs/tutorial.md's four `--8<-- "file"` lines as `--8 < --"file"`, which mkdocs renders as that text inside the
code block, so `mkdocs build --strict` passed while the tutorial showed no code.

Two checks. Always: every line of docs/*.md that looks like an include is one in the exact syntax, naming a file
(and section) that exists, and mkdocs.yml enables pymdownx.snippets from the repository's root. Where
pymdown-extensions is installed (the `docs` extra): each page is rendered with Python-Markdown and the snippets
extension as mkdocs configures it, and each file included into a code block shows its first line in the HTML;
rendering the pages is fast, where a whole `mkdocs build` (mkdocstrings, the theme) would not be.
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from doc_text import DOCS, ROOT

LOOKS_LIKE_AN_INCLUDE = re.compile(r"^\s*-{1,3}\s*8\s*<\s*-{1,3}")
INCLUDE = re.compile(r'^--8<-- "(?P<path>[^":]+)(?::(?P<section>[\w-]+))?"$')


class _MkdocsLoader(yaml.SafeLoader):
    """mkdocs.yml with its tags kept as text (`!relative $config_dir`), which only mkdocs can construct."""


_MkdocsLoader.add_multi_constructor(
    "", lambda loader, tag, node: f"{tag} {node.value}" if isinstance(node, yaml.ScalarNode) else None
)


def includes() -> list[tuple[Path, int, str]]:
    """(page, line number, line) of every line in docs/*.md that looks like a snippet include."""
    return [
        (page, number, line)
        for page in sorted(DOCS.glob("*.md"))
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1)
        if LOOKS_LIKE_AN_INCLUDE.match(line)
    ]


def snippets_config() -> dict[str, Any]:
    config = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=_MkdocsLoader)
    for extension in config["markdown_extensions"]:
        if isinstance(extension, dict) and "pymdownx.snippets" in extension:
            return dict(extension["pymdownx.snippets"] or {})
        if extension == "pymdownx.snippets":
            return {}
    raise AssertionError("mkdocs.yml does not enable pymdownx.snippets")


def test_every_include_in_the_docs_is_well_formed_and_names_a_file_that_exists():
    found = includes()
    assert len(found) >= 9, "the docs lost their includes (the tutorial's files, the README's sections)"
    problems = []
    for page, number, line in found:
        where = f"docs/{page.name}:{number}: {line.strip()!r}"
        match = INCLUDE.match(line)
        if match is None:
            problems.append(f'{where} is not `--8<-- "path"` or `--8<-- "path:section"`')
            continue
        target = ROOT / match["path"]
        if not target.is_file():
            problems.append(f"{where} names no file")
        elif match["section"] and f"--8<-- [start:{match['section']}]" not in target.read_text(encoding="utf-8"):
            problems.append(f"{where}: {match['path']} has no section {match['section']!r}")
    assert not problems, "\n".join(problems)


def test_mkdocs_expands_includes_from_the_repository_root_and_fails_on_a_missing_file():
    config = snippets_config()
    assert config.get("base_path") == ["!relative $config_dir"] and config.get("check_paths") is True, config


def test_each_file_included_in_a_code_block_shows_its_first_line_in_the_rendered_page():
    markdown = pytest.importorskip("markdown")
    pytest.importorskip("pymdownx.snippets")
    shown = 0
    for page in sorted({page for page, _, _ in includes()}):
        text = page.read_text(encoding="utf-8")
        renderer = markdown.Markdown(
            extensions=["pymdownx.snippets", "pymdownx.superfences", "tables", "admonition"],
            extension_configs={"pymdownx.snippets": {"base_path": [str(ROOT)], "check_paths": True}},
        )
        rendered = html.unescape(renderer.convert(text))
        for match in re.finditer(r'^```\w*\n(-[^\n]*"([^":\n]+)")\n```$', text, re.MULTILINE):
            include, path = match.group(1), match.group(2)
            if not LOOKS_LIKE_AN_INCLUDE.match(include):
                continue
            first = next(line for line in (ROOT / path).read_text(encoding="utf-8").splitlines() if line.strip())
            assert include not in rendered, f"docs/{page.name}: {include} was not expanded"
            assert first in rendered, f"docs/{page.name}: the first line of {path} is not in the page: {first!r}"
            shown += 1
    assert shown >= 5, "the tutorial's five included files were not found in code blocks"
