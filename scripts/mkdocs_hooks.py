"""MkDocs hook (mkdocs.yml `hooks:`): the docs' own fence marker, ```python no-run, shown as the
Python it is. Python-Markdown's fenced code takes one word after the fence; left as it is, the
marker would not open a code block and the rest of the page would be misread."""

from __future__ import annotations

import re

NO_RUN = re.compile(r"^(\s*```+)python no-run\s*$", re.M)


def on_page_markdown(markdown: str, **_: object) -> str:
    return NO_RUN.sub(r"\1python", markdown)
