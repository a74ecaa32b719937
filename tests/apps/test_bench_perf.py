"""`peg bench-perf`: runs benchmark scripts in fresh processes and keeps their transcripts."""

from __future__ import annotations

import contextlib
import io

import pytest

from peg.apps.bench.perf import run_benchmarks
from peg.apps.cli import main


@pytest.fixture
def folder(tmp_path):
    scripts = tmp_path / "benchmarks"
    scripts.mkdir()
    (scripts / "fast.py").write_text("import sys\nprint('ratio 0.5', '--quick' in sys.argv)\n")
    (scripts / "broken.py").write_text("raise SystemExit('no such model')\n")
    return scripts


def test_runs_every_script_and_writes_its_transcript(folder, tmp_path):
    said: list[str] = []
    status = run_benchmarks(folder=folder, out=tmp_path / "out", say=said.append)
    assert status == {"broken": 1, "fast": 0}
    text = (tmp_path / "out" / "fast.txt").read_text().splitlines()
    assert text[0] == f"$ python {folder / 'fast.py'}" and text[1].startswith("commit: ")
    assert text[2] == "ratio 0.5 False"
    assert "no such model" in (tmp_path / "out" / "broken.txt").read_text()
    assert "broken: failed with exit status 1" in said


def test_quick_passes_the_flag_and_the_cli_writes_nothing_by_default(folder, tmp_path):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["bench-perf", "fast", "--quick", "--dir", str(folder)])
    assert code == 0 and "ratio 0.5 True" in out.getvalue()
    assert not (tmp_path / "results").exists()


def test_unknown_names_and_missing_folders_are_named_before_anything_runs(folder, tmp_path):
    with pytest.raises(ValueError, match=r"names: unknown benchmark\(s\) \['nope'\]"):
        run_benchmarks(["fast", "nope"], folder=folder, out=tmp_path / "out")
    assert not (tmp_path / "out").exists()
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as e:
        main(["bench-perf", "--dir", str(tmp_path / "missing")])
    assert e.value.code == 2 and "peg bench-perf: error: dir:" in err.getvalue()
