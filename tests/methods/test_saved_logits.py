"""Saved logits, no model: `nn.Identity()` (any model without parameters) wherever a model is
taken. Logits `[N, C]` saved once from a big model are calibrated, evaluated, made conformal and
selected among, from tensors, NumPy arrays or a memory-mapped `.npy`, on the device they are on.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

import peg
from peg.apps.cli import main

C = 5


def saved(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, C, (n,), generator=g)
    return torch.randn(n, C, generator=g) * 2 + 3 * nn.functional.one_hot(y, C), y


def identity_linear() -> nn.Module:
    """A model with parameters whose output is its input: what made the logits."""
    linear = nn.Linear(C, C, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.eye(C))
    return linear.eval()


CALIBRATORS = {
    "TS": peg.TemperatureScaling,
    "Vector scaling": peg.VectorScaling,
    "Matrix scaling": peg.MatrixScaling,
    "Dirichlet": peg.DirichletCalibration,
    "Hist. binning": peg.HistogramBinning,
    "Isotonic": peg.IsotonicCalibration,
    "Spline": peg.SplineCalibration,
    "Ensemble TS": peg.EnsembleTemperatureScaling,
    "Order-preserving": peg.OrderPreservingScaling,
    "Conformal APS": lambda: peg.ConformalClassifier(alpha=0.1, score="aps"),
}


@pytest.mark.parametrize("name", list(CALIBRATORS))
def test_every_calibrator_fits_on_saved_logits_as_on_the_model_that_made_them(name):
    val, test = saved(300, 0), saved(100, 1)
    on_logits = CALIBRATORS[name]().fit(nn.Identity(), val)
    on_model = CALIBRATORS[name]().fit(identity_linear(), val)
    torch.testing.assert_close(
        on_logits.predict_proba(test[0]), on_model.predict_proba(test[0]), atol=1e-5, rtol=0
    )


def test_arrays_and_a_memory_mapped_npy_give_the_tensors_results(tmp_path):
    (X, y), (Xt, yt) = saved(300, 0), saved(100, 1)
    np.save(tmp_path / "logits.npy", X.numpy())
    mapped = np.load(tmp_path / "logits.npy", mmap_mode="r")
    expected = peg.TemperatureScaling().fit(nn.Identity(), (X, y)).temperature_
    for val in ((X.numpy(), y.numpy()), (mapped, y.numpy())):
        assert peg.TemperatureScaling().fit(nn.Identity(), val).temperature_ == expected
    reference = peg.evaluate(identity_linear(), Xt, yt)
    assert peg.evaluate(nn.Identity(), Xt.numpy(), yt.numpy()) == pytest.approx(reference)


def test_autoselect_takes_the_logits_only_candidates_by_default():
    chosen = peg.AutoSelect(cv=3).fit(nn.Identity(), saved(300, 0))
    assert [r["candidate"] for r in chosen.report_] == list(peg.apps.select.auto.LOGIT_CANDIDATES)
    assert chosen.predict_proba(saved(50, 1)[0]).shape == (50, C)


def test_a_model_without_parameters_runs_where_its_inputs_are(gpu):
    (X, y), (Xt, _) = saved(300, 0), saved(100, 1)
    expected = peg.TemperatureScaling().fit(nn.Identity(), (X, y)).predict_proba(Xt)
    probs = peg.TemperatureScaling().fit(nn.Identity(), (X.to(gpu), y.to(gpu)))
    out = probs.predict_proba(Xt.to(gpu))
    assert out.device == gpu
    torch.testing.assert_close(out.to("cpu"), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", list(CALIBRATORS))
def test_a_map_fitted_on_saved_logits_saves_alone_and_loads_without_a_model(name, tmp_path):
    """The archive holds the map and no weights; `peg.load(path)` (or with `nn.Identity()`)
    gives the same predictions, meta and class back."""
    val, (Xt, _) = saved(300, 0), saved(100, 1)
    fitted = CALIBRATORS[name]().fit(nn.Identity(), val)
    path = fitted.save(tmp_path / "map.peg")
    header = peg.archive.read_header(path)
    assert header["stacked"] == [] and header["shared"] == [] and header["members"] == 1
    assert header["meta"]["inputs"] == "logits"
    for loaded in (peg.load(path), peg.load(path, nn.Identity())):
        assert type(loaded) is type(fitted) and loaded.meta_ == fitted.meta_
        assert isinstance(loaded.predictor_, nn.Identity)
        torch.testing.assert_close(loaded.predict_proba(Xt), fitted.predict_proba(Xt))


def test_a_conformal_predictor_on_a_map_of_saved_logits_saves_and_loads(tmp_path):
    val, (Xt, _) = saved(300, 0), saved(100, 1)
    ts = peg.TemperatureScaling().fit(nn.Identity(), val)
    sets = peg.ConformalClassifier(alpha=0.1, score="aps").fit(ts, saved(300, 2))
    loaded = peg.load(sets.save(tmp_path / "sets.peg"))
    assert isinstance(loaded.predictor_, peg.TemperatureScaling)
    assert loaded.predictor_.temperature_ == ts.temperature_
    assert torch.equal(loaded.predict_set(Xt), sets.predict_set(Xt))


def test_autoselects_choice_on_saved_logits_saves_and_loads(tmp_path):
    chosen = peg.AutoSelect(cv=3, progress=False).fit(nn.Identity(), saved(300, 0))
    loaded = peg.load(chosen.save(tmp_path / "chosen.peg"))
    assert type(loaded) is type(chosen.predictor_)
    Xt = saved(100, 1)[0]
    torch.testing.assert_close(loaded.predict_proba(Xt), chosen.predict_proba(Xt))
    assert peg.archive.read_header(tmp_path / "chosen.peg")["meta"]["auto_select"]["chosen"] == (
        chosen.chosen_
    )


def test_a_map_of_saved_logits_refuses_a_model_with_weights_and_the_reverse(tmp_path):
    path = peg.TemperatureScaling().fit(nn.Identity(), saved(100, 0)).save(tmp_path / "ts.peg")
    with pytest.raises(peg.ArchiveError, match="fitted on saved logits .* Linear with parameters"):
        peg.load(path, identity_linear())
    weights = peg.TemperatureScaling().fit(identity_linear(), saved(100, 0)).save(tmp_path / "w")
    with pytest.raises(TypeError, match="model: .* holds the weights of a Linear; pass"):
        peg.load(weights)


def test_a_tampered_map_of_saved_logits_is_refused(tmp_path):
    """Loaded values are untrusted: weights smuggled into a logits archive, or a map's arrays
    of the wrong shape, are ArchiveErrors naming the field."""
    fitted = peg.VectorScaling().fit(nn.Identity(), saved(300, 0))
    entry = fitted._archived()
    meta = {"inputs": "logits", "calibration": entry}
    bad = peg.archive.write(tmp_path / "a", {"w": torch.ones(1, 2)}, {}, meta, "Identity")
    with pytest.raises(peg.ArchiveError, match="no weights in a map over saved logits"):
        peg.load(bad)
    short = {"weights": torch.ones(C - 1, dtype=torch.float64), "bias": torch.zeros(C)}
    wrong = peg.archive.write(tmp_path / "b", {}, {}, meta, "Identity", short)
    with pytest.raises(peg.ArchiveError, match="'weights' has shape"):
        peg.load(wrong)


def test_peg_select_on_saved_logits(tmp_path, capsys):
    (X, y) = saved(300, 0)
    np.save(tmp_path / "val.npy", X.numpy())
    np.save(tmp_path / "labels.npy", y.numpy())
    # integral floats are labels, as the API reads them (issue 46); a fraction is not
    np.save(tmp_path / "floats.npy", y.numpy().astype(np.float32) + 0.5)
    peg_cli = [sys.executable, "-m", "peg.apps", "select", "--no-progress"]
    ran = subprocess.run(
        [*peg_cli, "--logits", str(tmp_path / "val.npy"), "--labels", str(tmp_path / "labels.npy"),
         "--cv", "3", "--save", str(tmp_path / "out")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    chosen = json.loads((tmp_path / "out" / "results.json").read_text())["chosen"]
    assert chosen in ran.stdout
    loaded = peg.load(tmp_path / "out" / "chosen.peg")  # the chosen map, no model
    Xt = saved(50, 1)[0]
    reference = peg.AutoSelect(cv=3, progress=False).fit(nn.Identity(), (X, y))
    assert reference.chosen_ == chosen
    torch.testing.assert_close(loaded.predict_proba(Xt), reference.predict_proba(Xt))
    # the refusal in this process (`peg.apps.cli.main`, as `python -m peg.apps` calls it): the
    # run above is the fresh process's
    with pytest.raises(SystemExit) as bad:
        main(["select", "--no-progress", "--logits", str(tmp_path / "val.npy"), "--labels",
              str(tmp_path / "floats.npy")])  # fmt: skip
    err = capsys.readouterr().err
    assert bad.value.code == 2 and "--labels: expected integer class labels" in err
    assert f"the non-integer value {y[0].item() + 0.5} at row 0" in err
