"""`peg.compare(out=..., resume=True)` trusts nothing on disk, loses nothing, overwrites nothing
(issue 32): reused archives checked against the run, damaged rows refitted and said, bad data
refused once before fitting, the table always written, `out` checked before fitting and never a
folder of the user's overwritten. The refusals are error cases, rendered into docs/errors.md.
"""

from __future__ import annotations

import json
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from bad_inputs import _TupleOut, raises_test
from peg.apps import registry
from peg.apps.cli import main
from peg.apps.compare import compare
from peg.methods.calibration.temperature import TemperatureScaling
from peg.methods.perturbation.peg import PEG
from peg.utils.io import load_tree, save_tree

from conftest import moons, overfit

METHODS = ["TS", "PEG", "PEG + TS"]
TIMES = ("fit_seconds", "predict_seconds")


def _net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 2))
    return overfit(net, *moons(200, seed), steps=200)


@pytest.fixture(scope="module")
def data():
    return {"val": moons(300, 1), "test": moons(200, 2)}


@pytest.fixture(scope="module")
def model():
    return _net(0)


def _untimed(table):
    return [{k: v for k, v in r.items() if k not in TIMES} for r in table]


def _run(model, data, out, **kwargs):
    return compare(model, data["val"], data["test"], kwargs.pop("methods", METHODS), out=out,
                   progress=False, **kwargs)  # fmt: skip


# --- 4. a reused archive is the one this run saved ----------------------------------------------


def test_resume_refits_a_predictor_archive_of_another_model(model, data, tmp_path):
    clean = _run(model, data, tmp_path / "clean", say=None)
    out = tmp_path / "out"
    _run(model, data, out, say=None)
    PEG(seed=0, progress=False).fit(_net(1), data["val"]).save(str(out / "predictors" / "PEG.peg"))
    said: list[str] = []
    again = _run(model, data, out, say=said.append, resume=True)
    assert any("PEG.peg is not the archive this run saved" in s for s in said), said
    assert _untimed(again.table) == _untimed(clean.table)
    X = data["test"][0]
    assert torch.allclose(
        again.predictors["PEG"].predict_proba(X), clean.predictors["PEG"].predict_proba(X)
    )


# --- 5. a saved row that does not validate is refitted, and said --------------------------------


def _drop(key):
    return lambda tree: tree.pop(key)


def _row(key, value):
    return lambda tree: tree["row"].__setitem__(key, value)


@pytest.mark.parametrize(
    "change",
    [_drop("curves"), _row("fit_seconds", "x"), lambda t: t["row"].pop("fit_seconds"),
     _row("nll", "x"), lambda t: t["sizes"].__setitem__("test", ("x", "test")),
     lambda t: t["curves"].__setitem__("nowhere", {}), _row("method", "PEG"), _drop("row")],
    ids=["no curves", "fit_seconds 'x'", "no fit_seconds", "nll 'x'", "sizes 'x'",
         "curves of an unknown set", "another method's row", "no row"],
)  # fmt: skip
def test_a_malformed_saved_row_with_its_key_is_refitted_and_said(model, data, tmp_path, change):
    first = _run(model, data, tmp_path, methods=["TS"], say=None)
    path = next((tmp_path / ".compare").iterdir())
    tree = load_tree(path)
    change(tree)
    save_tree(path, tree)
    said: list[str] = []
    again = _run(model, data, tmp_path, methods=["TS"], say=said.append, resume=True)
    assert any("its saved row is not usable" in s and "fitting it again" in s for s in said)
    assert _untimed(again.table) == _untimed(first.table)


# --- 6. the table is always written; the command line exits 3 -----------------------------------


def test_the_table_is_written_when_every_method_fails(model, data, tmp_path, monkeypatch):
    def broken(self, *args, **kwargs):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(TemperatureScaling, "fit", broken)
    monkeypatch.setattr(PEG, "fit", broken)
    done = _run(model, data, tmp_path, say=None)
    assert set(done.failed) == set(METHODS)
    written = json.loads((tmp_path / "results.json").read_text())
    assert set(written["failed"]) == set(METHODS) and written["figures"] == []
    assert "Failed: TS: RuntimeError" in (tmp_path / "results.md").read_text()


def test_peg_compare_exits_3_when_every_method_failed(tmp_path, monkeypatch, data):
    X, y = data["val"]
    np.savez(tmp_path / "val.npz", x=X.numpy(), y=y.numpy())
    (tmp_path / "allfail_cmp.py").write_text(
        "import torch\nfrom torch import nn\ndef build():\n    torch.manual_seed(0)\n"
        "    return nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 2))\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "allfail_cmp", raising=False)
    monkeypatch.setattr(TemperatureScaling, "fit", lambda *a, **k: 1 / 0)
    argv = ["compare", "--model", "allfail_cmp:build", "--val", "val.npz", "--test", "val.npz",
            "--methods", "TS", "--out", "out", "--no-progress"]  # fmt: skip
    assert main(argv) == 3
    assert (tmp_path / "out" / "results.md").is_file()


# --- 7. a DataLoader over an IterableDataset ----------------------------------------------------


class _Stream(IterableDataset):
    def __init__(self, X: torch.Tensor, y: torch.Tensor) -> None:
        self.X, self.y = X, y

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(zip(self.X, self.y, strict=True))


def test_compare_takes_a_dataloader_over_an_iterable_dataset(model, data, tmp_path):
    stream = DataLoader(_Stream(*data["val"]), batch_size=64)
    done = compare(model, stream, data["test"], ["TS"], out=tmp_path, say=None, progress=False)
    reference = compare(model, data["val"], data["test"], ["TS"], say=None, progress=False)
    assert done.table[0]["nll"] == pytest.approx(reference.table[0]["nll"], rel=1e-6)


# --- 8. out writable before fitting; a failed save is a warning --------------------------------


def test_a_failed_save_is_a_warning_on_its_row_and_the_run_goes_on(
    model, data, tmp_path, monkeypatch
):
    def full_disk(self, path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(PEG, "save", full_disk)
    said: list[str] = []
    done = _run(model, data, tmp_path, say=said.append)
    assert not done.failed and "nll" in done.row("PEG + TS")
    assert "PermissionError" in done.row("PEG")["warning"]
    assert any("PEG: not saved (PermissionError" in s for s in said)
    assert "Warnings: PEG: not saved" in (tmp_path / "results.md").read_text()


def test_an_unwritable_out_is_refused_before_any_fitting(model, data, tmp_path, monkeypatch):
    built: list[str] = []
    build = registry.build
    monkeypatch.setattr(registry, "build", lambda k, *a, **o: built.append(k) or build(k, *a, **o))
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError, match="out: cannot write in"):
        _run(model, data, tmp_path / "file" / "out", say=None)
    assert built == []


# --- 9. a folder peg did not make is not overwritten --------------------------------------------


def test_a_folder_of_the_users_is_refused_unless_overwrite(model, data, tmp_path):
    (tmp_path / "results.md").write_text("my own notes")
    with pytest.raises(FileExistsError, match="non-empty folder peg compare did not make"):
        _run(model, data, tmp_path, methods=["TS"], say=None)
    assert (tmp_path / "results.md").read_text() == "my own notes"
    _run(model, data, tmp_path, methods=["TS"], say=None, overwrite=True)
    assert (tmp_path / ".peg-compare").is_file()
    _run(model, data, tmp_path, methods=["TS"], say=None)  # now peg's: a rerun writes


def test_peg_compare_refuses_a_folder_of_the_users_with_exit_2(tmp_path, monkeypatch, capsys):
    X, y = moons(60, 1)
    np.savez(tmp_path / "val.npz", x=X.numpy(), y=y.numpy())
    (tmp_path / "usersdir_cmp.py").write_text(
        "from torch import nn\ndef build():\n    return nn.Linear(2, 2)\n"
    )
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "results.md").write_text("my own")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "usersdir_cmp", raising=False)
    argv = ["compare", "--model", "usersdir_cmp:build", "--val", "val.npz", "--test", "val.npz",
            "--methods", "TS", "--out", "out", "--no-progress"]  # fmt: skip
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and "--overwrite" in err and len(err.strip().splitlines()) == 1
    assert (tmp_path / "out" / "results.md").read_text() == "my own"
    assert main([*argv, "--overwrite"]) == 0


# --- bad data is refused once, before any fitting ------------------------------------------------


def _shifted(labels: Callable[[torch.Tensor], torch.Tensor]):
    X, y = moons(60, 1)
    return X, labels(y)


class _Raises(IterableDataset):
    def __iter__(self):  # type: ignore[no-untyped-def]
        raise RuntimeError("disk gone")


def _cmp(val=None, test=None, model=None, **kwargs):
    return compare(model if model is not None else nn.Linear(2, 2),
                   val if val is not None else moons(60, 1),
                   test if test is not None else moons(60, 2), ["TS", "PEG"], say=None,
                   progress=False, **kwargs)  # fmt: skip


def _floats(X, y):
    return DataLoader(TensorDataset(X, y.float() + 0.5), batch_size=16)


def _saved_logits(classes: int, n: int = 60) -> tuple[np.ndarray, np.ndarray]:
    g = np.random.default_rng(classes)
    return g.normal(size=(n, classes)).astype(np.float32), g.integers(0, classes, n)


ERROR_CASES: list[tuple[str, str, Callable[[], object], type[Exception], str]] = [
    ("peg.compare", "val labels out of range",
     lambda: _cmp(val=_shifted(lambda y: y + 1)),
     ValueError, r"val labels: expected labels in \[0, 2\) \(C = 2\), got min 1 and max 2"),
    ("peg.compare", "test labels out of range",
     lambda: _cmp(test=_shifted(lambda y: y * 3)),
     ValueError, r"test labels: expected labels in \[0, 2\) \(C = 2\), got min 0 and max 3"),
    ("peg.compare", "shifted labels out of range",
     lambda: _cmp(shifted=_shifted(lambda y: y - 1)),
     ValueError, r"shifted\['shifted'\] labels: expected labels in \[0, 2\)"),
    ("peg.compare", "a loader's labels out of range",
     lambda: _cmp(val=DataLoader(TensorDataset(*_shifted(lambda y: y + 5)), batch_size=8)),
     ValueError, r"val labels: expected labels in \[0, 2\)"),
    ("peg.compare", "float labels in a loader",
     lambda: _cmp(test=_floats(*moons(60, 2))),
     ValueError, r"test: expected integer class labels \(compare is for classifiers\), got "
                 r"torch\.float32 values that are not class indices \(whole numbers in \[0, 2\)\)"),
    ("peg.compare", "saved logits: a test set of another class count",
     lambda: compare(*_saved_logits(3), _saved_logits(5), ["TS", "Vector scaling"], say=None,
                     progress=False),
     ValueError, r"test: logits with 5 columns \(classes\), but val's have 3; every set must "
                 r"be the same model's logits"),
    ("peg.compare", "saved logits: a shifted set of another class count",
     lambda: compare(*_saved_logits(3), _saved_logits(3), ["TS"], say=None, progress=False,
                     shifted={"s": _saved_logits(4)}),
     ValueError, r"shifted\['s'\]: logits with 4 columns \(classes\), but val's have 3"),
    ("peg.compare", "1-D inputs",
     lambda: _cmp(val=(moons(60, 1)[0][:, 0], moons(60, 1)[1])),
     ValueError, r"val: 1-D inputs \[N\] gave outputs of shape \(2,\), not logits"),
    ("peg.compare", "OOD inputs of another width",
     lambda: _cmp(ood=torch.randn(30, 5)),
     ValueError, r"ood\['ood'\]: the model cannot run on inputs of shape \[N, 5\]"),
    ("peg.compare", "a model returning a tuple",
     lambda: _cmp(model=_TupleOut()),
     TypeError, r"model: the model's forward must return a Tensor of logits"),
    ("peg.compare", "a loader that raises",
     lambda: _cmp(val=DataLoader(_Raises(), batch_size=8)),
     ValueError, r"val: reading its first batch failed \(RuntimeError: disk gone\)"),
    ("peg.compare", "overwrite not a bool",
     lambda: _cmp(overwrite="yes"),
     TypeError, r"overwrite: expected True or False"),
]  # fmt: skip


def _users_folder(tmp: Path) -> object:
    (tmp / "mine").mkdir(exist_ok=True)
    (tmp / "mine" / "notes.md").write_text("mine")
    return _cmp(out=tmp / "mine")


def _a_file(tmp: Path) -> object:
    (tmp / "file").write_text("")
    return _cmp(out=tmp / "file")


def _under_a_file(tmp: Path) -> object:
    (tmp / "file").write_text("")
    return _cmp(out=tmp / "file" / "out")


FILE_ERROR_CASES: list[tuple[str, str, Callable[[Path], object], type[Exception], str]] = [
    ("peg.compare", "out: a non-empty folder peg did not make", _users_folder,
     FileExistsError, r"out: .* is a non-empty folder peg compare did not make \(it holds "
     r"\['notes\.md'\]\).*overwrite=True \(--overwrite\)"),
    ("peg.compare", "out: a file", _a_file,
     NotADirectoryError, r"out: .*file is a file, not a folder"),
    ("peg.compare", "out: a folder that cannot be written", _under_a_file,
     NotADirectoryError, r"out: cannot write in .*file/out"),
]  # fmt: skip


test_bad_input = raises_test(ERROR_CASES)
test_bad_files = raises_test(FILE_ERROR_CASES, files=True)


def test_the_data_is_checked_before_any_fitting(monkeypatch):
    built: list[str] = []
    monkeypatch.setattr(registry, "build", lambda k, *a, **o: built.append(k))
    with pytest.raises(ValueError, match="test labels"):
        _cmp(test=_shifted(lambda y: y * 3))
    assert built == []


def test_one_class_in_val_is_a_warning():
    """PEG's scale is chosen on it (warned); a calibrator cannot fit a map on it (its row)."""
    X, y = moons(60, 1)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = compare(
            nn.Linear(2, 2),
            (X, torch.zeros_like(y)),
            moons(60, 2),
            ["TS"],
            say=None,
            progress=False,
        )
    assert any("val: every label is 0 (one class only)" in str(w.message) for w in seen)
    assert "one class only" in out.failed["TS"]["message"]


def test_the_class_count_is_checked_before_any_fitting(monkeypatch):
    """It fitted every method, and each failed on the test set, as many rows of errors."""
    built: list[str] = []
    monkeypatch.setattr(registry, "build", lambda k, *a, **o: built.append(k))
    with pytest.raises(ValueError, match="test: logits with 5 columns"):
        compare(*_saved_logits(3), _saved_logits(5), ["TS"], say=None, progress=False)
    assert built == []
