"""Issue 40, the applications' defects: a shifted set named as val or test is refused (2);
compare's resume fingerprints data and weights by their bytes (3); `peg select --save` and `peg
demo --out` never overwrite a folder of the user's, and only a mark proves a folder is peg's (4);
a saved row edited to impossible values is refitted, and said (9); the command line gives a
one-line error and exit 2, not a traceback (10); `resume` must be a bool (14). The refusals are
error cases, rendered into docs/errors.md.
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bad_inputs import raises_test
from peg.apps import results
from peg.apps.bench.uci import run_uci
from peg.apps.cli import main
from peg.apps.compare import compare, state
from peg.apps.compare.state import fingerprint
from peg.utils.io import load_tree, save_tree

from conftest import moons, overfit

TIMES = ("fit_seconds", "predict_seconds")


@pytest.fixture(scope="module")
def model() -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 2))
    return overfit(net, *moons(200, 0), steps=200)


@pytest.fixture(scope="module")
def data():
    return {"val": moons(300, 1), "test": moons(200, 2)}


def _untimed(table):
    return [{k: v for k, v in r.items() if k not in TIMES} for r in table]


def _ts(model, val, test, out=None, **kwargs):
    return compare(model, val, test, ["TS"], out=out, progress=False,
                   say=kwargs.pop("say", None), **kwargs)  # fmt: skip


def _cmp(**kwargs):
    return compare(nn.Linear(2, 2), moons(60, 1), moons(60, 2), ["TS"], say=None,
                   progress=False, **kwargs)  # fmt: skip


# --- 2. a shifted set named val or test would replace that set ---------------------------------


@pytest.mark.parametrize("name", ["val", "test"])
def test_a_shifted_set_named_val_or_test_is_refused_before_any_fitting(name, monkeypatch):
    from peg.apps import registry

    built: list[str] = []
    monkeypatch.setattr(registry, "build", lambda k, *a, **o: built.append(k))
    with pytest.raises(ValueError, match=f"shifted: the name '{name}' is taken by {name}"):
        _cmp(shifted={name: moons(60, 5)})
    assert built == []


# --- 3. resume fingerprints the bytes of data and weights --------------------------------------


def _permuted(model: nn.Module) -> nn.Module:
    """The model with the rows of its first layer swapped (the same sums, other weights)."""
    import copy

    other = copy.deepcopy(model)
    with torch.no_grad():
        other[0].weight.copy_(other[0].weight[[1, 0, *range(2, 16)]])
    return other


@pytest.mark.parametrize("change", ["labels rolled", "test rows swapped", "weights permuted"])
def test_resume_refits_when_data_or_weights_changed_with_the_same_sums(
    model, data, tmp_path, change
):
    X, y = data["test"]
    test, net = data["test"], model
    if change == "labels rolled":
        test = (X, y.roll(1))
    elif change == "test rows swapped":
        test = (X[[1, 0, *range(2, len(X))]], y)
    else:
        net = _permuted(model)
    assert fingerprint(test) != fingerprint(data["test"]) or change == "weights permuted"
    _ts(model, data["val"], data["test"], tmp_path)
    said: list[str] = []
    again = _ts(net, data["val"], test, tmp_path, resume=True, say=said.append)
    fresh = _ts(net, data["val"], test)
    assert _untimed(again.table) == _untimed(fresh.table)
    other = "weights" if change == "weights permuted" else "test data"
    assert any(f"made by a run with other {other}; fitting it again" in s for s in said), said


def test_resume_still_reuses_a_row_of_the_same_data(model, data, tmp_path, monkeypatch):
    first = _ts(model, data["val"], data["test"], tmp_path)
    copied = tuple(t.clone() for t in data["test"])  # equal bytes, another tensor
    monkeypatch.setattr("peg.apps.registry.build", lambda *a, **k: 1 / 0)  # nothing refitted
    again = _ts(model, data["val"], copied, tmp_path, resume=True)
    assert again.table == first.table


def test_the_fingerprint_streams_a_loader_and_sees_every_byte(monkeypatch):
    X, y = moons(100, 3)
    loader = DataLoader(TensorDataset(X, y), batch_size=16)
    assert fingerprint(TensorDataset(X, y), 16) == fingerprint(loader)
    y2 = y.clone()
    y2[57] = 1 - y2[57]  # one label of one batch
    assert fingerprint(DataLoader(TensorDataset(X, y2), batch_size=16)) != fingerprint(loader)
    whole = fingerprint((X, y))
    monkeypatch.setattr(state, "CHUNK", 24)  # a tensor hashed in chunks of a few rows
    assert fingerprint((X, y)) == whole
    assert fingerprint(X.double()) != fingerprint(X)  # the dtype counts
    assert fingerprint(np.asarray(X)[::-1]) == fingerprint(X.flip(0))  # a reversed view
    meta = [fingerprint(nn.Linear(2, k, device="meta")) for k in (2, 3)]  # shapes only
    assert meta[0] != meta[1]


# --- 4. never a folder of the user's; only the mark proves a folder is peg's -------------------


def _module(tmp: Path, name: str) -> None:
    (tmp / f"{name}.py").write_text(
        "import torch\nfrom torch import nn\ndef build():\n    torch.manual_seed(0)\n"
        "    return nn.Linear(2, 2)\ndef needs(width):\n    return nn.Linear(2, width)\n"
    )
    sys.modules.pop(name, None)


def _files(tmp: Path) -> None:
    X, y = moons(60, 1)
    np.savez(tmp / "val.npz", x=X.numpy(), y=y.numpy())
    np.save(tmp / "l.npy", np.random.default_rng(0).normal(size=(60, 2)).astype(np.float32))
    np.save(tmp / "y.npy", y.numpy())
    (tmp / "sub").mkdir(exist_ok=True)
    np.savez(tmp / "sub" / "test.npz", x=X.numpy(), y=y.numpy())
    _module(tmp, "untrusted_mod")


def _select(*extra: str) -> list[str]:
    return ["select", "--model", "untrusted_mod:build", "--val", "val.npz", "--candidates", "TS",
            "--cv", "2", "--no-progress", *extra]  # fmt: skip


def test_peg_select_save_refuses_a_folder_of_the_users(tmp_path, monkeypatch, capsys):
    _files(tmp_path)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "results.json").write_text("my own")
    with pytest.raises(SystemExit) as stopped:
        main(_select("--save", "mine"))
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "--save: mine is a non-empty folder peg select did not make" in err
    assert (tmp_path / "mine" / "results.json").read_text() == "my own"
    assert main(_select("--save", "mine", "--overwrite")) == 0
    assert (tmp_path / "mine" / ".peg-select").is_file()
    assert main(_select("--save", "mine")) == 0  # now peg's: a rerun writes
    assert main(_select("--save", "new")) == 0 and (tmp_path / "new" / "chosen.peg").is_file()


def test_peg_demo_out_refuses_a_folder_of_the_users_before_training(tmp_path, monkeypatch):
    import peg.apps.demo as demo

    monkeypatch.setattr(demo, "train", lambda *a, **k: 1 / 0)  # refused before any training
    (tmp_path / "results.md").write_text("my own")
    with pytest.raises(FileExistsError, match="peg demo did not make .*--overwrite"):
        demo.run("two-moons", quick=True, out=tmp_path, say=lambda _: None)
    assert (tmp_path / "results.md").read_text() == "my own"
    with pytest.raises(ZeroDivisionError):  # with overwrite: it goes on (to training)
        demo.run("two-moons", quick=True, out=tmp_path, say=lambda _: None, overwrite=True)
    assert results.is_marked(tmp_path, "demo")


@pytest.mark.parametrize("folder", ["demo", "demo-moons"])
def test_the_repositorys_demo_folders_are_peg_demos(folder):
    """`peg demo --out docs/demo` (how README's figures are made) reruns without --overwrite."""
    assert results.is_marked(Path(__file__).resolve().parents[2] / "docs" / folder, "demo")


@pytest.mark.parametrize(
    "sign, ours",
    [("an empty .compare/", False), ("a .compare/ of foreign files", False),
     ("a mark of the wrong text", False), ("a mark that is a folder", False),
     ("another application's mark", False), ("an earlier run's saved row", True)],
)  # fmt: skip
def test_only_a_mark_or_a_saved_row_proves_a_folder_is_compares(
    model, data, tmp_path, sign, ours
):
    if sign == "an earlier run's saved row":  # a run of a version before the mark
        _ts(model, data["val"], data["test"], tmp_path / "run")
        (tmp_path / "run" / ".peg-compare").unlink()
        folder = tmp_path / "run"
    else:
        folder = tmp_path / "mine"
        (folder / ".compare").mkdir(parents=True)
        if sign == "a .compare/ of foreign files":
            (folder / ".compare" / "000-TS.safetensors").write_text("not a saved row")
        elif sign == "a mark of the wrong text":
            (folder / ".peg-compare").write_text("my notes")
        elif sign == "a mark that is a folder":
            (folder / ".peg-compare").mkdir()
        elif sign == "another application's mark":
            (folder / ".peg-demo").write_text("made by peg demo\n")
    (folder / "results.md").write_text("mine")
    if ours:
        _ts(model, data["val"], data["test"], folder)
        assert results.is_marked(folder, "compare")
        return
    with pytest.raises(FileExistsError, match="non-empty folder peg compare did not make"):
        _ts(model, data["val"], data["test"], folder)
    assert (folder / "results.md").read_text() == "mine"


# --- 9. a saved row edited to impossible values is refitted, and said --------------------------


def _row(key, value):
    return lambda tree: tree["row"].__setitem__(key, value)


def _curve(key, value):
    return lambda tree: tree["curves"]["test"].__setitem__(key, value)


@pytest.mark.parametrize(
    "change",
    [_row("nll", float("nan")), _row("error", -5.0), _row("error", 1.5), _row("ece", None),
     _row("brier", 7.0), _row("forwards", float("inf")), _row("fit_seconds", float("nan")),
     _curve("confidence", torch.zeros(3, 3)), _curve("accuracy", torch.zeros(10)),
     _curve("count", -torch.ones(15, dtype=torch.int64)), _curve("count", torch.ones(15)),
     _curve("confidence", torch.full((15,), 2.0)), _curve("edges", torch.zeros(16) - 1),
     lambda t: t["curves"]["test"].pop("edges"),
     lambda t: t["sizes"].__setitem__("test", (200, "elsewhere"))],
    ids=["nll NaN", "error -5", "error 1.5", "ece null", "brier 7", "forwards inf",
         "fit_seconds NaN", "curve reshaped", "curve of 10 bins", "negative counts",
         "float counts", "confidence 2", "edges below 0", "no edges", "unknown kind"],
)  # fmt: skip
def test_an_edited_saved_row_is_refitted_and_said(model, data, tmp_path, change):
    first = _ts(model, data["val"], data["test"], tmp_path)
    path = next((tmp_path / ".compare").iterdir())
    tree = load_tree(path)
    change(tree)
    save_tree(path, tree)
    said: list[str] = []
    again = _ts(model, data["val"], data["test"], tmp_path, resume=True, say=said.append)
    assert any("its saved row is not usable" in s and "fitting it again" in s for s in said), said
    assert _untimed(again.table) == _untimed(first.table)
    assert (tmp_path / "reliability-test.png").is_file()


def test_a_saved_row_with_an_infinite_nll_is_taken_back(model, data, tmp_path):
    """An NLL may be infinite (a probability of 0 on a true class): such a row is valid."""
    _ts(model, data["val"], data["test"], tmp_path)
    path = next((tmp_path / ".compare").iterdir())
    tree = load_tree(path)
    tree["row"]["nll"] = float("inf")
    save_tree(path, tree)
    again = _ts(model, data["val"], data["test"], tmp_path, resume=True)
    assert again.row("TS")["nll"] == float("inf")


# --- 10. the command line: one line and exit 2, never a traceback ------------------------------


def _cli(tmp: Path, *argv: str) -> None:
    """`peg ARGV` run in `tmp` (its files made); an exit becomes SystemExit("exit N: <line>")."""
    _files(tmp)
    err = io.StringIO()
    try:
        with contextlib.chdir(tmp), contextlib.redirect_stderr(err):
            main(list(argv))
    except SystemExit as e:
        printed = err.getvalue().strip().splitlines()
        raise SystemExit(f"exit {e.code}: {printed[-1] if printed else ''}") from None


def _in_folder(tmp: Path, name: str, *argv: str) -> None:
    """`peg ARGV` with `--out made-<application>` (`--save` for select), a folder peg made,
    where `<name>` (a file peg writes there) is a folder."""
    application = argv[0]
    folder = tmp / f"made-{application}"
    folder.mkdir(exist_ok=True)
    (folder / name).mkdir(exist_ok=True)
    (folder / f".peg-{application}").write_text(f"made by peg {application}\n")
    _cli(tmp, *argv)


def _uci(tmp: Path, body: str) -> None:
    (tmp / "u.yaml").write_text(body)
    _cli(tmp, "bench", "u.yaml", "--out", "o", "--cache", "c", "--no-progress")


_COMPARE = ("compare", "--model", "untrusted_mod:build", "--val", "val.npz", "--test", "val.npz",
            "--methods", "TS", "--no-progress")  # fmt: skip

ERROR_CASES: list[tuple[str, str, Callable[[], object], type[Exception], str]] = [
    ("peg.compare", "a shifted set named test",
     lambda: _cmp(shifted={"test": moons(60, 5)}),
     ValueError, r"shifted: the name 'test' is taken by test; name the shifted set otherwise"),
    ("peg.compare", "a shifted set named val",
     lambda: _cmp(shifted={"val": moons(60, 5)}),
     ValueError, r"shifted: the name 'val' is taken by val"),
    ("peg.compare", "resume not a bool",
     lambda: _cmp(resume="yes"),
     TypeError, r"resume: expected True or False, got 'yes'"),
    ("peg bench spec", "uci: sets not a list",
     lambda: run_uci(sets="yacht"),
     ValueError, r"sets: expected a list of names among \['boston-housing', .*got 'yacht'"),
    ("peg bench spec", "uci: methods not a list",
     lambda: run_uci(sets=["yacht"], methods=5),
     ValueError, r"methods: expected a list of names among \['Single', .*got 5"),
    ("peg bench spec", "uci: splits not an integer",
     lambda: run_uci(sets=["yacht"], splits="x"),
     ValueError, r"splits: expected an integer >= 1, got 'x'"),
    ("peg bench spec", "uci: epochs not an integer",
     lambda: run_uci(sets=["yacht"], epochs=True),
     ValueError, r"epochs: expected an integer >= 1, got True"),
]  # fmt: skip

FILE_ERROR_CASES: list[tuple[str, str, Callable[[Path], object], type[BaseException], str]] = [
    ("peg (CLI)", "peg compare --shifted a file named test.npz",
     lambda tmp: _cli(tmp, *_COMPARE, "--shifted", "sub/test.npz", "--out", "o1"),
     SystemExit, r"exit 2: peg compare: error: --shifted: sub/test.npz would be named 'test', "
     r"as the --test set; name it NAME=sub/test.npz"),
    ("peg (CLI)", "peg select --logits of a .npz",
     lambda tmp: _cli(tmp, "select", "--logits", "val.npz", "--labels", "y.npy"),
     SystemExit, r"exit 2: peg select: error: --logits: val.npz is a \.npz archive of arrays; "
     r"expected one \.npy array"),
    ("peg (CLI)", "peg select --model a path",
     lambda tmp: _cli(tmp, "select", "--model", "../d/m:f", "--val", "val.npz"),
     SystemExit, r"exit 2: peg select: error: --model: expected module:function \(a module "
     r"name such as mymodel or pkg\.mymodel.*not a path\), got '\.\./d/m:f'"),
    ("peg (CLI)", "peg compare --model a relative module",
     lambda tmp: _cli(tmp, "compare", "--model", ".m:f", "--val", "val.npz", "--test", "val.npz"),
     SystemExit, r"exit 2: peg compare: error: --model: expected module:function .*got '\.m:f'"),
    ("peg (CLI)", "peg select --model a function that needs an argument",
     lambda tmp: _cli(tmp, "select", "--model", "untrusted_mod:needs", "--val", "val.npz"),
     SystemExit, r"exit 2: peg select: error: --model: untrusted_mod:needs must be callable "
     r"without arguments \(missing a required argument: 'width'\)"),
    ("peg (CLI)", "peg bench with a uci: block of bad values",
     lambda tmp: _uci(tmp, "uci: {sets: [yacht], splits: x}\n"),
     SystemExit, r"exit 2: peg bench: error: splits: expected an integer >= 1, got 'x'"),
    ("peg (CLI)", "peg compare: results.json a folder",
     lambda tmp: _in_folder(tmp, "results.json", *_COMPARE, "--out", "made-compare"),
     SystemExit, r"exit 2: peg compare: error: out: made-compare/results\.json is a folder, "
     r"where peg compare writes its results\.json: move it away or give another folder"),
    ("peg (CLI)", "peg select --save: results.json a folder",
     lambda tmp: _in_folder(tmp, "results.json", *_select("--save", "made-select")),
     SystemExit, r"exit 2: peg select: error: --save: made-select/results\.json is a folder"),
    ("peg (CLI)", "peg demo --out: results.md a folder",
     lambda tmp: _in_folder(tmp, "results.md", "demo", "--data", "moons", "--out", "made-demo"),
     SystemExit, r"exit 2: peg demo: error: out: made-demo/results\.md is a folder"),
    ("peg (CLI)", "peg select --save: a folder of the user's",
     lambda tmp: _cli(tmp, *_select("--save", "sub")),
     SystemExit, r"exit 2: peg select: error: --save: sub is a non-empty folder peg select did "
     r"not make \(it holds \['test\.npz'\]\); results\.json, results\.md and chosen\.peg would "
     r"replace files of the same names: give a new or empty folder, or --overwrite"),
    ("peg (CLI)", "peg demo --out: a folder of the user's",
     lambda tmp: _cli(tmp, "demo", "--data", "moons", "--out", "sub"),
     SystemExit, r"exit 2: peg demo: error: out: sub is a non-empty folder peg demo did not "
     r"make .*overwrite=True \(--overwrite\)"),
]  # fmt: skip

test_bad_input = raises_test(ERROR_CASES)
test_bad_files = raises_test(FILE_ERROR_CASES, files=True)
