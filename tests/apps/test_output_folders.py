"""Issue 46, item 14: `peg bench`, `peg paper-tables` and `peg diversity` wrote into any folder.
Now each claims its output folder before any work, as compare, select and demo do
(`peg.apps.results.claim`): a non-empty folder it did not make is refused, `--overwrite`
writes, a folder it marked reruns; `peg diversity` reads its YAML without aliases. The
refusals on the command line are error cases, rendered into docs/errors.md.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from bad_inputs import raises_test
from peg.apps import results
from peg.apps.bench import paper, runner
from peg.apps.bench.spec import find_spec, load_specs
from peg.apps.cli import main
from peg.apps.diversity import study
from peg.apps.diversity.config import load_config

QUICK = load_specs(find_spec("quick"))[0]  # its folder: out/quick-moons


class _Worked(Exception):
    """Raised where the work would begin: a refusal must come before it."""


def _no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    def work(*args: object, **kwargs: object) -> None:
        raise _Worked

    monkeypatch.setattr(runner, "_per_seed", work)
    monkeypatch.setattr(paper, "SeedRun", work)
    monkeypatch.setattr(study, "_run", work)


def _mine(folder: Path, name: str = "results.md") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("my own")
    return folder


RUNS: dict[str, Callable[..., object]] = {
    "bench": lambda out, **kw: runner.run_spec(QUICK, out, out / "c", progress=False,
                                               say=lambda _: None, **kw),
    "paper-tables": lambda out, **kw: paper.run("digits", [0], out, out.parent / "c",
                                                progress=False, say=lambda _: None, **kw),
    "diversity": lambda out, **kw: study.run(out=out, cache=None, progress=False,
                                             say=lambda _: None, **kw),
}  # fmt: skip
# the folder each writes its files into, under `out`
WRITTEN = {"bench": QUICK.name, "paper-tables": ".", "diversity": "."}


@pytest.mark.parametrize("application", list(RUNS))
def test_a_folder_of_the_users_is_refused_before_any_work(tmp_path, monkeypatch, application):
    _no_work(monkeypatch)
    out = tmp_path / "out"
    folder = _mine(out / WRITTEN[application])
    run = RUNS[application]
    with pytest.raises(FileExistsError, match=rf"out: .* is a non-empty folder peg {application} "
                       r"did not make .*overwrite=True \(--overwrite\)"):  # fmt: skip
        run(out)
    assert (folder / "results.md").read_text() == "my own"
    assert not results.is_marked(folder, application)
    with pytest.raises(_Worked):  # overwrite: marked, then the work begins
        run(out, overwrite=True)
    assert results.is_marked(folder, application)
    with pytest.raises(_Worked):  # now the application's: a rerun goes on
        run(out)
    with pytest.raises(_Worked):  # a new folder too
        run(tmp_path / "new")
    assert results.is_marked(tmp_path / "new" / WRITTEN[application], application)


@pytest.mark.parametrize(
    "application, found, keys",
    [("bench", f"{QUICK.name}/results.json", ("command", "commit", "machine", "datasets")),
     ("paper-tables", "paper-tables-digits.json", ("preset", "seeds", "entries", "tables")),
     ("diversity", "results.json", ("config", "table", "trajectory_history", "figures"))],
)  # fmt: skip
def test_an_earlier_versions_results_rerun_and_other_json_does_not(
    tmp_path, monkeypatch, application, found, keys
):
    """Before the marks: a results JSON the application wrote (its keys) makes the folder its
    own (the repository's results/ reruns without --overwrite); JSON of other keys does not."""
    _no_work(monkeypatch)
    path = tmp_path / "out" / found
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"command": "x"}))
    with pytest.raises(FileExistsError, match="did not make"):
        RUNS[application](tmp_path / "out")
    path.write_text(json.dumps(dict.fromkeys(keys, 0)))
    with pytest.raises(_Worked):
        RUNS[application](tmp_path / "out")


def test_paper_tables_shares_the_results_folder_with_the_other_commands(tmp_path, monkeypatch):
    """`peg bench quick`, `peg diversity --out results/diversity`, then `peg paper-tables`, all
    into the default `results`: its entries are folders peg marked, so the tables go there; a
    file of the user's beside them is refused."""
    _no_work(monkeypatch)
    out = tmp_path / "results"
    for run, where in ((RUNS["bench"], out), (RUNS["diversity"], out / "diversity")):
        with pytest.raises(_Worked):
            run(where)
    with pytest.raises(_Worked):
        RUNS["paper-tables"](out)
    (out / ".peg-paper-tables").unlink()
    (out / "notes.md").write_text("mine")
    with pytest.raises(FileExistsError, match="peg paper-tables did not make"):
        RUNS["paper-tables"](out)


def _cli(tmp: Path, *argv: str) -> None:
    """`peg ARGV` in `tmp`; a SystemExit says the exit status and the last line printed."""
    err = io.StringIO()
    with contextlib.chdir(tmp), contextlib.redirect_stderr(err):
        try:
            main(list(argv))
        except SystemExit as e:
            printed = err.getvalue().strip().splitlines()
            raise SystemExit(f"exit {e.code}: {printed[-1] if printed else ''}") from None


def _refused(tmp: Path, *argv: str, inside: str = ".") -> None:
    """`peg ARGV --out mine-<command>`, a folder holding a file of the user's (a folder of its
    own: docs/errors.md renders every case in one temporary folder)."""
    _mine(tmp / f"mine-{argv[0]}" / inside, "notes.md")
    _cli(tmp, *argv, "--out", f"mine-{argv[0]}", "--no-progress")


FILE_ERROR_CASES: list[tuple[str, str, Callable[[Path], object], type[BaseException], str]] = [
    ("peg (CLI)", "peg bench --out: a folder of the user's",
     lambda tmp: _refused(tmp, "bench", "quick", inside="quick-moons"),
     SystemExit, r"exit 2: peg bench: error: out: mine-bench/quick-moons is a non-empty folder peg "
     r"bench did not make \(it holds \['notes\.md'\]\); results\.json, results\.md and the "
     r"figures would replace files of the same names: give a new or empty folder, or "
     r"overwrite=True \(--overwrite\) to write into it"),
    ("peg (CLI)", "peg paper-tables --out: a folder of the user's",
     lambda tmp: _refused(tmp, "paper-tables", "--preset", "digits"),
     SystemExit, r"exit 2: peg paper-tables: error: out: mine-paper-tables is a non-empty "
     r"folder peg paper-tables did not make \(it holds \['notes\.md'\]\); "
     r"paper-tables-digits\.json and paper-tables-digits\.md would replace"),
    ("peg (CLI)", "peg diversity --out: a folder of the user's",
     lambda tmp: _refused(tmp, "diversity", "--quick"),
     SystemExit, r"exit 2: peg diversity: error: out: mine-diversity is a non-empty folder peg "
     r"diversity did not make \(it holds \['notes\.md'\]\)"),
    ("diversity", "a YAML spec of aliases (an alias bomb)",
     lambda tmp: load_config(_write(tmp / "d.yaml", "a: &a [1, 1]\nb: [*a, *a]\n")),
     ValueError, r"d\.yaml: not valid YAML at line 2, column 5: alias \*a refused"),
]  # fmt: skip

test_bad_files = raises_test(FILE_ERROR_CASES, files=True)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "argv",
    [("bench", "quick"), ("paper-tables", "--preset", "digits"), ("diversity", "--quick")],
)
def test_overwrite_on_the_command_line_goes_on_to_the_work(tmp_path, monkeypatch, argv):
    _no_work(monkeypatch)
    inside = QUICK.name if argv[0] == "bench" else "."
    _mine(tmp_path / "mine" / inside, "notes.md")
    with contextlib.chdir(tmp_path), pytest.raises(_Worked):
        main([*argv, "--out", "mine", "--cache", "c", "--no-progress", "--overwrite"])
    assert results.is_marked(tmp_path / "mine" / inside, argv[0])
