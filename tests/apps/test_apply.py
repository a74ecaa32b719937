"""`peg apply`: a map fitted on saved logits (`peg select --logits ... --save DIR`, or any
calibrator fitted on `nn.Identity()` and saved) applied to a new `.npy` of logits."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

import peg
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
    select = ["select", "--no-progress", "--logits", str(tmp_path / "val.npy"), "--cv", "3",
              "--labels", str(tmp_path / "labels.npy"), "--save", str(tmp_path / "sel")]
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
    assert "mine.npy exists and peg did not write it" in said
    assert mine.read_bytes() == b"not peg's"
    bad = saved(20, 2)[0].numpy()
    bad[7, 1] = np.nan
    np.save(tmp_path / "nan.npy", bad)
    out = tmp_path / "p.npy"
    said = _refused(["apply", str(tmp_path / "map.peg"), "--logits", str(tmp_path / "nan.npy"),
                     "--out", str(out)], capsys)  # fmt: skip
    assert "--logits: row 7 holds NaN" in said and not out.exists()
    np.save(tmp_path / "wide.npy", np.zeros((5, C + 1), np.float32))
    said = _refused(["apply", str(tmp_path / "map.peg"), "--logits", str(tmp_path / "wide.npy"),
                     "--out", str(out)], capsys)  # fmt: skip
    assert f"fitted on {C} classes" in said and not out.exists()
    none = ["apply", str(tmp_path / "none"), "--logits", str(tmp_path / "new.npy"), "--out",
            "o.npy"]
    assert "no saved map at" in _refused(none, capsys)
    weights = peg.TemperatureScaling().fit(nn.Linear(C, C), saved(100, 3)).save(tmp_path / "w")
    said = _refused(["apply", weights, "--logits", str(tmp_path / "new.npy"), "--out", str(out)],
                    capsys)  # fmt: skip
    assert "map: model: " in said and "holds the weights of a Linear" in said
    assert not out.exists()
