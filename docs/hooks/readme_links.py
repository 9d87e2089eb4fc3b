"""mkdocs hook: README text that a page includes (pymdownx.snippets, `--8<-- "README.md:section"`) links to the
docs as `docs/page.md`, from the repository's root; inside the site the same page is `page.md`.

Snippets are expanded by a Markdown preprocessor, after mkdocs' own `on_page_markdown` event, so the links are
rewritten by a preprocessor that runs right after it; mkdocs then checks them like any other link (--strict).
"""

from __future__ import annotations

import re
from typing import Any

from markdown import Extension, Markdown
from markdown.preprocessors import Preprocessor

SNIPPETS_PRIORITY = 32  # pymdownx.snippets' preprocessor; a lower priority runs later


class _ReadmeLinks(Preprocessor):
    def run(self, lines: list[str]) -> list[str]:
        return [re.sub(r"\]\(docs/", "](", line) for line in lines]


class _ReadmeLinksExtension(Extension):
    def extendMarkdown(self, md: Markdown) -> None:
        md.preprocessors.register(_ReadmeLinks(md), "gatedloop_readme_links", SNIPPETS_PRIORITY - 1)


def on_config(config: Any) -> Any:
    config.markdown_extensions.append(_ReadmeLinksExtension())
    return config
