"""What every `peg` command says and reads the same way (issue 46's silent gaps): a warning is
one line, `peg NAME: warning: ...`, as an error is; `peg select --labels` takes float labels
whose values are all integers, as `AutoSelect` does."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from bad_inputs import raises_test
from peg.apps import cli
from peg.apps.cli import main
from peg.apps.select.command import NOT_SAVED


def _saved(tmp_path, labels: np.ndarray) -> list[str]:
    """`peg select` on 60 rows of 3-class logits saved in `tmp_path`, with `labels`."""
    g = np.random.default_rng(0)
    y = np.asarray(labels).astype(np.int64) % 3
    logits = g.normal(size=(60, 3)) + 2 * np.eye(3)[y]
    np.save(tmp_path / "l.npy", logits.astype(np.float32))
    np.save(tmp_path / "y.npy", labels)
    return ["select", "--no-progress", "--logits", str(tmp_path / "l.npy"), "--labels",
            str(tmp_path / "y.npy"), "--candidates", "TS", "--cv", "2"]  # fmt: skip


def test_a_warning_is_one_line_naming_the_command(tmp_path, capsys):
    """It printed Python's `file.py:123: UserWarning: ...` and the source line that warned."""
    y = np.arange(60) % 2
    y[0] = 2  # class 2 has one point: fewer than the folds, which AutoSelect warns of
    assert main(_saved(tmp_path, y)) == 0
    err = [e for e in capsys.readouterr().err.splitlines() if NOT_SAVED not in e]
    assert err == [e for e in err if e.startswith("peg select: warning: ")] and err
    assert any("cv: 1 of 3 classes have fewer than 2 validation points" in e for e in err)
    assert not any(".py:" in e or "warnings.warn" in e or "UserWarning" in e for e in err)


def test_every_command_says_its_warnings_so_and_restores_python_s_own(monkeypatch, capsys):
    def warns(args, command, progress):
        warnings.warn("--x: first line\n  second line", UserWarning, stacklevel=1)
        return 0

    apply = dataclasses.replace(cli.COMMANDS["apply"], run=warns)
    monkeypatch.setitem(cli.COMMANDS, "apply", apply)
    before = warnings.showwarning
    assert main(["apply", "m", "--logits", "l.npy", "--out", "o.npy"]) == 0
    assert capsys.readouterr().err == "peg apply: warning: --x: first line second line\n"
    assert warnings.showwarning is before


def test_select_takes_integral_float_labels_as_the_api_does(tmp_path, capsys):
    y = (np.arange(60) % 3).astype(np.float64)
    assert main(_saved(tmp_path, y)) == 0
    assert "| TS |" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("bad", "said"),
    [(0.5, "the non-integer value 0.5 at row 7 of"), (np.nan, "non-integer value nan at row 7")],
)
def test_select_refuses_non_integral_labels_naming_the_row(tmp_path, capsys, bad, said):
    y = (np.arange(60) % 3).astype(np.float32)
    argv = _saved(tmp_path, y)
    y[7] = bad
    np.save(tmp_path / "y.npy", y)
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith("peg select: error: --labels: expected integer")
    assert said in err and err.count("\n") == 1


def _half_labels(tmp: Path) -> None:
    y = (np.arange(60) % 3).astype(np.float64)
    argv = _saved(tmp, y)
    y[7] = 0.5
    np.save(tmp / "y.npy", y)
    err = io.StringIO()
    try:
        with contextlib.chdir(tmp), contextlib.redirect_stderr(err):
            main([a.replace(str(tmp) + "/", "") for a in argv])
    except SystemExit as e:
        raise SystemExit(f"exit {e.code}: {err.getvalue().strip().splitlines()[-1]}") from None


FILE_ERROR_CASES: list[tuple[str, str, Callable[[Path], object], type[BaseException], str]] = [
    ("peg (CLI)", "peg select --labels with a non-integer float", _half_labels,
     SystemExit, r"exit 2: peg select: error: --labels: expected integer class labels \[N\], got "
     r"the non-integer value 0\.5 at row 7 of y\.npy \(dtype float64\)"),
]  # fmt: skip

test_bad_files = raises_test(FILE_ERROR_CASES, files=True)


def test_big_endian_npy_files_are_read_as_native_ones(tmp_path, capsys):
    """`peg select` and `peg monitor` stopped with torch's "byte order different from the
    native byte order" (`peg apply` read them): the files' arrays are swapped as they are read."""
    y = np.arange(60) % 3
    args = _saved(tmp_path, y)
    np.save(tmp_path / "l.npy", np.load(tmp_path / "l.npy").astype(">f4"))
    np.save(tmp_path / "y.npy", y.astype(">i8"))
    assert main(args) == 0
    assert "| TS |" in capsys.readouterr().out
    monitor = [
        "monitor",
        "--reference-logits",
        str(tmp_path / "l.npy"),
        "--reference-labels",
        str(tmp_path / "y.npy"),
        "--logits",
        str(tmp_path / "l.npy"),
        "--out",
        str(tmp_path / "m"),
    ]
    assert main(monitor) == 0
    assert (tmp_path / "m" / "results.json").is_file()
