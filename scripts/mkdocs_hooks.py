"""MkDocs hooks (mkdocs.yml `hooks:`).

- The docs' own fence marker, ```python no-run, shown as the Python it is. Python-Markdown's
  fenced code takes one word after the fence; left as it is, the marker would not open a code
  block and the rest of the page would be misread.
- The Reference pages (docs/reference/...: one per public class, function and `peg` command),
  written from the code of this checkout (src/ first on the path) by scripts/reference_pages.py
  and added as generated files: none is on disk, so none can drift from the code.
- The repository's files the pages link to outside docs/ (the README, results/...: links that
  GitHub follows), added under `repo/` with their repository paths (`repo/README.md`,
  `repo/results/benchmarks/x.txt`; a linked folder as a page listing its files, each added),
  and every link to them rewritten to those copies: no link of the site is dead, and
  `mkdocs build --strict` (mkdocs.yml's `validation:`) fails on one that is.
"""

from __future__ import annotations

import importlib.util
import posixpath
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files, InclusionLevel

NO_RUN = re.compile(r"^(\s*```+)python no-run\s*$", re.M)
ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
REPO = "repo"  # where the repository's files linked from the pages sit in the site
FENCE = re.compile(r"^\s*(```+|~~~+)")
# a Markdown link or image target `](target)`, or an HTML `src=`/`href=`
LINK = re.compile(r"""(\]\(\s*<?|(?:src|href)=["'])([^)\s>"'#]*)(#[^)\s>"']*)?""")
SKIPPED = ("__pycache__",)


def on_page_markdown(markdown: str, page: Any, **_: object) -> str:
    markdown = NO_RUN.sub(r"\1python", markdown)
    return "\n".join(_rewritten(markdown, _repository_path(page.file.src_uri)))


def _repository_path(src_uri: str) -> str:
    """The repository path of a site page (`index.md` -> `docs/index.md`)."""
    return src_uri[len(REPO) + 1 :] if src_uri.startswith(REPO + "/") else f"docs/{src_uri}"


def _prose(lines: list[str]) -> Iterator[tuple[bool, str]]:
    """Each line and whether it is prose (outside a fenced code block)."""
    fence = None
    for line in lines:
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)
            yield False, line
        elif fence is not None:
            if line.strip().startswith(fence) and not line.strip().strip(fence[0]):
                fence = None
            yield False, line
        else:
            yield True, line


def _target(page: str, link: str) -> Path | None:
    """The repository file or folder a relative link of the page at repository path `page`
    points to (None: a URL, an anchor, a generated page, or a page of docs/ linked from docs/,
    which mkdocs resolves itself)."""
    if not link or re.match(r"^[a-z][a-z0-9+.-]*:|^/", link, re.I):
        return None
    target = (ROOT / posixpath.dirname(page) / link).resolve()
    if target.is_relative_to(DOCS) and page.startswith("docs/"):
        return None
    return target if target.is_relative_to(ROOT) and target.exists() else None


def _site_path(target: Path) -> str:
    """Where a repository file is in the site: docs/ as it is, the others under `repo/`."""
    if target.is_relative_to(DOCS):
        return target.relative_to(DOCS).as_posix()
    rel = target.relative_to(ROOT).as_posix()
    return f"{REPO}/{rel}/index.md" if target.is_dir() else f"{REPO}/{rel}"


def _rewritten(markdown: str, page: str) -> Iterator[str]:
    """The page's lines, each link that leaves docs/ rewritten to the copy in the site."""
    here = posixpath.dirname(page[len("docs/") :] if page.startswith("docs/") else f"{REPO}/{page}")

    def rewrite(m: re.Match[str]) -> str:
        target = _target(page, m.group(2))
        if target is None:
            return m.group(0)
        new = posixpath.relpath(_site_path(target), here or ".")
        return m.group(1) + new + (m.group(3) or "")

    for is_prose, line in _prose(markdown.splitlines()):
        yield LINK.sub(rewrite, line) if is_prose else line


def linked_files() -> dict[str, Path | str]:
    """The repository's files and folders the pages link to outside docs/, and those their
    Markdown links to in turn: {site path: the file, or a folder's listing page's text}."""
    out: dict[str, Path | str] = {}
    queue = [(f"docs/{p.relative_to(DOCS).as_posix()}", p) for p in sorted(DOCS.rglob("*.md"))]
    while queue:
        page, path = queue.pop()
        for is_prose, line in _prose(path.read_text(encoding="utf-8").splitlines()):
            for m in LINK.finditer(line) if is_prose else ():
                target = _target(page, m.group(2))
                if target is None or target.is_relative_to(DOCS) or _site_path(target) in out:
                    continue
                for found in [target, *sorted(target.rglob("*"))] if target.is_dir() else [target]:
                    if set(found.relative_to(ROOT).parts) & set(SKIPPED):
                        continue
                    site = _site_path(found)
                    out[site] = _listing(found) if found.is_dir() else found
                    if found.suffix == ".md":
                        queue.append((found.relative_to(ROOT).as_posix(), found))
    return out


def _listing(folder: Path) -> str:
    """A folder's page: its files and folders, each linked."""
    rel = folder.relative_to(ROOT).as_posix()
    items = [
        f"- [`{p.name}/`]({p.name}/index.md)" if p.is_dir() else f"- [`{p.name}`]({p.name})"
        for p in sorted(folder.iterdir())
        if not p.name.startswith(".") and p.name not in SKIPPED
    ]
    return "\n".join([f"# `{rel}/`", "", f"The repository's folder `{rel}/`.", "", *items, ""])


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
    for path, source in linked_files().items():
        where = {"abs_src_path": str(source)} if isinstance(source, Path) else {"content": source}
        files.append(File.generated(config, path, inclusion=InclusionLevel.NOT_IN_NAV, **where))
    return files
