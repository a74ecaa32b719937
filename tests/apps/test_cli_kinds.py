"""`peg select`, `peg apply` and `peg compare` on `.npy` files of saved logits of every kind:
the kind read from the shapes (or `--task`), the map saved by select applied by apply in the
input's shape, compare's rows the maps that take the kind."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_select_kinds import CASES

import peg
from peg.apps import arguments
from peg.apps.cli import main
from peg.methods.calibration._calibrator import calibrators
from peg.source import _kinds


def _files(tmp_path, case):
    make, options, kind = CASES[case]
    logits, y = make()
    h = len(y) // 2
    paths = {}
    for name, value in (("val", logits[:h]), ("val_y", y[:h]), ("test", logits[h:]),
                        ("test_y", y[h:])):  # fmt: skip
        paths[name] = str(tmp_path / f"{name}.npy")
        np.save(paths[name], value.numpy())
    extra = (
        [] if "ignore_index" not in options else ["--ignore-index", str(options["ignore_index"])]
    )
    return paths, extra, kind, (logits[h:], y[h:]), options


@pytest.mark.parametrize("case", list(CASES))
def test_select_then_apply_on_each_kind(tmp_path, case, capsys):
    paths, extra, kind, test, _ = _files(tmp_path, case)
    save = tmp_path / "chosen"
    argv = ["select", "--val-logits", paths["val"], "--val-labels", paths["val_y"], "--cv", "3",
            "--max-fit-seconds", "none", "--save", str(save), "--no-progress", *extra]  # fmt: skip
    assert main(argv) == 0
    results = json.loads((save / "results.json").read_text())
    assert [r["candidate"] for r in results["report"]] == [c.name for c in calibrators(kind)]
    chosen = peg.load(save / "chosen.peg")
    assert chosen.kind_.kind == kind
    out = tmp_path / "probs.npy"
    assert main(["apply", str(save), "--logits", paths["test"], "--out", str(out)]) == 0
    probs = np.load(out)
    assert probs.shape == tuple(test[0].shape)
    np.testing.assert_allclose(probs, chosen.predict_proba(test[0]).numpy(), atol=1e-6)
    capsys.readouterr()


@pytest.mark.parametrize("case", list(CASES))
def test_compare_on_each_kind_from_files(tmp_path, case):
    paths, extra, kind, test, options = _files(tmp_path, case)
    out = tmp_path / "cmp"
    argv = ["compare", "--val-logits", paths["val"], "--val-labels", paths["val_y"],
            "--test-logits", paths["test"], "--test-labels", paths["test_y"], "--out", str(out),
            "--no-progress", *extra]  # fmt: skip
    assert main(argv) == 0
    table = json.loads((out / "results.json").read_text())["table"]
    assert [r["method"] for r in table] == ["Model", *(c.name for c in calibrators(kind))]
    model = next(r for r in table if r["method"] == "Model")
    assert model["nll"] == pytest.approx(peg.evaluate(*test, **options)["nll"], rel=1e-5)


def test_task_settles_one_score_as_a_one_label_multilabel_head(tmp_path):
    g = torch.Generator().manual_seed(5)
    z = torch.randn(120, 1, generator=g) * 3
    y = (torch.rand(120, 1, generator=g) < torch.sigmoid(z / 2)).long()
    np.save(tmp_path / "z.npy", z.numpy())
    np.save(tmp_path / "y.npy", y.numpy())
    argv = ["select", "--val-logits", str(tmp_path / "z.npy"), "--val-labels",
            str(tmp_path / "y.npy"), "--cv", "3", "--max-fit-seconds", "none", "--task",
            "multilabel", "--save", str(tmp_path / "s"), "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    assert peg.load(tmp_path / "s" / "chosen.peg").kind_.kind == "multilabel"


def test_the_command_lines_tasks_are_the_librarys():
    assert arguments.TASKS == _kinds.TASKS
