"""`peg.compare` on saved logits: `compare(logits, labels, (test_logits, test_labels))` (or a
model without parameters, `nn.Identity()`) fits the maps of logits by default, leaves out with
the reason the methods that change or sample weights (no failed rows), and `peg compare
--logits V.npy --labels VL.npy --test-logits T.npy --test-labels TL.npy` does the same.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from torch import nn

import peg
from peg.apps.cli import main
from peg.apps.compare.faults import NO_WEIGHTS
from peg.apps.compare.methods import DEFAULTS, LOGIT_METHODS
from peg.apps.select.auto import LOGIT_CANDIDATES

C = 4


def saved(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, C, (n,), generator=g)
    return torch.randn(n, C, generator=g) * 2 + 3 * nn.functional.one_hot(y, C), y


def test_the_defaults_on_saved_logits_are_the_maps_of_logits_and_none_fails():
    (X, y), test = saved(240, 0), saved(200, 1)
    result = peg.compare(X.numpy(), y.numpy(), (test[0].numpy(), test[1].numpy()), say=None)
    assert [row["method"] for row in result.table] == ["Model", *LOGIT_METHODS]
    assert result.failed == {}
    left_out = [name for name in DEFAULTS if name not in ("Model", "TS")]
    assert result.skipped == {name: NO_WEIGHTS for name in left_out}
    assert LOGIT_CANDIDATES == LOGIT_METHODS  # AutoSelect's, the same list


def test_a_weight_method_named_on_saved_logits_is_left_out_not_failed():
    (X, y), test = saved(240, 0), saved(200, 1)
    result = peg.compare(nn.Identity(), (X, y), test, ["TS", "PEG", "PEG + TS"], say=None)
    assert [row["method"] for row in result.table] == ["TS"]
    assert result.skipped == {"PEG": NO_WEIGHTS, "PEG + TS": "its base, PEG, is left out"}
    assert result.failed == {}


def test_the_command_line_takes_saved_logits(tmp_path, capsys):
    for name, (logits, labels) in {"v": saved(240, 0), "t": saved(200, 1)}.items():
        np.save(tmp_path / f"{name}.npy", logits.numpy())
        np.save(tmp_path / f"{name}l.npy", labels.numpy())
    out = tmp_path / "out"
    argv = ["compare", "--logits", str(tmp_path / "v.npy"), "--labels", str(tmp_path / "vl.npy"),
            "--test-logits", str(tmp_path / "t.npy"), "--test-labels", str(tmp_path / "tl.npy"),
            "--methods", "TS", "Dirichlet", "--out", str(out), "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    rows = json.loads((out / "results.json").read_text())["table"]
    assert [row["method"] for row in rows] == ["TS", "Dirichlet"]
    assert "| Dirichlet |" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ([], r"--logits: give --logits, --labels, --test-logits and --test-labels together"),
        (["--test-logits", "t.npy", "--test-labels", "tl.npy", "--val", "digits"],
         r"--logits: give .* without --model, --val and --test"),
    ],
)  # fmt: skip
def test_the_command_line_names_what_is_missing_or_mixed(tmp_path, capsys, extra, said):
    np.save(tmp_path / "v.npy", saved(20, 0)[0].numpy())
    with pytest.raises(SystemExit) as e:
        main(["compare", "--logits", str(tmp_path / "v.npy"), "--labels", "vl.npy", *extra])
    assert e.value.code == 2
    assert re.search(said, capsys.readouterr().err)


def test_the_command_line_still_needs_a_model_without_logits(capsys):
    with pytest.raises(SystemExit) as e:
        main(["compare", "--val", "digits"])
    assert e.value.code == 2
    assert "--model: give --model, --val and --test (or --val-logits" in capsys.readouterr().err
