"""MkDocs hooks (mkdocs.yml `hooks:`).

- The docs' own fence marker, ```python no-run, shown as the Python it is. Python-Markdown's
  fenced code takes one word after the fence; left as it is, the marker would not open a code
  block and the rest of the page would be misread.
- The Reference pages (docs/reference/...: one per public class, function and `peg` command),
  written from the code of this checkout (src/ first on the path) by scripts/reference_pages.py
  and added as generated files: none is on disk, so none can drift from the code.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

NO_RUN = re.compile(r"^(\s*```+)python no-run\s*$", re.M)
ROOT = Path(__file__).resolve().parents[1]


def on_page_markdown(markdown: str, **_: object) -> str:
    return NO_RUN.sub(r"\1python", markdown)


def reference_pages() -> dict[str, str]:
    """scripts/reference_pages.py's pages, the peg documented being this checkout's."""
    if str(ROOT / "src") not in sys.path:
        sys.path.insert(0, str(ROOT / "src"))
    spec = importlib.util.spec_from_file_location(
        "reference_pages", ROOT / "scripts" / "reference_pages.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.pages()


def on_files(files: Files, config: Any, **_: object) -> Files:
    for path, text in reference_pages().items():
        files.append(File.generated(config, path, content=text))
    return files
