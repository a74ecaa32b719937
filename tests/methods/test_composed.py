"""PEG composed with the calibrators both ways: a calibrator after PEG (PEG → Dirichlet, ...) and
PEG around a calibrated model (the map as the last layer: Dirichlet → PEG), through save/load."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

import peg
from bad_inputs import raises_test
from peg.apps.chain import as_base
from peg.methods import (
    DirichletCalibration,
    HistogramBinning,
    MatrixScaling,
    TemperatureScaling,
    VectorScaling,
)
from peg.methods.calibration.composed import CalibratedModel, calibrated_module


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 4)).eval()


def _data(n: int = 240, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 3, generator=g)
    return X, (X[:, 0] > 0).long() + 2 * (X[:, 1] > 0).long()


@pytest.mark.parametrize("cls", [VectorScaling, MatrixScaling, DirichletCalibration])
def test_the_map_as_last_layer_predicts_as_the_calibrator(cls: type) -> None:
    calibrator = cls().fit(_net(), _data())
    module = calibrated_module(calibrator)
    X = _data(50, seed=2)[0]
    with torch.no_grad():
        torch.testing.assert_close(
            module(X).softmax(-1), calibrator.predict_proba(X), atol=3e-5, rtol=0
        )  # the layer in float32, the calibrator's map in float64
    assert [n for n, _ in module.named_parameters()][-2:] == ["map.weight", "map.bias"]


def test_temperature_scaling_as_a_layer_needs_the_classes() -> None:
    ts = TemperatureScaling().fit(_net(), _data())
    X = _data(50, seed=2)[0]
    with torch.no_grad():
        p = calibrated_module(ts, n_classes=4)(X).softmax(-1)
    torch.testing.assert_close(p, ts.predict_proba(X), atol=1e-6, rtol=0)


def test_dirichlet_then_last_layer_peg_perturbs_the_map_alone_and_round_trips(tmp_path) -> None:
    module = calibrated_module(DirichletCalibration().fit(_net(), _data()))
    val = _data(seed=3)
    fitted = peg.PEG(n_members=4, grad_batch_size=32, params="last_layer", progress=False)
    fitted.fit(module, val)
    assert fitted.param_names_ == ["map.weight", "map.bias"]
    X = _data(60, seed=4)[0]
    expected = fitted.member_logits(X)
    skeleton = CalibratedModel(_net(), 4, log_probs=True)  # its map weights are replaced
    loaded = peg.load(fitted.save(str(tmp_path / "recipe")), skeleton, val=val)
    assert torch.equal(loaded.member_logits(X), expected)
    whole = peg.load(fitted.save(str(tmp_path / "members"), materialize=True), skeleton)
    assert torch.equal(whole.member_logits(X), expected)


@pytest.mark.parametrize("cls", [VectorScaling, MatrixScaling, DirichletCalibration])
def test_a_calibrator_after_peg_round_trips(tmp_path, cls: type) -> None:
    ensemble = peg.PEG(n_members=3, grad_batch_size=32, eta=0.1, progress=False)
    ensemble.fit(_net(), _data(seed=3))
    calibrator = cls().fit(ensemble, _data(seed=5))
    assert calibrator.scores_ == "log_probs"  # an ensemble has no single logits
    X = _data(60, seed=4)[0]
    loaded = peg.load(calibrator.save(str(tmp_path / "calibrated")), _net())
    torch.testing.assert_close(loaded.predict_proba(X), calibrator.predict_proba(X))


def test_the_apps_hand_peg_the_calibrated_model() -> None:
    dirichlet = DirichletCalibration().fit(_net(), _data())
    assert isinstance(as_base(dirichlet, "peg", "Dirichlet"), CalibratedModel)
    assert (
        as_base(dirichlet, "temperature", "Dirichlet") is dirichlet
    )  # a calibrator takes it as is


CALIBRATORS = [TemperatureScaling, VectorScaling, MatrixScaling, DirichletCalibration]


@pytest.mark.parametrize("cls", CALIBRATORS)
def test_peg_around_a_fitted_calibrator_is_peg_around_the_calibrated_module(cls: type) -> None:
    calibrator = cls().fit(_net(), _data())
    options = dict(n_members=4, grad_batch_size=32, eta=0.05, seed=3, progress=False)
    fitted = peg.PEG(**options).fit(calibrator, _data(seed=3))  # type: ignore[arg-type]
    module = as_base(calibrator, "peg", cls.__name__)
    reference = peg.PEG(**options).fit(module, _data(seed=3))  # type: ignore[arg-type]
    X = _data(50, seed=2)[0]
    torch.testing.assert_close(fitted.member_logits(X), reference.member_logits(X))
    # at a tiny η the members are the calibrated model: the calibrator's prediction
    still = peg.PEG(**{**options, "eta": 1e-9}).fit(calibrator, _data(seed=3))  # type: ignore[arg-type]
    torch.testing.assert_close(
        still.predict_proba(X), calibrator.predict_proba(X), atol=3e-5, rtol=0
    )  # the members in float32, the calibrator's map in float64


@pytest.mark.parametrize("cls", [TemperatureScaling, DirichletCalibration])
def test_pep_and_mc_dropout_around_a_fitted_calibrator(cls: type) -> None:
    calibrator = cls().fit(_net(), _data())
    X = _data(50, seed=2)[0]
    pep = peg.PEP(n_members=3, sigma=1e-9, seed=0, progress=False).fit(calibrator, _data(seed=3))
    p = calibrator.predict_proba(X)  # float64 map; PEP's members in float32
    torch.testing.assert_close(pep.predict_proba(X), p, atol=3e-5, rtol=0)
    mc = peg.MCDropout(n_members=3, insert=0.2, seed=0).fit(calibrator, _data(seed=3))
    assert mc.meta_["insert"] == 0.2 and mc.member_logits(X).shape == (3, 50, 4)
    # the dropout sits inside the model, before its last layer, not before the map
    names = [n for n, m in mc.model_.named_modules() if isinstance(m, nn.Dropout)]
    assert names and all(n.startswith("model.") for n in names)


def _binning() -> HistogramBinning:
    return HistogramBinning().fit(_net(), _data())


ERROR_CASES: list[tuple[str, str, Callable[[], object], type[Exception], str]] = [
    (
        "composed",
        "a calibrator without an affine map",
        lambda: calibrated_module(_binning()),
        ValueError,
        r"calibrator: expected a fitted temperature, vector or matrix scaling",
    ),
    (
        "composed",
        "an unfitted calibrator",
        lambda: calibrated_module(DirichletCalibration()),
        ValueError,
        "calibrator: DirichletCalibration is not fitted",
    ),
    (
        "composed",
        "temperature scaling without n_classes",
        lambda: calibrated_module(TemperatureScaling().fit(_net(), _data())),
        ValueError,
        "n_classes",
    ),
    (
        "composed",
        "a calibrator fitted on an ensemble",
        lambda: calibrated_module(
            DirichletCalibration().fit(
                peg.PEG(n_members=2, grad_batch_size=32, eta=0.1, progress=False).fit(
                    _net(), _data()
                ),
                _data(),
            )
        ),
        ValueError,
        "calibrator: fitted on a PEG",
    ),
    (
        "PEG",
        "a histogram binning as the base",
        lambda: peg.PEG(n_members=2, eta=0.1, progress=False).fit(_binning(), _data()),
        ValueError,
        r"model: a HistogramBinning cannot be the base .*only temperature, vector, matrix "
        r"scaling and Dirichlet maps become a model's last layer",
    ),
    (
        "PEP",
        "an isotonic regression as the base",
        lambda: peg.PEP(n_members=2, sigma=0.1, progress=False).fit(
            peg.IsotonicCalibration().fit(_net(), _data()), _data()
        ),
        ValueError,
        "model: a IsotonicCalibration cannot be the base",
    ),
    (
        "MCDropout",
        "an unfitted calibrator as the base",
        lambda: peg.MCDropout(n_members=2, insert=0.1).fit(DirichletCalibration()),
        ValueError,
        "model: DirichletCalibration is not fitted",
    ),
    (
        "PEG",
        "a calibrator fitted on an ensemble as the base",
        lambda: peg.PEG(n_members=2, eta=0.1, progress=False).fit(
            TemperatureScaling().fit(peg.Ensemble.from_models([_net(), _net()]), _data()),
            _data(),
        ),
        ValueError,
        "model: this TemperatureScaling was fitted on a Ensemble, not on an nn.Module",
    ),
]


test_bad_input_raises_a_clear_error = raises_test(ERROR_CASES)


def test_an_ensemble_around_a_wrapper_loads_with_the_bare_model(tmp_path) -> None:
    """An archive of members around `Scaled(model, T)` records T (`peg._wrappers`) and loads
    with the bare model, predicting as saved (a round trip of the same weights: the same
    kernels on the same shapes, so the same bits)."""
    from peg.methods.calibration.composed import Scaled

    ensemble = peg.Ensemble.from_models([Scaled(_net(), 2.5), Scaled(_net(), 2.5)])
    path = ensemble.save(str(tmp_path / "scaled.peg"))
    X = _data(30, seed=4)[0]
    loaded = peg.load(path, nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 4)))
    assert isinstance(loaded.skeleton, Scaled) and loaded.skeleton.temperature == 2.5
    assert torch.equal(loaded.member_logits(X), ensemble.member_logits(X))


@pytest.mark.parametrize(
    ("record", "shapes", "message"),
    [
        ({"kind": "Scaled", "temperature": -1.0}, {}, r"'meta\.wrapped\.temperature': expected a"),
        ({"kind": "Scaled"}, {}, r"'meta\.wrapped\.temperature'"),
        ({"kind": "Spline"}, {}, r"'meta\.wrapped\.kind': expected one of"),
        ({"kind": "CalibratedModel", "log_probs": 1}, {}, r"'meta\.wrapped\.log_probs'"),
        ({"kind": "CalibratedModel", "log_probs": True}, {"map.bias": (10**9,)},
         r"needs its map, 'map\.weight' \[C, C\]"),
    ],
)  # fmt: skip
def test_a_forged_wrapper_record_is_an_archive_error_naming_the_field(record, shapes, message):
    """The record is untrusted JSON: each field checked, C taken from the archive's own map
    (a bias of 10⁹ without its weight allocates nothing)."""
    from peg._wrappers import around

    with pytest.raises(peg.errors.ArchiveError, match=r"x\.peg: .*" + message):
        around(_net(), {"wrapped": record}, shapes, "x.peg")
