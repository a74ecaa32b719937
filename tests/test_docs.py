"""The README and the guides in docs/ run as written, as a user would run them, and their links
resolve.

Every fenced block opened with ```python in README.md and in docs/**/*.md is run, in the order
it appears, in one namespace per file (a later block sees what an earlier one defined), as a
user would: in a process of its own (this Python, with the peg the tests import on its path,
forked by tests/docs_run.py from a server that imported torch, numpy and peg once, in the state
a fresh Python starts in), whose working directory is a scratch folder outside the repository
(the examples write archives and checkpoints there). The blocks are self-contained: each file
builds its own tiny model and data in its first block, as a reader copying them would. A block
opened with ```python no-run is shown but not run (long benchmarks, torchrun); blocks in other
languages (bash, yaml, text) are not run, except a ```bash block right under the line `<!-- the
docs test runs the next block's commands ... -->`: its `peg ...` commands (and `cd DIR`) run
where the block stands, after the Python blocks above it, from the scratch folder, each in a
process of its own as the installed `peg` runs them, and must exit 0.

Every page promises that its examples print the same on every run: each page runs twice, each
time in a folder of its own, and what each block prints (a block's last bare expression is
shown, as in a notebook) must be the same both times. A block whose output cannot be the same
(wall-clock times) says why in an HTML comment on the line above its fence, `<!-- the docs test:
the next block's output varies (REASON) -->`; its output is not compared. The second run stops
after the last block whose output it compares. A block that needs a data set that is not under
any data root skips the page with peg's message, after the blocks above it ran. A block may
take SLOW_BLOCK_SECONDS of CPU (not of wall-clock time, which a busy machine inflates); the
runs get OMP_NUM_THREADS=1 unless it is set, as conftest.py gives the tests one thread.
docs/index.md documents these markers.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from docs_run import RECORD_SEPARATOR, Server

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOC_FILES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
NO_RUN = "no-run"  # the one marker: ```python no-run
RUN_COMMANDS = "<!-- the docs test runs the next block's commands"  # the line above a ```bash block
VARIES = "<!-- the docs test: the next block's output varies ("  # then the reason, ") -->"
PAGE_SECONDS = 600  # one run of a page, in a fresh process (a page takes seconds)
README_MAX_LINES = 200
SLOW_BLOCK_SECONDS = 30  # CPU seconds: a block is meant to take a second or two (imports included)
FENCE = re.compile(r"^(\s*)(```+)(.*)$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the block's first code line
    info: str  # the fence's info string, e.g. "python" or "python no-run"
    code: str
    notes: tuple[str, ...] = ()  # the HTML comment lines right above the fence

    @property
    def where(self) -> str:
        return f"{_id(self.path)}:{self.line}"

    @property
    def is_python(self) -> bool:
        return self.info.split()[:1] == ["python"]

    @property
    def runs(self) -> bool:
        return self.info == "python"

    @property
    def marked(self) -> bool:
        """The line right above the fence is RUN_COMMANDS."""
        return bool(self.notes) and self.notes[-1].startswith(RUN_COMMANDS)

    @property
    def runs_commands(self) -> bool:
        return self.marked and self.info == "bash"

    @property
    def varies(self) -> str | None:
        """The reason given by a VARIES note above the fence: its output is not compared."""
        for note in self.notes:
            if note.startswith(VARIES):
                return note[len(VARIES) :].removesuffix("-->").strip().removesuffix(")")
        return None

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
        k = i
        while k > 0 and lines[k - 1].startswith("<!--"):
            k -= 1
        notes = tuple(lines[k:i])
        found.append(Block(path, i + 2, info, "\n".join(body) + "\n", notes))
        i = j + 1
    return found


def _id(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


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


def _steps(path: Path) -> list[dict]:
    """The runnable blocks of a page, in order, as tests/docs_run.py reads them."""
    steps = []
    for b in blocks(path):
        if b.runs_commands:
            for argv in b.commands():
                assert argv[0] in ("peg", "cd"), f"{b.where}: only peg and cd run, not {argv[0]!r}"
            steps.append({"kind": "commands", "where": b.where, "commands": b.commands()})
        elif b.runs:
            steps.append({"kind": "python", "where": b.where, "path": str(path), "line": b.line,
                          "code": b.code})  # fmt: skip
    return steps


def _by_step(text: str, folder: Path) -> dict[str, str]:
    """A stream split at the runner's separators: each step's text, keyed by its place, with
    the scratch folder's path replaced by `.` (each run has a folder of its own)."""
    out = {}
    for chunk in text.split(RECORD_SEPARATOR)[1:]:
        where, _, rest = chunk.partition("\n")
        out[where] = rest.replace(str(folder), ".")
    return out


def _run(runner: Server, request: dict) -> int:
    """One run (a request as docs_run.py reads it) in its own process: its exit status."""
    request = {**request, "env": {**os.environ, **{k: runner.env[k] for k in
               ("PYTHONPATH", "OMP_NUM_THREADS")}}, "timeout": PAGE_SECONDS}  # fmt: skip
    return runner.ask(request, PAGE_SECONDS + 60)["status"]


@pytest.fixture(scope="session")
def runners(tmp_path_factory) -> Iterator[tuple[Server, Server]]:
    """Two servers, one for each run of a page: two processes, so the runs differ in what two
    fresh Pythons differ in (the hash seed, memory addresses), not only in the seeds a fork
    redraws."""
    folder = tmp_path_factory.mktemp("docs-runners")
    pair = (Server(folder / "first.log"), Server(folder / "second.log"))
    yield pair
    for runner in pair:
        runner.close()


def _run_page(
    runner: Server, path: Path, folder: Path, upto: int | None = None
) -> tuple[list[dict], dict[str, str], dict[str, str]]:
    """One run of a page's blocks (the first `upto`, or all) in a fresh process from `folder`:
    the report of each step, and what each step printed on stdout and on stderr."""
    folder.mkdir(parents=True)
    files = {k: folder.parent / f"{folder.name}{k}" for k in ("-steps.json", ".json", ".out",
             ".err")}  # fmt: skip
    steps, report = files["-steps.json"], files[".json"]
    steps.write_text(json.dumps(_steps(path)[:upto]), encoding="utf-8")
    status = _run(runner, {"steps": str(steps), "report": str(report), "cwd": str(folder),
                         "stdout": str(files[".out"]), "stderr": str(files[".err"])})  # fmt: skip
    stdout, stderr = (files[k].read_text(encoding="utf-8") for k in (".out", ".err"))
    assert status == 0 and report.exists(), (
        f"{_id(path)}: the runner exited {status}\n{stderr[-3000:]}"
    )
    report_ = json.loads(report.read_text(encoding="utf-8"))
    assert len(report_) == len(_steps(path)[:upto]) or any(
        "error" in e or "missing_data" in e for e in report_
    ), f"{_id(path)}: the runner stopped early\n{stderr[-3000:]}"
    return report_, _by_step(stdout, folder), _by_step(stderr, folder)


def _check_report(path: Path, report: list[dict], stderr: dict[str, str]) -> None:
    """Every step ran without error and in time; a missing data set skips the page."""
    by_place = {b.where: b for b in blocks(path)}
    for entry in report:
        where, b = entry["where"], by_place[entry["where"]]
        assert "error" not in entry, (
            f"{where}: the block starting here failed:\n{entry['error'][-3000:]}\n"
            f"stderr:\n{stderr.get(where, '')[-2000:]}"
        )
        if "missing_data" in entry:
            pytest.skip(f"{where}: needs a data set not present here: {entry['missing_data']}")
        commands = sum(a[0] == "peg" for a in b.commands()) if b.runs_commands else 1
        limit = SLOW_BLOCK_SECONDS * commands  # each command starts a Python and imports peg
        assert entry["cpu"] < limit or (b.runs and _imports_only(b.code)), (
            f"{where}: took {entry['cpu']:.0f} s of CPU ({entry['seconds']:.0f} s); use smaller "
            f"sizes or mark it ```python {NO_RUN}"
        )


@pytest.mark.parametrize("path", RUNNABLE, ids=_id)
def test_examples_run(path, tmp_path, runners):
    """Each page's examples run as a user would run them, twice, and print the same twice."""
    _run_twice(path, tmp_path, runners)


def _run_twice(path: Path, tmp_path: Path, runners: tuple[Server, Server]) -> None:
    report, first, stderr = _run_page(runners[0], path, tmp_path / "first")
    _check_report(path, report, stderr)
    by_place = {b.where: b for b in blocks(path)}
    compared = {w: text for w, text in first.items() if by_place[w].varies is None and text}
    if not compared:
        return  # nothing printed: a second run has nothing to compare
    places = [step["where"] for step in _steps(path)]
    upto = max(places.index(w) for w in compared) + 1  # the blocks after the last print: no need
    report, second, stderr = _run_page(runners[1], path, tmp_path / "second", upto)
    _check_report(path, report, stderr)
    for where, text in compared.items():
        assert second[where] == text, (
            f"{where}: the block starting here printed differently on a second run "
            f"(seed it, or mark it {VARIES}REASON) -->):\n--- first\n{text}--- second\n"
            f"{second[where]}"
        )


def test_the_runs_catch_differing_output_and_skip_for_missing_data(tmp_path, monkeypatch, runners):
    """The harness itself: output that differs between two runs fails unless its block is
    marked; a block needing a data set that no root holds skips the page with peg's message."""
    page = tmp_path / "page.md"
    varies = f"{VARIES}a fresh process's id) -->"
    page.write_text(
        f"{varies}\n```python\nimport os\nprint(os.getpid())\n```\n\n"
        "```python\nos.getpid()\n```\n",  # the last expression, shown
        encoding="utf-8",
    )
    assert [b.varies for b in blocks(page)] == ["a fresh process's id", None]
    with pytest.raises(AssertionError, match=r"page.md:8: the block starting here printed"):
        _run_twice(page, tmp_path / "pid", runners)
    monkeypatch.setenv("PEG_DATA_ONLY", "1")  # only $PEG_DATA, an empty folder, is searched
    monkeypatch.setenv("PEG_DATA", str(tmp_path / "no-data"))
    page.write_text(
        '```python\nprint("before")\n```\n\n```python\nfrom peg.data import load\n\n'
        'load("fashion-mnist", "test")\n```\n\n```python\nprint("never")\n```\n',
        encoding="utf-8",
    )
    with pytest.raises(pytest.skip.Exception, match=r"page.md:6: needs a data set .*fashion-mnist"):
        _run_twice(page, tmp_path / "data", runners)


def test_each_run_is_as_fresh_as_a_new_python(tmp_path, runners):
    """The runs are forked from servers that imported peg once: what a fresh Python draws
    anew (numpy's global seed, the hash seed) still differs between the two runs, nothing a
    run did is seen by the next, and a bash block's `peg` commands run as the installed
    command does (their output in their block, `--help`'s exit 0, a bad command's exit 2)."""
    page = tmp_path / "page.md"
    page.write_text("```python\nimport numpy as np\n\nprint(np.random.rand())\n```\n")
    with pytest.raises(AssertionError, match=r"page.md:2: the block starting here printed"):
        _run_twice(page, tmp_path / "numpy", runners)
    if "PYTHONHASHSEED" not in os.environ:  # set, every fresh Python has the same
        page.write_text('```python\nprint(hash("peg"))\n```\n')
        with pytest.raises(AssertionError, match=r"page.md:2: the block starting here printed"):
            _run_twice(page, tmp_path / "hash", runners)
    page.write_text("```python\nimport torch\n\ntorch.set_default_dtype(torch.float64)\n```\n")
    _run_page(runners[0], page, tmp_path / "leaks")
    page.write_text(
        "```python\nimport torch\n\nprint(torch.get_default_dtype())\n```\n\n"
        f"{RUN_COMMANDS}, after the blocks above -->\n```bash\npeg compare --help\n```\n"
    )
    report, out, _ = _run_page(runners[0], page, tmp_path / "fresh")
    assert [e.get("error") for e in report] == [None, None]
    assert out["page.md:2"] == "torch.float32\n" and "usage: peg compare" in out["page.md:9"]
    page.write_text(f"{RUN_COMMANDS}, after the blocks above -->\n```bash\npeg no-such\n```\n")
    report, _, stderr = _run_page(runners[1], page, tmp_path / "bad")
    assert "peg no-such exited 2" in report[0]["error"] and "invalid choice" in stderr["page.md:3"]


def test_the_command_blocks_are_marked_and_run():
    """The README's quick start on the command line and compare's example run as written; the
    markers sit right above the block they mark."""
    marked = {
        _id(p): [argv[:2] for b in blocks(p) if b.runs_commands for argv in b.commands()]
        for p in DOC_FILES
    }
    assert ["peg", "select"] in marked["README.md"] and ["peg", "apply"] in marked["README.md"]
    assert ["peg", "compare"] in marked["docs/compare.md"]
    for path in DOC_FILES:
        lines = path.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines[:-1]):
            if line.startswith(RUN_COMMANDS):
                assert lines[i + 1].strip() == "```bash", (
                    f"{_id(path)}:{i + 1}: marker not above a bash block"
                )
            if line.startswith(VARIES):  # a reason, then the fence or the commands' marker
                assert re.fullmatch(re.escape(VARIES) + r".+\) -->", line), (
                    f"{_id(path)}:{i + 1}: say why: {VARIES}REASON) -->"
                )
                assert lines[i + 1].startswith(("```", RUN_COMMANDS)), (
                    f"{_id(path)}:{i + 1}: marker not right above a block"
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


MACHINE_PATH = re.compile(r"(?<![\w$.}/~-])/(?:work|home|tmp|Users|root|mnt|scratch|private)/")


@pytest.mark.parametrize("path", DOC_FILES, ids=_id)
def test_no_page_quotes_a_machine_path(path):
    """A page's prose (inline code included) names no folder of the machine it was written on
    (`/work/...`, `/home/...`, `/tmp/...`): a reader has other folders. Code blocks are the
    examples, which write to the folder they run in."""
    for line in _outside_code(path):
        found = MACHINE_PATH.search(line)
        assert not found, f"{_id(path)}: quotes a machine path: {line.strip()[:160]!r}"


# ------------------------------------------------------------------------------------ the site
# `mkdocs build --strict` runs once, in tests/test_reference.py::test_the_site_builds (it
# checks the hand-written pages and the generated reference together).
