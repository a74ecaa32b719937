"""`peg apply`: a map fitted on saved logits (`peg select --logits ... --save DIR`, or any
calibrator fitted on `nn.Identity()` and saved) applied to a new `.npy` of logits."""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import peg
from bad_inputs import raises_test
from peg.apps import apply
from peg.apps.cli import main

C = 4


def saved(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, C, (n,), generator=g)
    return torch.randn(n, C, generator=g) * 3 + 3 * nn.functional.one_hot(y, C), y


@pytest.fixture
def fitted(tmp_path):
    ets = peg.EnsembleTemperatureScaling().fit(nn.Identity(), saved(400, 0))
    ets.save(tmp_path / "map.peg")
    X = saved(250, 1)[0]
    np.save(tmp_path / "new.npy", X.numpy())
    return ets, X


def test_apply_writes_the_maps_probabilities_with_its_record(tmp_path, fitted, capsys):
    ets, X = fitted
    out = tmp_path / "probs.npy"
    argv = ["apply", str(tmp_path / "map.peg"), "--logits", str(tmp_path / "new.npy"),
            "--out", str(out), "--batch-size", "64"]  # fmt: skip
    assert main(argv) == 0
    probs = np.load(out)
    assert probs.shape == (250, C) and probs.dtype == np.float32
    np.testing.assert_allclose(probs, ets.predict_proba(X).numpy(), atol=1e-6)
    record = json.loads((tmp_path / "probs.npy.peg.json").read_text())
    assert record["shape"] == [250, C] and record["map_meta"]["method"] == "ensemble-temperature"
    assert "apply: wrote" in capsys.readouterr().out
    assert main(argv) == 0  # peg wrote it: a rerun replaces it


def test_apply_takes_the_folder_peg_select_saved(tmp_path):
    X, y = saved(300, 0)
    np.save(tmp_path / "val.npy", X.numpy())
    np.save(tmp_path / "labels.npy", y.numpy())
    np.save(tmp_path / "new.npy", saved(50, 1)[0].numpy())
    select = [
        "select",
        "--no-progress",
        "--logits",
        str(tmp_path / "val.npy"),
        "--cv",
        "3",
        "--labels",
        str(tmp_path / "labels.npy"),
        "--save",
        str(tmp_path / "sel"),
    ]
    assert main(select) == 0
    out = tmp_path / "p.npy"
    assert main(["apply", str(tmp_path / "sel"), "--logits", str(tmp_path / "new.npy"),
                 "--out", str(out)]) == 0  # fmt: skip
    expected = peg.load(tmp_path / "sel" / "chosen.peg").predict_proba(saved(50, 1)[0])
    np.testing.assert_allclose(np.load(out), expected.numpy(), atol=1e-6)


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    return capsys.readouterr().err


def test_apply_refuses_bad_input_before_writing(tmp_path, fitted, capsys):
    mine = tmp_path / "mine.npy"
    mine.write_bytes(b"not peg's")
    args = ["apply", str(tmp_path / "map.peg"), "--logits", str(tmp_path / "new.npy")]
    said = _refused([*args, "--out", str(mine)], capsys)
    assert "mine.npy exists and peg apply did not write it" in said
    assert mine.read_bytes() == b"not peg's"
    bad = saved(20, 2)[0].numpy()
    bad[7, 1] = np.nan
    np.save(tmp_path / "nan.npy", bad)
    out = tmp_path / "p.npy"
    said = _refused(["apply", str(tmp_path / "map.peg"), "--logits", str(tmp_path / "nan.npy"),
                     "--out", str(out)], capsys)  # fmt: skip
    assert "--logits: row 7 holds NaN" in said and not out.exists()
    assert not (tmp_path / "p.npy.peg.json").exists()
    np.save(tmp_path / "wide.npy", np.zeros((5, C + 1), np.float32))
    said = _refused(["apply", str(tmp_path / "map.peg"), "--logits", str(tmp_path / "wide.npy"),
                     "--out", str(out)], capsys)  # fmt: skip
    assert f"fitted on {C} classes" in said and not out.exists()
    assert not (tmp_path / "p.npy.peg.json").exists()  # a failed run leaves no record
    none = [
        "apply",
        str(tmp_path / "none"),
        "--logits",
        str(tmp_path / "new.npy"),
        "--out",
        "o.npy",
    ]
    assert "no saved map at" in _refused(none, capsys)
    weights = peg.TemperatureScaling().fit(nn.Linear(C, C), saved(100, 3)).save(tmp_path / "w")
    said = _refused(["apply", weights, "--logits", str(tmp_path / "new.npy"), "--out", str(out)],
                    capsys)  # fmt: skip
    assert "map: model: " in said and "holds the weights of a Linear" in said
    assert not out.exists()


def _apply(tmp_path, logits, out="p.npy", archive="map.peg") -> list[str]:
    return ["apply", str(tmp_path / archive), "--logits", str(tmp_path / logits), "--out",
            str(tmp_path / out)]  # fmt: skip


# --- issue 46 item 8: --logits read as peg select reads it -----------------------------------


@pytest.mark.parametrize(
    ("name", "save", "said"),
    [
        ("x.npz", lambda p, X: np.savez(p, x=X), r"x\.npz is a \.npz archive of arrays; expected"),
        ("x.pt", lambda p, X: torch.save(torch.from_numpy(X), p), r"x\.pt is a PyTorch file"),
        ("x.csv", lambda p, X: np.savetxt(p, X, delimiter=","), r"x\.csv is not a \.npy file"),
    ],
)
def test_apply_reads_logits_as_peg_select_does(tmp_path, fitted, capsys, name, save, said):
    """A .npz or .pt ended in a traceback ('NpzFile' object has no attribute 'ndim'), a .csv
    in NumPy's advice to pass allow_pickle: one line naming --logits, exit 2 (issue 46, 8)."""
    save(tmp_path / name, fitted[1].numpy())
    err = _refused(_apply(tmp_path, name), capsys)
    assert err.count("\n") == 1 and re.search(f"peg apply: error: --logits: .*{said}", err)
    assert "allow_pickle" not in err and not (tmp_path / "p.npy").exists()
    select = ["select", "--logits", str(tmp_path / name), "--labels", str(tmp_path / name)]
    assert _refused(select, capsys).split("error: ")[1] == err.split("error: ")[1]


# --- issue 46 item 9: the logits' rule, every calibrator's: NaN and +-inf refused, by row -----

MAPS = ["TemperatureScaling", "VectorScaling", "MatrixScaling", "DirichletCalibration",
        "HistogramBinning", "IsotonicCalibration", "SplineCalibration",
        "EnsembleTemperatureScaling", "OrderPreservingScaling"]  # fmt: skip


@pytest.mark.parametrize("name", MAPS)
def test_apply_refuses_minus_inf_for_every_map_naming_the_row(tmp_path, capsys, name):
    """Several maps cannot carry -inf to a probability of 0 (binning, isotonic, ETS's uniform
    part, the matrix maps), so no map takes it: one rule, the calibrators' own."""
    getattr(peg, name)().fit(nn.Identity(), saved(200, 0)).save(tmp_path / "m.peg")
    X = saved(20, 1)[0].numpy()
    X[3, 2] = X[11, 0] = -np.inf
    np.save(tmp_path / "minf.npy", X)
    err = _refused(_apply(tmp_path, "minf.npy", archive="m.peg"), capsys)
    assert "--logits: row 3 holds -inf" in err and not list(tmp_path.glob("p.npy*"))


@pytest.mark.parametrize(
    ("value", "said"),
    [(np.nan, "row 12 holds NaN"), (np.inf, "row 12 holds +inf"),
     (-np.inf, "row 12 holds -inf")],
)  # fmt: skip
def test_apply_names_the_row_that_breaks_the_rule(tmp_path, fitted, capsys, value, said):
    X = saved(30, 2)[0].numpy()
    X[12, 1 if value != -np.inf else slice(None)] = value
    np.save(tmp_path / "bad.npy", X)
    err = _refused([*_apply(tmp_path, "bad.npy"), "--batch-size", "8"], capsys)
    assert f"--logits: {said}" in err and not list(tmp_path.glob("p.npy*"))


# --- issue 46 item 4 (its peg apply part): the output is checked before the rename ------------


class _Broken:
    """A map whose probabilities for row 9 are NaN (as OrderPreservingScaling gave on a
    float32-max row), or do not sum to 1 (`sums`)."""

    def __init__(self, bad: float) -> None:
        self.bad = bad

    def predict_proba(self, rows: torch.Tensor) -> torch.Tensor:
        probs = rows.softmax(-1)
        self.seen = getattr(self, "seen", 0)
        if self.seen <= 9 < self.seen + len(rows):
            probs[9 - self.seen] = self.bad
        self.seen += len(rows)
        return probs


@pytest.mark.parametrize("bad", [float("nan"), 0.9])
def test_apply_checks_the_maps_output_and_writes_nothing_bad(tmp_path, fitted, capsys, bad,
                                                              monkeypatch):  # fmt: skip
    monkeypatch.setattr(apply, "_load", lambda path: _Broken(bad))
    err = _refused([*_apply(tmp_path, "new.npy"), "--batch-size", "4"], capsys)
    assert "--logits: row 9: the map gave" in err and "not probabilities" in err
    left = [p.name for p in tmp_path.iterdir() if "p.npy" in p.name]
    assert left == []  # neither --out, nor its record, nor a temporary file


class _Narrow:
    """A map that drops a column (isotonic calibration fitted on 4 classes did, given 5)."""

    def predict_proba(self, rows: torch.Tensor) -> torch.Tensor:
        return rows[:, 1:].softmax(-1)


def test_apply_refuses_a_map_that_gives_other_columns(tmp_path, fitted, capsys, monkeypatch):
    """NumPy's 'could not broadcast input array from shape (10,4) into shape (10,5)' was all
    that was said."""
    monkeypatch.setattr(apply, "_load", lambda path: _Narrow())
    err = _refused(_apply(tmp_path, "new.npy"), capsys)
    assert f"--logits: the map gave {C - 1} columns for logits of {C} classes" in err
    assert not [p.name for p in tmp_path.iterdir() if "p.npy" in p.name]


# --- issue 46 item 11 and the silent gap --out = --logits: named, nothing written -----------------


def test_an_out_under_a_file_or_unwritable_names_out(tmp_path, fitted, capsys):
    (tmp_path / "f").write_text("mine")
    err = _refused(_apply(tmp_path, "new.npy", out="f/p.npy"), capsys)
    assert "--out: " in err and "f is a file, not a folder" in err and ".tmp" not in err
    if Path("/proc/self").is_dir():  # a folder nobody can create files in, root included
        argv = ["apply", str(tmp_path / "map.peg"), "--logits", str(tmp_path / "new.npy"),
                "--out", "/proc/p.npy"]  # fmt: skip
        err = _refused(argv, capsys)
        assert "--out: cannot write in /proc" in err and "[Errno" not in err
        assert ".tmp" not in err and ".peg.json" not in err


def test_out_equal_to_logits_is_refused_naming_both(tmp_path, fitted, capsys):
    before = (tmp_path / "new.npy").read_bytes()
    main(_apply(tmp_path, "new.npy", out="probs.npy"))
    probs = tmp_path / "probs.npy"  # peg's own output, with its record: still not an output
    for logits, out in [("new.npy", "new.npy"), ("probs.npy", "probs.npy")]:
        err = _refused(_apply(tmp_path, logits, out=out), capsys)
        assert f"--out: {tmp_path / out} is the --logits file" in err
    assert (tmp_path / "new.npy").read_bytes() == before and np.load(probs).shape == (250, C)


# --- the silent gap: a conformal archive writes its prediction sets, and says so -------------


def test_a_conformal_archive_writes_its_sets(tmp_path, fitted, capsys):
    ets, X = fitted
    cp = peg.ConformalClassifier(alpha=0.1, score="aps", randomized=True).fit(ets, saved(300, 4))
    cp.save(tmp_path / "cp.peg")
    argv = [*_apply(tmp_path, "new.npy", out="sets.npy", archive="cp.peg"), "--batch-size", "64"]
    assert main(argv) == 0
    sets = np.load(tmp_path / "sets.npy")
    assert sets.dtype == np.bool_ and sets.shape == (250, C)
    np.testing.assert_array_equal(sets, cp.predict_set(X).numpy())  # drawn in row order
    assert "250 prediction sets over 4 classes, bool" in capsys.readouterr().out
    assert json.loads((tmp_path / "sets.npy.peg.json").read_text())["contents"] == "sets"


# --- the error cases (docs/errors.md) --------------------------------------------------------


def _cli(tmp: Path, *argv: str, logits: np.ndarray | None = None) -> None:
    """`peg apply ARGV` run in tmp/apply-cases (a TS map, map.peg, and `logits`, new.npy,
    made there); an exit becomes SystemExit("exit N: <line>")."""
    where = tmp / "apply-cases"
    where.mkdir(exist_ok=True)
    if not (where / "map.peg").exists():
        peg.TemperatureScaling().fit(nn.Identity(), saved(100, 0)).save(where / "map.peg")
    np.save(where / "new.npy", saved(20, 1)[0].numpy() if logits is None else logits)
    err = io.StringIO()
    try:
        with contextlib.chdir(where), contextlib.redirect_stderr(err):
            main(["apply", "map.peg", "--logits", *argv])
    except SystemExit as e:
        printed = err.getvalue().strip().splitlines()
        raise SystemExit(f"exit {e.code}: {printed[-1] if printed else ''}") from None


def _with(value: float, row: int, columns: slice | int) -> np.ndarray:
    X = saved(20, 1)[0].numpy()
    X[row, columns] = value
    return X


def _users(tmp: Path, record: str) -> None:
    (tmp / "apply-cases").mkdir(exist_ok=True)
    (tmp / "apply-cases" / "mine.npy").write_bytes(b"the user's own")
    (tmp / "apply-cases" / "mine.npy.peg.json").write_text(record)
    _cli(tmp, "new.npy", "--out", "mine.npy")


def _npz(tmp: Path) -> None:
    (tmp / "apply-cases").mkdir(exist_ok=True)
    np.savez(tmp / "apply-cases" / "x.npz", x=np.zeros((3, 2)))
    _cli(tmp, "x.npz", "--out", "p.npy")


def _under_a_file(tmp: Path) -> None:
    (tmp / "apply-cases").mkdir(exist_ok=True)
    (tmp / "apply-cases" / "f").write_text("")
    _cli(tmp, "new.npy", "--out", "f/p.npy")


FILE_ERROR_CASES: list[tuple[str, str, Callable[[Path], object], type[BaseException], str]] = [
    ("peg (CLI)", "peg apply --logits of a .npz", _npz,
     SystemExit, r"exit 2: peg apply: error: --logits: x\.npz is a \.npz archive of arrays; "
     r"expected one \.npy array"),
    ("peg (CLI)", "peg apply --logits with a NaN",
     lambda tmp: _cli(tmp, "new.npy", "--out", "p.npy", logits=_with(np.nan, 4, 1)),
     SystemExit, r"exit 2: peg apply: error: --logits: row 4 holds NaN; logits must be finite "
     r"\(a class ruled out: a large negative logit, not -inf\); nothing was written"),
    ("peg (CLI)", "peg apply --logits with a -inf",
     lambda tmp: _cli(tmp, "new.npy", "--out", "p.npy", logits=_with(-np.inf, 4, 1)),
     SystemExit, r"exit 2: peg apply: error: --logits: row 4 holds -inf"),
    ("peg (CLI)", "peg apply --out the --logits file",
     lambda tmp: _cli(tmp, "new.npy", "--out", "new.npy"),
     SystemExit, r"exit 2: peg apply: error: --out: new\.npy is the --logits file new\.npy; "
     r"writing it would replace the input: give another path"),
    ("peg (CLI)", "peg apply --out under a file", _under_a_file,
     SystemExit, r"exit 2: peg apply: error: --out: f is a file, not a folder"),
    ("peg (CLI)", "peg apply --out a file of the user's, a record not peg's",
     lambda tmp: _users(tmp, "not even json"),
     SystemExit, r"exit 2: peg apply: error: --out: mine\.npy exists and peg apply did not "
     r"write it \(mine\.npy\.peg\.json beside it is not a record of peg apply\); remove it or "
     r"choose another path"),
]  # fmt: skip

test_bad_files = raises_test(FILE_ERROR_CASES, files=True)
