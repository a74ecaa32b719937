"""The README and the guides in docs/ run as written, and their links resolve.

Every fenced block opened with ```python in README.md and in docs/**/*.md is run, in the order
it appears, in one namespace per file (a later block sees what an earlier one defined), in a
temporary working directory (the examples write archives and checkpoints there). The blocks are
self-contained: each file builds its own tiny model and data in its first block, as a reader
copying them would. A block opened with ```python no-run is shown but not run (long
benchmarks, torchrun); blocks in other languages (bash, yaml, text) are not run, except a ```bash
block right under the line `<!-- the docs test runs the next block's commands ... -->`: its
`peg ...` commands run where the block stands, after the Python blocks above it, in the same
folder, and must exit 0. docs/index.md documents these markers.
"""

from __future__ import annotations

import ast
import re
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOC_FILES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
NO_RUN = "no-run"  # the one marker: ```python no-run
RUN_COMMANDS = "<!-- the docs test runs the next block's commands"  # the line above a ```bash block
README_MAX_LINES = 200
SLOW_BLOCK_SECONDS = 30  # a block meant to take a second or two; far slower: shrink it or mark it
FENCE = re.compile(r"^(\s*)(```+)(.*)$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the block's first code line
    info: str  # the fence's info string, e.g. "python" or "python no-run"
    code: str
    marked: bool = False  # the line above the fence is RUN_COMMANDS

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def is_python(self) -> bool:
        return self.info.split()[:1] == ["python"]

    @property
    def runs(self) -> bool:
        return self.info == "python"

    @property
    def runs_commands(self) -> bool:
        return self.marked and self.info == "bash"

    def commands(self) -> list[list[str]]:
        """The `peg ...` commands of a bash block, continuation lines joined, as argv lists."""
        text = self.code.replace("\\\n", " ")
        lines = [line.strip() for line in text.splitlines()]
        return [shlex.split(line, comments=True) for line in lines if line and line[0] != "#"]


def blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a markdown file, with their info strings and first lines."""
    found, lines = [], path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, ticks, info = m.group(1), m.group(2), m.group(3).strip()
        body, j = [], i + 1
        while j < len(lines) and not (
            lines[j].strip().startswith(ticks) and lines[j].strip().strip("`") == ""
        ):
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j])
            j += 1
        assert j < len(lines), f"{path.relative_to(ROOT)}:{i + 1}: unclosed code block"
        marked = i > 0 and lines[i - 1].startswith(RUN_COMMANDS)
        found.append(Block(path, i + 2, info, "\n".join(body) + "\n", marked))
        i = j + 1
    return found


def _id(path: Path) -> str:
    return str(path.relative_to(ROOT))


RUNNABLE = [p for p in DOC_FILES if any(b.runs or b.runs_commands for b in blocks(p))]


def test_the_docs_have_examples_to_run():
    assert README in RUNNABLE
    assert sum(b.runs for p in DOC_FILES for b in blocks(p)) >= 20


def test_python_blocks_are_run_or_marked_exactly():
    """A typo in the marker (```python norun, ```py) would silently skip or run a block."""
    for path in DOC_FILES:
        for b in blocks(path):
            assert not b.info.startswith("py") or b.info in ("python", f"python {NO_RUN}"), (
                f"{b.where}: info string {b.info!r}; use 'python' or 'python {NO_RUN}'"
            )


def _imports_only(code: str) -> bool:
    """A block of imports alone (a framework such as Lightning takes longer to import than an
    example should run, on a loaded machine): its time is the library's, not the example's."""
    body = ast.parse(code).body
    return bool(body) and all(isinstance(s, (ast.Import, ast.ImportFrom)) for s in body)


@pytest.mark.parametrize("path", RUNNABLE, ids=_id)
def test_examples_run(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "__main__"}
    for b in blocks(path):
        if b.runs_commands:
            _run_commands(b)
        if not b.runs:
            continue
        # Pad with blank lines so a traceback points at the line of the markdown file.
        code = compile("\n" * (b.line - 1) + b.code, str(path), "exec")
        start = time.perf_counter()
        try:
            exec(code, namespace)
        except Exception as e:
            raise AssertionError(f"{b.where}: the block starting here raised {e!r}") from e
        seconds = time.perf_counter() - start
        assert seconds < SLOW_BLOCK_SECONDS or _imports_only(b.code), (
            f"{b.where}: took {seconds:.0f} s; use smaller sizes or mark it ```python {NO_RUN}"
        )


def _run_commands(b: Block) -> None:
    from peg.apps.cli import main

    for argv in b.commands():
        assert argv[0] == "peg", f"{b.where}: only peg commands are run, not {argv[0]!r}"
        try:
            status = main(argv[1:])
        except SystemExit as e:  # argparse and the one-line errors exit
            status = e.code
        assert status == 0, f"{b.where}: {shlex.join(argv)} exited {status}"


def test_the_command_blocks_are_marked_and_run():
    """The README's quick start on the command line and compare's example run as written."""
    marked = {
        _id(p): [b.commands()[0][:2] for b in blocks(p) if b.runs_commands] for p in DOC_FILES
    }
    assert ["peg", "select"] in marked["README.md"] and ["peg", "compare"] in marked[
        "docs/compare.md"
    ]
    for path in DOC_FILES:
        lines = path.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines[:-1]):
            if line.startswith(RUN_COMMANDS):
                assert lines[i + 1].strip() == "```bash", (
                    f"{_id(path)}:{i + 1}: marker not above a bash block"
                )


def test_readme_is_short_and_shows_the_commands():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md: {len(lines)} lines > {README_MAX_LINES}"
    assert "bash scripts/test.sh" in lines
    assert "bash scripts/demo.sh" in lines


# ------------------------------------------------------------------------------------ links
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)", re.M)
HTML_SRC = re.compile(r"""(?:src|href)=["']([^"']+)["']""")


def _outside_code(path: Path) -> list[str]:
    """The file's lines outside fenced code blocks."""
    out, fence = [], None
    for line in path.read_text(encoding="utf-8").splitlines():
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(2)
        elif fence is not None and line.strip().startswith(fence) and not line.strip("` \t"):
            fence = None
        elif fence is None:
            out.append(line)
    return out


def _prose(path: Path) -> str:
    """The file without its code blocks and inline code (links there are not links)."""
    return re.sub(r"(`+)(?:(?!\1).)+\1", "", "\n".join(_outside_code(path)))


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    seen: dict[str, int] = {}
    out = set()
    for line in _outside_code(path):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1))  # a link's text
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(path: Path) -> list[str]:
    text = _prose(path)
    return LINK.findall(text) + REF_DEF.findall(text) + HTML_SRC.findall(text)


@pytest.mark.parametrize("path", DOC_FILES, ids=_id)
def test_relative_links_resolve(path):
    for target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto:, ...
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        assert dest.exists(), f"{_id(path)}: link to {target!r}: no such file"
        if anchor and dest.suffix == ".md":
            assert anchor in anchors(dest), f"{_id(path)}: link to {target!r}: no such heading"


# ------------------------------------------------------------------------------------ the site
def test_the_site_builds(tmp_path):
    """`mkdocs build --strict` (mkdocs.yml): every page in the nav, every anchor found, no
    warning; offline (the built-in theme) and quick. Skipped where mkdocs is not installed
    (it is in the dev extra)."""
    pytest.importorskip("mkdocs")
    import subprocess
    import sys

    site = tmp_path / "site"
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert (site / "index.html").exists() and (site / "glossary.html").exists()
